#!/usr/bin/env bash
# run-main.sh BIN — the README's main job (`make run`), after the build:
#   1. builds the corpus data/llm/input.txt from the fortune-cookie collection that Debian's
#      `fortunes` package ships (scripts/fortunes-corpus.sh: about 2.5 MB of English text, offline),
#   2. `jdt-train prepare configs/llm.yaml` turns it into HDF5 byte-token shards (once),
#   3. `jdt-train configs/llm.yaml` trains (resuming from the newest checkpoint if a previous
#      run was interrupted), then samples a few lines from the final checkpoint.
# Extra arguments are passed to the train command (e.g. run.steps=100).
# With data.train_path an http(s):// URL (in the config or as JDT_DATA_TRAIN_PATH), steps 1-2
# are skipped: the shards are fetched from there (docs/data.md "Remote data").
set -euo pipefail
BIN=${1:-build/jdt-train}; shift || true
CORPUS=data/llm/input.txt
TRAIN_PATH=$("$BIN" inspect configs/llm.yaml --print-config | sed -n 's/^  train_path: "\(.*\)"$/\1/p')
case "$TRAIN_PATH" in
  http://*|https://*|HTTP://*|HTTPS://*)
    echo "run-main: training from $TRAIN_PATH (fetched into the cache as it streams in)" ;;
  *)
    if [ ! -s "$CORPUS" ]; then
      bash "$(dirname "$0")/fortunes-corpus.sh" "$CORPUS"
      echo "run-main: corpus $CORPUS ($(wc -c < "$CORPUS") bytes from Debian's fortunes)"
    fi
    [ -s data/llm/train_000.h5 ] || "$BIN" prepare configs/llm.yaml ;;
esac
"$BIN" configs/llm.yaml "$@"
echo "--- sample from the trained model ---"
"$BIN" sample runs/llm/ckpt --prompt "The meaning of life is" --length 300 --temperature 0.8 --seed 7
"$BIN" plot runs/llm -o runs/llm/loss.png --log > /dev/null && \
  echo "run-main: loss curves in runs/llm/loss.png (compare runs: $BIN plot runs/a runs/b -o cmp.png;" \
       "TensorBoard: tensorboard --logdir runs)"
