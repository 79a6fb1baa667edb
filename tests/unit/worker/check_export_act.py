#!/usr/bin/env python3
"""hidden_act gelu_new / gelu_pytorch_tanh through import, training and export.

Usage: check_export_act.py HF_ACT_TOOL FIXTURE_DIR
For each of the two names of GELU's tanh form: transformers makes a tiny
BertForMaskedLM with that hidden_act and saves it (save_pretrained); the C
tool imports it, trains 3 steps and exports it; the export's config.json
must say the same hidden_act, transformers must load it, and its logits on
the fixture batch must be bertd's (relative L2 error <= 1e-5; the weights
before the GELUs are scaled up as in make_fixtures.py gelu_new, so the erf
form would be off by ~1e-4). bertd's
trained weights must differ from the imported ones (it did train).
Exit 77 (skip) when transformers is not installed."""
import json
import os
import subprocess
import sys
import tempfile

# first: it exits 77 (skip) when transformers or torch is missing
from export_logits import bertd_logits, fixture_batch, load_export, masked_logits, rel_l2

import torch
from transformers import BertConfig, BertForMaskedLM

tool, fixtures = sys.argv[1], sys.argv[2]
ref = fixture_batch(fixtures)
failed = 0
for act in ("gelu_new", "gelu_pytorch_tanh"):
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
        torch.manual_seed(3)
        cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=64,
                         max_position_embeddings=32, hidden_act=act)
        m0 = BertForMaskedLM(cfg)
        with torch.no_grad():  # GELU inputs wide enough that the erf form would show
            for n, p in m0.named_parameters():
                if n.endswith("intermediate.dense.weight") or n.endswith("transform.dense.weight"):
                    p.mul_(20.0)
        m0.save_pretrained(src, safe_serialization=True)
        subprocess.run([tool, src, fixtures, out], check=True)
        with open(os.path.join(out, "config.json")) as f:
            written = json.load(f)["hidden_act"]
        model = load_export(out)
        before = BertForMaskedLM.from_pretrained(src).float()
        err = rel_l2(bertd_logits(out)["logits"], masked_logits(model, ref))
        w0 = before.bert.encoder.layer[0].intermediate.dense.weight
        w1 = model.bert.encoder.layer[0].intermediate.dense.weight
        trained = not torch.equal(w0, w1)
        ok = written == act and err <= 1e-5 and trained
        print(f"{'ok' if ok else 'FAIL'} {act}: export says {written}, transformers' logits vs "
              f"bertd's relative L2 {err:.3g}, trained {trained}")
        failed += not ok
sys.exit(1 if failed else 0)
