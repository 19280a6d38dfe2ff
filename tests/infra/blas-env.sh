#!/usr/bin/env bash
# blas-env.sh [CMD [ARGS...]] — runs CMD with OPENBLAS_CORETYPE set to the kernels jdt-train runs
# on (`jdt-train version`'s "cpu: OpenBLAS <kernels> kernels" line; JDT_BIN, default
# build/jdt-train), unless the caller set it. The test binaries link OpenBLAS as jdt-train does
# but have no re-exec of their own (cmd/main.c, ensure_runtime_env): on a CPU that OpenBLAS does
# not know they would run its SSE3 fallback kernels, several times slower. Without CMD it
# prints the kernels' name (nothing when there is no binary or it does not say).
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  bin=${JDT_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/build/jdt-train}
  core=$("$bin" version 2>/dev/null | sed -nE 's/^cpu: OpenBLAS (.*) kernels;.*/\1/p')
  if [ -n "$core" ] && [ "$core" != unknown ]; then export OPENBLAS_CORETYPE="$core"; fi
fi
if [ $# -eq 0 ]; then echo "${OPENBLAS_CORETYPE:-}"; exit 0; fi
exec "$@"
