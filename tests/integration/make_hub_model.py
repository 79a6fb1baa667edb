#!/usr/bin/env python3
"""A tiny Hub-style BERT checkpoint for the continued-pretraining recipe.

Writes <dir> as BertForMaskedLM.save_pretrained (safetensors, no NSP head)
writes it, with the vocab file beside it as vocab.txt: what a directory
holding bert-base-uncased looks like, at a size a test trains on a CPU
(hidden 32, 1 layer, 64 positions; the vocab is the given file's).
Exits 77 (skip) without torch or transformers.

usage: make_hub_model.py <dir> <vocab.txt>
"""
import os
import shutil
import sys

try:
    import torch
    from transformers import BertConfig, BertForMaskedLM
except ImportError:
    print("torch or transformers not installed: skipped")
    sys.exit(77)


def main():
    out, vocab = sys.argv[1], sys.argv[2]
    with open(vocab, encoding="utf-8") as f:
        n = sum(1 for _ in f)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=n, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(out, safe_serialization=True)
    shutil.copyfile(vocab, os.path.join(out, "vocab.txt"))
    print(f"{out}: BertForMaskedLM, vocab {n}, {sorted(os.listdir(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
