#!/usr/bin/env python3
"""bertd-prepare's sentence-length stats against HF tokenizers.

Usage: check_sentence_lengths_hf.py BERTD_PREPARE VOCAB_TXT
Writes /usr/share/common-licenses as a paragraph-per-line corpus (each
file's paragraphs joined into lines of at least 1500 bytes, no blank
lines: one document per file, as PubMed abstracts come), prepares it with
bertd-prepare and Google's bert-base-uncased vocab, and checks the summary
line's tokens, longest_sentence, sentences_over_126 and sentences_over_510
against BertTokenizerFast's pipeline (tokenizers: BertNormalizer,
BertPreTokenizer, WordPiece) run on every line. Exit 77 (skip) when
tokenizers is not installed or the corpus is absent."""
import json
import os
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
except ImportError as e:
    print("skip: tokenizers not importable:", e)
    sys.exit(77)

prepare, vocab = sys.argv[1], sys.argv[2]
src = "/usr/share/common-licenses"
if not os.path.isdir(src):
    print("skip: no", src)
    sys.exit(77)


def long_lines(path):
    out, cur = [], []
    size = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            s = line.rstrip("\r\n").strip(" \t")
            if not s:
                if size >= 1500:
                    out.append(" ".join(cur))
                    cur, size = [], 0
                continue
            cur.append(s)
            size += len(s.encode()) + 1
    if cur:
        out.append(" ".join(cur))
    return out


tk = Tokenizer(models.WordPiece.from_file(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
tk.normalizer = normalizers.BertNormalizer(lowercase=True)
tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, "corpus")
    os.mkdir(corpus)
    lens = []
    for name in sorted(os.listdir(src)):
        p = os.path.join(src, name)
        if name.startswith(".") or os.path.islink(p) or not os.path.isfile(p):
            continue
        lines = long_lines(p)
        with open(os.path.join(corpus, name + ".txt"), "w", encoding="utf-8") as f:
            f.write("".join(l + "\n" for l in lines))
        lens += [len(tk.encode(l, add_special_tokens=False).ids) for l in lines]
    lens = [n for n in lens if n > 0]
    r = subprocess.run([prepare, "-o", os.path.join(tmp, "ds"), "--vocab", vocab, "-j", "1", corpus],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bertd-prepare failed (%d): %s" % (r.returncode, r.stderr))
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want = {"tokens": sum(lens), "longest_sentence": max(lens),
            "sentences_over_126": sum(n > 126 for n in lens),
            "sentences_over_510": sum(n > 510 for n in lens)}
    print("HF tokenizers:", want)
    print("bertd-prepare:", {k: got.get(k) for k in want})
    bad = [k for k in want if got.get(k) != want[k]]
    if bad:
        sys.exit("disagree on " + ", ".join(bad))
    if want["sentences_over_510"] == 0 or want["sentences_over_126"] * 2 < len(lens):
        sys.exit("the corpus is not the long-line corpus this test means")
    print("ok: %d lines, %d over 126 tokens, %d over 510, the longest %d" %
          (len(lens), want["sentences_over_126"], want["sentences_over_510"], want["longest_sentence"]))
