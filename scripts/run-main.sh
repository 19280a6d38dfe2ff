#!/usr/bin/env bash
# run-main.sh BIN — the README's main job (`make run`). Training is not built yet, so for now it
# validates configs/llm.yaml and prints its summary; it becomes `BIN train configs/llm.yaml`
# (after `prepare`) when the training loop lands.
set -euo pipefail
BIN=${1:-build/jdt-train}
exec "$BIN" inspect configs/llm.yaml
