#!/usr/bin/env bash
# cli_config_roundtrip.sh — `inspect --print-config` prints YAML that loads back to the same
# config (same printed text), for every shipped config, with overrides and environment applied.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
for cfg in configs/tiny.yaml configs/llm.yaml configs/mlp.yaml configs/gpt2-124m.yaml configs/qwen3-0.6b-ft.yaml configs/llama3.2-1b-ft.yaml configs/gemma-2b-ft.yaml; do
  "$BIN" inspect "$cfg" --print-config >"$TMP/a.yaml" || fail "$cfg: print-config failed"
  "$BIN" inspect "$TMP/a.yaml" --print-config >"$TMP/b.yaml" || fail "$cfg: resolved YAML does not load"
  cmp -s "$TMP/a.yaml" "$TMP/b.yaml" || { diff "$TMP/a.yaml" "$TMP/b.yaml"; fail "$cfg: round trip differs"; }
  grep -q "^  base_config" "$TMP/a.yaml" && fail "$cfg: base_config leaked into the resolved config"
done
JDT_RUNTIME_THREADS=2 "$BIN" inspect configs/tiny.yaml 'run.name=x "y": z' 'sharding.rules=[[batch, data]]' \
  --print-config >"$TMP/a.yaml" || fail "print-config with overrides"
grep -q '^  threads: 2$' "$TMP/a.yaml" || fail "env override missing from resolved config"
grep -qF 'name: "x \"y\": z"' "$TMP/a.yaml" || fail "string override not quoted right"
"$BIN" inspect "$TMP/a.yaml" --print-config >"$TMP/b.yaml" || fail "overridden config does not load"
cmp -s "$TMP/a.yaml" "$TMP/b.yaml" || fail "overridden round trip differs"
echo ok
