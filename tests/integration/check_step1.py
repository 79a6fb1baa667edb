#!/usr/bin/env python3
"""bertd's logged loss of a job's first step equals transformers' loss on
the same batch, and the job's export loads with from_pretrained.

Usage: check_step1.py MODEL_DIR BATCH_SLOT LOSS EXPORT_DIR [--nsp] [--tol T]
                      [--same-encoder INIT_DIR]

MODEL_DIR: the weights step 1 ran with (the init_from directory; with
--same-encoder, the export of a one-step job whose learning rate leaves
the weights as they started). BATCH_SLOT: the batch of step 1 as
`bertd-loader --job job.json --write-batch 0 --out FILE` writes it (one
batch slot, docs/formats.md "Batch slots"). The loss is computed in float64
with BertForMaskedLM (BertForPreTraining with --nsp: masked-LM plus
next-sentence loss), in eval mode. Exit 0 when |loss - LOSS| <= T (default
1e-6) and the export loads with no missing and no unexpected weights (as
BertForPreTraining with --nsp, else BertForMaskedLM: an MLM-only export has
no pooler and no NSP head); 1 otherwise; 77 (skip) without torch or
transformers. --same-encoder: also every tensor of INIT_DIR the export has
must be equal within 1e-9, and a pooler / NSP head INIT_DIR lacks must look
as transformers initialises it (weights std ~ initializer_range, biases 0).
Prints the measured difference."""
import struct
import sys

try:
    import torch
    from transformers import BertForMaskedLM, BertForPreTraining
except ImportError as e:
    print("skip: transformers not importable:", e)
    sys.exit(77)


def read_slot(path):
    with open(path, "rb") as f:
        d = f.read()
    magic, version = struct.unpack_from("<II", d, 0)
    if magic != 0x48435442 or version != 1:
        raise SystemExit("%s: not a version-1 batch slot" % path)
    B, T, P, flags = struct.unpack_from("<4I", d, 48)
    offs = struct.unpack_from("<7I", d, 72)

    def arr(off, n):
        return torch.tensor(struct.unpack_from("<%di" % n, d, off), dtype=torch.long)

    ids = arr(offs[0], B * T).view(B, T)
    tt = arr(offs[1], B * T).view(B, T)
    lens = arr(offs[2], B)
    pos = arr(offs[3], B * P).view(B, P)
    lab = arr(offs[4], B * P).view(B, P)
    nsp = arr(offs[5], B)
    npred = arr(offs[6], B)
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b in range(B):
        for j in range(int(npred[b])):
            labels[b, pos[b, j]] = lab[b, j]
    return ids, tt, mask, labels, (nsp if flags & 1 else None)


def main():
    args = sys.argv[1:]
    nsp = "--nsp" in args
    tol, same = 1e-6, None
    if "--tol" in args:
        tol = float(args[args.index("--tol") + 1])
    if "--same-encoder" in args:
        same = args[args.index("--same-encoder") + 1]
    model_dir, slot, want, export = args[0], args[1], float(args[2]), args[3]
    torch.set_grad_enabled(False)
    cls = BertForPreTraining if nsp else BertForMaskedLM
    model = cls.from_pretrained(model_dir).double().eval()
    ids, tt, mask, labels, nsp_labels = read_slot(slot)
    kw = dict(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels)
    if nsp:
        if nsp_labels is None:
            raise SystemExit("the batch has no NSP labels")
        kw["next_sentence_label"] = nsp_labels
    ref = model(**kw).loss.item()
    diff = abs(ref - want)
    print("step-1 loss: bertd %.9f transformers %.9f |diff| %.3g (tol %.1g)" % (want, ref, diff, tol))
    ok = diff <= tol
    back, info = cls.from_pretrained(export, output_loading_info=True)
    if info["missing_keys"]:
        print("export is missing", info["missing_keys"])
        ok = False
    if info["unexpected_keys"]:  # an MLM-only export holds no pooler, no NSP head
        print("export has more than the model:", info["unexpected_keys"])
        ok = False
    if same:
        init = BertForMaskedLM.from_pretrained(same).state_dict()
        got = back.state_dict()
        worst = max((got[k] - v).abs().max().item() for k, v in init.items() if k in got)
        print("export vs init: max |diff| %.3g over %d tensors" % (worst, sum(k in got for k in init)))
        ok = ok and worst <= 1e-9
        cfg = back.config
        for k in ("bert.pooler.dense.weight", "cls.seq_relationship.weight"):
            sd = got[k].std().item()
            print("%s std %.4f (initializer_range %g)" % (k, sd, cfg.initializer_range))
            ok = ok and abs(sd - cfg.initializer_range) < 0.15 * cfg.initializer_range
        for k in ("bert.pooler.dense.bias", "cls.seq_relationship.bias"):
            ok = ok and got[k].abs().max().item() <= 1e-9
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
