#!/usr/bin/env python3
"""bertd's HF export loads in transformers and gives bertd's logits.

Usage: check_export.py HF_EXPORT_TOOL FIXTURE_DIR
Runs the C tool (bertd-born weights -> export dir + bertd's logits), loads the
directory with transformers.BertForMaskedLM.from_pretrained, runs the fixture
batch and compares the masked-position logits: relative L2 error <= 1e-4.
Exit 77 (skip) when transformers is not installed."""
import subprocess
import sys
import tempfile

from export_logits import bertd_logits, fixture_batch, load_export, masked_logits, rel_l2

tool, fixtures = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as out:
    subprocess.run([tool, fixtures, out], check=True)
    ours = bertd_logits(out)
    model = load_export(out)
    logits = masked_logits(model, fixture_batch(fixtures))
    err = rel_l2(ours["logits"], logits)
    tied = model.cls.predictions.decoder.weight.data_ptr() == \
        model.bert.embeddings.word_embeddings.weight.data_ptr()
    print(f"exported model: logits relative L2 error {err:.3g}, decoder tied: {tied}")
    if not (err <= 1e-4) or not tied:
        sys.exit(1)
