/*
 * backend.h — the device seam: a jdt_device is one backend bound to one device (the CPU, or
 * CUDA device N). A program compiled with jdt_compile_opts.device runs there: the compiler's
 * device-neutral half (passes, fusion, schedule, memory plan, loop nests) is shared, and the
 * backend emits the nests in its dialect, builds them, allocates the planned arena, binds the
 * leaves, runs the steps and its builtins (GEMM, attention, norms, collectives) and copies
 * outputs back. See docs/backend.md.
 *
 * Leaves and host memory: callers keep binding leaves to host memory (jdt_tensor.data). A
 * backend with its own memory (CUDA) keeps a device copy of every leaf: INPUT leaves are copied
 * in at every run (the batch, the step's scalars); PARAM/STATE/data-CONSTANT leaves are copied
 * in once, then live on the device, where updates are applied. jdt_device_pull copies them
 * back into the host buffers (before a checkpoint); jdt_device_push marks the host copies as
 * newer (after a checkpoint load) so the next run uploads them. For the CPU both are no-ops.
 */
#ifndef JDT_BACKEND_H
#define JDT_BACKEND_H

#include "core/core.h"

typedef enum {
    JDT_DEVICE_CPU = 0,
    JDT_DEVICE_CUDA = 1,
} jdt_device_kind;

typedef struct jdt_device jdt_device;

/* True when this binary was built with the backend (CUDA needs `make CUDA=1`). */
bool jdt_device_built(jdt_device_kind kind);

/* Opens device `index` of `kind` (CUDA: the local rank's GPU; CPU: index ignored). cache_dir
 * (NULL: the compiler's default) holds compiled kernels. Errors: ERR_UNSUPPORTED (backend not
 * built in, no GPU or no driver: one line naming the CUDA error), ERR_RUNTIME, ERR_NOMEM. */
jdt_status jdt_device_open(jdt_device_kind kind, int index, const char *cache_dir, jdt_device **out,
                           jdt_err *e);
/* A CUDA device that compiles programs to CUDA source and stops there: jdt_program_compile
 * succeeds (jdt_program_source gives the kernels), jdt_program_run fails with ERR_UNSUPPORTED.
 * Needs no GPU, driver or CUDA library (`inspect`, CI tests that NVRTC-compile the source). */
jdt_status jdt_device_open_emit_only(jdt_device **out, jdt_err *e);
/* A CUDA device that compiles ahead of time, without a GPU (`inspect --cuda-arch sm_90`, a
 * login node warming the cache for a GPU job): jdt_program_compile plans the program as the CUDA
 * backend does, NVRTC-compiles its kernels for sm_<arch> and the builtin kernel sources it will
 * launch, and stores them in the compile cache under cache_dir (NULL: the compiler's default)
 * under the keys a run on such a GPU looks up; jdt_program_run fails with ERR_UNSUPPORTED.
 * Needs NVRTC only. Errors: ERR_UNSUPPORTED (a binary without CUDA), ERR_CONFIG (an arch this
 * NVRTC cannot compile for, naming the ones it can). */
jdt_status jdt_device_open_aot(jdt_device_kind kind, int arch, const char *cache_dir,
                               jdt_device **out, jdt_err *e);
/* Closes the device; every program compiled for it must be freed first. NULL is a no-op. */
void jdt_device_close(jdt_device *d);

jdt_device_kind jdt_device_get_kind(const jdt_device *d);
/* One line describing the device ("cpu", "cuda:0 NVIDIA H200 (sm_90)") into buf; returns buf. */
char *jdt_device_describe(const jdt_device *d, char *buf, size_t n);

/* Copies every device-resident leaf (parameters, optimizer state) back into the host memory
 * it is bound to, after finishing queued work. Errors: ERR_RUNTIME naming the device error. */
jdt_status jdt_device_pull(jdt_device *d, jdt_err *e);
/* The host copies of the leaves changed (e.g. a checkpoint was loaded into them): the next run
 * of any program on d uploads them again. */
void jdt_device_push(jdt_device *d);

/* Collectives on a device with its own (CUDA: NCCL): the job's process group; ALL_REDUCE,
 * ALL_GATHER and REDUCE_SCATTER nodes of programs on d then run over the groups of
 * jdt_device_set_groups (communicators created on each group's first collective, which every
 * member reaches in the same order). No-op for the CPU, whose programs use
 * jdt_compile_opts.collective. */
struct jdt_dist;
void jdt_device_set_dist(jdt_device *d, struct jdt_dist *dist);

/* Device memory of this process (a GPU; the CPU has none: use the peak RSS). */
typedef struct {
    int64_t peak_bytes;  /* most held at once by our allocations: the programs' planned
                            allocations, mirrored parameters/optimizer state, GEMM workspace */
    int64_t now_bytes;   /* the same, now */
    int64_t used_bytes;  /* cudaMemGetInfo: total - free now (all processes and libraries on
                            the GPU, NCCL and the CUDA context included) */
    int64_t total_bytes; /* the device's memory */
} jdt_device_mem;
/* Fills *m and returns true for a device with its own memory; false (m zeroed) for the CPU or
 * a device without the figures. */
bool jdt_device_memory(const jdt_device *d, jdt_device_mem *m);

/* Time spent in the device's own collectives (CUDA: NCCL, timed with CUDA events) by every
 * program run on d so far whose work has finished (each run's is counted by its output reads):
 * *moving_s the collectives' run time on their streams (waiting for peers included), *waited_s
 * how long the compute stream stalled waiting for them (a blocking collective: all of it; a
 * started one: what compute between its start and wait did not cover). Returns false (both 0)
 * for a device without its own collectives (the CPU: the trainer times jdt_compile_opts'
 * collective hooks itself) or before jdt_device_set_dist. */
bool jdt_device_comm_times(const jdt_device *d, double *waited_s, double *moving_s);

/* Maps a collective's group id (engine/shard: a mask of mesh axes) to its global ranks in group
 * order (at most max_ranks); returns their count, 0 for an unknown group. */
typedef int (*jdt_device_group_fn)(void *ctx, int group, int *ranks, int max_ranks);
/* The job's process groups, for a device with its own collectives (CUDA: one NCCL communicator
 * per distinct rank set, made on the group's first collective). Without it every group is the
 * whole world. No-op for the CPU. ctx must outlive the device's programs. */
void jdt_device_set_groups(jdt_device *d, jdt_device_group_fn fn, void *ctx);

#endif /* JDT_BACKEND_H */
