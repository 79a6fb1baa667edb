#!/usr/bin/env python3
"""Fixture generation and the HuggingFace reference for bench/loader_bench.

  prepare: tokenizes text files with HF BertTokenizerFast (the vocab given)
           into a rawcorpus directory (loader/rawcorpus.h): documents are
           blank-line separated blocks, sentences split at . ! ? ; tokens
           uint16.
  hf:      the reference loader: the same token stream chunked to max_seq_len
           as run_mlm.py's group_texts does, masked by
           DataCollatorForLanguageModeling(mlm_probability=0.15) through a
           torch DataLoader with --workers worker processes. Prints one line
           'HF_RESULT seqs_per_s=<wall> seqs_per_cpu_s=<per CPU-second> workers=<n> seq=<T>'.
Python is only the reference and the fixture maker; bertd itself is C.
"""
import argparse
import os
import re
import sys
import time

import numpy as np


def load_tokenizer(vocab, lower):
    """BertTokenizerFast over a vocab.txt (transformers 5 ignores vocab_file=,
    so go through from_pretrained on a directory holding it)."""
    import shutil
    import tempfile
    from transformers import BertTokenizerFast
    with tempfile.TemporaryDirectory() as td:
        shutil.copy(vocab, os.path.join(td, "vocab.txt"))
        tok = BertTokenizerFast.from_pretrained(td, do_lower_case=lower)
    assert len(tok.get_vocab()) > 1000, "vocab did not load"
    return tok


def prepare(args):
    tok = load_tokenizer(args.vocab, not args.cased)
    docs = []
    for path in args.text:
        with open(path, encoding="utf-8", errors="replace") as f:
            block = []
            for line in f:
                line = line.strip()
                if not line:
                    if block:
                        docs.append(" ".join(block))
                        block = []
                    continue
                block.append(line)
            if block:
                docs.append(" ".join(block))
    splitter = re.compile(r"(?<=[.!?])\s+")
    tokens, sent_off, doc_off = [], [0], [0]
    sents_per_doc = [[s for s in splitter.split(d) if s] for d in docs]
    flat = [s for d in sents_per_doc for s in d]
    enc = tok(flat, add_special_tokens=False)["input_ids"]
    i = 0
    for d in sents_per_doc:
        for _ in d:
            tokens.extend(enc[i])
            sent_off.append(len(tokens))
            i += 1
        doc_off.append(len(sent_off) - 1)
    os.makedirs(args.out, exist_ok=True)
    np.asarray(tokens, dtype="<u2").tofile(os.path.join(args.out, "tokens.bin"))
    np.asarray(sent_off, dtype="<u8").tofile(os.path.join(args.out, "sent_off.bin"))
    np.asarray(doc_off, dtype="<u8").tofile(os.path.join(args.out, "doc_off.bin"))
    v = tok.get_vocab()
    with open(os.path.join(args.out, "meta.txt"), "w") as f:
        f.write("format bertd-rawtok-1\n# made by bench/loader_hf.py prepare from %s\n" % " ".join(args.text))
        f.write("token_bytes 2\nvocab_size %d\n" % len(v))
        for k, name in (("pad", "[PAD]"), ("unk", "[UNK]"), ("cls", "[CLS]"), ("sep", "[SEP]"), ("mask", "[MASK]")):
            f.write("%s %d\n" % (k, v[name]))
    print("prepared %d docs, %d sentences, %d tokens in %s" % (len(docs), len(sent_off) - 1, len(tokens), args.out))


def hf(args):
    import torch
    from torch.utils.data import DataLoader, Dataset
    from transformers import DataCollatorForLanguageModeling
    torch.set_num_threads(1)
    tok = load_tokenizer(args.vocab, True)
    d = args.dir
    tokens = np.fromfile(os.path.join(d, "tokens.bin"), dtype="<u2").astype(np.int64)
    sent_off = np.fromfile(os.path.join(d, "sent_off.bin"), dtype="<u8")
    doc_off = np.fromfile(os.path.join(d, "doc_off.bin"), dtype="<u8")
    # run_mlm.py group_texts: each text (here: document) gets [CLS] .. [SEP],
    # everything is concatenated and cut into max_seq_len blocks.
    parts = []
    for k in range(len(doc_off) - 1):
        a, b = sent_off[doc_off[k]], sent_off[doc_off[k + 1]]
        if b > a:
            parts.append([tok.cls_token_id])
            parts.append(tokens[a:b])
            parts.append([tok.sep_token_id])
    stream = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
    T = args.seq
    n = len(stream) // T
    blocks = stream[: n * T].reshape(n, T)

    class Blocks(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": blocks[i].tolist()}

    coll = DataCollatorForLanguageModeling(tokenizer=tok, mlm=True, mlm_probability=0.15)
    dl = DataLoader(Blocks(), batch_size=args.batch, shuffle=True, num_workers=args.workers,
                    collate_fn=coll, persistent_workers=args.workers > 0, drop_last=True)
    def cpu_now(it):
        """CPU seconds of this process plus its DataLoader workers."""
        tot = time.process_time()
        tck = os.sysconf("SC_CLK_TCK")
        for w in getattr(it, "_workers", []):
            try:
                with open("/proc/%d/stat" % w.pid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                tot += (int(fields[11]) + int(fields[12])) / tck
            except OSError:
                pass
        return tot

    seen = 0
    t0 = None
    c0 = 0.0
    warm = max(2 * max(args.workers, 1), 4)
    deadline = None
    while True:
        it = iter(dl)
        for i, b in enumerate(it):
            if t0 is None and i + 1 >= warm:
                t0 = time.perf_counter()
                c0 = cpu_now(it)
                deadline = t0 + args.seconds
                continue
            if t0 is not None:
                seen += b["input_ids"].shape[0]
                if time.perf_counter() >= deadline:
                    c1 = cpu_now(it)
                    break
        if t0 is not None and time.perf_counter() >= deadline:
            break
    dt = time.perf_counter() - t0
    print("HF_RESULT seqs_per_s=%.1f seqs_per_cpu_s=%.1f workers=%d seq=%d"
          % (seen / dt, seen / max(c1 - c0, 1e-9), args.workers, T))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--text", nargs="+", required=True)
    p.add_argument("--vocab", required=True)
    p.add_argument("--cased", action="store_true")
    p.add_argument("--out", required=True)
    h = sub.add_parser("hf")
    h.add_argument("--dir", required=True)
    h.add_argument("--vocab", required=True)
    h.add_argument("--seq", type=int, default=128)
    h.add_argument("--batch", type=int, default=32)
    h.add_argument("--workers", type=int, default=1)
    h.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else hf(args)


if __name__ == "__main__":
    sys.exit(main())
