#!/usr/bin/env python3
"""gpt_peer_gpu.py — the GPU peers of jdt-train's GPT-2 124M benchmark: the same model
(L=12, C=768, H=12, T=1024, V=50257; token + learned position embeddings, pre-LayerNorm blocks,
causal attention, 4x GELU(tanh) MLP, final LayerNorm, tied head, biases) trained with AdamW
(lr 6e-4, betas 0.9/0.95, weight decay 0.1 on matrices) and global-norm clipping at 1.0, on one
device, in PyTorch (torch.compile, SDPA flash attention, bf16 autocast over f32 master weights)
or JAX (jax.jit of the whole step with its state buffers donated, bf16 compute over f32 master
weights, jax.nn.dot_product_attention through cuDNN's fused attention where it compiles).

JAX's dot_product_attention picks XLA's attention when no implementation is named (jax 0.10's
source: "defaults to XLA for now"), which stores the (B, H, T, T) scores; a JAX user on a GPU
names cuDNN (MaxText's GPU attention is cuDNN's too). --jax-attention auto (the default) tries
cuDNN at the run's shape, forward and backward, and falls back to XLA's when it does not compile
(the CPU, f32, an old cuDNN); the JSON line's "attention" says which ran.

Prints one JSON line:
  {"framework", "device", "dtype", "batch", "seq_len", "steps", "tokens_per_s", "step_ms",
   "mfu", "peak_mem", "loss", "attention"}
attention: torch "sdpa" (PyTorch chooses its kernel) or "math" (no SDPA); jax "cudnn" or "xla".
mfu = model FLOP/s / peak: 989e12 (H100/H200 dense bf16) or 494e12 (dense TF32) for --dtype f32;
model FLOPs per token = 6 * (parameters without the position table) + 12 * L * C * T (the
llm.c / PaLM convention: causal masking not discounted). peak_mem: bytes (CUDA: peak allocated
by the framework; CPU: peak RSS). Warm-up steps (compilation) are not timed.

Usage: gpt_peer_gpu.py --framework torch|jax [--batch B] [--steps N] [--warmup W]
                       [--dtype bf16|f32] [--device cuda|cpu] [--tiny] [--no-compile]
                       [--jax-attention auto|cudnn|xla]
--tiny shrinks the model (L=2, C=64, H=4, T=32, V=512) for a smoke test; --device cpu runs on
the CPU (torch 1.13 has no torch.compile or SDPA: both are then skipped).
"""
import argparse
import functools
import json
import math
import os
import resource
import sys
import time

PEAK = {"bf16": 989e12, "f32": 494e12}


def model_shape(tiny):
    if tiny:
        return dict(L=2, C=64, H=4, T=32, V=512)
    return dict(L=12, C=768, H=12, T=1024, V=50257)


def flops_per_token(L, C, T, V, **_):
    # parameters that cost FLOPs: wte (tied head) + blocks + final LN (wpe is a lookup)
    per_block = 12 * C * C + 13 * C  # qkv, o, fc, proj weights + biases + two LNs
    n = V * C + L * per_block + 2 * C
    return 6 * n + 12 * L * C * T


def tokens(B, T, V, seed=0):
    """Deterministic pseudo-random tokens (inputs, targets) as nested lists of ints."""
    x, s = [], seed * 2654435761 + 1
    for _ in range(B * (T + 1)):
        s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        x.append((s >> 33) % V)
    rows = [x[i * (T + 1):(i + 1) * (T + 1)] for i in range(B)]
    return [r[:-1] for r in rows], [r[1:] for r in rows]


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- PyTorch ------------------------------------------------------------------------------

def run_torch(a, shape):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, C, H, T, V = (shape[k] for k in "LCHTV")
    B = a.batch
    dev = torch.device(a.device)
    torch.manual_seed(0)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.o = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                att = sdpa(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
                att = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.o(att.transpose(1, 2).reshape(B, T, C))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, idx, tgt):
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))

    model = GPT().to(dev)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        opt = torch.optim.AdamW(groups, fused=dev.type == "cuda", **kw)
    except TypeError:  # torch without fused AdamW
        opt = torch.optim.AdamW(groups, **kw)

    compiled = model
    if dev.type == "cuda" and not a.no_compile and hasattr(torch, "compile"):
        compiled = torch.compile(model)
    use_bf16 = a.dtype == "bf16"

    def step(idx, tgt):
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            loss = compiled(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    xi, yi = tokens(B, T, V)
    idx = torch.tensor(xi, dtype=torch.long, device=dev)
    tgt = torch.tensor(yi, dtype=torch.long, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step(idx, tgt)
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step(idx, tgt)
    sync()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else peak_rss_bytes()
    return dt, peak, float(loss.item()), "sdpa" if sdpa is not None else "math"


# ---- JAX ----------------------------------------------------------------------------------

def run_jax(a, shape):
    if a.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    L, C, H, T, V = (shape[k] for k in "LCHTV")
    B, D = a.batch, shape["C"] // shape["H"]
    cdt = jnp.bfloat16 if a.dtype == "bf16" else jnp.float32
    if a.dtype == "f32":
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    dev = jax.devices(a.device if a.device != "cuda" else "gpu")[0]

    def init(key):
        ks = iter(jax.random.split(key, 4 + 4 * L))
        n = lambda shp: 0.02 * jax.random.normal(next(ks), shp, jnp.float32)
        z, o = (lambda s: jnp.zeros(s, jnp.float32)), (lambda s: jnp.ones(s, jnp.float32))
        blocks = [dict(ln1_w=o(C), ln1_b=z(C), qkv_w=n((C, 3 * C)), qkv_b=z(3 * C),
                       o_w=n((C, C)), o_b=z(C), ln2_w=o(C), ln2_b=z(C),
                       fc_w=n((C, 4 * C)), fc_b=z(4 * C), proj_w=n((4 * C, C)), proj_b=z(C))
                  for _ in range(L)]
        return dict(wte=n((V, C)), wpe=n((T, C)), blocks=blocks, lnf_w=o(C), lnf_b=z(C))

    def ln(x, w, b):
        x32 = x.astype(jnp.float32)
        mu = x32.mean(-1, keepdims=True)
        var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
        return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5) * w + b).astype(cdt)

    dpa = getattr(jax.nn, "dot_product_attention", None)
    impl = jax_attention_impl(a, jax, jnp, dpa, dev, (B, T, H, D), cdt)

    def attention(q, k, v):  # (B, T, H, D)
        if impl is not None:
            return dpa(q, k, v, is_causal=True, implementation=impl)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / math.sqrt(D)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1).astype(cdt), v)

    def loss_fn(p, idx, tgt):
        c = jax.tree_util.tree_map(lambda t: t.astype(cdt), p)
        x = c["wte"][idx] + c["wpe"][None]
        for blk in c["blocks"]:
            h = ln(x, blk["ln1_w"], blk["ln1_b"]) @ blk["qkv_w"] + blk["qkv_b"]
            q, k, v = (t.reshape(B, T, H, D) for t in jnp.split(h, 3, axis=-1))
            x = x + attention(q, k, v).reshape(B, T, C) @ blk["o_w"] + blk["o_b"]
            h = jax.nn.gelu(ln(x, blk["ln2_w"], blk["ln2_b"]) @ blk["fc_w"] + blk["fc_b"],
                            approximate=True)
            x = x + h @ blk["proj_w"] + blk["proj_b"]
        logits = (ln(x, c["lnf_w"], c["lnf_b"]) @ c["wte"].T).astype(jnp.float32)
        lp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(lp, tgt[..., None], -1).mean()

    b1, b2, lr, wd, eps = 0.9, 0.95, 6e-4, 0.1, 1e-8

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(p, m, v, t, idx, tgt):
        loss, g = jax.value_and_grad(loss_fn)(p, idx, tgt)
        gn = jnp.sqrt(sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g)))
        g = jax.tree_util.tree_map(lambda x: x * jnp.minimum(1.0, 1.0 / (gn + 1e-6)), g)
        m = jax.tree_util.tree_map(lambda a_, x: b1 * a_ + (1 - b1) * x, m, g)
        v = jax.tree_util.tree_map(lambda a_, x: b2 * a_ + (1 - b2) * x * x, v, g)
        t = t + 1
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def upd(w, mm, vv):
            dec = wd if w.ndim == 2 else 0.0
            return w - lr * (mm / c1 / (jnp.sqrt(vv / c2) + eps) + dec * w)

        return jax.tree_util.tree_map(upd, p, m, v), m, v, t, loss

    with jax.default_device(dev):
        p = init(jax.random.PRNGKey(0))
        m = jax.tree_util.tree_map(jnp.zeros_like, p)
        v = jax.tree_util.tree_map(jnp.zeros_like, p)
        t = jnp.zeros((), jnp.float32)
        xi, yi = tokens(B, T, V)
        idx, tgt = jnp.array(xi, jnp.int32), jnp.array(yi, jnp.int32)
        for _ in range(a.warmup):
            p, m, v, t, loss = step(p, m, v, t, idx, tgt)
        loss.block_until_ready()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            p, m, v, t, loss = step(p, m, v, t, idx, tgt)
        loss.block_until_ready()
        dt = time.perf_counter() - t0
    peak = peak_rss_bytes()
    stats = getattr(dev, "memory_stats", lambda: None)()
    if stats and "peak_bytes_in_use" in stats:
        peak = stats["peak_bytes_in_use"]
    return dt, peak, float(loss), impl or "math"


def jax_attention_impl(a, jax, jnp, dpa, dev, bthd, cdt):
    """The implementation the JAX peer names to dot_product_attention: "cudnn" where its forward
    and backward compile and run at the shape bthd (B, T, H, D) on dev (--jax-attention auto or
    cudnn), else "xla"; None without dot_product_attention (a jax older than 0.4.31: the
    attention is then written out). --jax-attention cudnn fails the run where cuDNN's does not
    compile."""
    if dpa is None:
        return None
    if a.jax_attention == "xla" or (a.jax_attention == "auto" and
                                    (a.device != "cuda" or cdt != jnp.bfloat16)):
        return "xla"
    try:
        with jax.default_device(dev):
            q = jnp.zeros(bthd, cdt)

            def f(q, k, v):
                return dpa(q, k, v, is_causal=True, implementation="cudnn").astype(
                    jnp.float32).sum()

            jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, q, q)[0].block_until_ready()
        return "cudnn"
    except Exception as exc:  # noqa: BLE001 - any failure means XLA's attention runs instead
        if a.jax_attention == "cudnn":
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"gpt_peer_gpu.py: jax: cuDNN attention unavailable ({first[:200]}); XLA's runs",
              file=sys.stderr)
        return "xla"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--framework", choices=["torch", "jax"], required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="PyTorch: eager (no torch.compile)")
    ap.add_argument("--jax-attention", choices=["auto", "cudnn", "xla"], default="auto",
                    help="JAX: dot_product_attention's implementation (auto: cuDNN where it "
                         "compiles on a GPU in bf16, else XLA)")
    a = ap.parse_args()
    if a.batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--batch and --steps must be >= 1, --warmup >= 0")
    shape = model_shape(a.tiny)
    run = run_torch if a.framework == "torch" else run_jax
    try:
        dt, peak, loss, attn = run(a, shape)
    except ImportError as exc:
        print(f"gpt_peer_gpu.py: {a.framework} is not importable: {exc}", file=sys.stderr)
        return 1
    tok = a.batch * shape["T"] * a.steps / dt
    mfu = tok * flops_per_token(**shape) / PEAK[a.dtype]
    print(json.dumps(dict(framework=a.framework, device=a.device, dtype=a.dtype, batch=a.batch,
                          seq_len=shape["T"], steps=a.steps, tokens_per_s=round(tok, 1),
                          step_ms=round(1000 * dt / a.steps, 3), mfu=round(mfu, 4),
                          peak_mem=int(peak), loss=round(loss, 4), attention=attn)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
