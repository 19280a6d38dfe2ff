#!/usr/bin/env bash
# blas-env.sh — sourced (`. tests/infra/blas-env.sh`): exports OPENBLAS_CORETYPE as the kernels
# jdt-train runs on (`jdt-train version`'s "cpu: OpenBLAS <kernels> kernels" line; JDT_BIN,
# default build/jdt-train), unless the caller set it or the binary does not say. The test
# binaries and the benchmark's peers link OpenBLAS as jdt-train does but have no re-exec of
# their own (cmd/main.c, ensure_runtime_env): on a CPU that OpenBLAS does not know they would run
# its SSE3 fallback kernels, several times slower.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  jdt_blas_bin=${JDT_BIN:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/jdt-train}
  jdt_blas_core=$("$jdt_blas_bin" version 2>/dev/null | sed -nE 's/^cpu: OpenBLAS (.*) kernels;.*/\1/p' || true)
  if [ -n "$jdt_blas_core" ] && [ "$jdt_blas_core" != unknown ]; then
    export OPENBLAS_CORETYPE="$jdt_blas_core"
  fi
  unset jdt_blas_bin jdt_blas_core
fi
