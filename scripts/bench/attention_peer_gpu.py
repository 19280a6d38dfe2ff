#!/usr/bin/env python3
"""attention_peer_gpu.py — PyTorch's fused causal attention at GPT-2 124M's shape, timed alone:
the reference for the attention rows of jdt-train's step profile (run.profile; scripts/gpu/check.sh
stage 4p prints both), so a GPU session can tell whether jdt-train's own attention kernels
(engine/backend/cuda/kernels/cuk_attention_tc.cu) are where its step loses to the peers.

For each SDPA backend PyTorch offers here (flash, cuDNN, memory-efficient; "math" when this
torch has no scaled_dot_product_attention, e.g. Debian's 1.13 for a CPU smoke test) it times the
forward, and the forward plus backward, of q, k, v of shape (B, H, T, D), causal, and prints one
JSON line per backend:
  {"backend", "device", "dtype", "B", "H", "T", "D", "fwd_ms", "bwd_ms", "fwd_tflops",
   "bwd_tflops"}
bwd_ms = (forward + backward) - forward. FLOPs are counted as jdt-train's profile counts them
(engine/compile/program.c node_flops): forward 4 B H D T (T + 1) / 2 (the causal half of QK^T
and PV), backward 2.5 times that. A backend that refuses the shape prints {"backend", "error"}.

Usage: attention_peer_gpu.py [--batch 32] [--heads 12] [--seq 1024] [--head-dim 64]
                             [--dtype bf16|f32] [--device cuda|cpu] [--reps 20]
"""
import argparse
import json
import sys
import time


def flops_fwd(B, H, T, D):
    return 4.0 * B * H * D * T * (T + 1) / 2.0


def timer(torch, device):
    """A function that runs f n times and returns the mean milliseconds per call."""
    def run(f, n):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(n):
                f()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / n
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) * 1e3 / n
    return run


def math_attention(torch, q, k, v):
    T, D = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-1, -2)) * (D ** -0.5)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F
    if a.device == "cuda" and not torch.cuda.is_available():
        print("attention_peer_gpu.py: no CUDA device for PyTorch", file=sys.stderr)
        return 1
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    B, H, T, D = a.batch, a.heads, a.seq, a.head_dim
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(device=a.device, dtype=dt).requires_grad_()
               for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=g).to(device=a.device, dtype=dt)
    run = timer(torch, a.device)
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    backends = [("math", None)]
    if sdpa is not None:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            backends = [(name, getattr(SDPBackend, attr)) for name, attr in
                        (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
                         ("efficient", "EFFICIENT_ATTENTION")) if hasattr(SDPBackend, attr)]
        except ImportError:  # torch 2.0-2.2: the default choice only
            backends = [("default", None)]
    ff = flops_fwd(B, H, T, D)
    for name, be in backends:
        def fwd():
            if sdpa is None:
                return math_attention(torch, q, k, v)
            return sdpa(q, k, v, is_causal=True)

        def fwd_bwd():
            q.grad = k.grad = v.grad = None
            fwd().backward(dout)
        rec = {"backend": name, "device": a.device, "dtype": a.dtype, "B": B, "H": H, "T": T,
               "D": D}
        try:
            ctx = sdpa_kernel(be) if be is not None else None
            if ctx is not None:
                ctx.__enter__()
            try:
                with torch.no_grad():
                    run(fwd, 3)  # warm-up: kernel selection, autotuning, allocation
                    t_f = run(fwd, a.reps)
                run(fwd_bwd, 3)
                t_fb = run(fwd_bwd, a.reps)
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)
        except Exception as ex:  # a backend that does not serve this shape, dtype or GPU
            rec["error"] = str(ex).split("\n")[0][:200]
            print(json.dumps(rec), flush=True)
            continue
        t_b = max(t_fb - t_f, 1e-9)
        rec.update(fwd_ms=round(t_f, 4), bwd_ms=round(t_b, 4),
                   fwd_tflops=round(ff / (t_f * 1e-3) / 1e12, 2),
                   bwd_tflops=round(2.5 * ff / (t_b * 1e-3) / 1e12, 2))
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
