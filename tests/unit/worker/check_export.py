#!/usr/bin/env python3
"""bertd's HF export loads in transformers and gives bertd's logits.

Usage: check_export.py HF_EXPORT_TOOL FIXTURE_DIR
Runs the C tool (bertd-born weights -> export dir + bertd's logits), loads the
directory with transformers.BertForMaskedLM.from_pretrained, runs the fixture
batch and compares the masked-position logits: relative L2 error <= 1e-4.
Exit 77 (skip) when transformers is not installed."""
import os
import subprocess
import sys
import tempfile

try:
    import torch
    from safetensors.torch import load_file
    from transformers import BertForMaskedLM
except ImportError as e:
    print("skip: transformers/torch not importable:", e)
    sys.exit(77)

tool, fixtures = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as out:
    subprocess.run([tool, fixtures, out], check=True)
    ours = load_file(os.path.join(out, "bertd_logits.safetensors"))
    ref = load_file(os.path.join(fixtures, "reference.safetensors"))
    model = BertForMaskedLM.from_pretrained(out, attn_implementation="eager").float().eval()
    ids = ref["batch.input_ids"].long()
    B, T = ids.shape
    lens = ref["batch.seq_lens"].long()
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    pos = ref["batch.mlm_positions"].long()
    with torch.no_grad():
        logits = model(input_ids=ids, token_type_ids=ref["batch.token_type_ids"].long(),
                       attention_mask=mask).logits.reshape(B * T, -1)[pos]
    err = float(torch.linalg.norm(logits - ours["logits"]) / torch.linalg.norm(logits))
    tied = model.cls.predictions.decoder.weight.data_ptr() == \
        model.bert.embeddings.word_embeddings.weight.data_ptr()
    print(f"exported model: logits relative L2 error {err:.3g}, decoder tied: {tied}")
    if not (err <= 1e-4) or not tied:
        sys.exit(1)
