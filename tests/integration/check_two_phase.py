#!/usr/bin/env python3
"""Phase 2's first update, recomputed from phase 1's checkpoint.

Phase 1's checkpoint ckpt-N holds params p, Adam moments m, v and its update
count t = N; phase 2 (init_from_restore "all", another max_seq_length and
batch) saved ckpt-(N+1) after its first update: p', m', v', t + 1. With
weight decay 0 in phase 2:
    g  = (m' - beta1 m) / (1 - beta1)            the gradient phase 2 saw
    v' = beta2 v + (1 - beta2) g^2
and torch.optim.AdamW's update
    p' = p - lr / (1 - beta1^(t+1)) * m' / (sqrt(v') / sqrt(1 - beta2^(t+1)) + eps)
or LAMB's (apex FusedLAMB; without weight decay the trust ratio is 1)
    p' = p - lr * (m' / (1 - beta1^(t+1))) / (sqrt(v' / (1 - beta2^(t+1))) + eps)
This fails if phase 2 started with zero moments (v' would be (1-beta2) g'^2
of its own gradient, not the continuation) or with its count reset (the bias
correction of update 1 is several times that of update t + 1); both
counterfactuals are checked to fail too, so the test can tell. Reads the
checkpoints with safetensors' numpy reader (docs/formats.md). Exits 77
(skip) without numpy or safetensors.

usage: check_two_phase.py <ckpt-N> <ckpt-N+1> <lr> <beta1> <beta2> <eps> [adamw|lamb]
"""
import json
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError:
    print("numpy or safetensors not installed: skipped")
    sys.exit(77)


def load(d):
    with open(f"{d}/state.json") as f:
        st = json.load(f)
    p = load_file(f"{d}/params.safetensors")["params"].astype(np.float64)
    o = load_file(f"{d}/optim.safetensors")
    return st, p, o["exp_avg"].astype(np.float64), o["exp_avg_sq"].astype(np.float64)


def update(p, m2, v2, lr, b1, b2, eps, t, optim):
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    if optim == "lamb":
        return p - lr * (m2 / bc1) / (np.sqrt(v2 / bc2) + eps)
    return p - lr / bc1 * m2 / (np.sqrt(v2) / np.sqrt(bc2) + eps)


def main():
    d1, d2 = sys.argv[1], sys.argv[2]
    lr, b1, b2, eps = (float(x) for x in sys.argv[3:7])
    optim = sys.argv[7] if len(sys.argv) > 7 else "adamw"
    st1, p1, m1, v1 = load(d1)
    st2, p2, m2, v2 = load(d2)
    t = st1["optimizer"]["updates"]
    print(f"phase 1: step {st1['step']}, updates {t}; phase 2: step {st2['step']}, "
          f"updates {st2['optimizer']['updates']}")
    if st2["optimizer"]["optim"] != optim:
        print(f"phase 2 trained with {st2['optimizer']['optim']}, not {optim}")
        return 1
    if st2["optimizer"]["updates"] != t + 1 or st2["step"] != st1["step"] + 1:
        print("phase 2's checkpoint is not one update after phase 1's")
        return 1
    if not (np.abs(m1).max() > 0 and np.abs(v1).max() > 0):
        print("phase 1's moments are zero: not a test")
        return 1
    g = (m2 - b1 * m1) / (1 - b1)
    # v: relative to the largest entries (float32 storage rounds the rest)
    vscale = np.abs(v2).max()
    v_err = np.abs(v2 - (b2 * v1 + (1 - b2) * g * g)).max() / vscale
    v_reset = np.abs(v2 - (1 - b2) * ((m2 / (1 - b1)) ** 2)).max() / vscale
    step = np.abs(p2 - p1).max()
    p_err = np.abs(p2 - update(p1, m2, v2, lr, b1, b2, eps, t + 1, optim)).max() / step
    p_reset = np.abs(p2 - update(p1, m2, v2, lr, b1, b2, eps, 1, optim)).max() / step
    print(f"v' vs beta2 v + (1-beta2) g^2: {v_err:.2e} of max v' (moments reset: {v_reset:.2e})")
    print(f"p' vs {optim} update {t + 1}: {p_err:.2e} of the largest change (count reset to 1: {p_reset:.2e})")
    ok = v_err < 1e-4 and p_err < 1e-3
    tells = v_reset > 1e-2 and p_reset > 1e-1
    if not tells:
        print("the counterfactuals pass too: the check cannot tell")
    print("phase 2 continued phase 1's moments and update count" if ok and tells else "MISMATCH")
    return 0 if ok and tells else 1


if __name__ == "__main__":
    sys.exit(main())
