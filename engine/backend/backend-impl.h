/*
 * backend-impl.h — the backend interface (a vtable in the spirit of ggml's backends) and the
 * device object. engine/compile/program.c drives a program through these calls; each backend
 * folder (cpu/, cuda/) implements them.
 *
 * Program life cycle: prepare (emit the groups' nests in the backend's dialect, build them,
 * allocate the planned arena) -> per run: begin (bind leaves), step(s) for every scheduled
 * step in order, finish (the updates that were not donated; completes the run) -> read outputs
 * -> release.
 */
#ifndef JDT_BACKEND_IMPL_H
#define JDT_BACKEND_IMPL_H

#include "backend/backend.h"
#include "compile/compile-impl.h"

typedef struct {
    const char *name;
    /* The backend loads and stores bf16-stored values (cnode.bf16: fused kernels round on
     * store, builtins read them; fuse.c mark_bf16_storage). The default CPU device always does. */
    bool bf16_storage;
    /* A lone ALL_GATHER sharded past its first axis runs on a planned wire buffer (fuse.c), as a
     * bucket does, instead of in its own output plus a full-size unpermuting copy (CUDA: no
     * staging buffer the size of the largest gathered tensor held for the program's life). */
    bool wire_gathers;
    /* The device's reduction kernels store the members of their loop other than the result
     * (each element of the reduced domain once), so fuse.c may merge an elementwise producer
     * with other readers into the reduction reading it (fuse_reduce_producers). */
    bool reduce_stores;
    /* A bf16-compute GEMM stores a bf16 output (with a bf16 bias), and the cross-entropy
     * (forward and backward) reads bf16 logits, so passes.c fold_bf16_casts may fold the CASTs
     * of precision.activations: bf16 into them. */
    bool bf16_builtins;
    /* Only the first half of bf16_builtins: a bf16-compute GEMM stores a bf16 output (with a
     * bf16 bias), so fold_bf16_casts folds a GEMM's CAST to bf16 into it and leaves the other
     * builtins' inputs f32 (the CPU: oneDNN's bf16 destination; precision.activations: bf16's
     * f32 copy of each linear layer's output is neither written nor read). */
    bool gemm_bf16_out;
    /* Its attention builtins read bf16 q, k, v (all three), so fold_bf16_casts drops the
     * widening CASTs before them too (the CPU: each head widened in the thread's scratch;
     * bf16_builtins implies it). */
    bool attention_bf16_qkv;
    /* Its cross-entropy builtins (forward and backward) read bf16 logits, so fold_bf16_casts drops
     * the widening CAST before them too (the CPU: precision.activations: bf16's lm head stores
     * its logits rounded, and their f32 copy, 4 bytes an element of GPT-2's largest tensor, is
     * neither written nor read; bf16_builtins implies it). */
    bool xent_bf16_logits;
    /* The layer and RMS norm backward builtins take the norm's scale w as a third input and
     * read dy, computing the normalised value's cotangent dy * w themselves (passes.c
     * fold_norm_scales: the product's kernel and its buffer go). */
    bool norm_bwd_scale;
    /* Its bf16-output GEMMs can apply GELU as an epilogue, writing GELU(y) and y (MATMUL attrs
     * i[4]: the output packs both), so passes.c fold_gelu_epilogues drops the MLP's GELU
     * kernel. */
    bool gemm_gelu;
    /* Its cross-entropy forward builtin can also write dlogits for a constant dloss (attrs f[0];
     * the cnode `co` names the backward it computes), reading each row of logits once for both,
     * so passes.c fold_xent_backwards drops the backward's step. */
    bool xent_fused;
    /* Its cross-entropy kernels may write dlogits over the logits (same storage type and row
     * pitch: each row is read before it is written, by one block), so fuse.c's memory plan may
     * give dlogits the buffer of logits that die there (GPT-2 at B 32: 3.1 GiB). */
    bool xent_inplace;
    /* Its attention forward builtin can also write o's (B, T, H, D) copy, f32 or bf16 (the cnode
     * `co`: the transpose the projection's GEMM reads), so passes.c fold_attention_copies drops
     * that transpose's kernel. */
    bool attention_copy;
    /* Its attention builtins take grouped-query attention themselves: k and v with fewer heads
     * than q, G = H / Hk query heads reading each, and the backward writing each group's summed
     * dk and dv (CUDA: JDT_CUK_ATT_GROUP), so passes.c fold_attention_groups drops the broadcast
     * that repeats each key/value head and the sums over each group. */
    bool attention_groups;
    /* Its RoPE builtin reads x in (B, H, T, D) order at an element offset (attrs i[1], i[2]), so
     * passes.c fold_rope_transposes drops the transpose before a RoPE backward. */
    bool rope_bhtd;
    /* Rows per partial column sum when its attention backward builtin can write, instead of
     * the packed f32 dq, dk, dv, their (B, T, H, D) copies (f32 or bf16, the cnode's chain of
     * `co`) and the column sums of each JDT_CUK_ATT_PART rows (ATTENTION_BWD attrs i[1]: the
     * output is those partials), so passes.c fold_attention_cotangents drops the kernel per
     * projection that made the copy and the bias gradient's sum from the f32 output; 0: not. */
    int attention_part_rows;
    /* Its attention forward builtin can store each query row's log-sum-exp after o (attrs
     * i[1]: the output packs both) and its backward take it from there (attrs i[2]) instead of
     * a pass over the keys, so passes.c fold_attention_lse packs the forwards the backwards
     * read (FlashAttention's saved statistics). */
    bool attention_lse;
    /* The largest head size D for which this device's attention backward builtin reads dO
     * stored as bf16 (with bf16 compute, bf16 q, k, v and a scale > 0: CUDA's tensor-core
     * kernels), so passes.c fold_attention_dout16 has the GEMM that computes dO store it as
     * bf16; 0 (or NULL): never. */
    int64_t (*attention_dout16_d)(const jdt_device *d);
    /* The widest row (C) for which its norm backward builtins with the scale also sum the
     * affine's gradients per block of rows (attrs i[0] = P: the output packs dx and P partial
     * rows of dw's and db's sums), so passes.c fold_norm_partials replaces the two gradient
     * reductions over every row (and the forward's stored xhat they read) by reductions over
     * P rows; 0: it does not. */
    int64_t norm_bwd_partials;
    /* Its GEMMs add a tensor of the output's shape to the product (cuBLASLt's C, beta 1), so
     * passes.c fold_addends folds y = x + a @ b into the GEMM (MATMUL attrs i[3]); also in
     * place, the output in the added tensor's buffer (C = D: fuse.c gemm_acc_donor). */
    bool gemm_accumulate;
    /* Its GEMMs and cross-entropy builtins take a row stride (cnode pitch) for their operands
     * and outputs, so fuse.c mark_pitched_rows may pad the rows of logits and dlogits whose
     * vocabulary is not a multiple of 16 bytes (cuBLASLt's fast kernels need aligned rows). */
    bool gemm_pitch;
    /* Consecutive fused kernels that touch disjoint memory may run as one launch (cstep.merged,
     * merge.c): the emitter gives them one grid, each keeping its blocks and code. */
    bool merge_launches;
    /* prepare honours c->arena_lender: a program that never runs at the same time as the lender
     * (eval, apply beside the train step) uses the lender's arena instead of its own (program.c
     * decides; both programs on this device). */
    bool arena_borrow;
    /* Scratch bytes builtin n needs (attention, a bf16 MATMUL); NULL: the CPU kernels' sizes. */
    int64_t (*scratch_bytes)(const cprog *c, const cnode *n);
    /* Builds program c for device d: *state receives the backend's per-program state, *src
     * the generated source (owned by the state). Errors name the failing op/compiler. */
    jdt_status (*prepare)(jdt_device *d, const cprog *c, void **state, jdt_err *e);
    const char *(*source)(const void *state);
    /* Binds every leaf (ERR_INVALID naming an unbound one) before the steps of a run. */
    jdt_status (*begin)(void *state, jdt_err *e);
    /* Whether the run just begun tries a setting the backend has not settled on (the CPU
     * tuner's probe of another thread count): the profile leaves it out, so that it shows the
     * runs as they go (NULL: never). */
    bool (*trial)(const void *state);
    /* Runs (or queues) scheduled step s. */
    jdt_status (*step)(void *state, int s, jdt_err *e);
    /* Applies the updates that were not donated; the run's results are then readable. */
    jdt_status (*finish)(void *state, jdt_err *e);
    /* Waits for every queued step (timing a step on an asynchronous device). */
    jdt_status (*sync)(void *state, jdt_err *e);
    /* Step timing on the device's own clock, without a wait per step (NULL: the steps are
     * timed on the host, each followed by sync). mark(state, i) queues mark i (0 <= i <=
     * c->n_steps + 1) behind everything queued so far; after a sync, mark_times(state, n, sec)
     * writes the seconds between mark i and mark i + 1 for i < n, each mark recorded since. */
    jdt_status (*mark)(void *state, int i, jdt_err *e);
    jdt_status (*mark_times)(void *state, int n, double *sec, jdt_err *e);
    /* Copies n_bytes of node's value to host memory dst (after finish). */
    jdt_status (*read)(void *state, int node, void *dst, size_t n_bytes, jdt_err *e);
    /* Host address of node's value, or NULL when the value lives in device memory. */
    const void *(*host_ptr)(void *state, int node);
    void (*release)(void *state);
    /* device-wide */
    jdt_status (*pull)(jdt_device *d, jdt_err *e);
    void (*push)(jdt_device *d);
    void (*close)(jdt_device *d);
    char *(*describe)(const jdt_device *d, char *buf, size_t n);
    /* Device memory figures (NULL: none, the CPU). */
    bool (*memory)(const jdt_device *d, jdt_device_mem *m);
    /* Collectives' time on a device with its own (NULL: none; see jdt_device_comm_times). */
    bool (*comm_times)(const jdt_device *d, double *waited_s, double *moving_s);
} jdt_backend_vt;

struct jdt_device {
    const jdt_backend_vt *vt;
    jdt_device_kind kind;
    int index;
    char cache_dir[1024]; /* "" = the compiler's default */
    void *impl;           /* the backend's device state */
};

extern const jdt_backend_vt jdt_backend_cpu;
extern const jdt_backend_vt jdt_backend_cuda_emit_only; /* cuda/emit.c, in every build */
/* The process's CPU device (programs compiled without opts.device). */
jdt_device *jdt_device_cpu_default(void);

#ifdef JDT_CUDA
/* cuda/cuda.c: fills d->vt and d->impl for CUDA device d->index. */
jdt_status jdt_cuda_device_open(jdt_device *d, jdt_err *e);
/* cuda/cuda.c: fills d->vt and d->impl for an ahead-of-time device compiling for sm_<arch>. */
jdt_status jdt_cuda_device_open_aot(jdt_device *d, int arch, jdt_err *e);
/* cuda/cuda.c: jdt_backend_cuda_emit_only with the CUDA backend's planned scratch (a bf16
 * GEMM's copies, the attention backward's), so that `inspect` plans a step's memory as a GPU run
 * plans it; a CPU-only build has the CPU's sizes there. */
const jdt_backend_vt *jdt_cuda_emit_only_vt(void);
#endif

#endif /* JDT_BACKEND_IMPL_H */
