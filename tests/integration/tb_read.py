"""Reads a bertd state dir's TensorBoard event files with TensorBoard's own
reader and checks them against the metrics rows the API returned.

usage: tb_read.py <state_dir>/jobs rows.json
rows.json: {"<job id>": [<GET /v1/jobs/{id}/metrics rows>], ...}

Expected scalars, from docs/formats.md: train/loss, train/learning_rate,
train/grad_norm, train/tokens_per_s from the row's fields of those names;
time/<phase>_share = phases_ms[phase] / step_time_ms; eval/loss,
eval/perplexity = exp(eval_loss) and eval/accuracy when a row has
eval_loss (a row of an eval step that logged nothing else has only
those). Every value is
compared at float32 precision (what an Event's simple_value holds), and the
tag set of each run must be exactly the expected one. Exit 0 when all
match, 1 with a message otherwise, 77 when tensorboard is not installed."""
import json
import math
import os
import struct
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator, event_multiplexer
except ImportError:
    print("tensorboard is not installed (scripts/setup --references)")
    sys.exit(77)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def expected(rows):
    want = {}
    for r in rows:
        step = r["step"]
        for field, tag in (("loss", "train/loss"), ("learning_rate", "train/learning_rate"),
                           ("grad_norm", "train/grad_norm"), ("tokens_per_s", "train/tokens_per_s")):
            if finite(r.get(field)):
                want.setdefault(tag, []).append((step, f32(r[field])))
        if finite(r.get("eval_loss")):
            want.setdefault("eval/loss", []).append((step, f32(r["eval_loss"])))
            want.setdefault("eval/perplexity", []).append((step, f32(math.exp(r["eval_loss"]))))
        if finite(r.get("eval_accuracy")):
            want.setdefault("eval/accuracy", []).append((step, f32(r["eval_accuracy"])))
        st = r.get("step_time_ms")
        if finite(st) and st > 0:
            for phase, ms in (r.get("phases_ms") or {}).items():
                if finite(ms):
                    want.setdefault("time/%s_share" % phase, []).append((step, f32(ms / st)))
    return want


def main():
    logdir, rows_path = sys.argv[1], sys.argv[2]
    with open(rows_path) as f:
        jobs = json.load(f)
    # as `tensorboard --logdir <state_dir>/jobs` finds them: one run per job
    mux = event_multiplexer.EventMultiplexer(size_guidance={event_accumulator.SCALARS: 0})
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    runs = set(mux.Runs())
    want_runs = {os.path.join(j, "tensorboard") for j in jobs}
    if runs != want_runs:
        print("runs %s, expected %s" % (sorted(runs), sorted(want_runs)))
        return 1
    checked = 0
    for job, rows in jobs.items():
        # and each job's directory on its own, with EventAccumulator
        acc = event_accumulator.EventAccumulator(os.path.join(logdir, job, "tensorboard"),
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        want = expected(rows)
        trained = [r for r in rows if "eval_loss" not in r or "loss" in r]
        if not rows or len(want.get("train/loss", [])) != len(trained):
            print("%s: %d rows, not every one with a loss or an eval_loss" % (job, len(rows)))
            return 1
        tags = set(acc.Tags()["scalars"])
        if tags != set(want):
            print("%s: tags %s, expected %s" % (job, sorted(tags), sorted(want)))
            return 1
        for tag, points in want.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            mux_got = [(e.step, e.value) for e in mux.Scalars(os.path.join(job, "tensorboard"), tag)]
            if got != points or mux_got != points:
                print("%s %s: read %s, expected %s" % (job, tag, got, points))
                return 1
            checked += len(points)
        print("%s: %d tags, %d rows" % (job, len(want), len(rows)))
    print("%d scalars match" % checked)
    return 0


if __name__ == "__main__":
    sys.exit(main())
