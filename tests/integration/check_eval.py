#!/usr/bin/env python3
"""bertd's held-out eval_loss equals transformers' on the same batches.

Usage: check_eval.py MODEL_DIR EVAL_BATCHES EVAL_LOSS EVAL_ACCURACY [TOL]

Loads the exported MODEL_DIR with BertForMaskedLM in eval mode (no
dropout), reads the eval batches bertd used (EVAL_BATCHES, the
eval_batches.bin of docs/formats.md: input ids, token type ids, attention
mask, labels with -100 where not masked) and computes the masked-LM
cross-entropy summed over every masked token of every batch, divided by the
masked-token count, and the share of masked tokens whose argmax is the
label. Exit 0 when |loss - EVAL_LOSS| <= TOL (default 1e-5) and the correct
count equals round(EVAL_ACCURACY * masked), 1 otherwise; 77 (skip) when torch
or transformers is not installed. Prints the measured difference."""
import math
import struct
import sys

try:
    import torch
    from transformers import BertForMaskedLM
except ImportError as e:
    print("skip: transformers not importable:", e)
    sys.exit(77)


def read_batches(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"BERTDEVB":
        raise SystemExit("%s: not an eval-batches file" % path)
    version, n_batches, T, nsp, _, _ = struct.unpack_from("<6I", data, 8)
    if version != 1:
        raise SystemExit("%s: version %d" % (path, version))
    off = 32
    batches = []

    def take(count):
        nonlocal off
        t = torch.tensor(struct.unpack_from("<%di" % count, data, off), dtype=torch.long)
        off += 4 * count
        return t

    for _ in range(n_batches):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        ids = take(n * T).view(n, T)
        tt = take(n * T).view(n, T)
        mask = take(n * T).view(n, T)
        labels = take(n * T).view(n, T)
        nsp_labels = take(n) if nsp else None
        batches.append((ids, tt, mask, labels, nsp_labels))
    if off != len(data):
        raise SystemExit("%s: %d bytes left over" % (path, len(data) - off))
    return batches


def main():
    model_dir, path = sys.argv[1], sys.argv[2]
    want_loss, want_acc = float(sys.argv[3]), float(sys.argv[4])
    tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-5
    torch.set_grad_enabled(False)
    model = BertForMaskedLM.from_pretrained(model_dir).eval()
    batches = read_batches(path)
    loss_sum, count, correct = 0.0, 0, 0
    for ids, tt, mask, labels, _ in batches:
        logits = model(input_ids=ids, token_type_ids=tt, attention_mask=mask).logits
        sel = labels != -100
        # the same cross-entropy BertForMaskedLM's loss takes the mean of
        ce = torch.nn.functional.cross_entropy(logits[sel].double(), labels[sel], reduction="sum")
        loss_sum += ce.item()
        count += int(sel.sum())
        correct += int((logits[sel].argmax(-1) == labels[sel]).sum())
        # and HF's own loss on this batch is that sum over the count
        hf = model(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels).loss.item()
        assert abs(hf - ce.item() / int(sel.sum())) < 1e-4, (hf, ce.item() / int(sel.sum()))
    loss = loss_sum / count
    acc = correct / count
    diff = abs(loss - want_loss)
    want_correct = round(want_acc * count)
    print("transformers eval_loss %.9f over %d masked tokens in %d batches; bertd %.9f; |diff| %.3g "
          "(tol %.1g); accuracy %d/%d, bertd %.6f (%d)" %
          (loss, count, len(batches), want_loss, diff, tol, correct, count, want_acc, want_correct))
    ok = diff <= tol and correct == want_correct and math.isfinite(loss)
    sys.exit(0 if ok else 1)


main()
