#!/usr/bin/env python3
"""CPU training-step time: bertd vs PyTorch (HF BertForMaskedLM), one run.

Usage: bench/train_step_vs_torch.py BUILD_DIR [--preset bert-mini] [--batch 32]
                                    [--seq 128] [--threads 2] [--steps 10]
Both sides: same BertConfig preset, fp32, dropout 0.1, ~15% masked positions,
AdamW (weight decay 0.01, clip 1.0) step included, same thread count. bertd's
MLM head runs on masked rows only; HF computes logits for every position and
ignores labels of -100 (that is how HF trains). Prints a table and one line
starting with "BENCH" for scripts. Reference: torch + transformers, run here.
"""
import argparse
import os
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("build_dir")
ap.add_argument("--preset", default="bert-mini")
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()

PRESETS = {"bert-tiny": (2, 128, 2), "bert-mini": (4, 256, 4), "bert-small": (4, 512, 8),
           "bert-medium": (8, 512, 8), "bert-base": (12, 768, 12), "bert-large": (24, 1024, 16)}

env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))


def bertd_round():
    out = subprocess.run([os.path.join(a.build_dir, "bench", "bench_train_step"), a.preset,
                          str(a.batch), str(a.seq), str(a.threads), str(a.steps)],
                         env=env, check=True, capture_output=True, text=True).stdout
    lines = out.splitlines()
    return ([float(x) for x in lines[0].split()[1:]], [float(x) for x in lines[1].split()[1:]])


import torch  # noqa: E402
from transformers import BertConfig, BertForMaskedLM  # noqa: E402

torch.set_num_threads(a.threads)
torch.manual_seed(0)
L, C, NH = PRESETS[a.preset]
cfg = BertConfig(num_hidden_layers=L, hidden_size=C, num_attention_heads=NH,
                 intermediate_size=4 * C, hidden_act="gelu")
model = BertForMaskedLM(cfg).float().train()
decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
rest = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                         {"params": rest, "weight_decay": 0.0}], lr=1e-4)
B, T = a.batch, a.seq
ids = torch.randint(1000, cfg.vocab_size, (B, T))
masked = torch.rand(B, T) < 0.15
masked[:, 0] = False
labels = torch.where(masked, ids, torch.full_like(ids, -100))
ids = torch.where(masked, torch.full_like(ids, 103), ids)
attn = torch.ones(B, T, dtype=torch.long)
tt = torch.zeros(B, T, dtype=torch.long)
flat_pos = masked.view(-1).nonzero().squeeze(1)
flat_lab = labels.view(-1)[flat_pos]


def hf_loss():
    # what BertForMaskedLM does: the head on every position, labels -100 ignored
    return model(input_ids=ids, attention_mask=attn, token_type_ids=tt, labels=labels).loss


def sparse_loss():
    # the same math with the head on masked rows only, as bertd (and NVIDIA's
    # BERT recipe) does: an apples-to-apples reference for the kernels
    h = model.bert(input_ids=ids, attention_mask=attn, token_type_ids=tt).last_hidden_state
    logits = model.cls(h.reshape(B * T, -1)[flat_pos])
    return torch.nn.functional.cross_entropy(logits, flat_lab)


def bench(loss_fn, times, cpus):
    for s in range(a.steps + 2):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if s >= 2:
            times.append((time.perf_counter() - t0) * 1e3)
            cpus.append((time.process_time() - c0) * 1e3)


# Rounds interleave the three contenders so background load on a shared
# machine hits them alike; the ratio uses each one's fastest step.
tb, th, ts, cb, ch, cs = [], [], [], [], [], []
for _ in range(a.rounds):
    w, c = bertd_round()
    tb += w
    cb += c
    bench(hf_loss, th, ch)
    bench(sparse_loss, ts, cs)
bertd_ms, bertd_min = statistics.median(tb), min(tb)
torch_ms, torch_min = statistics.median(th), min(th)
sparse_ms, sparse_min = statistics.median(ts), min(ts)

ratio = bertd_min / torch_min
ratio_sparse = bertd_min / sparse_min
print(f"CPU training step, {a.preset} B={B} T={T} fp32, {a.threads} threads, "
      f"{a.rounds} rounds x {a.steps} steps after 2 warm-up")
print(f"{'':<28}{'median ms':>12}{'min ms':>10}{'min CPU ms':>12}")
print(f"{'bertd (C, OpenBLAS)':<28}{bertd_ms:>12.1f}{bertd_min:>10.1f}{min(cb):>12.1f}")
print(f"{'PyTorch BertForMaskedLM':<28}{torch_ms:>12.1f}{torch_min:>10.1f}{min(ch):>12.1f}")
print(f"{'PyTorch, head masked-only':<28}{sparse_ms:>12.1f}{sparse_min:>10.1f}{min(cs):>12.1f}")
print(f"torch {torch.__version__}; ratios of fastest steps: bertd/BertForMaskedLM = {ratio:.3f} "
      f"(goal <= 0.8), bertd/torch-masked-head = {ratio_sparse:.3f}")
print(f"BENCH train_step_cpu preset={a.preset} B={B} T={T} threads={a.threads} "
      f"bertd_min_ms={bertd_min:.2f} torch_min_ms={torch_min:.2f} ratio={ratio:.3f} "
      f"torch_masked_head_min_ms={sparse_min:.2f} ratio_masked_head={ratio_sparse:.3f} "
      f"cpu_ratio={min(cb) / min(ch):.3f} cpu_ratio_masked_head={min(cb) / min(cs):.3f}")
