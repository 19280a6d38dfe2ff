#!/usr/bin/env bash
# fortunes-corpus.sh OUT — writes an English text corpus to OUT, offline: every plain-text file
# of the fortune-cookie collection in Debian's `fortunes` package (/usr/share/games/fortunes:
# quotations, jokes, poems, definitions; about 2.5 MB), in name order, without the .dat indexes,
# the .u8 links or the ASCII-art files; the '%' separator lines become blank lines. The same
# package version gives the same bytes. Used by `make run` (scripts/run-main.sh) and by the
# convergence test tests/e2e/train_fortunes.sh.
# Exit: 0 written, 1 the package is missing (`make deps` installs it) or OUT cannot be written.
set -euo pipefail
OUT=${1:?usage: fortunes-corpus.sh OUT}
FORTUNES=${JDT_FORTUNES_DIR:-/usr/share/games/fortunes}
[ -d "$FORTUNES" ] || { echo "fortunes-corpus: $FORTUNES is missing (apt-get install fortunes, or make deps)" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
for f in "$FORTUNES"/*; do
  case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue;; esac
  [ -f "$f" ] && sed 's/^%$//' "$f"
done >"$OUT.tmp"
[ -s "$OUT.tmp" ] || { rm -f "$OUT.tmp"; echo "fortunes-corpus: no text files in $FORTUNES" >&2; exit 1; }
mv "$OUT.tmp" "$OUT"
