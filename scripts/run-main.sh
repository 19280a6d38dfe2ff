#!/usr/bin/env bash
# run-main.sh BIN — the README's main job: build has run; run jdt-train on configs/llm.yaml.
set -euo pipefail
BIN=${1:-build/jdt-train}
exec "$BIN" inspect configs/llm.yaml
