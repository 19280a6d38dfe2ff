#!/usr/bin/env bash
# inspect_plan.sh — `inspect` plans from shapes alone (issue 9, item 7; docs/sharding.md
# "Planning"). A Llama-2-7B-shaped gpt (configs/gpt-7b.yaml) on a data 64 x tensor 8 mesh plans
# under a 2 GB address-space limit (its per-device parameters alone are 4 GiB, a single device's
# 25 GiB: allocating any of them would fail), starts no process, compiles nothing and writes
# nothing to the compile cache. Its figures are consistent: the parameter shardings add up to
# the model's 6,738,415,616 parameters and to the per-device figure, each block is its global
# shape divided by the sizes of its mesh axes, parameters x 8 = model x 4 bytes when the vocab
# is split over tensor too (norm scales are the only replicated tensors), fsdp=2 halves the
# parameter + optimizer bytes within 1e-3 (the norm scales, [norm, null], stay whole; vs one
# device's figure, and vs data=64 at 512 devices), the tensor axis
# carries the 4 Megatron all-reduces per block per micro-batch, and every gradient is summed
# over data exactly once per step. A -1 mesh axis is a config error (exit 2). `--source FILE`
# writes the compiled step's C, one `group N` comment per fused loop nest the summary counts,
# and refuses to run without a compile. No timing assertion: the generous timeout only bounds
# a hang.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_CACHE_DIR="$TMP/cache" JDT_RUNTIME_CACHE_DIR="$TMP/cache"
CFG=configs/gpt-7b.yaml
N_MODEL=6738415616

plan() { # $1 output file, then overrides
  local out=$1; shift
  (ulimit -v 2000000; exec timeout 300 "$BIN" inspect "$CFG" run.out_dir="$TMP/runs" "$@") >"$out" 2>"$TMP/err"
  local rc=$?
  [ $rc -eq 124 ] && fail "inspect $* still running after 300 s"
  [ $rc -eq 0 ] || { cat "$TMP/err"; fail "inspect $*: exit $rc"; }
}
per_device() { grep -o 'per device: [0-9]* bytes' "$1" | awk '{print $3}'; }
local_params() { awk '$1 == "parameters" && $5 == "of" {print $4}' "$1"; }
# prints "global_numel local_numel ways" per parameter line of the shardings table
shardings() { # $1 file, $2 data, $3 fsdp, $4 tensor
  awk -v D="$2" -v F="$3" -v T="$4" '
    /parameter shardings/ { on = 1; next }
    on && /->/ {
      line = $0; sub(/^ *[^ ]+ +/, "", line)
      split(line, halves, "->"); g = halves[1]; l = halves[2]
      sub(/\[.*/, "", l); spec = halves[2]; sub(/.*\[/, "", spec); sub(/\].*/, "", spec)
      gsub(/[(), ]+/, " ", g); gsub(/[(), ]+/, " ", l)
      ng = split(g, gd, " "); nl = split(l, ld, " ")
      gn = 1; for (i = 1; i <= ng; i++) if (gd[i] != "") gn *= gd[i]
      ln = 1; for (i = 1; i <= nl; i++) if (ld[i] != "") ln *= ld[i]
      w = 1; n = split(spec, dims, ",")
      for (i = 1; i <= n; i++) {
        if (dims[i] ~ /data/) w *= D; if (dims[i] ~ /fsdp/) w *= F; if (dims[i] ~ /tensor/) w *= T }
      printf "%.0f %.0f %d\n", gn, ln, w }' "$1"
}

# --- the 64 x 8 plan: no process, no tensor, no compiled code -------------------------------
plan "$TMP/p64x8" mesh.data=64 mesh.tensor=8
grep -q "planned step of rank 0 of the mesh data 64 x fsdp 1 x tensor 8 (512 devices" "$TMP/p64x8" \
  || fail "no 64 x 8 plan header: $(head -20 "$TMP/p64x8")"
for w in "optimizer state" "gradients" "activations" "arena of the apply program" "total over tensor" \
         "total over data" "parameter shardings"; do
  grep -q "$w" "$TMP/p64x8" || fail "the plan lacks '$w'"; done
[ -d "$TMP/runs" ] && fail "inspect created a run directory"
ls "$TMP/cache" 2>/dev/null | grep -q '\.so$' && fail "inspect compiled code into the cache"
pgrep -P $$ >/dev/null 2>&1 && fail "a process was left running"

# --- consistency of the figures --------------------------------------------------------------
shardings "$TMP/p64x8" 64 1 8 >"$TMP/s64x8"
[ "$(wc -l <"$TMP/s64x8")" -eq 291 ] || fail "expected 291 parameters (32 x 9 + 3), got $(wc -l <"$TMP/s64x8")"
awk -v N="$N_MODEL" -v L="$(local_params "$TMP/p64x8")" -v B="$(per_device "$TMP/p64x8")" '
  { g += $1; l += $2; if ($1 != $2 * $3) { printf "block %s x %s ways != %s\n", $2, $3, $1; bad = 1 } }
  END { printf "64x8: sum of global shapes %.0f (model %.0f), of local blocks %.0f (plan %.0f), per-device bytes %.0f = 12 x %.0f\n", g, N, l, L, B, B / 12
        exit !(bad == 0 && g == N && l == L && B == 12 * L) }' "$TMP/s64x8" \
  || fail "the parameter shardings do not add up to the model and the per-device figure"

R='[[batch, [data, fsdp]], [embed, fsdp], [mlp, tensor], [heads, tensor], [kv_heads, tensor], [vocab, tensor], [norm, null]]'
plan "$TMP/pvocab" mesh.data=64 mesh.tensor=8 "sharding.rules=$R"
awk -v N="$N_MODEL" -v L="$(local_params "$TMP/pvocab")" 'BEGIN {
  r = L * 8 / N; printf "vocab split over tensor: per-device parameters x 8 / model = %.6f\n", r
  exit !(r > 1.0 && r < 1.001) }' || fail "per-device parameters x devices-per-replica != the model"

# data=2 holds what one device would (all parameters + AdamW m and v: 12 bytes each); one
# device itself is not planned here: a one-process CPU plan is this machine's, which refuses it
plan "$TMP/pd2" mesh.data=2 mesh.tensor=1
[ "$(per_device "$TMP/pd2")" = $((12 * N_MODEL)) ] || fail "data=2 per-device bytes $(per_device "$TMP/pd2") != 12 x $N_MODEL"
plan "$TMP/pf2" mesh.data=1 mesh.tensor=1 mesh.fsdp=2
plan "$TMP/p32x2x8" mesh.data=32 mesh.fsdp=2 mesh.tensor=8
for pair in "pd2 pf2 one device (data=2) -> fsdp=2" "p64x8 p32x2x8 data 64 x tensor 8 -> data 32 x fsdp 2 x tensor 8"; do
  set -- $pair; a=$(per_device "$TMP/$1"); b=$(per_device "$TMP/$2"); shift 2
  awk -v a="$a" -v b="$b" -v l="$*" 'BEGIN { r = b / a
    printf "%s: parameter + optimizer bytes per device %.0f -> %.0f (x %.5f)\n", l, a, b, r; exit !(r > 0.499 && r < 0.501) }' \
    || fail "fsdp=2 does not halve the parameter + optimizer bytes ($*)"
done

# --- the collectives of one step (runtime.remat none: no recomputed forward collectives) ----
plan "$TMP/pnr" mesh.data=64 mesh.tensor=8 runtime.remat=none
awk '$1 == "micro" && $2 == "all_reduce" && $4 == "tensor" { n += $6; if ($NF != "4096)") bad = 1 }
     $1 == "apply" && $4 ~ /data/ && $NF != "()" { g += $6 }
     END { printf "tensor all-reduces per step %d (16 micro-batches x 32 blocks x 4), gradient sums over data %d (291 parameters)\n", n, g
           exit !(n == 2048 && g == 291 && !bad) }' "$TMP/pnr" || fail "collective counts: $(grep -A14 'collectives of one' "$TMP/pnr")"

# --- runtime.loss_chunks under FSDP: the sequence slices' GEMMs read one gather of the head's
# weight (shard/partition.c redistribute's cache), so a step issues the collectives of the
# whole head: the dX GEMMs on the forward's gather (passes.c share_loss_gathers), one
# reduce-scatter of the summed dW ---------------------------------------------------------------
colls() { sed -n '/collectives of one/,/parameter shardings/p' "$1" | grep -E '^ +(micro|apply) '; }
for k in 1 4; do
  "$BIN" inspect configs/tiny.yaml mesh.fsdp=2 mesh.data=1 runtime.loss_chunks=$k >"$TMP/lc$k" 2>&1 ||
    { cat "$TMP/lc$k"; fail "inspect tiny fsdp=2 runtime.loss_chunks=$k"; }
done
[ -n "$(colls "$TMP/lc1")" ] && cmp -s <(colls "$TMP/lc1") <(colls "$TMP/lc4") ||
  { diff <(colls "$TMP/lc1") <(colls "$TMP/lc4"); fail "runtime.loss_chunks=4 under fsdp=2: other collectives than the whole head's"; }
echo "fsdp=2, runtime.loss_chunks=4: the whole head's $(colls "$TMP/lc1" | awk '{ n += $6 } END { print n }') collectives a step"

# --- a mesh of unknown size is a config error ------------------------------------------------
"$BIN" inspect "$CFG" mesh.data=-1 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || fail "mesh.data=-1: exit $rc, expected 2"
[ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "mesh" "$TMP/err" || fail "mesh.data=-1 message: $(cat "$TMP/err")"
# --- --source: the compiled step's generated C, one `group N` comment per fused kernel ---------
"$BIN" inspect configs/tiny.yaml --compile --source "$TMP/step.c" >"$TMP/src.out" 2>&1 ||
  { cat "$TMP/src.out"; fail "inspect --compile --source"; }
nests=$(sed -nE 's/^ +kernels +([0-9]+) fused loop nests.*/\1/p' "$TMP/src.out")
groups=$(grep -c '^/\* group [0-9]*: ' "$TMP/step.c")
[ -n "$nests" ] && [ "$nests" -gt 0 ] && [ "$groups" -eq "$nests" ] &&
  grep -q "generated source ($(wc -c <"$TMP/step.c") bytes) written to $TMP/step.c" "$TMP/src.out" ||
  { cat "$TMP/src.out"; fail "--source: $groups group comments for $nests fused loop nests"; }
ls "$TMP"/step.c.tmp* >/dev/null 2>&1 && fail "--source left a temporary behind"
# without a compile there is no code: refused (exit 2), and an unwritable path is one error line
"$BIN" inspect configs/tiny.yaml --source "$TMP/x.c" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "--compile" "$TMP/err" && [ ! -e "$TMP/x.c" ] ||
  fail "--source without --compile: exit $rc, $(cat "$TMP/err")"
"$BIN" inspect configs/tiny.yaml --compile --source "$TMP/none/x.c" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q "error: --source $TMP/none/x.c" "$TMP/err" ||
  fail "--source into a missing folder: exit $rc, $(cat "$TMP/err")"
echo "--source: $groups fused kernels under their group comments, $(wc -c <"$TMP/step.c") bytes of C"
echo "inspect_plan: all ok"
