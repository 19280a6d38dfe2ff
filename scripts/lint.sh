#!/usr/bin/env bash
# lint.sh — `make lint`: clang-format (the repository's .clang-format, --dry-run -Werror) and
# cppcheck (warnings and portability, with scripts/lint/cppcheck.supp) over the C sources:
# engine/, cmd/, models/, datasets/, tests/unit/, scripts/bench/. Files listed in
# scripts/lint/format-baseline.txt are not format-checked yet (see that file). Exits non-zero
# on any finding, printing each.
set -uo pipefail
cd "$(dirname "$0")/.."
for tool in clang-format cppcheck; do
  command -v "$tool" >/dev/null || { echo "lint: $tool is not installed (scripts/install-deps.sh)"; exit 2; }
done
mapfile -t files < <(git ls-files 'engine/*.[ch]' 'cmd/*.[ch]' 'models/*.[ch]' 'datasets/*.[ch]' \
                                  'tests/unit/*.[ch]' 'tests/infra/*.c' 'scripts/bench/*.c' 2>/dev/null)
# a checkout without git metadata: every file on disk
[ ${#files[@]} -gt 0 ] || mapfile -t files < <(ls engine/*/*.[ch] cmd/*.[ch] models/*.[ch] \
                                                 datasets/*.[ch] tests/unit/*.[ch] scripts/bench/*.c 2>/dev/null)
baseline=scripts/lint/format-baseline.txt
rc=0

fmt_bad=0; stale=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  if grep -qxF -- "$f" "$baseline"; then
    clang-format --dry-run -Werror "$f" >/dev/null 2>&1 && stale+=("$f")
    continue
  fi
  if ! clang-format --dry-run -Werror "$f" 2>/tmp/lint-fmt.$$; then
    head -20 /tmp/lint-fmt.$$; fmt_bad=$((fmt_bad + 1))
  fi
done
rm -f /tmp/lint-fmt.$$
if [ $fmt_bad -gt 0 ]; then
  echo "lint: $fmt_bad file(s) not in .clang-format style: run clang-format -i on them"; rc=1
fi
[ ${#stale[@]} -eq 0 ] || echo "lint: note: already formatted, delete from $baseline: ${stale[*]}"

c_files=()
for f in "${files[@]}"; do case $f in *.c) [ -f "$f" ] && c_files+=("$f");; esac; done
if ! cppcheck -q --error-exitcode=1 --enable=warning,portability --std=c11 --inline-suppr \
     --suppressions-list=scripts/lint/cppcheck.supp -Iengine -I. -D_GNU_SOURCE \
     -j "$(nproc 2>/dev/null || echo 2)" "${c_files[@]}"; then
  echo "lint: cppcheck found problems (fix them, or add a reasoned line to scripts/lint/cppcheck.supp)"
  rc=1
fi
[ $rc -eq 0 ] && echo "lint: ok (${#files[@]} files; $(grep -cv '^#' "$baseline") awaiting clang-format)"
exit $rc
