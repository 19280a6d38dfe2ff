#!/usr/bin/env bash
# train_threads.sh — the adaptive thread count (runtime.adaptive_threads, engine/runtime/
# threads.c): a run that probes 1 thread against 2 every few steps (JDT_THREAD_PROBE_EVERY=2)
# trains to the same losses as a run pinned to 2 threads, reuses its compiled step (the
# thread count is a variable in the generated C, not a literal), and the pinned run never
# probes, and that 1 and 2 threads give bitwise the same losses (every logged loss, printed
# to 17 digits, over 20 steps): GEMMs are cut into tiles by shape (each a single-threaded
# SGEMM over all of K), whole-domain reductions add per-chunk partials in chunk order, and
# row kernels and attention split work without reordering any sum, so the thread count
# changes no bit, and neither does the tuner switching it mid-run. Then OpenMP settings that
# shrink a team (OMP_DYNAMIC, OMP_THREAD_LIMIT) with bf16 GEMMs: finite losses, the same ones.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" | tail -n 20; fail "'$*' exited $rc, expected $want"; }; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
# the tiny GPT of issue 14: loops big enough to run parallel regions
cat >"$TMP/t.yaml" <<YAML
run: {name: t, out_dir: $TMP/runs, steps: 20, log_every: 1, eval_every: 0}
model: {type: gpt, vocab_size: 256, seq_len: 64, n_layer: 2, n_embd: 128, n_head: 4}
data: {format: synthetic, batch_size: 16, micro_batch_size: 16}
optimizer: {lr: 0.001, warmup_steps: 2}
checkpoint: {every: 0, resume: none}
runtime: {threads: 2}
YAML
losses() { grep '"loss"' "$1" | sed -E 's/.*"loss": ([0-9.e+-]+).*/\1/'; }

# 1. pinned to 2 threads: no probes
expect 0 "$BIN" "$TMP/t.yaml" run.name=pinned runtime.adaptive_threads=false --log-level debug
grep -q 'threads: ' "$TMP/err" && fail "a pinned run probed or switched: $(grep 'threads: ' "$TMP/err")"
losses "$TMP/runs/pinned/metrics.jsonl" >"$TMP/pinned"
[ "$(wc -l <"$TMP/pinned")" -eq 20 ] || fail "pinned run logged $(wc -l <"$TMP/pinned") losses"

# 2. adaptive, probing every 2 runs: runs with 1 thread, same compiled step, same losses
JDT_THREAD_PROBE_EVERY=2 expect 0 "$BIN" "$TMP/t.yaml" run.name=probed --log-level debug
grep -q 'step compiled in .*(cache hit)' "$TMP/err" || fail "the probing run recompiled: $(grep 'compiled' "$TMP/err")"
n=$(grep -c 'probes 1 threads against 2\|probes 2 threads against 1' "$TMP/err")
[ "$n" -ge 1 ] || fail "no probe in 20 steps: $(grep 'threads:' "$TMP/err")"
losses "$TMP/runs/probed/metrics.jsonl" >"$TMP/probed"
cmp -s "$TMP/pinned" "$TMP/probed" ||
  fail "the probing run's losses differ from the pinned run's: $(paste "$TMP/pinned" "$TMP/probed" | head -20 | tr '\n' ' ')"

# 3. pinned to 1 thread: bitwise the same losses as 2 threads
expect 0 "$BIN" "$TMP/t.yaml" run.name=one runtime.threads=1 runtime.adaptive_threads=false
losses "$TMP/runs/one/metrics.jsonl" >"$TMP/one"
cmp -s "$TMP/pinned" "$TMP/one" ||
  fail "1 and 2 threads differ: $(paste "$TMP/pinned" "$TMP/one" | head -20 | tr '\n' ' ')"
echo "$n probes; switches: $(grep -o '[0-9]* instead of [0-9]* from run [0-9]*' "$TMP/err" | tr '\n' ';')"

# 4. OpenMP settings that shrink a team (OMP_DYNAMIC=true; OMP_THREAD_LIMIT=1) under bf16
#    GEMMs through oneDNN, whose work split is planned for the thread count: a team of fewer
#    left part of each product unwritten, and the first step's gradient norm was NaN. Dynamic
#    teams are turned off (the same losses as without); a limit of 1 runs on 1 thread.
bf="precision.compute=bf16 precision.activations=bf16 runtime.adaptive_threads=false run.steps=6"
expect 0 "$BIN" "$TMP/t.yaml" run.name=bf $bf
losses "$TMP/runs/bf/metrics.jsonl" >"$TMP/bf"
OMP_DYNAMIC=true expect 0 "$BIN" "$TMP/t.yaml" run.name=dyn $bf
losses "$TMP/runs/dyn/metrics.jsonl" >"$TMP/dyn"
cmp -s "$TMP/bf" "$TMP/dyn" ||
  fail "OMP_DYNAMIC=true changed the losses: $(paste "$TMP/bf" "$TMP/dyn" | tr '\n' ' ')"
OMP_THREAD_LIMIT=1 expect 0 "$BIN" "$TMP/t.yaml" run.name=lim $bf
losses "$TMP/runs/lim/metrics.jsonl" >"$TMP/lim"
[ "$(grep -c '^[0-9]' "$TMP/lim")" -eq 6 ] || fail "OMP_THREAD_LIMIT=1: losses $(cat "$TMP/lim" | tr '\n' ' ')"
echo "ok: OMP_DYNAMIC and OMP_THREAD_LIMIT"
# OMP_PROC_BIND=master puts a team on its primary thread's place (here one CPU): kept, and said
OMP_PROC_BIND=master OMP_PLACES=threads expect 0 "$BIN" "$TMP/t.yaml" run.name=prim run.steps=1
grep -q "OMP_PROC_BIND=master binds all 2 threads to the primary thread's place (1 CPU)" "$TMP/err" ||
  fail "no warning for OMP_PROC_BIND=master: $(cat "$TMP/err")"
OMP_PROC_BIND=close OMP_PLACES=threads expect 0 "$BIN" "$TMP/t.yaml" run.name=close run.steps=1
grep -q "OMP_PROC_BIND" "$TMP/err" && fail "a warning for OMP_PROC_BIND=close: $(cat "$TMP/err")"
echo "ok: OMP_PROC_BIND=master said"

# 5. a bad value is a config error
expect 2 "$BIN" "$TMP/t.yaml" runtime.adaptive_threads=maybe
grep -q 'adaptive_threads' "$TMP/err" || fail "bad adaptive_threads not named: $(cat "$TMP/err")"
echo ok
