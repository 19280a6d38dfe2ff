"""hf_ref.py — the Python side of tests/e2e/hf_export.sh: reads an exported Hugging Face
directory with the `safetensors` package (numpy API) and config.json, checks names, shapes
and dtypes against what transformers expects for the architecture, then runs the model with a
numpy implementation written from transformers' GPT2LMHeadModel / LlamaForCausalLM /
Qwen2ForCausalLM / Qwen3ForCausalLM / GemmaForCausalLM / Phi3ForCausalLM code (Conv1D (in, out) weights,
gelu_new, LayerNorm; rotate_half RoPE with Llama 3.1's "llama3" frequency scaling, RMSNorm,
SiLU-gated MLP, GQA by repeating kv heads; Qwen2's q/k/v biases; Qwen3's RMSNorm of each
head's q and k before RoPE; Gemma's embeddings times sqrt(hidden_size), RMSNorm scaled by
1 + weight and tanh-GELU-gated MLP; Phi-3's fused qkv_proj and gate_up_proj rows) and
greedy-decodes LENGTH tokens after PROMPT_IDS.

  hf_ref.py DIR LENGTH ID [ID ...]   prints the generated ids, space-separated

Where `transformers` and `torch` import, the same is done with
AutoModelForCausalLM.from_pretrained(DIR) and the logits of both are compared (1e-4).
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file


def layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v):  # (H, T, D) each
    T, D = q.shape[1], q.shape[2]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(D)
    s = s + np.triu(np.full((T, T), -np.inf), 1)
    s = np.exp(s - s.max(-1, keepdims=True))
    return (s / s.sum(-1, keepdims=True)) @ v


def gpt2_logits(W, c, ids):
    T, C, H = len(ids), c["n_embd"], c["n_head"]
    D = C // H
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    for l in range(c["n_layer"]):
        p = "transformer.h.%d." % l
        a = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], c["layer_norm_epsilon"])
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, D).transpose(1, 0, 2) for i in range(3))
        o = attention(q, k, v).transpose(1, 0, 2).reshape(T, C)
        x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], c["layer_norm_epsilon"])
        m = gelu_new(m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"])
        x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], c["layer_norm_epsilon"])
    return x @ W["transformer.wte.weight"].T


def inv_freq(c, D):  # transformers' rope init: "default", or "llama3" (Llama 3.1's scaling)
    rp = c.get("rope_parameters") or {}
    theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
    sc = rp if rp else (c.get("rope_scaling") or {})
    inv = 1.0 / theta ** (np.arange(0, D, 2) / D)
    kind = sc.get("rope_type", sc.get("type", "default"))
    if kind == "default":
        return inv
    assert kind == "llama3", kind
    factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
    old = sc["original_max_position_embeddings"]
    wavelen = 2 * np.pi / inv
    out = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    return np.where(medium, (1 - smooth) * out / factor + smooth * out, out)


def rope(x, c):  # (H, T, D), HF rotate_half convention
    H, T, D = x.shape
    inv = inv_freq(c, D)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, -1)
    sin = np.concatenate([np.sin(ang)] * 2, -1)
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + rot * sin


def llama_logits(W, c, ids):
    T, C, H, Hkv = len(ids), c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim", C // H)
    gemma = c["model_type"] == "gemma"
    # Gemma's RMSNorm scales by 1 + weight (the file's weights start at 0); its embeddings are
    # multiplied by sqrt(hidden_size) (in the model's dtype: float32 here), not the tied head
    norm_w = (lambda w: 1.0 + w) if gemma else (lambda w: w)
    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * float(np.float32(np.sqrt(C)))
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        a = rms_norm(x, norm_w(W[p + "input_layernorm.weight"]), c["rms_norm_eps"])
        proj = {}
        for n in "qkv":
            y = a @ W[p + "self_attn.%s_proj.weight" % n].T
            if p + "self_attn.%s_proj.bias" % n in W:  # Qwen2
                y = y + W[p + "self_attn.%s_proj.bias" % n]
            y = y.reshape(T, -1, D)
            if n != "v" and p + "self_attn.%s_norm.weight" % n in W:  # Qwen3: each head's row of D
                y = rms_norm(y, W[p + "self_attn.%s_norm.weight" % n], c["rms_norm_eps"])
            proj[n] = y.transpose(1, 0, 2)
        q, k, v = proj["q"], proj["k"], proj["v"]
        assert q.shape[0] == H and k.shape[0] == Hkv
        q, k = rope(q, c), rope(k, c)
        k, v = np.repeat(k, H // Hkv, 0), np.repeat(v, H // Hkv, 0)
        o = attention(q, k, v).transpose(1, 0, 2).reshape(T, H * D)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, norm_w(W[p + "post_attention_layernorm.weight"]), c["rms_norm_eps"])
        g = m @ W[p + "mlp.gate_proj.weight"].T
        u = m @ W[p + "mlp.up_proj.weight"].T
        g = gelu_new(g) if gemma else g / (1 + np.exp(-g))  # gelu_pytorch_tanh is gelu_new's form
        x = x + (g * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, norm_w(W["model.norm.weight"]), c["rms_norm_eps"])
    head = W["model.embed_tokens.weight"] if c["tie_word_embeddings"] else W["lm_head.weight"]
    return x @ head.T


def main():
    d, length, ids = sys.argv[1], int(sys.argv[2]), [int(t) for t in sys.argv[3:]]
    c = json.load(open(d + "/config.json"))
    W = {k: v.astype(np.float64) for k, v in load_file(d + "/model.safetensors").items()}
    if c["model_type"] == "phi3":  # Phi3ForCausalLM: rows [q | k | v] and [gate | up] fused
        H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        D = c.get("head_dim", c["hidden_size"] // H)
        for k in [k for k in W if k.endswith("qkv_proj.weight")]:
            qkv = W.pop(k)
            assert qkv.shape[0] == (H + 2 * Hkv) * D, qkv.shape
            for n, a, b in (("q", 0, H * D), ("k", H * D, (H + Hkv) * D), ("v", (H + Hkv) * D, (H + 2 * Hkv) * D)):
                W[k.replace("qkv_proj", n + "_proj")] = qkv[a:b]
        for k in [k for k in W if k.endswith("gate_up_proj.weight")]:
            g, u = np.split(W.pop(k), 2)
            W[k.replace("gate_up_proj", "gate_proj")], W[k.replace("gate_up_proj", "up_proj")] = g, u
        c["head_dim"] = D
    raw = load_file(d + "/model.safetensors")
    assert all(v.dtype == np.float32 for v in raw.values())
    arch = c["architectures"][0]
    if arch == "GPT2LMHeadModel":
        C, F = c["n_embd"], c["n_inner"]
        assert W["transformer.h.0.attn.c_attn.weight"].shape == (C, 3 * C)
        assert W["transformer.h.0.mlp.c_fc.weight"].shape == (C, F)
        assert "lm_head.weight" not in W  # tied
        n_expect = 2 + 2 + 12 * c["n_layer"]
        fwd = gpt2_logits
    else:
        C, H, Hkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        D = c["head_dim"]
        assert W["model.layers.0.self_attn.k_proj.weight"].shape == (Hkv * D, C)
        assert W["model.layers.0.mlp.down_proj.weight"].shape == (C, c["intermediate_size"])
        per_layer = 9 + {"qwen2": 3, "qwen3": 2}.get(c["model_type"], 0)
        arch_of = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                   "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM"}
        assert arch == arch_of[c["model_type"]], (arch, c["model_type"])
        if c["model_type"] == "qwen3":
            assert W["model.layers.0.self_attn.q_norm.weight"].shape == (D,)
        if c["model_type"] == "qwen2":
            assert W["model.layers.0.self_attn.k_proj.bias"].shape == (Hkv * D,)
        if c["model_type"] == "gemma":
            assert c["hidden_activation"] == "gelu_pytorch_tanh", c.get("hidden_activation")
        n_expect = 1 + 1 + per_layer * c["num_hidden_layers"] + (0 if c["tie_word_embeddings"] else 1)
        fwd = llama_logits
    assert len(W) == n_expect, (len(W), n_expect, sorted(W)[:5])
    T = c.get("n_positions", c.get("max_position_embeddings"))
    out = []
    ctx = list(ids)
    for _ in range(length):
        logits = fwd(W, c, ctx[-T:])
        nxt = int(np.argmax(logits[-1]))
        out.append(nxt)
        ctx.append(nxt)
    print(" ".join(map(str, out)))
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as ex:  # noqa: BLE001
        print("transformers/torch not importable (%s): numpy reference only" % type(ex).__name__,
              file=sys.stderr)
        return
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = model(torch.tensor([ctx[-T:]])).logits[0].double().numpy()
    want = fwd(W, c, ctx[-T:])
    err = float(np.abs(got - want).max())
    assert err < 1e-4, "transformers logits differ by %g" % err
    print("transformers %s logits match within %.2g" % (arch, err), file=sys.stderr)


if __name__ == "__main__":
    main()
