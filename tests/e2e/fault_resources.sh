#!/usr/bin/env bash
# fault_resources.sh — resource limits before allocation (issue 11, item 4): a 99,999-layer
# config is refused in well under a second (a 20 s timeout bounds a hang) with the memory it
# needs and what to change; a plan whose exact arena exceeds the memory available (here an
# address-space limit, ulimit -v) is refused before the arena is allocated; a small stack limit
# (ulimit -s) is raised where it may be, and said where it may not.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"

for cmd in "" inspect; do
  timeout 20 "$BIN" $cmd configs/tiny.yaml model.n_layer=99999 run.out_dir="$TMP/runs" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 124 ] && fail "${cmd:-train} of 99,999 layers still running after 20 s"
  [ $rc -eq 1 ] || { cat "$TMP/err"; fail "${cmd:-train} of 99,999 layers: exit $rc, expected 1"; }
  grep -qE "the plan needs at least [0-9.]+ GiB \(5e\+09 parameters.* is available \((MemAvailable|cgroup|address-space).*: use a smaller model" "$TMP/err" ||
    { cat "$TMP/err"; fail "no figure or advice"; }
  [ "$(grep -c error "$TMP/err")" -eq 1 ] || fail "more than one error line"
done

# on a mesh the estimate is per device: mesh.fsdp=2 halves the state figure (93.1 -> 46.6 GiB)
state1=$(grep -oE "parameters: [0-9.]+ GiB for parameters" "$TMP/err" | grep -oE "[0-9.]+ GiB" | cut -d' ' -f1)
timeout 60 "$BIN" --nproc 2 configs/tiny.yaml model.n_layer=99999 mesh.fsdp=2 run.out_dir="$TMP/runs" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "fsdp=2 of 99,999 layers: exit $rc, expected 1"; }
state2=$(grep -oE "per device \(5e\+09 parameters: [0-9.]+ GiB for parameters" "$TMP/err" | head -1 | grep -oE "[0-9.]+ GiB" | cut -d' ' -f1)
[ -n "$state2" ] || { cat "$TMP/err"; fail "fsdp=2: no per-device figure"; }
awk -v a="$state1" -v b="$state2" 'BEGIN { r = b / a; exit !(r > 0.49 && r < 0.51) }' ||
  fail "fsdp=2 state per device $state2 GiB is not half of one process's $state1 GiB"

# the estimate (2.6 GiB, a lower bound) passes under a 3.2 GB limit; the exact plan (3.4 GiB
# of intermediates) does not, and is refused before allocating
(ulimit -v 3300000; exec "$BIN" inspect configs/tiny.yaml model.seq_len=65536) >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "seq_len 65536 under ulimit -v: exit $rc, expected 1"; }
grep -qE "compile: the plan needs [0-9.]+ MiB for intermediates but [0-9.]+ MiB is available \(address-space limit, ulimit -v\): use a smaller data.micro_batch_size" "$TMP/err" ||
  { cat "$TMP/err"; fail "arena refusal message"; }
echo "99,999 layers refused at once (state $state1 GiB, $state2 GiB per device with fsdp=2); an arena over the limit refused before allocation"

# a small stack (ulimit -s): a soft limit of 128 KiB is raised (cmd/main.c ensure_stack; the
# first step of this model's reductions, 128 KiB of partial sums on the main thread, died of a
# segmentation fault under it); a hard one that allows no more is said, once
wide=(configs/tiny.yaml model.n_layer=1 model.n_embd=384 model.n_head=6 model.seq_len=256
      data.batch_size=8 data.micro_batch_size=8 run.steps=1 run.eval_every=0 checkpoint.every=0
      run.out_dir="$TMP/runs" run.name=stack)
(ulimit -Ss 128; exec "$BIN" "${wide[@]}") >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 0 ] || { tail -n 3 "$TMP/out" "$TMP/err"; fail "soft stack limit of 128 KiB: exit $rc, expected 0"; }
(ulimit -s 128; exec "$BIN" version) >/dev/null 2>"$TMP/err"
[ "$(grep -c 'the stack limit is 128 KiB and its hard limit allows no more' "$TMP/err")" -eq 1 ] ||
  { cat "$TMP/err"; fail "hard stack limit of 128 KiB: no single warning"; }
echo "a soft stack limit of 128 KiB raised; a hard one said"
