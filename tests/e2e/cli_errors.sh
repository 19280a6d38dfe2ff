#!/usr/bin/env bash
# cli_errors.sh — bad configs give one clear line naming file:line:col (or the override / the
# environment variable), the key and what was expected; exit code 2; nothing is written.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$TMP" || exit 1
# check NAME WANT_TEXT... : runs "$BIN" inspect with the args in ARGS, expects exit 2, a single
# stderr line, and every WANT_TEXT in it.
check() {
  local name=$1; shift
  "$BIN" inspect "${ARGS[@]}" >out 2>err; local rc=$?
  [ $rc -eq 2 ] || { cat out err; fail "$name: exit $rc, expected 2"; }
  [ "$(wc -l <err)" -eq 1 ] || { cat err; fail "$name: expected one line on stderr"; }
  [ ! -s out ] || fail "$name: wrote to stdout"
  for w in "$@"; do grep -qF -- "$w" err || { cat err; fail "$name: message lacks '$w'"; }; done
}
printf 'model:\n  n_layr: 4\n' >typo.yaml
ARGS=(typo.yaml);                          check typo "typo.yaml:2:3" "model.n_layr" "did you mean model.n_layer?"
printf 'model:\n  n_layer: four\n' >type.yaml
ARGS=(type.yaml);                          check type "type.yaml:2:12" "model.n_layer" "expected an integer"
printf 'optimizer:\n  beta2: 1.5\n' >range.yaml
ARGS=(range.yaml);                         check range "range.yaml:2:10" "optimizer.beta2" "[0, 1)"
printf 'run:\n  steps: 1\n  steps: 2\n' >dup.yaml
ARGS=(dup.yaml);                           check dup "dup.yaml:3:3" "run.steps" "duplicate key"
printf 'run: [\n' >syntax.yaml
ARGS=(syntax.yaml);                        check syntax "syntax.yaml:" "YAML syntax error"
ARGS=(missing.yaml);                       check missing "missing.yaml" "No such file"
mkdir -p sub && printf 'base_config: ../loop.yaml\n' >sub/b.yaml && printf 'base_config: sub/b.yaml\n' >loop.yaml
ARGS=(loop.yaml);                          check cycle "base_config cycle" "loop.yaml -> sub/b.yaml -> "
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.n_embd=x); check override "override 'model.n_embd=x'" "model.n_embd"
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.nembd=64); check override-key "did you mean model.n_embd?"
ARGS=("$JDT_ROOT/configs/tiny.yaml" model);          check syntax-ov "unexpected argument 'model'"
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.n_head=5); check cross "model.n_head" "n_embd = 64"
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.n_layer=2147483648); check int-bound "model.n_layer" "at most 2147483647"
# a mapping of thousands of keys is refused at once (the duplicate checks were quadratic: 500k
# keys ran for minutes)
awk 'BEGIN { print "run:"; for (i = 0; i < 5000; i++) print "  k" i ": 1" }' >many.yaml
ARGS=(many.yaml);                          check many-keys "many.yaml:4098:3" "more than 4096 keys"
# a path the run would cut short in its file-name buffers (outputs went to a truncated directory)
ARGS=("$JDT_ROOT/configs/tiny.yaml" "run.out_dir=/tmp/$(printf 'd%.0s' $(seq 600))"); check longpath "run.out_dir" "at most 512"
# the config's bound is the data loader's (it refused 65..1024 only once the data was open)
ARGS=("$JDT_ROOT/configs/tiny.yaml" data.prefetch=65); check prefetch "data.prefetch" "0..64"
# a vocabulary of one token (it failed only once the synthetic data was being written, exit 1)
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.vocab_size=1); check vocab1 "model.vocab_size" ">= 2"
ARGS=("$JDT_ROOT/configs/tiny.yaml" runtime.loss_chunks=33); check chunks "runtime.loss_chunks" "33 slices" "model.seq_len = 32" "at most 32"
export JDT_MODEL_N_LAYER=3
ARGS=("$JDT_ROOT/configs/tiny.yaml" model.n_layer=3); check both-ways "command line" "environment" "JDT_MODEL_N_LAYER=3"
unset JDT_MODEL_N_LAYER
export JDT_OPTIMIZER_LR=fast
ARGS=("$JDT_ROOT/configs/tiny.yaml");                check env "environment variable JDT_OPTIMIZER_LR=fast" "optimizer.lr"
unset JDT_OPTIMIZER_LR
export JDT_OPTIMIZER_LRR=0.1
ARGS=("$JDT_ROOT/configs/tiny.yaml");                check env-unknown "JDT_OPTIMIZER_LRR" "did you mean JDT_OPTIMIZER_LR?"
unset JDT_OPTIMIZER_LRR
# What this build cannot run is refused by one check before any work (engine/train/caps.c):
# train, eval and the --nproc launcher give one line and exit 2; inspect still summarises the
# config and says why it cannot run it.
T=("$JDT_ROOT/configs/tiny.yaml" run.out_dir="$TMP/runs")
cap() {
  local name=$1 cmd=$2; shift 2
  "$BIN" $cmd "${ARGS[@]}" >out 2>err; local rc=$?
  [ $rc -eq 2 ] || { cat out err; fail "$name ($cmd): exit $rc, expected 2"; }
  [ "$(wc -l <err)" -eq 1 ] || { cat err; fail "$name ($cmd): expected one line on stderr"; }
  for w in "$@"; do grep -qF -- "$w" err || { cat err; fail "$name ($cmd): message lacks '$w'"; }; done
}
caps() { local name=$1; shift; cap "$name" train "$@"; cap "$name" eval "$@"; }
if ! "$BIN" version | grep -q '^backends:.* cuda'; then
  ARGS=("${T[@]}" runtime.backend=cuda);   caps cuda "runtime.backend" "CUDA build" "make CUDA=1"
fi
ARGS=("${T[@]}" "sharding.rules=[[batch, data], [embd, fsdp]]")
caps rule-axis "sharding.rules" "rule 2" "'embd'" "no model uses" "embed"
ARGS=("${T[@]}" "sharding.rules=[[batch, data], [embed, pipeline]]")
caps rule-mesh "sharding.rules" "pipeline"
# the launcher refuses once, before starting any rank
"$BIN" --nproc 2 "${T[@]}" mesh.data=2 "sharding.rules=[[batch, data], [embd, fsdp]]" >out 2>err; rc=$?
[ $rc -eq 2 ] || { cat out err; fail "launcher: exit $rc, expected 2"; }
[ "$(wc -l <err)" -eq 1 ] && grep -qF "sharding.rules" err || { cat err; fail "launcher: expected one line naming sharding.rules"; }
# a mesh the world cannot hold: the launcher says so once (jdt_train_check_mesh)
"$BIN" --nproc 2 "${T[@]}" mesh.data=2 mesh.fsdp=2 >out 2>err; rc=$?
[ $rc -eq 2 ] || { cat out err; fail "launcher mesh: exit $rc, expected 2"; }
[ "$(wc -l <err)" -eq 1 ] && grep -qF "mesh" err || { cat err; fail "launcher mesh: expected one line naming the mesh"; }
# inspect: the summary, plus the reason, exit 0
"$BIN" inspect "${T[@]}" "sharding.rules=[[batch, data], [embd, fsdp]]" >out 2>err || { cat out err; fail "inspect of an unrunnable config failed"; }
grep -q "not runnable by this build: sharding.rules" out || { cat out; fail "inspect does not say why it cannot run"; }
grep -q "compiled step" out && fail "inspect compiled a config this build cannot run"
[ ! -e "$TMP/runs" ] || fail "a refused run wrote $TMP/runs"

# no C compiler for the CPU backend's kernels: one line that says so, exit 1
"$BIN" "$JDT_ROOT/configs/tiny.yaml" run.steps=1 run.out_dir="$TMP/cc-runs" runtime.cc=no-such-cc-here \
  runtime.cache_dir="$TMP/cc-cache" checkpoint.every=0 >out 2>err; rc=$?
[ $rc -eq 1 ] || { cat out err; fail "no compiler: exit $rc, expected 1"; }
grep -c "error" err | grep -qx 1 && grep -qF "C compiler 'no-such-cc-here' not found" err ||
  { cat err; fail "no compiler: expected one error line naming it"; }
rm -rf "$TMP/cc-runs" "$TMP/cc-cache"

# nothing was written by any failing run (only our inputs and out/err are here)
extra=$(ls -A | grep -vE '^(typo|type|range|dup|syntax|loop|many)\.yaml$|^(sub|out|err)$' || true)
[ -z "$extra" ] || fail "failing runs wrote: $extra"
echo ok
