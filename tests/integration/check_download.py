#!/usr/bin/env python3
"""A downloaded, unpacked bertd export loads in transformers.

Usage: check_download.py MODEL_DIR
BertForMaskedLM.from_pretrained and AutoTokenizer.from_pretrained (fast and
slow) load MODEL_DIR as they would a model from the Hub; the tokenizer's
vocabulary is vocab.txt's lines, and a forward pass over a tokenized line
gives finite logits of shape (1, tokens, vocab_size).
Exit 77 (skip) when torch or transformers is not installed."""
import json
import math
import os
import sys

try:
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM
except ImportError as e:
    print("skip: transformers not importable:", e)
    sys.exit(77)

d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
with open(os.path.join(d, "vocab.txt"), encoding="utf-8") as f:
    vocab_lines = sum(1 for _ in f)
model = BertForMaskedLM.from_pretrained(d).eval()
assert model.config.vocab_size == cfg["vocab_size"], (model.config.vocab_size, cfg)
for fast in (True, False):
    tok = AutoTokenizer.from_pretrained(d, use_fast=fast)
    assert len(tok) == vocab_lines, (fast, len(tok), vocab_lines)
    enc = tok("To be, or not to be, that is the question.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert tuple(logits.shape) == (1, enc["input_ids"].shape[1], cfg["vocab_size"]), logits.shape
    assert all(math.isfinite(v) for v in logits.flatten().tolist())
print("transformers loaded the download: %d parameters, vocab %d" %
      (sum(p.numel() for p in model.parameters()), vocab_lines))
