#!/usr/bin/env bash
# hf_export.sh — end to end: `jdt-train export CKPT --format hf OUT_DIR` for a GPT-2-style gpt
# (GPT2LMHeadModel), a Llama-style one (rmsnorm + rope + swiglu, GQA, untied head:
# LlamaForCausalLM), a Qwen2-style one (q/k/v biases), a Qwen3-style one (q/k norm, a head
# width apart from n_embd / n_head) and a Gemma-style one (GeGLU, embeddings times sqrt(n_embd),
# norm weights stored less one, one key/value head of 32 in a width of 64). The `safetensors` package (numpy API) reads model.safetensors; an
# independent numpy implementation of transformers' two models (tests/e2e/hf_ref.py) greedy-
# decodes from the exported files and must produce exactly the tokens `jdt-train sample
# --temperature 0 --context window` produces from the checkpoint (40 tokens, past the 32-token
# window: an exact sliding window on both sides); where
# transformers + torch import, hf_ref.py also compares logits within 1e-4. A BPE run exports
# its tokenizer.json. Bad input: a model that maps to neither, an unknown --format, a missing
# checkpoint each give one line and the right exit code.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:-$PWD}
BUILD=$(cd "$(dirname "$BIN")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" | tail -n 20; fail "'$*' exited $rc, expected $want"; }; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
. "$ROOT/tests/infra/lib.sh"
infra_pyvenv "$BUILD" "$TMP" # sets PY
O="run.out_dir=$TMP/runs"

check_model() { # name, overrides...
  local name=$1; shift
  expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name="$name" run.steps=2 run.eval_every=0 model.init_std=0.3 "$@"
  expect 0 "$BIN" export "$TMP/runs/$name/ckpt" --format hf "$TMP/hf_$name"
  grep -q "exported" "$TMP/out" || fail "$name: no export line"
  # --context window: past seq_len every token sees exactly the last 32 tokens, as hf_ref.py does
  expect 0 "$BIN" sample "$TMP/runs/$name/ckpt" --prompt "ab" --length 40 --temperature 0 --context window
  local ours; ours=$(head -c 42 "$TMP/out" | od -An -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  "$PY" "$ROOT/tests/e2e/hf_ref.py" "$TMP/hf_$name" 40 97 98 >"$TMP/ref" 2>"$TMP/referr" ||
    { cat "$TMP/referr"; fail "$name: hf_ref.py failed"; }
  [ "97 98 $(cat "$TMP/ref")" = "$ours" ] || fail "$name: greedy tokens differ: jdt [$ours] vs HF-semantics numpy [97 98 $(cat "$TMP/ref")]"
  # sample reads the exported directory itself (its config.json makes the model): the same text
  expect 0 "$BIN" sample "$TMP/hf_$name" --prompt "ab" --length 40 --temperature 0 --context window
  [ "$(head -c 42 "$TMP/out" | od -An -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')" = "$ours" ] ||
    fail "$name: sample of the Hugging Face directory differs from sample of the checkpoint"
  echo "$name: $(grep -o '"architectures": \[[^]]*\]' "$TMP/hf_$name/config.json"), 40 greedy tokens identical; $(tail -1 "$TMP/referr")"
}
check_model gpt2
check_model llama model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu \
  model.n_kv_head=2 model.tie_embeddings=false model.rope_theta=500
check_model llama_tied model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu
Q2="model.norm=rmsnorm model.bias=false model.qkv_bias=true model.pos=rope model.activation=swiglu model.n_kv_head=2 model.mlp_dim=200"
Q3="model.norm=rmsnorm model.bias=false model.qk_norm=true model.head_dim=32 model.pos=rope model.activation=swiglu model.n_kv_head=2 model.tie_embeddings=false"
# shellcheck disable=SC2086
check_model qwen2 $Q2
# shellcheck disable=SC2086
check_model qwen3 $Q3
GM="model.norm=rmsnorm model.bias=false model.pos=rope model.activation=geglu model.embed_scale=true model.head_dim=32"
# shellcheck disable=SC2086
check_model gemma $GM model.n_kv_head=1
GM="$GM model.n_kv_head=2" # tensor=2 below splits the key/value heads
grep -q '"hidden_activation": "gelu_pytorch_tanh"' "$TMP/hf_gemma/config.json" || fail "gemma: no hidden_activation"
# Llama 3.1's RoPE scaling (rope_scaling llama3) with an original context of 28 at head size 16:
# the first pair's frequency kept, the second blended, the rest divided by 4
check_model llama31 model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu \
  model.rope_scaling=llama3 model.rope_factor=4 model.rope_original_max_pos=28
grep -q '"rope_scaling": {"rope_type": "llama3", "factor": 4,' "$TMP/hf_llama31/config.json" || fail "llama31: rope_scaling not exported"
# ... and it matters: the same weights without the scaling decode otherwise
mkdir -p "$TMP/hf_llama31_plain" && cp "$TMP/hf_llama31/model.safetensors" "$TMP/hf_llama31_plain/"
sed 's/"rope_scaling": {[^}]*}/"rope_scaling": null/' "$TMP/hf_llama31/config.json" > "$TMP/hf_llama31_plain/config.json"
"$PY" "$ROOT/tests/e2e/hf_ref.py" "$TMP/hf_llama31_plain" 40 97 98 >"$TMP/ref_plain" 2>/dev/null || fail "hf_ref.py (plain RoPE)"
"$PY" "$ROOT/tests/e2e/hf_ref.py" "$TMP/hf_llama31" 40 97 98 >"$TMP/ref" 2>/dev/null || fail "hf_ref.py (llama3 RoPE)"
cmp -s "$TMP/ref" "$TMP/ref_plain" && fail "llama31: decoding with and without the RoPE scaling agree: the check proves nothing"
# transformers 5 saves RoPE as one "rope_parameters" object (rope_theta inside, no rope_scaling):
# such a config.json samples as the transformers 4 form
mkdir -p "$TMP/hf_llama31_tf5" && cp "$TMP/hf_llama31/model.safetensors" "$TMP/hf_llama31_tf5/"
"$PY" -c "
import json
c = json.load(open('$TMP/hf_llama31/config.json'))
c['rope_parameters'] = dict(c.pop('rope_scaling'), rope_theta=c.pop('rope_theta'))
json.dump(c, open('$TMP/hf_llama31_tf5/config.json', 'w'))" || fail "transformers 5 config"
expect 0 "$BIN" sample "$TMP/hf_llama31" --prompt "ab" --length 20 --temperature 0
cp "$TMP/out" "$TMP/tf4.txt"
expect 0 "$BIN" sample "$TMP/hf_llama31_tf5" --prompt "ab" --length 20 --temperature 0
cmp -s "$TMP/out" "$TMP/tf4.txt" || fail "llama31: rope_parameters (transformers 5) samples otherwise than rope_theta + rope_scaling"
# Phi-3's files are Llama's with q, k, v rows in one qkv_proj and gate, up rows in one
# gate_up_proj: the Llama export refused into that layout samples the same tokens, and a
# tensor=2 eval (each rank's heads and MLP columns out of the fused rows) the one-process loss
PH="model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu model.n_kv_head=2 model.tie_embeddings=false model.rope_theta=500"
mkdir -p "$TMP/hf_phi3"
"$PY" - "$TMP/hf_llama" "$TMP/hf_phi3" <<'PY' || fail "phi3: fusing the llama export"
import json, sys
import numpy as np
from safetensors.numpy import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
c = json.load(open(src + "/config.json"))
c["model_type"], c["architectures"] = "phi3", ["Phi3ForCausalLM"]
json.dump(c, open(dst + "/config.json", "w"))
t, out = load_file(src + "/model.safetensors"), {}
for k, v in t.items():
    if ".self_attn.q_proj." in k:
        p = k.replace("q_proj", "%s_proj")
        out[k.replace("q_proj", "qkv_proj")] = np.concatenate([t[p % n] for n in "qkv"])
    elif ".mlp.gate_proj." in k:
        out[k.replace("gate_proj", "gate_up_proj")] = np.concatenate([v, t[k.replace("gate_proj", "up_proj")]])
    elif not any(s in k for s in (".k_proj.", ".v_proj.", ".up_proj.")):
        out[k] = v
save_file(out, dst + "/model.safetensors", metadata={"format": "pt"})
PY
"$PY" "$ROOT/tests/e2e/hf_ref.py" "$TMP/hf_phi3" 40 97 98 >"$TMP/ref" 2>"$TMP/referr" || { cat "$TMP/referr"; fail "phi3: hf_ref.py failed"; }
expect 0 "$BIN" sample "$TMP/hf_phi3" --prompt "ab" --length 40 --temperature 0 --context window
[ "$(head -c 42 "$TMP/out" | od -An -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')" = "97 98 $(cat "$TMP/ref")" ] ||
  fail "phi3: sample of the fused directory differs from hf_ref.py's decoding of it"
# shellcheck disable=SC2086
expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hf_llama" $PH
want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
# shellcheck disable=SC2086
expect 0 "$BIN" --nproc 2 eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hf_phi3" $PH mesh.tensor=2
grep -q "val loss $want " "$TMP/out" || fail "phi3: eval on tensor=2 $(cat "$TMP/out"), the Llama files on one process $want"
echo "phi3: the Llama export fused (qkv_proj, gate_up_proj) samples as hf_ref.py decodes it; val loss $want on tensor=2 as the Llama files'"
echo "llama31: rope_scaling llama3 exported and read back (also as transformers 5's rope_parameters); without it hf_ref.py decodes otherwise"
# Qwen2's q/k/v biases and Qwen3's q/k norm scales are near their init (zeros, ones) after two
# steps, where a wrong RoPE permutation of them would not show, nor Gemma's norm weights off by
# one (its file's 0 is our 1): give every vector of the export large noise (in transformers'
# layout) and check that (1) `sample` of that directory (our import) decodes as hf_ref.py does
# from it, (2) a run started from it (lr 0) exports it back bit for bit (our export is the
# inverse of our import; Gemma's norm weights within an f32 rounding of 1 + w, whose low bits
# the import's sum drops)
for name in qwen2 qwen3 gemma; do
  A=$Q2; [ $name = qwen3 ] && A=$Q3; [ $name = gemma ] && A=$GM
  mkdir -p "$TMP/hfn_$name" && cp "$TMP/hf_$name/config.json" "$TMP/hfn_$name/"
  [ $name = gemma ] && sed -i 's/"num_key_value_heads": 1/"num_key_value_heads": 2/' "$TMP/hfn_$name/config.json"
  "$PY" -c "
import numpy as np
from safetensors.numpy import load_file, save_file
t = load_file('$TMP/hf_$name/model.safetensors'); r = np.random.default_rng(7)
for k, v in t.items():
    if v.ndim == 1: t[k] = (v + r.normal(0, 0.5, v.shape)).astype(np.float32)
    if '$name' == 'gemma' and k.endswith('k_proj.weight'):  # a second key/value head
        t[k] = np.concatenate([v, r.normal(0, 0.3, v.shape).astype(np.float32)])
    if '$name' == 'gemma' and k.endswith('v_proj.weight'):
        t[k] = np.concatenate([v, v[::-1]])
save_file(t, '$TMP/hfn_$name/model.safetensors', metadata={'format': 'pt'})" || fail "$name: noising the export"
  "$PY" "$ROOT/tests/e2e/hf_ref.py" "$TMP/hfn_$name" 40 97 98 >"$TMP/ref" 2>"$TMP/referr" ||
    { cat "$TMP/referr"; fail "$name (noised): hf_ref.py failed"; }
  expect 0 "$BIN" sample "$TMP/hfn_$name" --prompt "ab" --length 40 --temperature 0 --context window
  got=$(head -c 42 "$TMP/out" | od -An -tu1 | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  [ "97 98 $(cat "$TMP/ref")" = "$got" ] || fail "$name (noised vectors): sample [$got] vs hf_ref.py [97 98 $(cat "$TMP/ref")]"
  # shellcheck disable=SC2086
  expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=rt_$name run.steps=1 run.eval_every=0 optimizer.lr=0 \
    checkpoint.resume=none checkpoint.init_from="$TMP/hfn_$name" $A
  expect 0 "$BIN" export "$TMP/runs/rt_$name/ckpt" --format hf "$TMP/hfrt_$name"
  "$PY" -c "
import numpy as np
from safetensors.numpy import load_file
a, b = load_file('$TMP/hfn_$name/model.safetensors'), load_file('$TMP/hfrt_$name/model.safetensors')
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
tol = lambda k: 5e-7 if '$name' == 'gemma' and k.endswith('norm.weight') else 0
bad = [(k, float(np.abs(a[k] - b[k]).max())) for k in a if np.abs(a[k] - b[k]).max() > tol(k)]
assert not bad, bad" || fail "$name: init_from then export did not give the same tensors back"
  # tensor parallel: each rank reads its heads' block of the permuted biases / projections
  # shellcheck disable=SC2086
  expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hfn_$name" $A
  want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
  # shellcheck disable=SC2086
  expect 0 "$BIN" --nproc 2 eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hfn_$name" $A mesh.tensor=2
  grep -q "val loss $want " "$TMP/out" || fail "$name: eval on tensor=2 $(cat "$TMP/out"), one process $want"
  echo "$name (every bias / norm scale noised): sample of the directory = hf_ref.py; init_from + export = the same tensors; val loss $want on 1 process and tensor=2"
done
# a Qwen3 directory into a Llama config: the settings that select Qwen3 are named
LL="model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu model.n_kv_head=2 model.tie_embeddings=false"
# shellcheck disable=SC2086
expect 2 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hf_qwen3" $LL
grep -q "model_type 'qwen3' but this config's gpt maps to 'llama': set model.norm=rmsnorm model.bias=false model.qk_norm=true" "$TMP/err" ||
  { cat "$TMP/err"; fail "qwen3 into llama message"; }
# shellcheck disable=SC2086
expect 2 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hf_gemma" $LL
grep -q "model_type 'gemma' but this config's gpt maps to 'llama': set model.norm=rmsnorm model.bias=false model.activation=geglu model.embed_scale=true" "$TMP/err" ||
  { cat "$TMP/err"; fail "gemma into llama message"; }
# Mistral is Llama's layout; a sliding window shorter than the run's context is refused
mkdir -p "$TMP/hf_mistral" && cp "$TMP/hf_llama/model.safetensors" "$TMP/hf_mistral/"
sed 's/"model_type": "llama"/"model_type": "mistral", "sliding_window": 16/' "$TMP/hf_llama/config.json" > "$TMP/hf_mistral/config.json"
# shellcheck disable=SC2086
expect 2 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hf_mistral" $LL model.rope_theta=500
grep -q "sliding_window is 16, below this config's model.seq_len 32" "$TMP/err" || { cat "$TMP/err"; fail "mistral window message"; }
sed -i 's/"sliding_window": 16/"sliding_window": null/' "$TMP/hf_mistral/config.json"
# shellcheck disable=SC2086
expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=mistral run.steps=1 run.eval_every=0 checkpoint.resume=none \
  checkpoint.init_from="$TMP/hf_mistral" $LL model.rope_theta=500
echo "model_type checks: qwen3 and gemma into a llama config named; mistral read as llama, a short sliding window refused"

# a BPE run exports its tokenizer, and tokenizers loads it
head -c 300000 /usr/share/games/fortunes/fortunes > "$TMP/small.txt"
cat > "$TMP/bpe.yaml" <<YAML
base_config: $ROOT/configs/tiny.yaml
model: {vocab_size: 300}
data: {format: tokens, source: $TMP/small.txt, train_path: $TMP/bpedata, val_path: $TMP/bpedata, tokenizer: bpe}
run: {out_dir: $TMP/runs, name: bpe, steps: 2, eval_every: 0}
YAML
expect 0 "$BIN" prepare "$TMP/bpe.yaml"
expect 0 "$BIN" "$TMP/bpe.yaml"
expect 0 "$BIN" export "$TMP/runs/bpe/ckpt" --format hf "$TMP/hf_bpe"
cmp -s "$TMP/bpedata/tokenizer.json" "$TMP/hf_bpe/tokenizer.json" || fail "tokenizer.json not exported"
"$PY" -c "
import json, sys
from tokenizers import Tokenizer
t = Tokenizer.from_file('$TMP/hf_bpe/tokenizer.json')
c = json.load(open('$TMP/hf_bpe/config.json'))
assert c['eos_token_id'] == t.token_to_id('<|endoftext|>') == 299, c
assert t.decode(t.encode('Hello world').ids) == 'Hello world'
" || fail "exported tokenizer"
echo "bpe: tokenizer.json exported, ids agree with config.json"
expect 0 "$BIN" sample "$TMP/runs/bpe/ckpt" --prompt "The " --length 12 --temperature 0
cp "$TMP/out" "$TMP/bpe_ckpt.txt"
expect 0 "$BIN" sample "$TMP/hf_bpe" --prompt "The " --length 12 --temperature 0
cmp -s "$TMP/out" "$TMP/bpe_ckpt.txt" || fail "bpe: sample of the Hugging Face directory differs from the checkpoint's"
# a tokenizer whose post-processor puts a special token before every text (Llama 3's
# <|begin_of_text|>: a TemplateProcessing inside a Sequence) gets it before every prompt, as
# transformers' tokenizer(prompt) does: the same text as the token written into the prompt
mkdir -p "$TMP/hf_tp" && cp "$TMP/hf_bpe/model.safetensors" "$TMP/hf_bpe/config.json" "$TMP/hf_tp/"
"$PY" -c "
import json
from tokenizers import Tokenizer
t = json.load(open('$TMP/hf_bpe/tokenizer.json'))
a, b = {'Sequence': {'id': 'A', 'type_id': 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}
eot = {'SpecialToken': {'id': '<|endoftext|>', 'type_id': 0}}
t['post_processor'] = {'type': 'Sequence', 'processors': [t['post_processor'], {'type': 'TemplateProcessing',
  'single': [eot, a], 'pair': [eot, a, b],
  'special_tokens': {'<|endoftext|>': {'id': '<|endoftext|>', 'ids': [299], 'tokens': ['<|endoftext|>']}}}]}
json.dump(t, open('$TMP/hf_tp/tokenizer.json', 'w'))
assert Tokenizer.from_file('$TMP/hf_tp/tokenizer.json').encode('The ').ids[0] == 299" || fail "template tokenizer"
expect 0 "$BIN" sample "$TMP/hf_tp" --prompt "The " --length 12 --temperature 0
tail -c +5 "$TMP/out" > "$TMP/tp.txt"
expect 0 "$BIN" sample "$TMP/hf_bpe" --prompt "<|endoftext|>The " --length 12 --temperature 0
tail -c +18 "$TMP/out" | cmp -s - "$TMP/tp.txt" || fail "template prefix: [$(cat "$TMP/tp.txt")] vs [$(cat "$TMP/out")]"
cmp -s "$TMP/tp.txt" <(tail -c +5 "$TMP/bpe_ckpt.txt") && fail "template prefix: the same text as without it: the check proves nothing"
# no prompt: the leading token alone (here <|endoftext|>, where a tokenizer without a template
# starts from <|endoftext|> too: the same text), not the token and then the no-prompt start
expect 0 "$BIN" sample "$TMP/hf_tp" --length 12 --temperature 0
cp "$TMP/out" "$TMP/tp0.txt"
expect 0 "$BIN" sample "$TMP/hf_bpe" --length 12 --temperature 0
cmp -s "$TMP/out" "$TMP/tp0.txt" || fail "template prefix, no prompt: [$(cat "$TMP/tp0.txt")] vs [$(cat "$TMP/out")]"
echo "sample HF_DIR: a post-processor's leading special token is put before the prompt (alone without one)"
# a directory without a tokenizer cannot turn a prompt into ids: said in one line
mkdir -p "$TMP/hf_notok" && cp "$TMP/hf_bpe/model.safetensors" "$TMP/hf_bpe/config.json" "$TMP/hf_notok/"
expect 1 "$BIN" sample "$TMP/hf_notok" --prompt "x"
grep -q "no tokenizer.json beside the model" "$TMP/err" || fail "no-tokenizer message: $(cat "$TMP/err")"
echo "sample HF_DIR: the same text as sample of the checkpoint (byte and BPE runs, GPT-2 and Llama)"
# a Hugging Face model's end-of-sequence ids end a sample (Llama 3 Instruct lists <|eot_id|> in
# generation_config.json's eos_token_id): the 7th generated byte of hf_gpt2's greedy text as one
mkdir -p "$TMP/hf_eos" && cp "$TMP/hf_gpt2/model.safetensors" "$TMP/hf_gpt2/config.json" "$TMP/hf_eos/"
expect 0 "$BIN" sample "$TMP/hf_gpt2" --prompt "ab" --length 40 --temperature 0
read -r -a full <<<"$(od -An -tu1 "$TMP/out" | tr -s ' \n' ' ')"
stop=${full[8]}; want=("${full[@]:0:2}"); for b in "${full[@]:2:40}"; do [ "$b" = "$stop" ] && break; want+=("$b"); done
echo "{\"eos_token_id\": [255, $stop]}" > "$TMP/hf_eos/generation_config.json"
expect 0 "$BIN" sample "$TMP/hf_eos" --prompt "ab" --length 40 --temperature 0
got=$(od -An -tu1 "$TMP/out" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
[ "$got" = "${want[*]} 10" ] || fail "eos_token_id $stop: [$got], expected [${want[*]} 10]"
echo "sample HF_DIR: generation_config.json's eos_token_id ends the text (${#want[@]} of 42 bytes)"

# checkpoint.init_from: a run started from the export (or from the jdt checkpoint) continues at
# the same loss: with lr 0 for one step its val loss equals the source's to 4 decimals
for arch in gpt2 llama; do
  A=""; [ $arch = llama ] && A=$LL
  # shellcheck disable=SC2086
  expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=src_$arch run.steps=30 run.eval_every=0 $A
  expect 0 "$BIN" export "$TMP/runs/src_$arch/ckpt" --format hf "$TMP/hfsrc_$arch"
  expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=src_$arch $A
  want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
  # the same weights as written by the safetensors package itself (its own header layout)
  mkdir -p "$TMP/hfpy_$arch" && cp "$TMP/hfsrc_$arch/config.json" "$TMP/hfpy_$arch/"
  "$PY" -c "from safetensors.numpy import load_file, save_file
save_file(dict(reversed(list(load_file('$TMP/hfsrc_$arch/model.safetensors').items()))), '$TMP/hfpy_$arch/model.safetensors', metadata={'format': 'np'})" ||
    fail "safetensors re-save"
  for from in "$TMP/hfsrc_$arch" "$TMP/hfpy_$arch" "$TMP/runs/src_$arch/ckpt"; do
    expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=ft_$arch run.steps=1 run.eval_every=0 \
      optimizer.lr=0 checkpoint.resume=none checkpoint.init_from="$from" $A
    grep -q "initialised params from" "$TMP/err" || fail "no init_from line"
    expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=ft_$arch $A
    got=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
    [ "$got" = "$want" ] || fail "$arch init_from $from: val loss $got, source $want"
    rm -rf "$TMP/runs/ft_$arch"
  done
  expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=fresh_$arch run.steps=1 run.eval_every=0 optimizer.lr=0 $A
  expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=fresh_$arch $A
  fresh=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
  [ "$fresh" != "$want" ] || fail "a fresh model has the trained model's loss: the check proves nothing"
  echo "init_from ($arch): export, its safetensors-package copy and the checkpoint all continue at val loss $want (fresh model: $fresh)"
done
# the hub's gpt2 as downloaded: tensors saved from GPT2Model (no "transformer." prefix), the
# attention-mask buffers beside them, no n_inner in config.json (transformers: 4 * n_embd), and
# n_positions (64) above this run's seq_len (32): the run takes the first 32 rows of wpe
mkdir -p "$TMP/hub_gpt2"
"$PY" -c "
import json, numpy as np
from safetensors.numpy import load_file, save_file
t = {k.removeprefix('transformer.'): v for k, v in load_file('$TMP/hfsrc_gpt2/model.safetensors').items()}
t['wpe.weight'] = np.concatenate([t['wpe.weight'], np.full((32, t['wpe.weight'].shape[1]), 9, np.float32)])
for l in range(2): t[f'h.{l}.attn.bias'] = np.tril(np.ones((1, 1, 64, 64), np.float32))
save_file(t, '$TMP/hub_gpt2/model.safetensors', metadata={'format': 'pt'})
c = json.load(open('$TMP/hfsrc_gpt2/config.json'))
del c['n_inner']; c['n_positions'] = c['n_ctx'] = 64
json.dump(c, open('$TMP/hub_gpt2/config.json', 'w'))" || fail "hub-style copy"
want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' <("$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=src_gpt2 2>/dev/null))
expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=ft_hub run.steps=1 run.eval_every=0 optimizer.lr=0 \
  checkpoint.resume=none checkpoint.init_from="$TMP/hub_gpt2"
expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=ft_hub
got=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
[ -n "$want" ] && [ "$got" = "$want" ] || fail "init_from a hub-layout gpt2: val loss $got, source $want"
echo "init_from (hub-layout gpt2: no prefix, no n_inner, n_positions 64 > seq_len 32): val loss $got as the source"
# under a sharded mesh each rank reads its block: FSDP and tensor parallel, from Hugging Face
# files (GPT-2, and the GQA Llama whose RoPE rows are permuted) and from a jdt checkpoint
for spec in "gpt2:$TMP/hub_gpt2:mesh.fsdp=2" "gpt2:$TMP/runs/src_gpt2/ckpt:mesh.tensor=2" \
            "llama:$TMP/hfsrc_llama:mesh.tensor=2" "llama:$TMP/hfsrc_llama:mesh.fsdp=2"; do
  IFS=: read -r arch from mesh <<<"$spec"
  A=""; [ "$arch" = llama ] && A=$LL
  want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' <("$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=src_$arch $A 2>/dev/null))
  rm -rf "$TMP/runs/ft_mesh"
  # shellcheck disable=SC2086
  expect 0 "$BIN" --nproc 2 "$ROOT/configs/tiny.yaml" "$O" run.name=ft_mesh run.steps=1 run.eval_every=0 \
    optimizer.lr=0 checkpoint.resume=none checkpoint.init_from="$from" "$mesh" $A
  expect 0 "$BIN" eval "$TMP/runs/ft_mesh/ckpt"
  got=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' "$TMP/out")
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "init_from $from under $mesh: val loss $got, source $want"
done
echo "init_from under fsdp=2 and tensor=2 (GPT-2 and GQA Llama files, a jdt checkpoint): the source's val loss"
# eval of a Hugging Face model under a config (GPT-2's own loss on this data), on 1 and 2 ranks
want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' <("$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=src_gpt2 2>/dev/null))
expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hub_gpt2"
grep -q "^val loss $want " "$TMP/out" || fail "eval --ckpt of a Hugging Face model: $(cat "$TMP/out"), source $want"
expect 0 "$BIN" --nproc 2 eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hub_gpt2" mesh.fsdp=2
grep -q "val loss $want " "$TMP/out" || fail "eval --ckpt of a Hugging Face model on fsdp=2: $(cat "$TMP/out"), source $want"
expect 1 "$BIN" eval "$TMP/hub_gpt2"
grep -q "is a Hugging Face model, which stores no jdt config" "$TMP/err" || fail "eval HF_DIR message: $(cat "$TMP/err")"
echo "eval CONFIG --ckpt HF_DIR: val loss $want on 1 process and on fsdp=2"

expect 2 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hfsrc_gpt2" model.n_layer=3
[ "$(grep -c "error" "$TMP/err")" -eq 1 ] && grep -q "n_layer is 2 but this config's model.n_layer is 3" "$TMP/err" ||
  { cat "$TMP/err"; fail "init_from mismatch message"; }
# a Llama whose head is tied in config.json, into an untied config: named, not "no tensor lm_head"
sed 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' "$TMP/hfsrc_llama/config.json" > "$TMP/tied.json"
mkdir -p "$TMP/hf_tied" && cp "$TMP/hfsrc_llama/model.safetensors" "$TMP/hf_tied/" && mv "$TMP/tied.json" "$TMP/hf_tied/config.json"
# shellcheck disable=SC2086
expect 2 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hf_tied" $LL
grep -q "tie_word_embeddings is true but this config's model.tie_embeddings is false" "$TMP/err" ||
  { cat "$TMP/err"; fail "tied-head mismatch message"; }
# a RoPE base that differs is the user's choice (context extension): warned, the run goes on
# shellcheck disable=SC2086
expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=theta run.steps=1 run.eval_every=0 checkpoint.resume=none \
  checkpoint.init_from="$TMP/hfsrc_llama" $LL model.rope_theta=20000
grep -q "rope_theta is 10000, this config's model.rope_theta 20000" "$TMP/err" || { cat "$TMP/err"; fail "rope_theta warning"; }
# weights sharded over several files (model.safetensors.index.json, as transformers saves
# large models): the GQA Llama split in two files loads to the same val loss and samples alike
mkdir -p "$TMP/hf_sharded" && cp "$TMP/hfsrc_llama/config.json" "$TMP/hf_sharded/"
"$PY" -c "
import json
from safetensors.numpy import load_file, save_file
t = load_file('$TMP/hfsrc_llama/model.safetensors'); names = sorted(t)
parts = {'model-00001-of-00002.safetensors': names[::2], 'model-00002-of-00002.safetensors': names[1::2]}
for f, ns in parts.items(): save_file({n: t[n] for n in ns}, '$TMP/hf_sharded/' + f, metadata={'format': 'pt'})
json.dump({'metadata': {}, 'weight_map': {n: f for f, ns in parts.items() for n in ns}},
          open('$TMP/hf_sharded/model.safetensors.index.json', 'w'))" || fail "sharding the export"
want=$(sed -nE 's/^val loss ([0-9.]+).*/\1/p' <("$BIN" eval "$ROOT/configs/tiny.yaml" "$O" run.name=src_llama $LL 2>/dev/null))
# shellcheck disable=SC2086
expect 0 "$BIN" eval "$ROOT/configs/tiny.yaml" "$O" --ckpt "$TMP/hf_sharded" $LL
grep -q "^val loss $want " "$TMP/out" || fail "sharded weights: $(cat "$TMP/out"), source $want"
expect 0 "$BIN" sample "$TMP/hfsrc_llama" --prompt "ab" --length 20 --temperature 0
cp "$TMP/out" "$TMP/one_file.txt"
expect 0 "$BIN" sample "$TMP/hf_sharded" --prompt "ab" --length 20 --temperature 0
cmp -s "$TMP/out" "$TMP/one_file.txt" || fail "sharded weights sample differently"
echo "weights in two files with an index: val loss $want and the same samples as one file"
echo '{}' > "$TMP/hf_sharded/model.safetensors.index.json"
# shellcheck disable=SC2086
expect 1 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/hf_sharded" $LL
grep -q 'model.safetensors.index.json: no "weight_map" object' "$TMP/err" || { cat "$TMP/err"; fail "bad index message"; }
expect 1 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=bad run.steps=1 checkpoint.init_from="$TMP/nothing"
[ "$(grep -c "error" "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "init_from missing: not one line"; }

# bad input
expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name=relu run.steps=1 run.eval_every=0 model.activation=relu
expect 1 "$BIN" export "$TMP/runs/relu/ckpt" --format hf "$TMP/hf_relu"
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "model.activation must be gelu" "$TMP/err" || { cat "$TMP/err"; fail "unmappable model message"; }
expect 2 "$BIN" export "$TMP/runs/gpt2/ckpt" --format onnx "$TMP/x"
grep -q "only hf" "$TMP/err" || fail "unknown format message"
expect 2 "$BIN" export "$TMP/runs/gpt2/ckpt" "$TMP/x"
expect 1 "$BIN" export "$TMP/nope" --format hf "$TMP/x"
[ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "missing checkpoint: not one line"; }
echo "hf_export: ok"
