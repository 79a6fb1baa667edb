#!/usr/bin/env python3
"""gpu_hf -- the reference for bench/gpu_bench.c: HuggingFace BertForMaskedLM
training steps with torch on one GPU, bf16 autocast, fused AdamW, the same
model shape, batch and sequence length, 15% of positions labelled (the rest
-100), dropout on. Weights are randomly initialised (no download).

scripts/device-check runs it beside bench_gpu, one process per row (eager
and --compile, seq 128 and 512), and turns the step time into tokens/s and
MFU with bench_gpu's FLOP count. Prints one line:
  HF_RESULT step_ms=<mean> fwd_ms=<mean> bwd_ms=<mean> opt_ms=<mean>
timed with CUDA events after --warmup untimed steps. --compile wraps the
model in torch.compile (the warm-up steps then include the compilation;
scripts/device-check gives it more of them). --device cpu (fp32, plain
AdamW, phases timed on the host) exists only for device-check's dry run,
which checks the row's plumbing with a tiny model: it measures nothing.
Python is allowed here only as a benchmark reference; nothing in bertd
runs it.
"""
import argparse
import contextlib
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the dry run's plumbing check, fp32, not a measurement")
    a = ap.parse_args()

    import torch
    from transformers import BertConfig, BertForMaskedLM

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        # gpu_bench found a device before it ran this, so torch not seeing
        # one is a failure of the reference (a driver too old for torch's
        # CUDA, a CPU-only torch), never a skip: say why and what versions.
        try:
            torch.cuda.init()
            why = "no device"
        except Exception as e:  # torch's own explanation
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"gpu_hf: torch {torch.__version__} (CUDA {torch.version.cuda}) cannot use the GPU: {why}",
              file=sys.stderr)
        return 1
    dev = torch.device(a.device)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                     num_attention_heads=a.heads, intermediate_size=a.intermediate,
                     max_position_embeddings=512)
    model = BertForMaskedLM(cfg).to(dev)
    model.train()
    fwd_model = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                            **({"fused": True} if cuda else {}))

    B, T = a.batch, a.seq
    N = B * T
    M = int(0.15 * N)

    def batch(k):
        g = torch.Generator(device="cpu").manual_seed(k)
        ids = torch.randint(1000, a.vocab, (B, T), generator=g)
        tt = (torch.arange(T) >= T // 2).long().expand(B, T).contiguous()
        labels = torch.full((N,), -100, dtype=torch.long)
        pos = (torch.arange(M) * N // M + k) % N  # same positions as gpu_bench.c
        labels[pos] = ids.view(-1)[pos]
        return (ids.to(dev), tt.to(dev), torch.ones(B, T, dtype=torch.long, device=dev),
                labels.view(B, T).to(dev))

    class HostEvent:  # torch.cuda.Event's interface, for --device cpu
        def record(self): self.t = time.perf_counter()
        def synchronize(self): pass
        def elapsed_time(self, end): return (end.t - self.t) * 1e3

    def sync():
        if cuda:
            torch.cuda.synchronize()

    batches = [batch(0), batch(1)]
    ev = [torch.cuda.Event(enable_timing=True) if cuda else HostEvent() for _ in range(4)]
    fwd = bwd = optt = 0.0
    t0 = None
    for s in range(a.warmup + a.steps):
        if s == a.warmup:
            sync()
            t0 = time.perf_counter()
        ids, tt, am, labels = batches[s % 2]
        ev[0].record()
        opt.zero_grad(set_to_none=True)
        with (torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()):
            out = fwd_model(input_ids=ids, token_type_ids=tt, attention_mask=am, labels=labels)
        ev[1].record()
        out.loss.backward()
        ev[2].record()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ev[3].record()
        if s >= a.warmup:
            ev[3].synchronize()
            fwd += ev[0].elapsed_time(ev[1])
            bwd += ev[1].elapsed_time(ev[2])
            optt += ev[2].elapsed_time(ev[3])
    sync()
    wall = time.perf_counter() - t0
    n = a.steps
    print(f"gpu_hf: torch {torch.__version__}{' (torch.compile)' if a.compile else ''}{'' if cuda else ' on the CPU, fp32'}, last loss {out.loss.item():.4f}", flush=True)
    print(f"HF_RESULT step_ms={wall * 1e3 / n:.3f} fwd_ms={fwd / n:.3f} bwd_ms={bwd / n:.3f} "
          f"opt_ms={optt / n:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
