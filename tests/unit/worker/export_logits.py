"""export_logits: shared by check_export.py and check_export_act.py.

Importing it exits 77 (skip) when transformers/torch are not importable.
fixture_batch reads the fixture's batch (reference.safetensors);
load_export loads an exported directory in transformers; masked_logits runs
a BertForMaskedLM on that batch and keeps the masked positions' logits;
rel_l2 is the relative L2 error of bertd's logits against transformers'."""
import os
import sys

try:
    import torch
    from safetensors.torch import load_file
    from transformers import BertForMaskedLM
except ImportError as e:
    print("skip: transformers/torch not importable:", e)
    sys.exit(77)


def fixture_batch(fixtures):
    return load_file(os.path.join(fixtures, "reference.safetensors"))


def load_export(out):
    return BertForMaskedLM.from_pretrained(out, attn_implementation="eager").float().eval()


def masked_logits(model, ref):
    ids = ref["batch.input_ids"].long()
    B, T = ids.shape
    lens = ref["batch.seq_lens"].long()
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    pos = ref["batch.mlm_positions"].long()
    with torch.no_grad():
        return model(input_ids=ids, token_type_ids=ref["batch.token_type_ids"].long(),
                     attention_mask=mask).logits.reshape(B * T, -1)[pos]


def rel_l2(ours, logits):
    return float(torch.linalg.norm(logits - ours) / torch.linalg.norm(logits))


def bertd_logits(out):
    return load_file(os.path.join(out, "bertd_logits.safetensors"))
