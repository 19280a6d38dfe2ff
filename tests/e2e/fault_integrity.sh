#!/usr/bin/env bash
# fault_integrity.sh — flipped bits are detected (issue 11, item 3): one bit of a checkpoint's
# step, a byte of its stored config, one byte inside the token data of a prepared shard. Each
# is an error naming the damaged file, exit 1, before any training on bad data; `sample` on
# a damaged checkpoint exits 1 (run-time), not 2 (usage). Then checkpoints that read cleanly
# but are not what this run wrote: a renamed copy, a newer directory without its state.h5,
# another model's (exit 2).
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { tail -n 5 "$TMP/err"; fail "'$*' exited $rc, expected $want"; }; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
# flip FILE PATTERN_HEX SKIP XOR: xor the byte SKIP bytes after the first match of PATTERN
flip() { python3 - "$@" <<'PY'
import sys
path, pat, skip, xor = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4], 0)
b = bytearray(open(path, "rb").read())
i = b.find(pat)
assert i >= 0, "pattern not found"
b[i + skip] ^= xor
open(path, "wb").write(b)
PY
}

# 1. a checkpoint at step 8 whose step attribute has one flipped bit (8 -> 12)
R="configs/tiny.yaml run.out_dir=$TMP/runs run.eval_every=0"
expect 0 "$BIN" $R run.steps=8 checkpoint.every=8
ck="$TMP/runs/tiny/ckpt/step_000008"
cp -r "$ck" "$TMP/good"
# the attribute message: name "step\0" padded to 8 bytes, then type and space, then the value;
# find the int64 8 that follows the name
python3 - "$ck/state.h5" <<'PY' || fail "could not locate the step attribute"
import sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
i = b.find(b"step\x00\x00\x00\x00")
assert i >= 0
j = b.find((8).to_bytes(8, "little"), i + 8, i + 200)
assert j >= 0
b[j] ^= 0x04  # 8 -> 12
open(path, "wb").write(b)
PY
expect 1 "$BIN" $R run.steps=16 checkpoint.resume=auto
grep -q "step_000008/state.h5: the checkpoint's metadata (step 12, .*fails its checksum" "$TMP/err" ||
  { cat "$TMP/err"; fail "flipped step not detected"; }
grep -q "^step 9/" "$TMP/err" && fail "trained after a damaged checkpoint"
expect 1 "$BIN" sample "$ck" --prompt "ab" --length 4
grep -q "fails its checksum" "$TMP/err" || { cat "$TMP/err"; fail "sample: flipped step not detected"; }

# 2. a damaged stored config: also caught by the metadata checksum, sample exits 1
rm -rf "$ck"; cp -r "$TMP/good" "$ck"
flip "$ck/state.h5" "$(printf 'n_layer: 2' | xxd -p)" 9 0x01  # n_layer: 2 -> 3
expect 1 "$BIN" sample "$ck" --prompt "ab" --length 4
grep -q "fails its checksum" "$TMP/err" || { cat "$TMP/err"; fail "damaged config not detected"; }

# 3. token shards: a byte flipped inside /tokens is detected when the shard is opened
awk 'BEGIN { for (i = 0; i < 2000; i++) printf "the quick brown fox %d jumps over the lazy dog\n", i;
             print "ZQXJZQXJZQXJ"; for (i = 0; i < 2000; i++) print "tail line", i }' > "$TMP/text.txt"
D="data.format=tokens data.source=$TMP/text.txt data.train_path=$TMP/data data.val_path=$TMP/data data.n_shards=2 data.val_fraction=0.05"
expect 0 "$BIN" prepare configs/tiny.yaml $D
expect 0 "$BIN" $R run.out_dir="$TMP/r2" run.steps=2 $D
shard=$(python3 -c "
import sys,glob
for f in sorted(glob.glob('$TMP/data/train_*.h5')):
    if bytes.fromhex('5a0051005800') in open(f,'rb').read(): print(f); break")
[ -n "$shard" ] || fail "could not find the marker in a shard"
flip "$shard" 5a0051005800 2 0x01  # 'Q' -> 'P': still a valid byte token
expect 1 "$BIN" $R run.out_dir="$TMP/r3" run.steps=2 $D
grep -q "$(basename "$shard"): the data fails its checksum" "$TMP/err" ||
  { cat "$TMP/err"; fail "flipped token byte not detected or wrong file named"; }
[ "$(grep -c error "$TMP/err")" -eq 1 ] || fail "more than one error line"

# 4. checkpoints that read cleanly but are not what the run wrote (resume: auto)
rm -rf "$ck"; cp -r "$TMP/good" "$ck"; A="$R checkpoint.resume=auto"
#  a copy under a newer step's name: its step is not its directory's
cp -r "$ck" "$TMP/runs/tiny/ckpt/step_000010"
expect 1 "$BIN" $A run.steps=16
grep -q "step_000010: corrupt checkpoint: it says step 8, its directory step 10" "$TMP/err" ||
  { cat "$TMP/err"; fail "renamed checkpoint not detected"; }
#  a newer step's directory without its state.h5: an error, not a silent start from step 8
rm "$TMP/runs/tiny/ckpt/step_000010/state.h5"
expect 1 "$BIN" $A run.steps=16
grep -q "step_000010: damaged checkpoint (no readable state.h5)" "$TMP/err" ||
  { cat "$TMP/err"; fail "damaged newer checkpoint not detected"; }
grep -q "^step 9/" "$TMP/err" && fail "trained past a damaged newer checkpoint"
rm -rf "$TMP/runs/tiny/ckpt/step_000010"
#  another model whose tensors fit (one layer of the two): refused, not loaded in part
expect 2 "$BIN" $A run.steps=16 model.n_layer=1
grep -q "the checkpoint holds another model (the checkpoint's model.n_layer is 2, this config's 1)" "$TMP/err" ||
  { cat "$TMP/err"; fail "resume with another model not refused"; }
expect 2 "$BIN" $A run.steps=16 model.bias=false
grep -q "model.bias is true, this config's false" "$TMP/err" || { cat "$TMP/err"; fail "bias change not refused"; }
#  another optimizer (adamw's m and v against sgd's momentum): named, not "tensor missing";
#  init_from with another model too; an evaluation reads the params alone, so any optimizer
expect 2 "$BIN" $A run.steps=16 optimizer.type=sgd
grep -q "holds another optimizer's state (the checkpoint's optimizer.type is adamw, this config's sgd)" "$TMP/err" ||
  { cat "$TMP/err"; fail "resume with another optimizer not named"; }
expect 2 "$BIN" $A run.steps=16 run.name=other checkpoint.resume=none checkpoint.init_from="$TMP/runs/tiny/ckpt" model.n_layer=1
grep -q "checkpoint.init_from .*step_000008: the checkpoint holds another model (the checkpoint's model.n_layer is 2, this config's 1)" "$TMP/err" ||
  { cat "$TMP/err"; fail "init_from another model not named"; }
expect 0 "$BIN" eval $A optimizer.type=sgd
grep -q "^val loss" "$TMP/out" || { cat "$TMP/out" "$TMP/err"; fail "eval under another optimizer"; }
expect 0 "$BIN" $A run.steps=10 model.dropout=0.1 # not the model's parameters: resumes
grep -q "resumed from .*step_000008 at step 8" "$TMP/err" || { cat "$TMP/err"; fail "dropout change refused"; }
echo "flipped step, damaged config, flipped token byte, renamed and damaged checkpoints, another model: detected"
