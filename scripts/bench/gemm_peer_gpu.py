#!/usr/bin/env python3
"""gemm_peer_gpu.py — cuBLAS (through PyTorch, eager: no compiler padding) on the GEMMs of GPT-2's
lm head, timed alone, with the vocabulary as GPT-2 has it (50257) and rounded to multiples of 8, 64
and 128: how much an unaligned dimension costs the GEMM library, the question behind jdt-train's
aligned split (engine/backend/cuda/cuk_gemm.c gemm; scripts/gpu/check.sh stage gm prints both).

For each vocabulary size V it times, in bf16 with f32 accumulation (PyTorch's default for bf16
matmuls), the three products of a linear layer without bias over x (M, C):
  fwd    logits (M, V) = x (M, C) @ w (V, C)^T      cuBLAS m = V
  dx     dx (M, C)     = dlogits (M, V) @ w (V, C)  cuBLAS k = V
  dw     dw (V, C)     = dlogits^T (V, M) @ x (M, C) cuBLAS n = V
and prints one JSON line per (V, product): {"V", "gemm", "M", "C", "ms", "tflops"}. Inputs are
random (never zeros: a product of zeros runs faster than real data). The times are the mean of
--reps calls after warm-up calls, measured with CUDA events.

Usage: gemm_peer_gpu.py [--tokens 32768] [--channels 768] [--vocab 50257,50264,50304,50432]
                        [--reps 10] [--device cuda|cpu]
"""
import argparse
import json
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--channels", type=int, default=768)
    ap.add_argument("--vocab", default="50257,50264,50304,50432")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    import torch
    dev = a.device
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    M, C = a.tokens, a.channels

    def timed(f):
        for _ in range(2):
            f()
        if dev == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            for _ in range(a.reps):
                f()
            e.record()
            torch.cuda.synchronize()
            return s.elapsed_time(e) / a.reps
        t0 = time.perf_counter()
        for _ in range(a.reps):
            f()
        return (time.perf_counter() - t0) * 1e3 / a.reps

    g = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(M, C, device=dev, dtype=dt, generator=g)
    for V in (int(v) for v in a.vocab.split(",")):
        w = torch.randn(V, C, device=dev, dtype=dt, generator=g)
        dl = torch.randn(M, V, device=dev, dtype=dt, generator=g)
        flops = 2.0 * M * V * C
        for name, f in (("fwd", lambda: x @ w.t()), ("dx", lambda: dl @ w),
                        ("dw", lambda: dl.t() @ x)):
            ms = timed(f)
            print(json.dumps({"V": V, "gemm": name, "M": M, "C": C, "ms": round(ms, 4),
                              "tflops": round(flops / ms / 1e9, 1)}), flush=True)
        del w, dl
        if dev == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
