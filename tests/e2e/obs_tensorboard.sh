#!/usr/bin/env bash
# obs_tensorboard.sh — a tiny run writes TensorBoard events and metrics that TensorBoard's own
# event reader (the `tensorboard` PyPI package, in a venv cached under build/tb-venv) reads back
# with every metric, and `jdt-train plot` draws the run to a non-trivial PNG; a run resumed from
# a checkpoint older than its last logged step shows each step once in metrics.jsonl and in
# TensorBoard.
# Skips (77) with a reason only when the venv cannot be created or PyPI cannot be reached (a
# failure under CI=true, infra_skip).
set -uo pipefail
cd "$JDT_TMP"
fail() { echo "FAIL: $*"; exit 1; }
"$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs" run.steps=8 run.log_every=2 \
  run.eval_every=4 > log 2>&1 || { cat log; fail "training failed"; }
grep -q "MFU reference:" log || fail "no MFU reference line"
grep -q "peak RSS" log || fail "no peak RSS in the progress line"
ev=$(ls runs/tiny/events.out.tfevents.* 2>/dev/null | head -1)
[ -n "$ev" ] || fail "no event file"
grep -q '"peak_rss_mb"' runs/tiny/metrics.jsonl || fail "no peak_rss_mb in metrics.jsonl"
"$JDT_BIN" plot runs/tiny -o tiny.png > /dev/null || fail "plot failed"
[ "$(stat -c %s tiny.png)" -gt 20000 ] || fail "tiny.png is too small to be a plot"
"$JDT_BIN" plot runs/nope -o x.png 2>err; [ $? -eq 1 ] || fail "plot of a missing run: want exit 1"
grep -q "metrics.jsonl" err || fail "plot error does not name the file"

VENV="$JDT_ROOT/build/tb-venv"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
  . "$JDT_ROOT/tests/infra/lib.sh"
  # --clear: a venv left half-made by an interrupted run (no pip) is made afresh
  python3 -m venv --clear "$VENV" > /dev/null 2>&1 || infra_skip "python3 -m venv failed"
  "$VENV/bin/pip" install -q tensorboard > pip.log 2>&1 ||
    infra_skip "pip cannot install tensorboard (PyPI unreachable?): $(tail -1 pip.log)"
fi
"$VENV/bin/python" - "$ev" <<'PY' || fail "TensorBoard's reader rejected the event file"
import sys
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.backend.event_processing import event_accumulator as ea
tags = {}
n = 0
for ev in EventFileLoader(sys.argv[1]).Load():   # checks the framing and both CRCs
    n += 1
    for v in ev.summary.value:
        tags.setdefault(v.tag, []).append((ev.step, v))
assert n > 10, n
want = ["loss/train", "loss/val", "optim/lr", "optim/grad_norm", "perf/tokens_per_s",
        "perf/mfu_percent", "perf/step_ms", "perf/data_wait_ms", "memory/peak_rss_mb", "config"]
missing = [t for t in want if t not in tags]
assert not missing, missing
assert len(tags["loss/train"]) == 8, len(tags["loss/train"])
acc = ea.EventAccumulator(sys.argv[1].rsplit("/", 1)[0]); acc.Reload()
losses = [s.value for s in acc.Scalars("loss/train")]
assert 1 < losses[0] < 20 and losses[-1] < losses[0], losses
assert "model" in acc.Tensors("config")[0].tensor_proto.string_val[0].decode()
print("tensorboard read", n, "events;", len(tags), "tags; loss", losses[0], "->", losses[-1])
PY

# a run that logged steps past its last checkpoint (5-7, its step-7 save lost as in a kill),
# then resumed from step 4 to 10: metrics.jsonl and TensorBoard's reader (every event file of
# the run) show each step once, the resumed values
R=("$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/rk" run.log_every=1 run.eval_every=0
   checkpoint.every=4 checkpoint.keep=5)
"$JDT_BIN" "${R[@]}" run.steps=4 > rk0.log 2>&1 || { cat rk0.log; fail "run to step 4"; }
"$JDT_BIN" "${R[@]}" run.steps=7 checkpoint.resume=auto > rk1.log 2>&1 || { cat rk1.log; fail "run to step 7"; }
rm -rf rk/tiny/ckpt/step_000007
[ "$(grep -c '"loss"' rk/tiny/metrics.jsonl)" -eq 7 ] || fail "want 7 steps logged before the resume"
last=4
"$JDT_BIN" "${R[@]}" run.steps=$((last + 6)) checkpoint.resume=auto > rk2.log 2>&1 ||
  { cat rk2.log; fail "resume failed"; }
grep -qE "metrics.jsonl: dropped [1-9][0-9]* line\(s\) of the steps after 4" rk2.log ||
  fail "the resume did not say it dropped the lines of steps 5-7: $(grep metrics.jsonl rk2.log)"
steps=$(grep -o '"step": [0-9]*, "loss"' rk/tiny/metrics.jsonl | awk '{print $2}' | tr -d ,)
[ "$(echo "$steps" | sort -n | uniq -d)" = "" ] || fail "metrics.jsonl repeats steps: $(echo $steps)"
[ "$(echo "$steps" | wc -l)" -eq $((last + 6)) ] || fail "metrics.jsonl has $(echo "$steps" | wc -l) steps, want $((last + 6))"
"$VENV/bin/python" - rk/tiny $((last + 6)) <<'PY' || fail "TensorBoard shows the resumed run's steps more than once"
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1]); acc.Reload()
steps = [s.step for s in acc.Scalars("loss/train")]
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
print("tensorboard after the resume:", len(steps), "steps, each once")
PY
echo ok
