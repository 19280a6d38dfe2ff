#!/usr/bin/env bash
# build_switch_enum.sh — the build refuses a switch over ops (or dtypes) that misses one: the
# project's warning flags (the Makefile's WARN, with -Werror) include -Wswitch-enum, which names
# every enumerator a switch does not list, even when the switch has a `default:`. A switch that
# lists every op compiles; the same switch without JDT_OP_MATMUL, with or without `default:`,
# does not, and the compiler names the missing op. See docs/graph.md ("Adding an op").
set -uo pipefail
ROOT=${JDT_ROOT:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
CC=${CC:-cc}
WARN=$(make -s --no-print-directory -C "$ROOT" print-WARN) || fail "make print-WARN"
case " $WARN " in *" -Wswitch-enum "*) ;; *) fail "the Makefile's WARN lacks -Wswitch-enum: $WARN";; esac
case " $WARN " in *" -Werror "*) ;; *) WARN="$WARN -Werror";; esac
ops=$(sed -nE 's/^ *X\(([A-Z0-9_]+), "[a-z0-9_]+", -?[0-9]+, [A-Z]+\).*/\1/p' "$ROOT/engine/graph/graph.h")
[ "$(echo "$ops" | wc -l)" -gt 40 ] || fail "could not read the op list from graph.h"
grep -qx MATMUL <<<"$ops" || fail "MATMUL not in the op list"

# write_src FILE SKIP DEFAULT: a function with a switch over jdt_op listing every op but SKIP
write_src() {
  { echo '#include "graph/graph.h"'
    echo 'int op_kind(jdt_op op);'
    echo 'int op_kind(jdt_op op)'
    echo '{'
    echo '    switch (op) {'
    for o in $ops; do [ "$o" = "$2" ] || echo "    case JDT_OP_$o:"; done
    echo '        return 1;'
    [ "$3" = default ] && echo '    default:' && echo '        return 2;'
    echo '    }'
    echo '    return 0;'
    echo '}'; } >"$1"
}
compile() { $CC -std=c11 -I"$ROOT/engine" -I"$ROOT" -D_GNU_SOURCE $WARN -c "$1" -o "$TMP/out.o" 2>"$TMP/err"; }

write_src "$TMP/all.c" NONE none
compile "$TMP/all.c" || { cat "$TMP/err"; fail "a switch listing every op does not compile"; }
for d in none default; do
  write_src "$TMP/miss_$d.c" MATMUL $d
  if compile "$TMP/miss_$d.c"; then fail "a switch missing JDT_OP_MATMUL ($d) compiled"; fi
  grep -q "JDT_OP_MATMUL" "$TMP/err" || { cat "$TMP/err"; fail "the error does not name JDT_OP_MATMUL"; }
done

# dtypes too: a switch missing JDT_DTYPE_BF16 behind a default: is refused
cat >"$TMP/dt.c" <<'SRC'
#include "core/core.h"
int dt_size(jdt_dtype dt);
int dt_size(jdt_dtype dt)
{
    switch (dt) {
    case JDT_DTYPE_F32: case JDT_DTYPE_F64: case JDT_DTYPE_I32: case JDT_DTYPE_U8:
    case JDT_DTYPE_U16: case JDT_DTYPE_U32: case JDT_DTYPE_COUNT:
        return 1;
    default:
        return 0;
    }
}
SRC
if compile "$TMP/dt.c"; then fail "a dtype switch missing JDT_DTYPE_BF16 compiled"; fi
grep -q "JDT_DTYPE_BF16" "$TMP/err" || { cat "$TMP/err"; fail "the error does not name JDT_DTYPE_BF16"; }
echo ok
