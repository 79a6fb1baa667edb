#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_ptbin (tests/fuzz/ptbin_corpus/), which
test_ptbin also reads: small files in torch.save's zip format, each a state
dict of known values, plus two it must refuse. Run with Debian's python3
(torch) from the repository root; the output is committed.

  plain.bin      {"a": arange(6)/2 f32 (2,3), "b": arange(4)/4 f16 (4,), "c": arange(4)/8 bf16 (2,2)}
  ordered.bin    nn.Linear(3, 2).state_dict() with weights arange(6)/10, bias [1, 2]:
                 an OrderedDict carrying _metadata (BUILD), as older checkpoints
  shared.bin     {"w": t, "tied": t, "tail": t[1:]} over one storage (t = arange(5) f32):
                 one storage, two views, an offset
  proto4.bin     plain.bin's dict saved with pickle_protocol=4 (FRAME, MEMOIZE,
                 SHORT_BINUNICODE)
  scalar.bin     {"s": tensor(3.5), "position_ids": arange(4) int64 (1,4)}
  transposed.bin {"t": arange(6).view(2,3).t()}: a non-contiguous view, refused
  evil.bin       a zip whose data.pkl calls os.system: refused (written byte
                 by byte; never unpickled)"""
import collections
import os
import zipfile

import torch

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptbin_corpus")
os.makedirs(out, exist_ok=True)


def p(name):
    return os.path.join(out, name)


plain = {"a": (torch.arange(6, dtype=torch.float32) / 2).view(2, 3),
         "b": torch.arange(4, dtype=torch.float16) / 4,
         "c": (torch.arange(4, dtype=torch.float32) / 8).to(torch.bfloat16).view(2, 2)}
torch.save(plain, p("plain.bin"))
lin = torch.nn.Linear(3, 2)
with torch.no_grad():
    lin.weight.copy_(torch.arange(6, dtype=torch.float32).view(2, 3) / 10)
    lin.bias.copy_(torch.tensor([1.0, 2.0]))
sd = lin.state_dict()
assert isinstance(sd, collections.OrderedDict) and hasattr(sd, "_metadata")
torch.save(sd, p("ordered.bin"))
t = torch.arange(5, dtype=torch.float32)
torch.save({"w": t, "tied": t, "tail": t[1:]}, p("shared.bin"))
torch.save(plain, p("proto4.bin"), pickle_protocol=4)
torch.save({"s": torch.tensor(3.5), "position_ids": torch.arange(4).view(1, 4)}, p("scalar.bin"))
torch.save({"t": torch.arange(6, dtype=torch.float32).view(2, 3).t()}, p("transposed.bin"))
pkl = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03."
with zipfile.ZipFile(p("evil.bin"), "w", zipfile.ZIP_STORED) as z:
    z.writestr("evil/data.pkl", pkl)
    z.writestr("evil/version", "3\n")
print(sorted(os.listdir(out)))
