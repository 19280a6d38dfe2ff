#!/usr/bin/env bash
# fault_messages.sh — clean error messages (issue 11, item 5): config files and overrides full
# of newlines, carriage returns and terminal escapes give one printable error line (exit 2);
# a base_config that is a FIFO, a device or a directory is refused at once instead of hanging;
# no error ends in an empty detail after a colon.
# e2e: exclusive (peer time-outs)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
# one_line RC: the command exited RC with exactly one stderr line, all printable, not ending ": "
one_line() {
  local want=$1 rc=$2
  [ "$rc" -eq "$want" ] || { cat -A "$TMP/err" | head -5; fail "exit $rc, expected $want"; }
  [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat -A "$TMP/err" | head -5; fail "not one line"; }
  LC_ALL=C grep -q $'[\x01-\x09\x0b-\x1f\x7f]' "$TMP/err" && { cat -A "$TMP/err"; fail "control characters in the error"; }
  grep -qE ':[[:space:]]*$' "$TMP/err" && { cat -A "$TMP/err"; fail "error ends with an empty detail"; }
  return 0
}

# 1. control characters in a config file's keys and values
printf 'run:\n  name: "a\\nb\\x1b[31mred"\n  steps: "x\\ry"\n' > "$TMP/a.yaml"
"$BIN" inspect --no-compile "$TMP/a.yaml" >/dev/null 2>"$TMP/err"; one_line 2 $?
grep -q 'x\\ry' "$TMP/err" || fail "carriage return not shown as \\r: $(cat "$TMP/err")"
printf 'run:\n  "st\\x1b]0;pwned\\x07eps": 3\n' > "$TMP/b.yaml"
"$BIN" inspect --no-compile "$TMP/b.yaml" >/dev/null 2>"$TMP/err"; one_line 2 $?
grep -q 'x1b\]0;pwned\\x07' "$TMP/err" || fail "escape sequence not shown escaped: $(cat "$TMP/err")"

# 2. overrides with control bytes (keys and values), a small deterministic fuzz
python3 - > "$TMP/overrides" <<'PY'
import random
r = random.Random(11)
keys = ["run.steps", "model.n_layer", "optimizer.lr", "run.name", "data.batch_size", "x.y"]
bad = ["\n", "\r", "\x1b[2J", "\x1b]0;t\x07", "\x00", "\x7f", "\t", "\x9b", "\xc2\x9b"]
for i in range(60):
    k = r.choice(keys)
    parts = [r.choice(bad) if r.random() < 0.4 else r.choice("abc19=.-") for _ in range(r.randint(1, 8))]
    s = "".join(parts).replace("\x00", "")
    if r.random() < 0.5: print(repr(k + "=" + s))
    else: print(repr(k[:3] + s + k[3:] + "=1"))
PY
n=0
while IFS= read -r line; do
  ov=$(python3 -c "import ast,sys; sys.stdout.write(ast.literal_eval(sys.argv[1]))" "$line")
  "$BIN" inspect --no-compile configs/tiny.yaml "$ov" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 0 ] && continue
  one_line 2 $rc; n=$((n + 1))
done < "$TMP/overrides"
[ $n -ge 40 ] || fail "only $n of 60 fuzzed overrides were errors"

# 3. base_config that is not a regular file: refused at once, never a hang
mkfifo "$TMP/fifo"
for target in "$TMP/fifo" /dev/zero "$TMP"; do
  printf 'base_config: %s\n' "$target" > "$TMP/c.yaml"
  timeout 10 "$BIN" inspect --no-compile "$TMP/c.yaml" >/dev/null 2>"$TMP/err"; rc=$?
  [ $rc -eq 124 ] && fail "base_config $target hangs"
  one_line 2 $rc
  grep -qE "not a regular file|Is a directory" "$TMP/err" || fail "base_config $target: $(cat "$TMP/err")"
done
echo "one printable line for $n fuzzed overrides, control characters in files, non-regular base_config"
