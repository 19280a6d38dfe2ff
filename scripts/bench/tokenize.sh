#!/usr/bin/env bash
# tokenize.sh [VOCAB] [REPS] — byte-level BPE encode speed on one core, in one run:
# jdt (datasets/bpe.c through build/bench/bpe_tool) vs Hugging Face `tokenizers` vs `tiktoken`,
# all with the same vocabulary and merges (a GPT-2-style tokenizer of VOCAB ids, default
# 32000, trained by `tokenizers` on the fortunes corpus of `make run`) on the same text.
# Each side encodes the whole corpus as one string, from a cold cache, best of REPS (3).
# All three are pinned to one CPU (taskset) and RAYON_NUM_THREADS=1 for `tokenizers`.
# The Python side runs in build/pyvenv (made from PyPI if missing). Numbers go in docs/perf.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VOCAB=${1:-32000}; REPS=${2:-3}
TOOL=$ROOT/build/bench/bpe_tool; REF=$ROOT/tests/e2e/bpe_ref.py; VENV=$ROOT/build/pyvenv
[ -x "$TOOL" ] || { echo "tokenize: $TOOL missing (make bench-build)" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import tokenizers, tiktoken" 2>/dev/null; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q tokenizers tiktoken
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue;; esac
  [ -f "$f" ] && sed 's/^%$//' "$f"
done > "$W/corpus.txt"
"$VENV/bin/python" "$REF" train "$W/corpus.txt" "$VOCAB" "$W/tok.json"
CPU=$(taskset -pc $$ | sed -E 's/.*: ([0-9]+).*/\1/')
echo "corpus $(wc -c < "$W/corpus.txt") bytes, vocab $VOCAB, pinned to CPU $CPU, load: $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c "$CPU" "$TOOL" bench "$W/tok.json" "$W/corpus.txt" "$REPS"
RAYON_NUM_THREADS=1 taskset -c "$CPU" "$VENV/bin/python" "$REF" bench "$W/tok.json" "$W/corpus.txt" "$REPS"
