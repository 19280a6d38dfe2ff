#!/usr/bin/env python3
"""gpt_peer.py — the peers of jdt-train's GPT training benchmark: the same GPT-2 style model
(token + learned position embeddings, pre-LayerNorm blocks, causal attention, 4x GELU MLP,
final LayerNorm, tied head, biases) trained with AdamW and global-norm clipping, in PyTorch
(eager, CPU) or JAX (jax.jit of the whole step, CPU). Prints one line:
    <framework> tok/s <float> step_ms <float>
Usage: gpt_peer.py torch|jax L C H T B V STEPS THREADS
BF16=1 (torch only): the forward runs under torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's
CPU mixed precision (bf16 GEMMs, f32 master weights and optimizer), the peer of jdt-train's
precision.compute: bf16.
"""
import math
import os
import sys
import time


def torch_gpt(L, C, H, T, V):
    """The PyTorch model (also used by mesh_peer.py): returns GPT() whose forward(idx, tgt)
    takes (b, T) token ids and targets for any batch b and returns the mean loss."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
                a = s.softmax(-1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(B, T, C))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        block_class = Block

        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            # GPT-2's initialisation, as jdt-train's and the JAX model's: weights N(0, 0.02),
            # biases 0. PyTorch's defaults (N(0, 1) embeddings, tied to the head) start from
            # logits of std ~sqrt(C) and a loss of hundreds at V = 50304; the run then diverges,
            # and its softmax's denormals slowed the step ~10x (mesh.sh, session 57)
            for mod in self.modules():
                if isinstance(mod, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(mod.weight, 0.0, 0.02)
                if isinstance(mod, nn.Linear) and mod.bias is not None:
                    nn.init.zeros_(mod.bias)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(T))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, V), tgt.view(-1))

    return GPT()


def run_torch(L, C, H, T, B, V, steps, threads):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_gpt(L, C, H, T, V)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(steps):
        x = torch.randint(0, V, (B, T), generator=g)
        y = torch.randint(0, V, (B, T), generator=g)
        t0 = time.perf_counter()
        if os.environ.get("BF16") == "1":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def run_jax(L, C, H, T, B, V, steps, threads):
    import jax
    import jax.numpy as jnp

    D = C // H
    key = jax.random.PRNGKey(0)
    ks = iter(jax.random.split(key, 8 * L + 4))

    def nrm(shape, std=0.02):
        return std * jax.random.normal(next(ks), shape, jnp.float32)

    params = {"wte": nrm((V, C)), "wpe": nrm((T, C)), "lnf_w": jnp.ones(C), "lnf_b": jnp.zeros(C), "blocks": []}
    for _ in range(L):
        params["blocks"].append({
            "ln1_w": jnp.ones(C), "ln1_b": jnp.zeros(C), "ln2_w": jnp.ones(C), "ln2_b": jnp.zeros(C),
            "qkv_w": nrm((C, 3 * C)), "qkv_b": jnp.zeros(3 * C), "o_w": nrm((C, C)), "o_b": jnp.zeros(C),
            "fc_w": nrm((C, 4 * C)), "fc_b": jnp.zeros(4 * C), "proj_w": nrm((4 * C, C)), "proj_b": jnp.zeros(C)})

    def ln(x, w, b):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + 1e-5) * w + b

    mask = jnp.tril(jnp.ones((T, T), bool))

    def loss_fn(p, idx, tgt):
        x = p["wte"][idx] + p["wpe"][None]
        for b in p["blocks"]:
            qkv = ln(x, b["ln1_w"], b["ln1_b"]) @ b["qkv_w"] + b["qkv_b"]
            q, k, v = (t.reshape(B, T, H, D).transpose(0, 2, 1, 3) for t in jnp.split(qkv, 3, -1))
            s = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(D), -jnp.inf)
            a = jax.nn.softmax(s, -1) @ v
            x = x + a.transpose(0, 2, 1, 3).reshape(B, T, C) @ b["o_w"] + b["o_b"]
            h = jax.nn.gelu(ln(x, b["ln2_w"], b["ln2_b"]) @ b["fc_w"] + b["fc_b"], approximate=True)
            x = x + h @ b["proj_w"] + b["proj_b"]
        logits = ln(x, p["lnf_w"], p["lnf_b"]) @ p["wte"].T
        lp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(lp, tgt[..., None], -1).mean()

    def decays(path):
        return path[-1].key.endswith("_w") and not path[-1].key.startswith("ln")

    @jax.jit
    def step(p, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, tgt)
        norm = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        scale = jnp.minimum(1.0, 1.0 / (norm + 1e-6))
        g = jax.tree_util.tree_map(lambda x: x * scale, g)
        m = jax.tree_util.tree_map(lambda a, b: 0.9 * a + 0.1 * b, m, g)
        v = jax.tree_util.tree_map(lambda a, b: 0.95 * a + 0.05 * b * b, v, g)
        bc1, bc2 = 1 / (1 - 0.9 ** t), 1 / (1 - 0.95 ** t)

        def upd(path, pp, mm, vv):
            u = mm * bc1 / (jnp.sqrt(vv * bc2) + 1e-8)
            if decays(path):
                u = u + 0.1 * pp
            return pp - 1e-3 * u
        p = jax.tree_util.tree_map_with_path(upd, p, m, v)
        return p, m, v, loss

    m = jax.tree_util.tree_map(jnp.zeros_like, params)
    v = jax.tree_util.tree_map(jnp.zeros_like, params)
    rk = jax.random.PRNGKey(1)
    times = []
    for t in range(1, steps + 1):
        rk, k1, k2 = jax.random.split(rk, 3)
        idx = jax.random.randint(k1, (B, T), 0, V)
        tgt = jax.random.randint(k2, (B, T), 0, V)
        t0 = time.perf_counter()
        params, m, v, loss = step(params, m, v, float(t), idx, tgt)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    return times


def main():
    fw = sys.argv[1]
    L, C, H, T, B, V, steps, threads = (int(a) for a in sys.argv[2:10])
    times = (run_torch if fw == "torch" else run_jax)(L, C, H, T, B, V, steps, threads)
    warm = times[min(2, len(times) - 1):]  # drop compile/warm-up steps
    warm.sort()
    med = warm[len(warm) // 2]
    print(f"{fw} tok/s {B * T / med:.1f} step_ms {med * 1e3:.1f}")


if __name__ == "__main__":
    main()
