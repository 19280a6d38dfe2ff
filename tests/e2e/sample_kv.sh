#!/usr/bin/env bash
# sample_kv.sh — end to end: `jdt-train sample` with the KV cache against the old path
# (--no-kv-cache: the whole forward graph per token) on a GPT-2-style and a Llama-style tiny
# checkpoint (layernorm/learned/gelu/bias/tied; rmsnorm/rope/swiglu/GQA/untied/no bias): greedy
# text identical under every --context mode, past seq_len too; batch sampling (--prompt
# repeated, --prompts FILE; --batch 2 reusing a finished sequence's slot) gives each prompt the
# text it gets alone; --stop cuts the text at the
# stop sequence; --context stop ends at seq_len; --max-new-tokens 0; the same seed gives the same
# text; the tokens/s line on stderr. Bad flags, an unreadable prompts file (missing, empty, a
# device such as /dev/zero, a directory, over 64 MiB) and an mlp checkpoint each give one line
# and exit 2.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:-$PWD}
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" | tail -n 20; fail "'$*' exited $rc, expected $want"; }; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
O="run.out_dir=$TMP/runs"

train() { # name, overrides...
  local name=$1; shift
  expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "$O" run.name="$name" run.steps=2 run.eval_every=0 model.init_std=0.3 "$@"
}
train gpt2
train llama model.norm=rmsnorm model.bias=false model.pos=rope model.activation=swiglu \
  model.n_kv_head=2 model.tie_embeddings=false model.rope_theta=500

for name in gpt2 llama; do
  CK=$TMP/runs/$name/ckpt
  # greedy, 60 tokens after 2 (seq_len 32): identical text from both paths in every context mode
  for mode in shift window stop; do
    expect 0 "$BIN" sample "$CK" --prompt "ab" --max-new-tokens 60 --temperature 0 --context $mode
    cp "$TMP/out" "$TMP/kv_$mode"; cp "$TMP/err" "$TMP/kv_$mode.err"
    expect 0 "$BIN" sample "$CK" --prompt "ab" --max-new-tokens 60 --temperature 0 --context $mode --no-kv-cache
    cmp -s "$TMP/out" "$TMP/kv_$mode" || fail "$name --context $mode: KV cache and full forward differ:
$(od -An -tu1 "$TMP/kv_$mode" | head -3)
vs
$(od -An -tu1 "$TMP/out" | head -3)"
  done
  [ "$(wc -c < "$TMP/kv_shift")" -eq 63 ] || fail "$name: expected prompt + 60 bytes + newline"
  # stop: the sequence ends when its context is full: 32 - 2 + 1 = 31 generated tokens
  [ "$(wc -c < "$TMP/kv_stop")" -eq $((2 + 31 + 1)) ] || fail "$name --context stop: $(wc -c < "$TMP/kv_stop") bytes"
  cmp -s <(head -c 33 "$TMP/kv_stop") <(head -c 33 "$TMP/kv_window") || fail "$name: stop is not a prefix of window"
  grep -qE "^sample: prefill 2 tokens in [0-9.]+ ms \([0-9]+ tokens/s\); decode 60 tokens in [0-9.]+ ms \([0-9]+ tokens/s\); 1 sequence, KV cache" "$TMP/kv_shift.err" ||
    { cat "$TMP/kv_shift.err"; fail "$name: no tokens/s line"; }
  grep -qE "[1-9][0-9]* context re-runs" "$TMP/kv_shift.err" || fail "$name: no context shift past seq_len: $(cat "$TMP/kv_shift.err")"
  echo "$name: greedy text identical with and without the KV cache (shift, window, stop); $(cat "$TMP/kv_shift.err")"

  # batch: three prompts (two flags, one file) in one run; each sample equals its prompt alone
  printf 'xyz\n\nhello\r\n' > "$TMP/prompts"
  expect 0 "$BIN" sample "$CK" --prompt "ab" --prompts "$TMP/prompts" --max-new-tokens 20 --temperature 0
  cp "$TMP/out" "$TMP/batch"
  expect 0 "$BIN" sample "$CK" --prompt "ab" --prompts "$TMP/prompts" --max-new-tokens 20 --temperature 0 --batch 2
  cmp -s "$TMP/out" "$TMP/batch" || fail "$name: --batch 2 (a slot reused) prints other text than one batch of 3"
  grep -q "3 sequences (2 at a time)" "$TMP/err" || fail "$name --batch 2: $(cat "$TMP/err")"
  grep -q "decode 60 tokens" "$TMP/err" || fail "$name batch: expected 60 decoded tokens: $(cat "$TMP/err")"
  grep -q "3 sequences" "$TMP/err" || fail "$name batch: $(cat "$TMP/err")"
  i=0
  for p in ab xyz hello; do
    i=$((i + 1))
    expect 0 "$BIN" sample "$CK" --prompt "$p" --max-new-tokens 20 --temperature 0
    python3 - "$TMP/batch" "$TMP/out" $i <<'PY' || fail "$name batch: sample $i differs from its prompt alone"
import sys
batch, alone, i = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), int(sys.argv[3])
head = b"==> sample %d/3 <==\n" % i
start = batch.index(head) + len(head)
want = alone  # the prompt, the text, a newline
assert batch[start:start + len(want)] == want, (batch[start:start + len(want)], want)
PY
  done
  echo "$name: 3 prompts as one batch, or 2 at a time, print what each prints alone"

  # stop sequences: take a printable piece of the greedy text and stop there
  expect 0 "$BIN" sample "$CK" --prompt "ab" --max-new-tokens 30 --temperature 0
  stop=$(python3 - "$TMP/out" <<'PY'
import sys
gen = open(sys.argv[1], "rb").read()[2:-1]
ok = lambda b: 0x21 <= b <= 0x7e and b not in b"'\\\"$`"
for n in (2, 1):
    for i in range(3, len(gen) - n):
        if all(ok(b) for b in gen[i:i + n]) and gen.find(gen[i:i + n]) == i:
            print(gen[i:i + n].decode()); sys.exit(0)
sys.exit(1)
PY
) || fail "$name: no printable piece in the greedy text to stop at"
  cp "$TMP/out" "$TMP/nostop"
  expect 0 "$BIN" sample "$CK" --prompt "ab" --max-new-tokens 30 --temperature 0 --stop "$stop" --stop "never-there"
  python3 - "$TMP/nostop" "$TMP/out" "$stop" <<'PY' || fail "$name: --stop '$stop' output wrong"
import sys
full, cut, stop = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), sys.argv[3].encode()
gen = full[2:-1]
assert cut == b"ab" + gen[:gen.index(stop)] + b"\n", (cut, full, stop)
PY
  echo "$name: --stop '$stop' ends the text before it"
done

CK=$TMP/runs/gpt2/ckpt
# 24 prompts of 29 bytes in one batch: a 696-row prefill, split over decoder calls (and context
# shifts: 29 + 5 > seq_len 32)
for ((i = 0; i < 24; i++)); do printf 'prompt %02d of the long batch..\n' $i; done > "$TMP/many"
expect 0 "$BIN" sample "$CK" --prompts "$TMP/many" --max-new-tokens 5 --temperature 0 --batch 24
cp "$TMP/out" "$TMP/many24"
grep -q "prefill 696 tokens" "$TMP/err" || fail "24 prompts: $(cat "$TMP/err")"
expect 0 "$BIN" sample "$CK" --prompts "$TMP/many" --max-new-tokens 5 --temperature 0 --batch 1
cmp -s "$TMP/out" "$TMP/many24" || fail "24 prompts: one batch and one at a time differ"
echo "24 prompts (696 prefill rows in pieces) print the same as one at a time"
expect 0 "$BIN" sample "$CK" --prompt "hey" --max-new-tokens 0
[ "$(cat "$TMP/out")" = "hey" ] || fail "--max-new-tokens 0 should print the prompt only"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --seed 9 --top-k 20 --top-p 0.9
cp "$TMP/out" "$TMP/s1"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --seed 9 --top-k 20 --top-p 0.9
cmp -s "$TMP/out" "$TMP/s1" || fail "the same seed gave different text"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --seed 9 --top-k 20 --top-p 0.9 --no-kv-cache
cmp -s "$TMP/out" "$TMP/s1" || fail "sampling with the same seed differs between the paths"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --seed 10 --top-k 20 --top-p 0.9
cmp -s "$TMP/out" "$TMP/s1" && fail "another seed gave the same text"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --temperature 0
cp "$TMP/out" "$TMP/greedy"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --temperature 1.5 --top-k 1 --seed 4
cmp -s "$TMP/out" "$TMP/greedy" || fail "--top-k 1 is not greedy"
expect 0 "$BIN" sample "$CK" --prompt "ab" --length 40 --temperature 1.5 --top-p 0.000001 --seed 4
cmp -s "$TMP/out" "$TMP/greedy" || fail "a tiny --top-p is not greedy"
echo "seeded sampling (top-k, top-p) is deterministic and the same on both paths; top-k 1 and a tiny top-p are greedy"

# bad input: one line, exit 2
: > "$TMP/empty"
bad() { # expected message part, args...
  local want=$1; shift
  expect 2 "$BIN" sample "$CK" "$@"
  [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "sample $*: not one line"; }
  grep -q -- "$want" "$TMP/err" || { cat "$TMP/err"; fail "sample $*: message lacks '$want'"; }
}
bad "--top-p: expected a number in (0, 1]" --top-p 0
bad "--top-p: expected a number in (0, 1]" --top-p 1.5
bad "--context: expected shift|window|stop" --context slide
bad "--stop needs a non-empty text" --stop ""
bad "--max-new-tokens: expected an integer" --max-new-tokens -1
bad "--max-new-tokens: expected an integer" --max-new-tokens lots
bad "--prompts: cannot read '$TMP/nope'" --prompts "$TMP/nope"
bad "holds no prompt" --prompts "$TMP/empty"
# a device, a directory and a file over 64 MiB are refused before reading: /dev/zero was read
# forever with memory growing (run under a memory and time bound so that a regression fails
# instead of taking the machine down)
truncate -s 65M "$TMP/huge"
bounded() { (ulimit -v 2097152; exec timeout 20 "$@"); }
for c in "/dev/zero|'/dev/zero': not a regular file" "$TMP|'$TMP': Is a directory" \
         "$TMP/huge|'$TMP/huge' is 65.0 MiB, more than the 64 MiB limit"; do
  expect 2 bounded "$BIN" sample "$CK" --prompts "${c%%|*}"
  [ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q -- "--prompts: .*${c#*|}" "$TMP/err" ||
    { cat "$TMP/err"; fail "--prompts ${c%%|*}: expected one line saying ${c#*|}"; }
done
expect 2 bounded "$BIN" sample "$CK" --prompts <(yes ab)
grep -q "holds more than the 64 MiB limit" "$TMP/err" || { cat "$TMP/err"; fail "endless pipe"; }
rm -f "$TMP/huge"
bad "--prompt needs text" --prompt
bad "unknown option '--beam'" --beam 4
bad "--batch: expected 1 to 4096" --batch 0
bad "--threads: expected 0 (the checkpoint's) to 1024" --threads 5000
expect 0 "$BIN" configs/mlp.yaml "$O" run.steps=2 run.eval_every=0 checkpoint.every=2
expect 2 "$BIN" sample "$TMP/runs/mlp/ckpt" --prompt "ab"
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "not autoregressive" "$TMP/err" || { cat "$TMP/err"; fail "mlp checkpoint message"; }
train v64 model.vocab_size=64
expect 2 "$BIN" sample "$TMP/runs/v64/ckpt" --prompt "ab"
[ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "prompt 1: token 97 (a byte) is outside the model's vocabulary of 64" "$TMP/err" ||
  { cat "$TMP/err"; fail "byte outside the vocabulary message"; }
echo "bad flags, a prompt outside the vocabulary and an mlp checkpoint: one line, exit 2"
echo "sample_kv: ok"
