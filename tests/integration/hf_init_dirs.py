#!/usr/bin/env python3
"""Makes the HF model directories test_init_hf continues training from.

Usage: hf_init_dirs.py OUT_DIR VOCAB_TXT

Small BERTs (hidden 32, 2 layers, vocab of VOCAB_TXT, dropout 0, random
init with fixed torch seeds), written by transformers' save_pretrained as a
user's Hub download would be:
  pt_st, pt_bin          BertForPreTraining, model.safetensors / pytorch_model.bin
                         (torch.save's zip, safe_serialization=False)
  mlmnsp_st, mlmnsp_bin  the same weights (pooler and NSP head included) under
                         config "architectures": ["BertForMaskedLM"], as
                         bert-base-uncased ships
  sharded                BertForPreTraining in several safetensors shards
                         (model.safetensors.index.json)
  sharded_bin            the same in pytorch_model.bin shards
                         (pytorch_model.bin.index.json)
  mlm_st                 BertForMaskedLM: no pooler, no NSP head
  bare_st                BertModel: no MLM head
  tf_only                config.json + tf_model.h5 only
  evil_bin               config.json + a pytorch_model.bin whose pickle calls
                         os.system: written byte by byte, never unpickled
Exit 77 when torch or transformers is missing."""
import io
import json
import os
import sys
import zipfile

try:
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertForPreTraining, BertModel
except ImportError as e:
    print("skip: transformers not importable:", e)
    sys.exit(77)


def main():
    out, vocab = sys.argv[1], sys.argv[2]
    with open(vocab, encoding="utf-8") as f:
        V = sum(1 for _ in f)
    cfg = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(1)
    pt = BertForPreTraining(cfg).eval()
    pt.save_pretrained(os.path.join(out, "pt_st"))
    pt.save_pretrained(os.path.join(out, "pt_bin"), safe_serialization=False)
    pt.save_pretrained(os.path.join(out, "sharded"), max_shard_size="300KB")
    pt.save_pretrained(os.path.join(out, "sharded_bin"), max_shard_size="300KB",
                       safe_serialization=False)
    for d, safe in (("mlmnsp_st", True), ("mlmnsp_bin", False)):
        p = os.path.join(out, d)
        pt.save_pretrained(p, safe_serialization=safe)
        with open(os.path.join(p, "config.json")) as f:
            c = json.load(f)
        c["architectures"] = ["BertForMaskedLM"]
        with open(os.path.join(p, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
    torch.manual_seed(2)
    BertForMaskedLM(cfg).save_pretrained(os.path.join(out, "mlm_st"))
    torch.manual_seed(3)
    BertModel(cfg).save_pretrained(os.path.join(out, "bare_st"))

    tf = os.path.join(out, "tf_only")
    os.makedirs(tf, exist_ok=True)
    cfg.save_pretrained(tf)
    with open(os.path.join(tf, "tf_model.h5"), "wb") as f:
        f.write(b"\x89HDF\r\n\x1a\n" + bytes(64))

    evil = os.path.join(out, "evil_bin")
    os.makedirs(evil, exist_ok=True)
    cfg.save_pretrained(evil)
    # PROTO 2; GLOBAL os.system; the argument tuple; REDUCE; STOP
    pkl = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
    with zipfile.ZipFile(os.path.join(evil, "pytorch_model.bin"), "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
    n_shards = len([f for f in os.listdir(os.path.join(out, "sharded")) if f.endswith(".safetensors")])
    assert n_shards >= 2, n_shards
    assert os.path.exists(os.path.join(out, "sharded_bin", "pytorch_model.bin.index.json"))
    print("made", sorted(os.listdir(out)), "sharded into", n_shards)


if __name__ == "__main__":
    main()
