#!/usr/bin/env python3
"""gpt_peer_min.py — a minimal GPU peer for scripts/gpu/check.sh (used when
scripts/bench/gpt_peer_gpu.py is not there): the GPT-2 style model jdt-train trains (token +
learned position embeddings, pre-LayerNorm blocks, causal attention, 4x tanh-GELU MLP, final
LayerNorm, tied head, biases), AdamW + global-norm clipping, synthetic tokens, one whole step
compiled (torch.compile / jax.jit). Precision: "tf32" (f32 storage, TF32 matmuls: what
jdt-train's CUDA backend computes) or "bf16" (bf16 autocast / bf16 compute, f32 master).
Prints one line:  <framework> tok/s <float> step_ms <float>
Usage: gpt_peer_min.py torch|jax L C H T B V STEPS [tf32|bf16]
"""
import math
import sys
import time


def run_torch(L, C, H, T, B, V, steps, prec):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a local smoke test only

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, C))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, V).float(), tgt.view(-1))

    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=dev == "cuda")

    def step(idx, tgt):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=prec == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    step = torch.compile(step) if dev == "cuda" else step
    g = torch.Generator(device=dev).manual_seed(0)
    idx = torch.randint(0, V, (B, T), device=dev, generator=g)
    tgt = torch.randint(0, V, (B, T), device=dev, generator=g)
    for _ in range(3):
        step(idx, tgt)
    if dev == "cuda": torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(idx, tgt)
    loss.item()
    dt = (time.perf_counter() - t0) / steps
    return dt


def run_jax(L, C, H, T, B, V, steps, prec):
    import jax
    import jax.numpy as jnp

    if prec == "tf32":
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    cdt = jnp.bfloat16 if prec == "bf16" else jnp.float32
    key = jax.random.PRNGKey(0)

    def init(key):
        ks = iter(jax.random.split(key, 4 + 4 * L))
        n = lambda shape: 0.02 * jax.random.normal(next(ks), shape, jnp.float32)
        p = {"wte": n((V, C)), "wpe": n((T, C)), "lnf": (jnp.ones(C), jnp.zeros(C)), "blocks": []}
        for _ in range(L):
            p["blocks"].append({
                "ln1": (jnp.ones(C), jnp.zeros(C)), "ln2": (jnp.ones(C), jnp.zeros(C)),
                "qkv": (n((C, 3 * C)), jnp.zeros(3 * C)), "o": (n((C, C)), jnp.zeros(C)),
                "fc": (n((C, 4 * C)), jnp.zeros(4 * C)), "proj": (n((4 * C, C)), jnp.zeros(C))})
        return p

    def ln(x, wb):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * wb[0].astype(x.dtype) + wb[1].astype(x.dtype)

    def lin(x, wb):
        return x @ wb[0].astype(cdt) + wb[1].astype(cdt)

    def loss_fn(p, idx, tgt):
        x = (p["wte"][idx] + p["wpe"][None]).astype(cdt)
        mask = jnp.tril(jnp.ones((T, T), bool))
        for b in p["blocks"]:
            q, k, v = jnp.split(lin(ln(x, b["ln1"]), b["qkv"]), 3, axis=-1)
            q, k, v = (t.reshape(B, T, H, C // H) for t in (q, k, v))
            a = jax.nn.dot_product_attention(q, k, v, mask=mask[None, None])
            x = x + lin(a.reshape(B, T, C), b["o"])
            h = jax.nn.gelu(lin(ln(x, b["ln2"]), b["fc"]), approximate=True)
            x = x + lin(h, b["proj"])
        logits = (ln(x, p["lnf"]) @ p["wte"].astype(cdt).T).astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, -1)
        return (lse - jnp.take_along_axis(logits, tgt[..., None], -1)[..., 0]).mean()

    def adamw(p, g, m, v, t):
        gn = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        sc = jnp.minimum(1.0, 1.0 / (gn + 1e-6))
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g * sc, m, g)
        v = jax.tree_util.tree_map(lambda v, g: 0.95 * v + 0.05 * (g * sc) ** 2, v, g)
        c1, c2 = 1 - 0.9 ** t, 1 - 0.95 ** t
        p = jax.tree_util.tree_map(lambda p, m, v: p - 3e-4 * (m / c1 / (jnp.sqrt(v / c2) + 1e-8) + 0.1 * p), p, m, v)
        return p, m, v

    @jax.jit
    def step(p, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, tgt)
        p, m, v = adamw(p, g, m, v, t)
        return p, m, v, loss

    p = init(key)
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    idx = jax.random.randint(key, (B, T), 0, V)
    tgt = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, V)
    for t in range(3):
        p, m, v, loss = step(p, m, v, t + 1.0, idx, tgt)
    loss.block_until_ready()
    t0 = time.perf_counter()
    for t in range(steps):
        p, m, v, loss = step(p, m, v, t + 4.0, idx, tgt)
    loss.block_until_ready()
    return (time.perf_counter() - t0) / steps


def main():
    fw = sys.argv[1]
    L, C, H, T, B, V, steps = (int(x) for x in sys.argv[2:9])
    prec = sys.argv[9] if len(sys.argv) > 9 else "tf32"
    dt = (run_torch if fw == "torch" else run_jax)(L, C, H, T, B, V, steps, prec)
    print(f"{fw} tok/s {B * T / dt:.1f} step_ms {dt * 1e3:.2f}", flush=True)


if __name__ == "__main__":
    main()
