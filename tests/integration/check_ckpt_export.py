#!/usr/bin/env python3
"""An HF export made from a bertd checkpoint holds that checkpoint's weights.

Usage: check_ckpt_export.py MODEL_DIR CHECKPOINT_DIR
Loads MODEL_DIR with transformers (BertForMaskedLM, AutoTokenizer) and
compares every parameter, bit for bit, with the checkpoint's flat parameter
span (params.safetensors), cut into tensors here from state.json's
param_tensors and model config by bertd's layout as docs/formats.md states
it (fused QKV per layer as (3C, C), query rows first) -- not by bertd's own
export code. The tied decoder weight must equal the word embeddings.
Exit 77 (skip) when torch, transformers or safetensors is not installed."""
import json
import os
import sys

try:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, BertForMaskedLM
except ImportError as e:
    print("skip: not importable:", e)
    sys.exit(77)

model_dir, ckpt = sys.argv[1], sys.argv[2]
state = json.load(open(os.path.join(ckpt, "state.json")))
cfg = state["model"]
C, L, I = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
flat = load_file(os.path.join(ckpt, "params.safetensors"))["params"]
assert flat.dtype == torch.float32 and flat.numel() == state["num_params"], (flat.dtype, flat.numel())

# the flat span, tensor by tensor, in state.json's order
span, off = {}, 0
for t in state["param_tensors"]:
    span[t["name"]] = flat[off:off + t["numel"]]
    off += t["numel"]
assert off == flat.numel(), (off, flat.numel())


def per_layer(name, l, *shape):
    n = 1
    for d in shape:
        n *= d
    return span[name][l * n:(l + 1) * n].reshape(*shape)


want = {
    "bert.embeddings.word_embeddings.weight": span["wte"].reshape(-1, C),
    "bert.embeddings.position_embeddings.weight": span["wpe"].reshape(-1, C),
    "bert.embeddings.token_type_embeddings.weight": span["wtt"].reshape(-1, C),
    "bert.embeddings.LayerNorm.weight": span["emb_lnw"],
    "bert.embeddings.LayerNorm.bias": span["emb_lnb"],
    "cls.predictions.transform.dense.weight": span["head_w"].reshape(C, C),
    "cls.predictions.transform.dense.bias": span["head_b"],
    "cls.predictions.transform.LayerNorm.weight": span["head_lnw"],
    "cls.predictions.transform.LayerNorm.bias": span["head_lnb"],
    "cls.predictions.bias": span["dec_b"],
    "cls.predictions.decoder.bias": span["dec_b"],  # tied to cls.predictions.bias
    "cls.predictions.decoder.weight": span["wte"].reshape(-1, C),  # tied
}
for l in range(L):
    p = "bert.encoder.layer.%d." % l
    qkvw, qkvb = per_layer("qkvw", l, 3 * C, C), per_layer("qkvb", l, 3 * C)
    for k, nm in enumerate(("query", "key", "value")):
        want[p + "attention.self.%s.weight" % nm] = qkvw[k * C:(k + 1) * C]
        want[p + "attention.self.%s.bias" % nm] = qkvb[k * C:(k + 1) * C]
    want[p + "attention.output.dense.weight"] = per_layer("attprojw", l, C, C)
    want[p + "attention.output.dense.bias"] = per_layer("attprojb", l, C)
    want[p + "attention.output.LayerNorm.weight"] = per_layer("ln1w", l, C)
    want[p + "attention.output.LayerNorm.bias"] = per_layer("ln1b", l, C)
    want[p + "intermediate.dense.weight"] = per_layer("fcw", l, I, C)
    want[p + "intermediate.dense.bias"] = per_layer("fcb", l, I)
    want[p + "output.dense.weight"] = per_layer("fcprojw", l, C, I)
    want[p + "output.dense.bias"] = per_layer("fcprojb", l, C)
    want[p + "output.LayerNorm.weight"] = per_layer("ln2w", l, C)
    want[p + "output.LayerNorm.bias"] = per_layer("ln2b", l, C)

model = BertForMaskedLM.from_pretrained(model_dir).eval()
got = model.state_dict()
for name, w in want.items():
    assert name in got, ("transformers has no", name)
    g = got[name]
    assert tuple(g.shape) == tuple(w.shape), (name, tuple(g.shape), tuple(w.shape))
    assert torch.equal(g, w), ("%s differs from the checkpoint's" % name,
                               float((g - w).abs().max()))
missing = [n for n in got if n not in want and not n.endswith("position_ids")]
assert not missing, ("parameters not compared", missing)
assert model.config.vocab_size == cfg["vocab_size"], (model.config.vocab_size, cfg["vocab_size"])
tok = AutoTokenizer.from_pretrained(model_dir)
enc = tok("To be, or not to be", return_tensors="pt")
with torch.no_grad():
    assert torch.isfinite(model(**enc).logits).all()
print("%s: %d tensors equal checkpoint %s (step %d)" % (model_dir, len(want), ckpt, state["step"]))
