#!/usr/bin/env bash
# run-main.sh BIN — the README's main job (`make run`), after the build:
#   1. builds the corpus data/llm/input.txt from the fortune-cookie collection that Debian's
#      `fortunes` package ships (about 2.4 MB of English text, available offline),
#   2. `jdt-train prepare configs/llm.yaml` turns it into HDF5 byte-token shards (once),
#   3. `jdt-train configs/llm.yaml` trains (resuming from the newest checkpoint if a previous
#      run was interrupted), then samples a few lines from the final checkpoint.
# Extra arguments are passed to the train command (e.g. run.steps=100).
set -euo pipefail
BIN=${1:-build/jdt-train}; shift || true
CORPUS=data/llm/input.txt
FORTUNES=/usr/share/games/fortunes
if [ ! -s "$CORPUS" ]; then
  [ -d "$FORTUNES" ] || { echo "run-main: $FORTUNES is missing (apt-get install fortunes)" >&2; exit 1; }
  mkdir -p data/llm
  # every plain-text fortune file (not the .dat indexes, .u8 links or the ASCII-art files);
  # the '%' separator lines become blank lines
  for f in "$FORTUNES"/*; do
    case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue;; esac
    [ -f "$f" ] && sed 's/^%$//' "$f"
  done > "$CORPUS.tmp"
  mv "$CORPUS.tmp" "$CORPUS"
  echo "run-main: corpus $CORPUS ($(wc -c < "$CORPUS") bytes from $FORTUNES)"
fi
[ -s data/llm/train_000.h5 ] || "$BIN" prepare configs/llm.yaml
"$BIN" configs/llm.yaml "$@"
echo "--- sample from the trained model ---"
"$BIN" sample runs/llm/ckpt --prompt "The meaning of life is" --length 300 --temperature 0.8 --seed 7
"$BIN" plot runs/llm -o runs/llm/loss.png --log > /dev/null && \
  echo "run-main: loss curves in runs/llm/loss.png (compare runs: $BIN plot runs/a runs/b -o cmp.png;" \
       "TensorBoard: tensorboard --logdir runs)"
