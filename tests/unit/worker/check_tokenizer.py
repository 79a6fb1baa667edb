#!/usr/bin/env python3
"""bertd's HF export tokenizes in transformers as bertd tokenized the data.

Usage: check_tokenizer.py HF_TOKENIZE_TOOL DATA_DIR
For the cased and the uncased BERT vocab (DATA_DIR/bert-base-{cased,uncased}-
vocab.txt) the C tool exports a model with that vocab and lowercase setting
and writes bertd's WordPiece ids of every line of the text (the GPL's first
lines: "GNU General Public License" is where a cased model loaded as uncased
goes wrong, plus the BERT sample text). transformers.AutoTokenizer, fast and
slow, loads the export and must give the same ids line by line, report
do_lower_case as exported and model_max_length = max_position_embeddings.
Exit 77 (skip) when transformers is not installed."""
import json
import os
import subprocess
import sys
import tempfile

try:
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
except ImportError as e:
    print("skip: transformers not importable:", e)
    sys.exit(77)

hf_logging.set_verbosity_error()  # "longer than model_max_length": expected here
tool, data = sys.argv[1], sys.argv[2]
gpl = "/usr/share/common-licenses/GPL-3"
lines = []
if os.path.exists(gpl):
    with open(gpl, encoding="utf-8") as f:
        lines += [l for l in f.read().splitlines() if l.strip()][:40]
with open(os.path.join(data, "bert-sample_text.txt"), encoding="utf-8") as f:
    lines += [l for l in f.read().splitlines() if l.strip()]
lines += ["GNU General Public License, Version 3; Café naïve RÉSUMÉ"]

failed = False
with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    for vocab, lower in (("bert-base-cased-vocab.txt", False),
                         ("bert-base-uncased-vocab.txt", True)):
        out = os.path.join(tmp, vocab)
        subprocess.run([tool, os.path.join(data, vocab), "1" if lower else "0", text, out],
                       check=True)
        with open(os.path.join(out, "bertd_ids.jsonl")) as f:
            ours = [json.loads(l) for l in f]
        assert len(ours) == len(lines), (len(ours), len(lines))
        for fast in (True, False):
            tok = AutoTokenizer.from_pretrained(out, use_fast=fast)
            kind = type(tok).__name__
            bad = [i for i, l in enumerate(lines)
                   if tok(l, add_special_tokens=False)["input_ids"] != ours[i]]
            gnu = tok.tokenize("GNU")
            print(f"{vocab} {kind}: do_lower_case {tok.do_lower_case}, "
                  f"model_max_length {tok.model_max_length}, 'GNU' -> {gnu}, "
                  f"{len(lines) - len(bad)}/{len(lines)} lines id-identical")
            for i in bad[:3]:
                print("  differs:", repr(lines[i][:80]))
                print("    bertd:", ours[i][:20])
                print("    hf:   ", tok(lines[i], add_special_tokens=False)["input_ids"][:20])
            if bad or tok.do_lower_case != lower or tok.model_max_length != 96:
                failed = True
            if "".join(t.replace("##", "") for t in gnu) != ("gnu" if lower else "GNU"):
                failed = True
            special = (tok.cls_token, tok.sep_token, tok.pad_token, tok.mask_token, tok.unk_token)
            if special != ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"):
                print("  special tokens:", special)
                failed = True
sys.exit(1 if failed else 0)
