#!/usr/bin/env bash
# bundle.sh — packs what scripts/gpu/check.sh needs on a GPU machine that has none of this
# project's C libraries: bin/jdt-train, bin/check_cuda and bin/check_cuk (built here with make CUDA=1),
# libs.tar.xz (every shared library they load except glibc's own and the CUDA/NCCL libraries,
# which come from the GPU machine), repo/ (configs and the scripts check.sh runs) and cache/
# (the kernels of check.sh's training runs compiled for sm_90 ahead of time: check.sh
# PRECOMPILE, `jdt-train inspect --cuda-arch`), so the GPU machine's minutes are not spent in NVRTC.
# Usage: scripts/gpu/bundle.sh OUT_DIR      then there: bash OUT_DIR/repo/scripts/gpu/check.sh OUT_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTD=${1:?usage: bundle.sh OUT_DIR}
cd "$ROOT"
make -j2 CUDA=1 build-cuda/jdt-train build-cuda/tests/check_cuda build-cuda/tests/check_cuk >/dev/null
rm -rf "$OUTD/bin" "$OUTD/repo" "$OUTD/libs.tar.xz" "$OUTD/cache"
mkdir -p "$OUTD/bin" "$OUTD/repo/scripts/bench"
cp build-cuda/jdt-train build-cuda/tests/check_cuda build-cuda/tests/check_cuk "$OUTD/bin/"
cp -r configs "$OUTD/repo/"
cp -r scripts/gpu "$OUTD/repo/scripts/"
# every script check.sh runs from $ROOT (a stage whose script is missing there cannot run)
for f in $(grep -o '\$ROOT/scripts/[A-Za-z0-9_./-]*' scripts/gpu/check.sh | sed 's|^\$ROOT/||' | sort -u); do
  [ -f "$f" ] || { echo "bundle.sh: check.sh runs $f, which is missing" >&2; exit 1; }
  mkdir -p "$OUTD/repo/$(dirname "$f")"; cp "$f" "$OUTD/repo/$f"
done
tmp=$(mktemp -d)
ldd build-cuda/jdt-train build-cuda/tests/check_cuda build-cuda/tests/check_cuk | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libnvrtc[^/]*|libcublas[^/]*|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$tmp/"; done
tar -cJf "$OUTD/libs.tar.xz" -C "$tmp" .
PRECOMPILE="$OUTD/cache" OUT="$tmp/out" bash scripts/gpu/check.sh
rm -rf "$tmp"
du -sh "$OUTD"
