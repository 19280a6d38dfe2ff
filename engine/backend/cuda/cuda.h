/*
 * cuda.h — CUDA-backend entry points beyond the device seam (built with `make CUDA=1`):
 * compiling CUDA C with NVRTC (no GPU needed: the CI tests use it) and attaching the job's
 * process group for NCCL collectives.
 */
#ifndef JDT_CUDA_H
#define JDT_CUDA_H

#include "backend/backend.h"

/* nvrtcCompileProgram(prog) for `target` (sm_NN or compute_NN), C++17, single-threaded. With
 * JDT_NVRTC_SPLIT=N in the environment NVRTC's optimiser and ptxas split over N threads
 * (--split-compile=N, 0 = every core; the same code: 27% less wall time for the FMA attention on
 * 2 cores), opt-in because NVRTC 13.0 crashed in it under CPU load (cuda.c); an NVRTC that does
 * not know the option compiles without it. Returns NVRTC's status (typed int: nvrtc.h stays out
 * of this header). */
int jdt_cuda_nvrtc_compile(void *prog, const char *target);

/* Compiles CUDA C++ source `src` (named `name` in messages) with NVRTC for sm_<arch> into a
 * cubin: *image (jdt_free) of *n_bytes. ERR_COMPILE with NVRTC's log on failure. */
jdt_status jdt_cuda_nvrtc(const char *src, const char *name, int arch, void **image,
                          size_t *n_bytes, jdt_err *e);

#endif /* JDT_CUDA_H */
