#!/usr/bin/env bash
# train_mlp.sh — configs/mlp.yaml (built only from builder-API ops, SGD + Nesterov momentum)
# trains through the JIT path on its synthetic classification data: the val loss falls below
# half of ln(10) within 150 steps, and the interpreter path (runtime.jit=false) agrees with the
# compiled path on the first steps' losses.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
"$BIN" configs/mlp.yaml run.out_dir="$TMP/a" run.steps=150 run.eval_every=150 >/dev/null 2>"$TMP/err" \
  || { tail -n 5 "$TMP/err"; fail "mlp run"; }
vl=$(grep -o '"val_loss": [0-9.e+-]*' "$TMP/a/mlp/metrics.jsonl" | tail -1 | awk '{print $2}')
awk -v v="$vl" 'BEGIN { exit !(v < 1.1513) }' || fail "val loss $vl not below ln(10)/2"
echo "val loss after 150 steps: $vl"
"$BIN" configs/mlp.yaml run.out_dir="$TMP/b" run.steps=3 run.eval_every=0 runtime.jit=false >/dev/null 2>"$TMP/err2" \
  || { tail -n 5 "$TMP/err2"; fail "interpreter run"; }
grep '"loss"' "$TMP/a/mlp/metrics.jsonl" | head -3 | grep -o '"loss": [0-9.e+-]*' | awk '{print $2}' > "$TMP/j"
grep -o '"loss": [0-9.e+-]*' "$TMP/b/mlp/metrics.jsonl" | awk '{print $2}' > "$TMP/i"
paste "$TMP/j" "$TMP/i" | awk '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d }
  END { printf "JIT vs interpreter: max relative difference %.2g\n", m; exit !(m < 1e-4) }' \
  || fail "JIT and interpreter disagree"
# arrays data whose classes are not the model's: refused when the data opens, naming the file
f=$(ls "$TMP"/a/mlp/synthetic_train-*.h5) v=$(ls "$TMP"/a/mlp/synthetic_val-*.h5)
"$BIN" configs/mlp.yaml run.out_dir="$TMP/c" run.steps=2 data.format=arrays data.train_path="$f" \
  data.val_path="$v" model.n_classes=5 >/dev/null 2>"$TMP/err3"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err3"; fail "classes mismatch: exit $rc, expected 1"; }
grep -q "synthetic_train-.*: attribute n_classes is 10 but the model has 5 classes" "$TMP/err3" ||
  { cat "$TMP/err3"; fail "classes mismatch not named"; }
grep -q "^step 1/" "$TMP/err3" && fail "trained before refusing the data"
echo ok
