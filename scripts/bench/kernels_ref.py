#!/usr/bin/env python3
"""kernels_ref.py SCALE THREADS [wall|cpu] — the peers of build/bench/kernels (same cases, same sizes) in
JAX and PyTorch on the CPU, whichever is importable. Prints "framework case min_ms" lines (least disturbed of 15 runs).
Thread count: JAX/XLA uses the whole machine unless XLA_FLAGS limits it (kernels.sh sets it);
torch.set_num_threads(THREADS)."""
import sys, time, os

scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 0
N, C, V = int(2048 * scale), 768, 8192
B, H, D = 2, 12, 64
T = max(16, int(256 * min(scale, 1.0) + 0.5))
REPS = 15
clock = time.process_time if len(sys.argv) > 3 and sys.argv[3] == "cpu" else time.perf_counter

def min_ms(fn, sync):
    sync(fn())  # compile / warm up
    ts = []
    for _ in range(REPS):
        t0 = clock(); sync(fn()); ts.append(clock() - t0)
    return min(ts) * 1e3

def run_jax():
    import jax, jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    u = lambda *s: jax.random.uniform(key, s, jnp.float32, -1, 1)
    x, r, b, w = u(N, C), u(N, C), u(C), u(C)
    logits, tg, dl = u(N // 4, V), jax.random.randint(key, (N // 4,), 0, V), u(N // 4)
    q, k, v, o, do = u(B, H, T, D), u(B, H, T, D), u(B, H, T, D), u(B, H, T, D), u(B, H, T, D)
    gelu = lambda z: 0.5 * z * (1 + jnp.tanh(0.7978845608028654 * (z + 0.044715 * z ** 3)))
    f_gelu = jax.jit(lambda x, r, b: (gelu(x + b) + r) * 0.5)
    f_sm = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    def ln(x, w, b):
        m = x.mean(-1, keepdims=True); vv = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(vv + 1e-5) * w + b
    f_ln = jax.jit(ln)
    def xent(lg, t, d):
        lse = jax.nn.logsumexp(lg, -1)
        loss = lse - jnp.take_along_axis(lg, t[:, None], -1)[:, 0]
        dlog = d[:, None] * (jnp.exp(lg - lse[:, None]) - jax.nn.one_hot(t, V))
        return loss, dlog
    f_xent = jax.jit(xent)
    def att(q, k, v):
        s = jnp.einsum("bhtd,bhsd->bhts", q, k) * 0.125
        mask = jnp.tril(jnp.ones((T, T), bool))
        s = jnp.where(mask, s, -jnp.inf)
        return jnp.einsum("bhts,bhsd->bhtd", jax.nn.softmax(s, -1), v)
    f_att = jax.jit(att)
    f_att_bwd = jax.jit(lambda q, k, v, do: jax.vjp(att, q, k, v)[1](do))
    sync = lambda t: jax.block_until_ready(t)
    cases = [("bias_gelu_residual", lambda: f_gelu(x, r, b)), ("softmax_primitives", lambda: f_sm(x)),
             ("layernorm_affine", lambda: f_ln(x, w, b)), ("xent_fwd_bwd", lambda: f_xent(logits, tg, dl)),
             ("attention_fwd", lambda: f_att(q, k, v)), ("attention_bwd", lambda: f_att_bwd(q, k, v, do))]
    for name, fn in cases:
        print(f"jax {name} {min_ms(fn, sync):.3f}", flush=True)

def run_torch():
    import torch
    if threads > 0: torch.set_num_threads(threads)
    u = lambda *s: torch.rand(*s) * 2 - 1
    x, r, b, w = u(N, C), u(N, C), u(C), u(C)
    logits, tg, dl = u(N // 4, V), torch.randint(0, V, (N // 4,)), u(N // 4)
    q, k, v, do = u(B, H, T, D), u(B, H, T, D), u(B, H, T, D), u(B, H, T, D)
    F = torch.nn.functional
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    def sdpa(qq, kk, vv):
        # torch >= 2.0 has the fused kernel; 1.x (Debian's python3-torch) gets the textbook form
        if hasattr(F, "scaled_dot_product_attention"):
            return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=0.125)
        s = (qq @ kk.transpose(-2, -1)) * 0.125
        return s.masked_fill(mask, float("-inf")).softmax(-1) @ vv
    def att_bwd():
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        out = sdpa(qq, kk, vv)
        return torch.autograd.grad(out, (qq, kk, vv), do)
    def xent():
        lg = logits.clone().requires_grad_()
        loss = F.cross_entropy(lg, tg, reduction="none")
        return torch.autograd.grad(loss, lg, dl)
    cases = [("bias_gelu_residual", lambda: (F.gelu(x + b, approximate="tanh") + r) * 0.5),
             ("softmax_primitives", lambda: torch.softmax(x, -1)),
             ("layernorm_affine", lambda: F.layer_norm(x, (C,), w, b, 1e-5)),
             ("xent_fwd_bwd", xent),
             ("attention_fwd", lambda: sdpa(q, k, v)),
             ("attention_bwd", att_bwd)]
    with torch.no_grad():
        pass
    for name, fn in cases:
        print(f"torch {name} {min_ms(fn, lambda t: None):.3f}", flush=True)

for name, runner in (("jax", run_jax), ("torch", run_torch)):
    try:
        __import__(name)
    except ImportError:
        print(f"# {name}: not installed (pip install {name}); skipped", flush=True)
        continue
    runner()
