#!/usr/bin/env bash
# install-deps.sh — installs the Debian packages jdt-train needs to build, test and run.
# Idempotent and quick when everything is present: it asks dpkg first and runs apt-get only
# for what is missing (apt-get update once, first). Needs root (or sudo) to install.
set -euo pipefail

PKGS=(
  build-essential    # gcc, make (also the JIT's run-time C compiler)
  pkg-config
  libyaml-dev        # config parser
  libhdf5-dev        # datasets and checkpoints
  hdf5-tools         # h5dump, used by tests to check files independently
  libcurl4-openssl-dev # HTTP(S) data (not linked yet: the Makefile adds libcurl to PKGS when a source uses it)
  libopenblas-dev    # CPU GEMMs
  libopenblas-openmp-dev # the OpenMP build: GEMMs share the kernels' thread pool (Makefile)
  check              # unit-test framework
  iproute2           # network-namespace tests
  procps             # pkill/ps in e2e tests
  fortunes           # the offline text corpus of `make run` (configs/llm.yaml)
  clang-format       # make lint (format check against .clang-format)
  cppcheck           # make lint (static analysis)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
