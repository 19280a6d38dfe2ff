#!/usr/bin/env bash
# cli_schema.sh — `inspect --schema` lists every key (type, default, bounds, env name, doc), and
# docs/config.md documents every key the binary knows, in the generator's own table.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
"$BIN" inspect --schema >"$TMP/schema.txt" || fail "--schema failed"
"$BIN" inspect --schema=markdown >"$TMP/schema.md" || fail "--schema=markdown failed"
keys=$(grep -oE '^  [a-z_]+\.[a-z0-9_]+' "$TMP/schema.txt" | tr -d ' ')
n=$(echo "$keys" | wc -l)
[ "$n" -gt 60 ] || fail "only $n keys in --schema"
for k in run.steps model.n_layer mesh.fsdp sharding.rules data.batch_size optimizer.lr \
         precision.compute checkpoint.every runtime.jit dist.coordinator; do
  grep -qx "$k" <<<"$keys" || fail "--schema lacks $k"; done
grep -q 'JDT_MODEL_N_LAYER' "$TMP/schema.txt" || fail "--schema lacks env names"
grep -q 'gelu|swiglu|relu' "$TMP/schema.txt" || fail "--schema lacks choices"
[ "$(grep -c '^| `' "$TMP/schema.md")" -eq "$n" ] || fail "markdown schema row count differs"
for k in $keys; do grep -qF "\`$k\`" docs/config.md || fail "docs/config.md does not document $k"; done
# the doc's table is the generator's output, row for row (regenerate it after editing schema.c)
sed -n '/^| key | type | default/,/^$/p' docs/config.md | sed '/^$/d' >"$TMP/doc-table.md"
diff -q "$TMP/schema.md" "$TMP/doc-table.md" >/dev/null ||
  fail "docs/config.md's schema table differs from inspect --schema=markdown (regenerate it)"
"$BIN" inspect --schema configs/tiny.yaml >/dev/null 2>&1; [ $? -eq 2 ] || fail "--schema with CONFIG should be a usage error"
echo ok
