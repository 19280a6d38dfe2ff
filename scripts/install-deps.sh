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
  libcurl4-openssl-dev # remote data over HTTP(S) (engine/io/fetch.c)
  ca-certificates    # the system CA store remote data's TLS verification uses
  libssl-dev         # libcrypto's EVP SHA-256 for remote data's checksums
  libpcre2-dev       # tokenizer pre-tokenizer regexes (UTF + Unicode classes, JIT)
  libicu-dev         # NFC normalization of Qwen2-style tokenizers
  libopenblas-dev    # CPU GEMMs
  libopenblas-openmp-dev # the OpenMP build: GEMMs share the kernels' thread pool (Makefile)
  libdnnl-dev        # oneDNN: bf16 GEMMs on AVX512-BF16 CPUs (optional; engine/runtime/bf16.c)
  check              # unit-test framework
  python3            # e2e tests check JSON traces and metrics with it
  procps             # pkill/ps in e2e tests
  fortunes           # the offline text corpus (scripts/fortunes-corpus.sh): `make run`, train_fortunes.sh
  # test fixtures (tests/infra/, docs/testing.md): they start daemons of their own, with their
  # own config; none of these needs to run as a system service
  iproute2           # network-namespace hosts (ip netns, veth, bridge); ss for free ports
  iputils-ping       # netns-up.sh checks every host reaches every other one
  util-linux         # nsenter, unshare (netns-exec.sh)
  slurmctld          # local SLURM cluster (slurm-up.sh)
  slurmd
  slurm-client       # sbatch, srun, squeue, sinfo, scancel
  munge              # SLURM's authentication
  nginx-light        # HTTP server with Range for remote-data tests (http-up.sh)
  openmpi-bin        # launch_others.sh: a job started by mpirun joins without dist.* keys
  curl               # HTTP checks in fixtures and tests
  openssl            # data_http.sh: a self-signed certificate and an HTTPS server (s_server)
  clang              # `make fuzz`: libFuzzer targets (tests/fuzz/) with ASan/UBSan
  libclang-rt-dev    # libFuzzer and the sanitizer runtimes for that clang
  libomp-dev         # OpenMP for clang (the engine's kernels use it)
  libcairo2-dev      # `jdt-train plot`: PNG and SVG loss curves
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
