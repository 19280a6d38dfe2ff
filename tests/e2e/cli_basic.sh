#!/usr/bin/env bash
# cli_basic.sh — the jdt-train command line: help, version, subcommand dispatch, exit codes
# (0 ok, 1 run-time failure, 2 usage/config error), inspect's summary.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
# expect RC CMD... : runs CMD, checks its exit code, leaves stdout in $TMP/out, stderr in $TMP/err
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err"; fail "'$*' exited $rc, expected $want"; }; }

expect 0 "$BIN" --help;            grep -q "usage: jdt-train" "$TMP/out" || fail "--help lacks usage"
grep -q "exit codes" "$TMP/out" || fail "--help lacks exit codes"
expect 0 "$BIN" -h
expect 0 "$BIN" --version;         grep -qE '^jdt-train [0-9]+\.[0-9]+\.[0-9]+$' "$TMP/out" || fail "bad --version"
expect 0 "$BIN" version
grep -qE '^cpu: OpenBLAS [^ ]+ kernels; f32 GEMMs: [^;]+; bf16 GEMMs: ' "$TMP/out" || { cat "$TMP/out"; fail "version: no cpu line"; }
expect 0 "$BIN" inspect --help;    grep -q -- "--print-config" "$TMP/out" || fail "inspect --help"
expect 0 "$BIN" train --help;      grep -q "jdt-train \[train\] CONFIG" "$TMP/out" || fail "train --help"
expect 0 "$BIN" help inspect;      grep -q "inspect --schema" "$TMP/out" || fail "help inspect"
expect 2 "$BIN"                    # no arguments: usage on stderr
grep -q "usage:" "$TMP/err" || fail "no usage on bare call"
expect 2 "$BIN" inspct configs/tiny.yaml
grep -q "unknown command 'inspct'" "$TMP/err" || fail "unknown command message"
expect 2 "$BIN" inspect configs/tiny.yaml --frobnicate
grep -q "unknown option '--frobnicate'" "$TMP/err" || fail "unknown option message"
expect 2 "$BIN" inspect
grep -q "missing CONFIG" "$TMP/err" || fail "missing CONFIG message"
expect 2 "$BIN" inspect configs/tiny.yaml --log-level loud
grep -q "log-level" "$TMP/err" || fail "bad log level message"
expect 2 "$BIN" inspect configs/tiny.yaml extra
grep -q "unexpected argument 'extra'" "$TMP/err" || fail "extra argument message"

# inspect: an honest summary
expect 0 "$BIN" inspect configs/llm.yaml --no-compile
for w in "model " "parameters " "mesh " "data " "optimizer " "checkpoint "; do
  grep -q "^$w" "$TMP/out" || fail "inspect summary lacks '$w'"; done
grep -q "L=4 C=256" "$TMP/out" || fail "summary does not show llm.yaml's model"
expect 0 "$BIN" inspect configs/gpt2-124m.yaml
grep -q "124,475,904" "$TMP/out" || fail "gpt2-124m parameter count (llm.c's padded-vocab figure)"
# the fine-tuning recipes' model sections are the hub models': their published sizes
expect 0 "$BIN" inspect configs/qwen3-0.6b-ft.yaml
grep -q "596,049,920" "$TMP/out" || fail "Qwen3-0.6B parameter count (0.44B non-embedding + 151936 x 1024)"
expect 0 "$BIN" inspect configs/llama3.2-1b-ft.yaml
grep -q "1,235,814,400" "$TMP/out" || fail "Llama-3.2-1B parameter count"
grep -q "llama3 scaling x32 from 8192" "$TMP/out" || fail "Llama-3.2-1B's RoPE scaling not in the summary"
expect 0 "$BIN" inspect configs/gemma-2b-ft.yaml
grep -q "2,506,172,416" "$TMP/out" || fail "gemma-2b parameter count (18 layers of 110,104,576 + 256000 x 2048 + 2048)"
grep -q "geglu.*tied embeddings (times sqrt(C) on the way in)" "$TMP/out" || fail "gemma-2b: GeGLU and the embedding scale not in the summary"
expect 0 "$BIN" inspect configs/tiny.yaml model.n_layer=3 --log-level=debug --compile
for w in "compiled step" "fused loop nests" "FLOPs/step" "planned peak" "cache "; do
  grep -q "$w" "$TMP/out" || fail "inspect lacks the compiled-step line '$w'"; done
grep -q "L=3" "$TMP/out" || fail "override not applied"

# train: a config error is exit 2 before anything runs (training itself: tests/e2e/train_*.sh)
expect 2 "$BIN" configs/tiny.yaml model.n_layer=0
grep -q "model.n_layer" "$TMP/err" || fail "train config error"
echo ok
