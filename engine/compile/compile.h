/*
 * compile.h — the compiler and executable program: graph passes (DCE, CSE, constant folding,
 * algebraic simplification), fusion of elementwise/broadcast/row-reduction chains into single
 * loop nests, a schedule, a liveness memory plan (one arena, reuse, in-place, views, donated
 * leaves), C code generation compiled at run time by the system C compiler into a cached
 * shared object, and the run loop that executes generated kernels and hand-written CPU kernels
 * (engine/runtime) in schedule order.
 *
 * The caller's graph is never modified: the compiler works on its own copy of the node list.
 * Leaves (PARAM, INPUT, data CONSTANT) are read through the caller's tensors' `data` pointers at
 * every run, so rebinding a leaf between runs is allowed.
 */
#ifndef JDT_COMPILE_H
#define JDT_COMPILE_H

#include "core/core.h"
#include "graph/graph.h"

typedef enum {
    JDT_COMPILE_REMAT_NONE = 0,  /* keep every forward activation for the backward pass */
    JDT_COMPILE_REMAT_BLOCK = 1, /* the train step was differentiated with per-block recompute
                                   (jdt_autodiff_grad_ex); the compiler keeps the copies */
    JDT_COMPILE_REMAT_DOTS = 2,  /* the same, the GEMMs', attentions' and collectives' outputs
                                   kept (JDT_AD_REMAT_DOTS) */
} jdt_compile_remat;

/* Asynchronous collectives (the start/wait halves of a jdt_collective_fn call, same arguments
 * and buffer contract). start issues the collective on buf and returns at once with *handle
 * set; buf must then stay untouched until wait(handle) returns, after which buf holds what
 * the blocking call would have left there. Every rank's program issues its starts in one
 * order (the schedule is a pure function of the graph), so members of a group always agree.
 * Every started handle is waited exactly once, also when the run fails. */
typedef jdt_status (*jdt_collective_start_fn)(void *ctx, int group, int kind, jdt_dtype dt,
                                              void *buf, size_t n_elems, void **handle, jdt_err *e);
typedef jdt_status (*jdt_collective_wait_fn)(void *ctx, void *handle, jdt_err *e);

/* Options of a compilation. Device-neutral: cache_dir, no_fuse, no_simplify, profile, no_jit,
 * remat, collective, trace, device. CPU backend only (the CUDA backend ignores them: NVRTC and
 * the GPU take their place): cc, cflags, cc_timeout_s, threads, adaptive_threads. */
typedef struct {
    const char *cache_dir; /* NULL: $JDT_CACHE_DIR, else $XDG_CACHE_HOME/jdt-train, else
                              ~/.cache/jdt-train (compiled kernels of every backend) */
    const char *cc;        /* CPU: NULL: $CC, else "cc" */
    const char *cflags;    /* NULL: "-O3 -march=native -fno-math-errno -fno-trapping-math",
                              and -mprefer-vector-width=512 where the CPU has AVX512-BF16 (no
                              fast-math: NaN/Inf semantics must hold) */
    double cc_timeout_s;   /* CPU: 0: 600; the compiler is killed after this (ERR_TIMEOUT) */
    int64_t cache_max_bytes; /* bound of the on-disk cache: 0 = 1 GiB, < 0 = unbounded */
    int threads;           /* CPU: 0: omp_get_max_threads(); the most threads a run uses */
    bool adaptive_threads; /* CPU: time the runs and use 1 thread instead of `threads` while
                              that is faster (jdt_rt_tuner, engine/runtime/runtime.h); false:
                              always `threads` */
    bool no_fuse;          /* debug: one kernel per op (tests compare against fusion) */
    bool no_merge_launches; /* debug: one launch per fused kernel on devices that merge
                               independent consecutive kernels into one (CUDA: merge.c) */
    bool no_simplify;      /* debug: skip CSE, folding and algebraic simplification */
    bool no_bf16_storage;  /* keep every intermediate f32 (by default the CPU backend stores a
                              value read only by bf16-compute GEMMs as bf16: same numbers) */
    bool profile;          /* time every step of every run (see jdt_program_profile) */
    bool no_jit;           /* run the reference interpreter instead (no C compiler needed;
                              slow, allocates per run: for debugging and machines without cc) */
    bool plan_only;        /* stop after the memory plan: statistics and buffer plan only, no
                              code generated, no compiler run, no arena allocated, no memory
                              check; jdt_program_run then fails (for `inspect`) */
    jdt_compile_remat remat;
    jdt_collective_fn collective; /* runs ALL_REDUCE nodes; NULL: graphs with one fail */
    void *collective_ctx;
    /* Optional (CPU backend; both or neither, same ctx): collectives are scheduled as a start
     * right after their input is computed and a wait just before their first reader, so they
     * run under the compute in between (docs/compiler.md, "Collectives"). NULL: each runs
     * blocking through `collective` at its place in the graph. */
    jdt_collective_start_fn collective_start;
    jdt_collective_wait_fn collective_wait;
    /* With collective_start: gradient-style ALL_REDUCEs and REDUCE_SCATTERs of one group (and
     * kind) whose inputs become ready one after another, and ALL_GATHERs of leaves needed one
     * after another, are coalesced into buckets of at most this many bytes (of the full
     * tensors), one collective each (an all-reduce bucket's members side by side in the arena:
     * no concat, no split; a gather's or scatter's through a wire buffer). <= 0: one
     * collective per node. */
    int64_t bucket_bytes;
    /* With collective_start: collectives of leaves (FSDP weight all-gathers; buckets of them
     * when bucket_bytes > 0) are issued ahead of their use while the gathered bytes in flight
     * (issued, not yet waited) stay within this many bytes; at least one call ahead. 0: the
     * default, 8 MiB; < 0: one call ahead only. */
    int64_t prefetch_bytes;
    /* Per-step trace hook: when non-NULL, jdt_program_run calls it once per executed step, in
     * schedule order, on the calling thread, with jdt_now_s() timestamps around the step. name
     * is "fused:<root op>" for generated kernels, the op name for builtins ("matmul",
     * "attention_bwd", "all_reduce" ...) and "update" for the update copies after the steps;
     * it is a static string owned by the program (valid while it lives). No cost when NULL.
     * Not called with opts.no_jit (the interpreter has no steps). */
    void (*trace)(void *ctx, const char *name, double t_start_s, double t_end_s);
    void *trace_ctx;
    /* The device the program runs on (engine/backend/backend.h); NULL: the CPU. A CUDA
     * device keeps leaves in device memory (see backend.h for how host buffers relate). */
    struct jdt_device *device;
    /* CPU backend: a compiled program whose arena this one reuses instead of allocating its
     * own, when that arena is at least as large as this program's plan (a train step's eval
     * and apply programs never run at the same time as the step). The two programs' outputs
     * then live in the same memory: an output is valid only until either program runs. The
     * lender must outlive the borrower. Ignored by other backends and when too small
     * (jdt_program_arena_shared says which happened). */
    const struct jdt_program *share_arena;
} jdt_compile_opts;

/* Fills o with the defaults (all NULL/0). */
void jdt_compile_opts_init(jdt_compile_opts *o);

/* One arena buffer live at the memory plan's peak (jdt_compile_stats.peak_top). */
typedef struct {
    char op[32]; /* the op of the node it holds ("scratch": a builtin's; a collective's
                    "collective bucket" or "collective wire") */
    int64_t dims[4], bytes;
    int ndim;    /* of the node's shape (at most 4 listed) */
    bool bf16;   /* stored as bf16 */
} jdt_peak_buf;

typedef struct {
    int n_ops_in;          /* graph nodes before the passes */
    int n_ops_out;         /* live nodes after DCE/CSE/simplification */
    int n_kernels;         /* generated (fused) loop-nest kernels */
    int n_builtin;         /* hand-written kernel calls (matmul, softmax, attention ...) */
    int n_steps;           /* n_kernels + n_builtin */
    int n_inplace;         /* buffers written in place over a dying input */
    int n_donated;         /* updates written directly into their leaf's buffer */
    int n_update_copies;   /* updates copied into their leaf after the step */
    int n_coll_calls;      /* collective calls per run (a bucket of all-reduces is one) */
    int n_coll_async;      /* of which issued as start/wait pairs (opts.collective_start) */
    int n_coll_bucketed;   /* collective nodes that run inside a bucket of several */
    int n_coll_prefetch;   /* calls of collectives of leaves (FSDP weight gathers), prefetched */
    int64_t prefetch_peak_bytes; /* most gathered bytes of them in flight (opts.prefetch_bytes) */
    int64_t gather_bytes;  /* bytes all-gathered per run (the gathered tensors; bf16: 2 each) */
    int n_bf16_stored;     /* values stored as bf16 (read only by bf16-compute GEMMs) */
    int n_pitched;         /* values whose rows are padded to 64 elements (fuse.c
                              mark_pitched_rows: logits, dlogits) */
    int n_reduce_siblings; /* bf16 copies stored by the reduction reading the same value
                              (fuse.c fuse_reduce_siblings) */
    int n_reduce_merged;   /* elementwise groups merged into the reduction reading them
                              (fuse.c fuse_reduce_producers; devices with reduce_stores) */
    int n_ew_siblings;     /* elementwise groups merged into an earlier one reading the same
                              value over the same domain (fuse.c fuse_ew_siblings) */
    int n_bf16_converted;  /* operands of bf16-compute GEMMs stored in f32: converted by the GEMM
                              at every call (0 in a bf16 GPT step: ops.c vjp_MATMUL) */
    int n_bf16_folded;     /* bf16 CASTs folded into builtins: GEMMs storing bf16 outputs and
                              cross-entropies reading bf16 logits (passes.c fold_bf16_casts) */
    int n_norm_scales_folded; /* norm backwards that form dy * w themselves (passes.c
                                 fold_norm_scales) */
    int n_dgelu_epilogues;      /* GELU backwards by the GEMM computing their cotangent */
    int n_dgelu_bgrads;         /* of those, the GEMMs that also sum it into the bias gradient */
    int n_gelu_epilogues;       /* GELUs computed by their GEMM (passes.c fold_gelu_epilogues) */
    int n_norm_affines_folded;  /* norms that apply their affine (passes.c fold_norm_affines) */
    int n_norm_acc_folded;      /* of those, the ones adding the residual's cotangent to dx */
    int n_norm_partials_folded; /* norm backwards that also sum their affine's gradients
                                   (passes.c fold_norm_partials) */
    int n_norm_cotangents_folded; /* of those, the ones that also sum their output's columns
                                     and/or store its bf16 copy (passes.c fold_norm_cotangents) */
    int n_widenings_split; /* copies of widening CASTs made so that each reader widens the bf16
                              value itself (passes.c split_widenings) */
    int n_recomputes_split; /* copies of cheap functions of stored values made so that each
                               reader recomputes it (passes.c split_widenings) */
    int n_rope_transposes_folded; /* RoPEs reading (B, H, T, D) input themselves (passes.c
                                     fold_rope_transposes) */
    int n_attention_copies; /* attentions that also write o's (B, T, H, D) copy (passes.c
                               fold_attention_copies) */
    int n_attention_groups; /* attentions, forward or backward, reading grouped-query k and v
                               without their repetition per query head (passes.c
                               fold_attention_groups) */
    int n_attention_cotangents; /* attention backwards writing the projections' copies of dq,
                                   dk, dv and their bias-gradient partials (passes.c
                                   fold_attention_cotangents) */
    int n_attention_partials;   /* of them, those whose bias-gradient partials are read (a
                                   bias on q, k or v: GPT-2, not Llama) */
    int n_ropes_in_attention;   /* of their copies, RoPE backwards the attention's kernels apply
                                   as they store (passes.c fold_attention_cotangents) */
    int n_rotated_partials;     /* of those, bias-gradient partials of the rotated values, the
                                   copy bf16 (Qwen2's q, k biases: passes.c rotated_sums) */
    int n_attention_dout16; /* attention backwards reading dO that its GEMM stored as bf16
                               (passes.c fold_attention_dout16) */
    int n_norm_dy16;     /* norm backwards reading dy that its GEMM stored as bf16 (passes.c
                            fold_norm_dy16) */
    int n_norm_dy_terms; /* norm backwards summing dy from several GEMMs' bf16 products
                            (passes.c fold_norm_dy_terms) */
    int n_attention_o16; /* attention backwards reading o's bf16 copy, their forward storing no
                            f32 o (passes.c fold_attention_o16) */
    int n_attention_lse; /* attention backwards taking their forward's stored log-sum-exp
                            (passes.c fold_attention_lse) */
    int n_xent_fused;      /* cross-entropy backwards computed by their forward's step in the
                              same pass over the logits (passes.c fold_xent_backwards) */
    int n_loss_slices;     /* cross-entropy backwards (several: runtime.loss_chunks) each run
                              right after its forward (passes.c hoist_loss_backwards) */
    int n_gemm_acc_inplace; /* GEMMs adding their product to an input in its buffer (fuse.c
                               gemm_acc_donor) */
    int n_xent_inplace;    /* dlogits planned over their dying logits (fuse.c xent_donor) */
    int n_gemm_acc_folded; /* adds folded into the GEMM computing one of their operands
                              (passes.c fold_addends) */
    int n_residual_gemms;  /* of those, residual adds of a bf16 branch output that the GEMM
                              adds unrounded (passes.c fold_residual_gemms) */
    int n_launch_merged;   /* fused kernels run inside an earlier kernel's launch (merge.c):
                              the device launches n_kernels - n_launch_merged */
    double flops_per_step; /* matmul/attention 2*MACs plus one per elementwise result */
    double kernel_bytes;   /* bytes the fused kernels move per run at least (every element of
                              every buffer they read or write once: the memory-bound floor) */
    double builtin_bytes;  /* the same for builtin calls (inputs and output once) */
    struct {               /* the kinds that move the most of those bytes, most first: */
        char name[32];     /* "fused:<root op>" or the builtin's op ("" past the last) */
        int count;         /* steps of the kind */
        double bytes;      /* bytes they move per run at least */
    } traffic_top[8];
    int64_t arena_bytes;   /* planned peak memory of intermediates (one arena) */
    int64_t peak_live_bytes; /* the most arena bytes live at once (arena_bytes less this:
                                fragmentation of the placement) */
    int peak_step;           /* the step where they are live */
    bool placed_by_size;     /* the second placement (largest first) beat the sweep's */
    jdt_peak_buf peak_top[4]; /* the largest buffers live there, largest first (bytes 0: none) */
    bool arena_shared;     /* the arena is opts.share_arena's (nothing allocated for it) */
    double compile_s;      /* wall time of jdt_program_compile */
    double cc_s;           /* of which spent in the C compiler (0 on a cache hit) */
    bool cache_hit;        /* shared object found in the on-disk cache */
    bool cache_waited;     /* ... after waiting for another process of this host to build it */
    char so_path[1024];    /* the cached shared object */
} jdt_compile_stats;

typedef struct jdt_program jdt_program;

/* Compiles g into an executable program. Returns JDT_OK and sets *out (owned by the caller,
 * release with jdt_program_free); on failure *out is NULL and e names the cause:
 * ERR_UNSUPPORTED (op/dtype without a CPU kernel, naming the op and node), ERR_COMPILE (the C
 * compiler failed or is missing; its output is saved to a log file named in the message;
 * NVRTC's log for the CUDA backend),
 * ERR_TIMEOUT (the compiler ran longer than opts.cc_timeout_s and was killed; log named),
 * ERR_IO (cache directory), ERR_NOMEM. g must stay alive and unchanged while the program
 * lives (leaf tensors are read at every run). opts may be NULL (defaults). */
jdt_status jdt_program_compile(jdt_graph *g, const jdt_compile_opts *opts, jdt_program **out,
                               jdt_err *e);

/* True when p runs in the arena of opts.share_arena (no arena of its own). */
bool jdt_program_arena_shared(const jdt_program *p);

/* Refuses (ERR_NOMEM, one line with both figures and what to change) an arena of n_bytes
 * that exceeds the memory available to this process (jdt_mem_available); JDT_OK when it fits
 * or the figure is unknown. jdt_program_compile calls it before allocating its arena. */
jdt_status jdt_compile_check_arena(int64_t n_bytes, jdt_err *e);

/* Runs one step: reads every leaf through its tensor's data pointer (all must be bound:
 * ERR_INVALID naming the leaf otherwise), computes the outputs, then applies every update to
 * its target leaf's buffer in place. Distinct leaves must not share memory, nor point into the
 * program's arena: updates are written in place during the step and kernels load a scalar
 * leaf once, before their loops. Not thread-safe for one program; allocates nothing. */
jdt_status jdt_program_run(jdt_program *p, jdt_err *e);

/* Pointer to graph output i after a run (row-major, the output tensor's dtype and shape);
 * valid until the next run or jdt_program_free. NULL if i is out of range, when the program
 * was planned only, or when the program runs on a device whose memory the host cannot address
 * (CUDA): use jdt_program_read_output. The memory is owned by the program (or is the bound
 * leaf when the output is a leaf/updated leaf). */
const void *jdt_program_output(const jdt_program *p, int i);

/* Copies the first n_bytes of graph output i after a run into host memory dst, on any device
 * (waits for the run to finish). ERR_INVALID when i is out of range or n_bytes exceeds the
 * output; ERR_RUNTIME naming the device error. */
jdt_status jdt_program_read_output(const jdt_program *p, int i, void *dst, size_t n_bytes,
                                   jdt_err *e);

/* Statistics of the compilation (never NULL for a live program). */
/* The compile cache directory o selects (cache_dir, $JDT_CACHE_DIR, $XDG_CACHE_HOME/jdt-train,
 * ~/.cache/jdt-train), created if missing, into buf (n bytes). Errors: ERR_IO (mkdir). Other
 * per-machine caches (the MFU reference, engine/obs) live beside the kernels. */
jdt_status jdt_compile_cache_dir(const jdt_compile_opts *o, char *buf, size_t n, jdt_err *e);

const jdt_compile_stats *jdt_program_stats(const jdt_program *p);

/* The generated C source of the program (for inspection and tests); "" with opts.no_jit. */
const char *jdt_program_source(const jdt_program *p);

/* Writes a human-readable summary (passes, kernels, memory, cache) into buf; returns buf. */
char *jdt_program_summary(const jdt_program *p, char *buf, size_t n);

/* With opts.profile: writes the accumulated time per kind of step over all runs so far but the
 * backend's trial runs (vt->trial: the CPU tuner's probes of another thread count; the header
 * counts them) (fused
 * kernels by their root op, builtins by op, update copies), largest first, one per line with
 * its share, then the GEMMs (MATMUL builtins) grouped by shape and form, the 16 that take
 * longest, into buf; returns buf. Without profiling it says so. */
char *jdt_program_profile(const jdt_program *p, char *buf, size_t n);

/* Forgets the profile's accumulated times and runs (the trainer's warm-up step: its first
 * calls' setup, cuBLASLt's plans and module loads on a GPU, would count as kernel time). No-op
 * without opts.profile. */
void jdt_program_profile_reset(jdt_program *p);

/* Frees the program (closes the shared object). NULL is a no-op. */
void jdt_program_free(jdt_program *p);

/* ---- memory plan introspection (tests, `inspect`) ------------------------------------------- */

typedef enum {
    JDT_BUF_LEAF = 0,  /* caller-bound leaf memory */
    JDT_BUF_ARENA = 1, /* an interval of the program's arena */
} jdt_buf_kind;

typedef struct {
    jdt_buf_kind kind;
    int64_t offset, n_bytes; /* arena interval (ARENA only) */
    int def_step;            /* step that writes it (-1: leaf, valid before step 0) */
    int last_step;           /* last step that reads it (n_steps: kept to the end) */
    int inplace_of;          /* buffer whose storage it took over at def_step, or -1 */
    int slot_of;             /* a slot inside bucket buffer slot_of (an all-reduce bucket's
                                member: placed with it, not on its own), or -1 */
    bool bf16;               /* holds bf16 values of an f32 node (bf16 storage, fuse.c) */
} jdt_buf_info;

int jdt_program_n_buffers(const jdt_program *p);
/* Fills *info for buffer i; false if out of range. */
bool jdt_program_buffer(const jdt_program *p, int i, jdt_buf_info *info);

/* ---- the on-disk compile cache (cache.c), generic over what it stores ------------------ *
 * An entry is <dir>/jdt-<key as 16 hex>.<kind> (the CPU JIT uses kind "so"; NVRTC output can use
 * "cubin" or "ptx"), checksummed, written atomically (unique temporary + rename), so any
 * number of processes may read and write one directory at once, NFS included. */

/* The cache directory opts ask for (cache_dir, $JDT_CACHE_DIR, $XDG_CACHE_HOME/jdt-train,
 * ~/.cache/jdt-train), created if missing; ERR_IO naming it otherwise. */
jdt_status jdt_compile_cache_dir(const jdt_compile_opts *o, char *buf, size_t n, jdt_err *e);
/* The path of entry (key, kind) in dir. */
void jdt_compile_cache_path(const char *dir, uint64_t key, const char *kind, char *buf, size_t n);
/* Looks up (key, kind). True with *bytes (jdt_malloc'd, caller frees; the trailer is still
 * there past *n_bytes) and *n_bytes when a complete entry with a matching checksum exists; it
 * then counts as just used for the size bound. False when absent or damaged (rebuild it). */
bool jdt_compile_cache_get(const char *dir, uint64_t key, const char *kind, unsigned char **bytes,
                           size_t *n_bytes);
/* Stores n_bytes under (key, kind), replacing any entry atomically, then prunes the directory
 * to max_bytes (0: 1 GiB, < 0: unbounded). ERR_IO naming the file. */
jdt_status jdt_compile_cache_put(const char *dir, uint64_t key, const char *kind, const void *bytes,
                                 size_t n_bytes, int64_t max_bytes, jdt_err *e);
/* Removes temporaries of dead writers (this host's, at once; any older than an hour), failure
 * records older than 7 days, then least recently used entries (never `keep`, a path or NULL)
 * until the total is within max_bytes (0: 1 GiB, < 0: no bound). One process prunes at a time
 * (flock on <dir>/.prune.lock; a busy lock skips). Best effort: never fails. */
void jdt_compile_cache_prune(const char *dir, int64_t max_bytes, const char *keep);

#endif /* JDT_COMPILE_H */
