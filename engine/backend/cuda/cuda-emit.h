/*
 * cuda-emit.h — the CUDA backend's emitter (engine/backend/cuda/emit.c). Pure C with no CUDA
 * headers: it is built into every binary, so `inspect` and the CI tests can produce and check
 * the CUDA source of a program on machines without CUDA.
 */
#ifndef JDT_CUDA_EMIT_H
#define JDT_CUDA_EMIT_H

#include "compile/compile-impl.h"

/* Launch shape of one generated kernel: (grid_x, grid_y) blocks of (block_x, block_y) threads. */
typedef struct {
    int grid_x, grid_y;
    int block_x, block_y;
} jdt_cuda_launch;

/* The CUDA C++ translation unit (for NVRTC) with one `extern "C" __global__ void k<i>(void
 * *const *p)` per launch of c, in kernel order: kernel i's own, or for a run of kernels that
 * cstep.merged gives one launch, the run's with i its first kernel (the others are device
 * functions it calls); p is the device array of buffer pointers (one slot per buffer, like the
 * CPU's table). *launch receives n_kernels launch shapes (a merged run's members' unused).
 * Both outputs are owned by the caller (jdt_free). ERR_UNSUPPORTED (a group the nest builder
 * rejects), ERR_NOMEM. */
jdt_status jdt_cuda_codegen(const cprog *c, char **src, jdt_cuda_launch **launch, jdt_err *e);

/* Most blocks of a grid-stride launch (the loops cover any size). */
#define JDT_CUDA_MAX_GRID 4096
/* Reductions with fewer output tiles than this (about two per SM of an H100/H200) split their
 * reduced range over more blocks. */
#define JDT_CUDA_SPLIT_TILES 264

#endif /* JDT_CUDA_EMIT_H */
