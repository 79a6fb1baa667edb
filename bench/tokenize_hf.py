#!/usr/bin/env python3
"""HF side of bench/tokenize.sh: single-threaded HuggingFace tokenizers
(BertNormalizer + BertPreTokenizer + WordPiece, as in
tests/fixtures/tokenizer/make_fixtures.py) over whole files, line by line
with encode_batch, best of R runs. Prints the same columns as
tokenize_bench: <file> <bytes> <lines> <tokens> <MB/s> <sha256 of ids>.
Timing covers encode_batch on already-decoded str lines (decoding is not
charged to HF). Run with RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false.
Usage: tokenize_hf.py VOCAB lower|cased REPEATS FILE...
"""
import hashlib
import os
import struct
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, normalizers, pre_tokenizers  # noqa: E402
from tokenizers.models import WordPiece  # noqa: E402


def main():
    vocab, mode, reps, files = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    lower = mode == "lower"
    tok = Tokenizer(WordPiece.from_file(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lower)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    for f in files:
        data = open(f, "rb").read()
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        text = [l.decode("utf-8", "replace") for l in lines]
        best = 1e30
        for _ in range(reps):
            t0 = time.perf_counter()
            encs = tok.encode_batch(text, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
        h = hashlib.sha256()
        n = 0
        for e in encs:
            h.update(struct.pack("<%dI" % len(e.ids), *e.ids))
            h.update(b"\xff\xff\xff\xff")
            n += len(e.ids)
        print("%s %d %d %d %.2f %s" % (f, len(data), len(lines), n, len(data) / 1e6 / best,
                                       h.hexdigest()))


if __name__ == "__main__":
    main()
