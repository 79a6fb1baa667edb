#!/usr/bin/env python3
"""bertd's learning-rate schedules against transformers' get_scheduler.

For each case: a job spec (training_args with lr_scheduler_type and
lr_scheduler_kwargs) goes through lr_schedule_tool (the worker's own path
from the spec to optim_lr_at), and the same settings build an
optimizer and get_scheduler(..., scheduler_specific_kwargs=kwargs) as
Trainer does; every step's learning rate, and two past the end, must agree
within a relative 1e-6 (bertd keeps the peak rate as a float32).
Exits 77 (skip) without torch or transformers.

usage: check_schedules.py <lr_schedule_tool>
"""
import json
import math
import subprocess
import sys

try:
    import torch
    from transformers import get_scheduler
except ImportError:
    print("torch or transformers not installed: skipped")
    sys.exit(77)

CASES = [
    # (lr, max_steps, warmup_steps, warmup_ratio, type, kwargs)
    (1e-3, 40, 5, 0.0, "polynomial", {"power": 0.5, "lr_end": 1e-7}),
    (6e-3, 37, 0, 0.2843, "polynomial", {"power": 0.5}),
    (1e-4, 30, 3, 0.0, "polynomial", {}),
    (1e-4, 30, 4, 0.0, "polynomial", {"lr_end": 2e-5, "power": 2.0}),
    (1e-3, 30, 3, 0.0, "cosine_with_min_lr", {"min_lr": 1e-5}),
    (1e-3, 33, 0, 0.1, "cosine_with_min_lr", {"min_lr_rate": 0.1, "num_cycles": 1.5}),
    (1e-3, 30, 4, 0.0, "warmup_stable_decay",
     {"num_stable_steps": 10, "num_decay_steps": 12, "min_lr_ratio": 0.05}),
    (2e-4, 25, 0, 0.0, "warmup_stable_decay", {"num_stable_steps": 5, "num_decay_steps": 30}),
    (2e-4, 25, 2, 0.0, "warmup_stable_decay",
     {"num_stable_steps": 3, "num_decay_steps": 7, "num_cycles": 1.0, "min_lr_ratio": 0.2}),
    (1e-3, 20, 3, 0.0, "cosine", {"num_cycles": 2.0}),
    (1e-3, 20, 3, 0.0, "cosine", {}),
    (1e-3, 20, 3, 0.0, "linear", {}),
    (1e-3, 20, 3, 0.0, "constant", {}),
    (1e-3, 20, 3, 0.0, "constant_with_warmup", {}),
]


def reference(lr, max_steps, warmup, sched, kwargs):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=lr)
    s = get_scheduler(sched, opt, num_warmup_steps=warmup, num_training_steps=max_steps,
                      scheduler_specific_kwargs=dict(kwargs))
    out = []
    for _ in range(max_steps + 3):
        out.append(s.get_last_lr()[0])
        opt.step()
        s.step()
    return out


def main():
    tool = sys.argv[1]
    bad = 0
    for lr, max_steps, warm, ratio, sched, kwargs in CASES:
        spec = {"dataset": "x", "model": {"preset": "bert-tiny", "vocab_size": 100},
                "training_args": {"learning_rate": lr, "max_steps": max_steps, "warmup_steps": warm,
                                  "warmup_ratio": ratio, "lr_scheduler_type": sched,
                                  "lr_scheduler_kwargs": kwargs}}
        got = [float(x) for x in subprocess.run([tool, json.dumps(spec)], check=True,
                                                capture_output=True, text=True).stdout.split()]
        # TrainingArguments.get_warmup_steps
        w = warm if warm > 0 else math.ceil(max_steps * ratio)
        ref = reference(lr, max_steps, w, sched, kwargs)
        assert len(got) == len(ref), (sched, len(got), len(ref))
        worst = max(abs(g - r) / max(abs(r), 1e-12) for g, r in zip(got, ref))
        ok = worst <= 1e-6 and all((g == 0) == (r == 0) or abs(g - r) < 1e-15 for g, r in zip(got, ref))
        print(f"{sched:22s} {json.dumps(kwargs):70s} warmup {w:2d}/{max_steps}: "
              f"worst relative difference {worst:.2e} {'ok' if ok else 'MISMATCH'}")
        if not ok:
            for i, (g, r) in enumerate(zip(got, ref)):
                print(f"  step {i}: bertd {g:.9g} transformers {r:.9g}")
            bad += 1
    if bad:
        print(f"{bad} schedule(s) differ from transformers")
        return 1
    print(f"all {len(CASES)} schedules equal transformers' get_scheduler at every step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
