#!/usr/bin/env python3
"""The learning_rate a bertd job logged, step by step, against transformers.

Input: a JSON file {"spec": <the job's effective spec>, "metrics": [rows]}
(GET /v1/jobs/{id} and /metrics). The reference is what Trainer builds from
the same training_args: TrainingArguments.get_warmup_steps and
get_scheduler(lr_scheduler_type, optimizer(lr=learning_rate), ...,
scheduler_specific_kwargs=lr_scheduler_kwargs). A metrics row of step s
carries the rate step s's update used: the scheduler's value after s - 1
scheduler steps. Relative tolerance 1e-6 (bertd keeps the peak as float32).
Exits 77 (skip) without torch or transformers.

usage: check_logged_lr.py <file>
"""
import json
import math
import sys

try:
    import torch
    from transformers import get_scheduler
except ImportError:
    print("torch or transformers not installed: skipped")
    sys.exit(77)


def main():
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    ta = doc["spec"]["training_args"]
    max_steps = ta["max_steps"]
    warm = ta["warmup_steps"] if ta["warmup_steps"] > 0 else math.ceil(max_steps * ta["warmup_ratio"])
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=ta["learning_rate"])
    sched = get_scheduler(ta["lr_scheduler_type"], opt, num_warmup_steps=warm,
                          num_training_steps=max_steps,
                          scheduler_specific_kwargs=dict(ta["lr_scheduler_kwargs"]))
    ref = []
    for _ in range(max_steps):
        ref.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    rows = doc["metrics"]
    if len(rows) < 2:
        print(f"only {len(rows)} metrics rows")
        return 1
    bad = 0
    for r in rows:
        s = r["step"]
        want = ref[s - 1]
        got = r["learning_rate"]
        ok = abs(got - want) <= 1e-6 * abs(want) + 1e-15
        print(f"step {s:3d}: bertd {got:.9g} transformers {want:.9g} {'ok' if ok else 'MISMATCH'}")
        bad += not ok
    distinct = len({round(r["learning_rate"], 12) for r in rows})
    if distinct < 3:
        print("the schedule did not move: not a test of it")
        return 1
    print(f"{ta['lr_scheduler_type']} {json.dumps(ta['lr_scheduler_kwargs'])}: "
          f"{len(rows) - bad}/{len(rows)} logged rates equal transformers'")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
