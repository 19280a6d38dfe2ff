# cuda-emu-common.sh — sourced by tests/e2e/cuda_emu.sh and cuda_emu_mesh.sh: the binaries
# (jdt-train for the CPU references, build-cuda/jdt-train-emu on the host CUDA emulator), exit 77
# (skip) where the emulated build is missing, the tiny run both use (C), the emulator's settings,
# and the helpers: losses FILE, compare REF RUN LABEL TOL (6 steps, relative), run BIN DIR ARGS.
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
EMU=${JDT_CUDA_EMU_BIN:-$ROOT/build-cuda/jdt-train-emu}
fail() { echo "FAIL: $*"; exit 1; }
if [ ! -x "$EMU" ]; then # make test builds it wherever CUDA's headers are installed
  echo "SKIP: no $EMU (make CUDA=1 build-cuda/jdt-train-emu; needs the CUDA toolkit's headers)"
  exit 77
fi
cd "$ROOT" || exit 1
export JDT_RUNTIME_CACHE_DIR="$TMP/cache" JDT_CUDAEMU_DEVICES=4
C=(configs/tiny.yaml run.steps=6 run.eval_every=0 runtime.threads=1 checkpoint.every=0)
# jdt-train's attention kernels unless a run asks for cuDNN's: the default, auto, tries cuDNN
# (here the emulator's) against them and keeps the faster by the clock (its own block below)
export JDT_CUDNN_ATTENTION=0
# GEMMs on cuBLASLt's heuristic's first algorithm unless a run asks otherwise: the default times
# each plan's candidates at its first call (the emulator's compute the same; its own block below)
export JDT_CUDA_AUTOTUNE=0

losses() { grep -o '"loss": [0-9.e+-]*' "$1" | awk '{print $2}'; }
compare() { # $1 reference metrics, $2 metrics, $3 label, $4 relative tolerance
  losses "$1" > "$TMP/a"; losses "$2" > "$TMP/b"
  paste "$TMP/a" "$TMP/b" | awk -v l="$3" -v t="$4" '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
    END { printf "%-36s max relative loss difference %.2g over %d steps\n", l, m, NR; exit !(m <= t && NR == 6) }'
}
run() { # $1 binary, $2 out dir, rest: overrides (and --nproc N first)
  local b=$1 out=$2; shift 2
  "$b" "$@" run.out_dir="$out" >"$TMP/out" 2>"$TMP/err" || { tail -n 5 "$TMP/err"; fail "$b $*"; }
}
