/*
 * compile-impl.h — internals of the compiler shared by its files: the compiler's own node list
 * (a rewritten copy of the caller's graph), fusion groups, steps and buffers.
 *
 * Pipeline (program.c drives it):
 *   passes.c   graph -> cnodes: simplification, splat folding and CSE while copying, then DCE
 *   fuse.c     cnodes -> groups (fused loop nests) and builtin steps, schedule, memory plan
 *   nest.c     group -> device-neutral loop nest (accesses, collapsed dims, value expressions)
 *   backend    the nests -> source in the backend's dialect, built and run by the backend
 *              (engine/backend: cpu/ C + OpenMP via cache.c; cuda/ CUDA C via NVRTC)
 */
#ifndef JDT_COMPILE_IMPL_H
#define JDT_COMPILE_IMPL_H

#include "compile/compile.h"

typedef enum {
    CK_LEAF,    /* PARAM, INPUT, data CONSTANT: caller/arena-bound memory */
    CK_SPLAT,   /* CONSTANT without data: every element = splat (inlined as a literal) */
    CK_EW,      /* elementwise (incl. IOTA, CAUSAL_MASK, DROPOUT): fusible */
    CK_MAP,     /* BROADCAST, TRANSPOSE, SLICE: a strided read of a materialised input */
    CK_REDUCE,  /* REDUCE_*: a group root */
    CK_VIEW,    /* RESHAPE: aliases its input's buffer */
    CK_BUILTIN, /* hand-written kernel (engine/runtime) */
    CK_COOUT,   /* a builtin's second output: written by the step of the builtin in[0] (its
                   only input), whose `co` names this node; a buffer of its own, no step */
} cnode_kind;

typedef struct {
    jdt_op op;
    jdt_dtype dtype;
    jdt_shape shape;
    int n_in;
    int in[JDT_MAX_INPUTS]; /* cnode indices (< own index) */
    jdt_attrs attrs;
    double splat;    /* CK_SPLAT value */
    jdt_tensor *src; /* leaves: the caller's tensor */
    cnode_kind kind;
    bool live;
    int n_users;
    int group;     /* fusion group or -1 */
    bool store;    /* materialised: has a buffer */
    int buf;       /* buffer index (views: their input's) or -1 */
    bool absorbed; /* a strided read (MAP) composed into its MAP consumers' reads: no kernel */
    bool bf16;     /* stored as bf16 (2 bytes, round to nearest even on store, widened on load)
                      though computed in f32: a value read only by bf16-compute GEMMs, which
                      round it anyway (fuse.c mark_bf16_storage) */
    int co;        /* CK_BUILTIN: the first CK_COOUT node its step writes besides its own output;
                      CK_COOUT: the next one of the same step (a chain, in the builtin's order);
                      always a later index than the builtin, 0: none (passes.c make_co_output) */
    int64_t pitch; /* elements from one row (last axis) of its buffer to the next when more than
                      the row's length (fuse.c mark_pitched_rows: written and read by builtins
                      only); 0: rows back to back. Views: their root's (cnode_pitch) */
    bool hoisted;  /* moved up to just after its inputs (passes.c hoist_loss_backwards): it runs
                      there, so it joins no reader's fusion group (fuse.c joinable) */
} cnode;

typedef struct {
    int root;     /* cnode index; the group runs at the root's position */
    int *members; /* cnode indices in topological order (a bf16 copy moved into its
                     producer's group comes after the root: fuse.c fuse_bf16_copies) */
    int n_members, cap_members;
    jdt_shape domain; /* loop domain: the root's shape, or a reduction's input shape */
    bool is_reduce;
    int n_in_bound; /* sum of the members' input counts (bounds the distinct reads) */
    int n_stores;   /* members stored from inside the group, besides the root */
} cgroup;

/* Fusion stops growing a group at these sizes, so the generated function's reads and writes
 * stay within codegen's access table and the plan's per-step output list. */
#define JDT_GROUP_MAX_READS 96
#define JDT_GROUP_MAX_STORES 24

/* STEP_COLL_*: an asynchronous collective (opts.collective_start): PACK copies a member's
 * input into its buffer (an all-gather's part, a reduce-scatter's permuted input) right after
 * the input is computed; START issues the collective once every member is packed; WAIT, just
 * before the first step that reads a member, waits and finishes each member (scale, unpermute). */
typedef enum {
    STEP_KERNEL,
    STEP_BUILTIN,
    STEP_COLL_PACK,
    STEP_COLL_START,
    STEP_COLL_WAIT
} step_kind;

typedef struct {
    step_kind kind;
    int group; /* STEP_KERNEL: group index; kernel index = order among kernel steps */
    int kernel;
    int node;        /* STEP_BUILTIN, STEP_COLL_PACK: cnode index */
    int scratch_buf; /* builtin scratch buffer or -1 */
    int coll;        /* STEP_COLL_*: index into cprog.colls, else -1 */
    int merged;      /* STEP_KERNEL on a device that merges launches (merge.c): 0: a launch of
                        its own; n > 1: its launch runs this kernel and the next n - 1 kernel
                        steps; -1: an earlier step's launch runs it (this step does nothing) */
} cstep;

/* One asynchronous collective call: a single ALL_REDUCE / ALL_GATHER / REDUCE_SCATTER node, or
 * a bucket of nodes of one op and group (fuse.c add_coll). A bucket of ALL_REDUCEs runs on
 * `buf`, whose consecutive slots are its members' buffers. A REDUCE_SCATTER (one or a bucket)
 * and a bucket of ALL_GATHERs run on the wire buffer `scratch_buf` of k segments, segment r
 * holding every member's part r side by side (part_off): PACK puts a member's input there
 * (scatter: its parts permuted into the segments), WAIT takes each member's result out into
 * the member's own buffer, which is defined there. A lone ALL_GATHER runs on its own output. */
typedef struct {
    int *members; /* cnode indices, in slot order */
    int n_members;
    int64_t *part_off; /* per member: offset of its part in a segment (all-reduce: of its slot) */
    int64_t n_elems;   /* of the call: the bucket, or the full (gathered / scattered) tensor */
    int64_t esz;       /* bytes per element of every member: 4 (f32), 2 (a bf16 all-gather) */
    int buf;           /* all-reduce bucket buffer (n_members > 1) or -1 */
    int scratch_buf;   /* the wire buffer (see above), live from the first PACK to WAIT; or -1 */
    int first_pack_step, start_step, wait_step;
    bool inline_run; /* nothing runs between START and WAIT: START runs it blocking (no thread
                        hand-off), WAIT only finishes */
} ccoll;

/* The index of cnode `node` among the members of cl (the last member if none). */
static inline int jdt_ccoll_member(const ccoll *cl, int node)
{
    int m = 0;
    while (m < cl->n_members - 1 && cl->members[m] != node)
        m++;
    return m;
}

/* The length of one of cl's wire segments, in elements (a gather's or scatter's k: parts). */
static inline int64_t jdt_ccoll_seg(const ccoll *cl, int64_t k)
{
    return k > 0 ? cl->n_elems / k : 0;
}

typedef struct {
    jdt_buf_info info;
    int leaf_node; /* JDT_BUF_LEAF: the cnode whose src->data is bound, else -1 */
} cbuf;

typedef struct {
    int value, target; /* cnode indices */
    bool donated;      /* value written directly into the target's buffer */
} cupdate;

/* Everything the compiler builds; program.c owns it. */
typedef struct cprog_ {
    jdt_compile_opts opts;
    int nt;
    cnode *nodes;
    int n_nodes, cap_nodes;
    int *outputs; /* cnode index per graph output */
    int n_outputs;
    cupdate *updates;
    int n_updates;
    cgroup *groups;
    int n_groups, cap_groups;
    cstep *steps;
    int n_steps, cap_steps;
    cbuf *bufs;
    int n_bufs, cap_bufs;
    ccoll *colls;
    int n_colls, cap_colls;
    int64_t arena_bytes;
    jdt_compile_stats stats;
    /* opts.share_arena accepted (same device, its arena large enough): the lender's backend
     * state, whose arena this program's buffers point into; NULL: an arena of its own */
    const void *arena_lender;
    bool bf16_storage;   /* the device stores bf16 values (the CPU backend): fuse.c may mark them */
    bool host_builtins;  /* the CPU backend's builtins run it (scatter-add onto an initial value) */
    bool wire_gathers;   /* the device's vtable flag: lone all-gathers with outer > 1 get a wire */
    bool reduce_stores;  /* the device's vtable flag: reduction kernels store members of their
                            loop (fuse.c fuse_reduce_producers) */
    bool bf16_builtins;  /* the device's vtable flag: GEMMs store bf16 outputs, the cross-entropy
                            reads bf16 logits (passes.c fold_bf16_casts) */
    bool gemm_bf16_out;  /* the device's vtable flag, or bf16_builtins, unless JDT_GEMM_BF16_OUT=0:
                            GEMMs store bf16 outputs (fold_bf16_casts' first rule) */
    bool norm_bwd_scale; /* the device's vtable flag: the norm backwards take the scale
                            (passes.c fold_norm_scales) */
    bool gemm_gelu;      /* the device's vtable flag: bf16 GEMMs apply GELU (fold_gelu_epilogues) */
    bool xent_fused;     /* the device's vtable flag, unless JDT_FUSED_XENT=0: the cross-entropy
                            forward writes dlogits too (passes.c fold_xent_backwards) */
    bool xent_inplace;   /* the device's vtable flag: dlogits may take over dying logits */
    bool attention_copy; /* the device's vtable flag, unless JDT_ATTENTION_COPY=0: the attention
                            forward writes o's (B, T, H, D) copy too (fold_attention_copies) */
    bool attention_groups;     /* the device's vtable flag, unless JDT_ATTENTION_GROUPS=0: the
                                  attention reads grouped k and v itself (fold_attention_groups) */
    bool rope_bhtd;            /* the device's vtable flag: its RoPE reads (B, H, T, D) input at an
                                  offset (passes.c fold_rope_transposes) */
    int attention_part_rows;   /* the device's vtable field, unless JDT_ATTENTION_GRADS=0: the
                                  attention backward's cotangent form (fold_attention_cotangents) */
    bool attention_lse;        /* the device's vtable flag, unless JDT_ATTENTION_LSE=0: the forward
                                  stores the log-sum-exp its backward reads (fold_attention_lse) */
    bool attention_bf16_qkv;   /* the device's vtable flag, unless JDT_ATTENTION_BF16_QKV=0, or
                                  bf16_builtins: the attention reads bf16 q, k, v (passes.c
                                  fold_bf16_casts' attention rule) */
    bool xent_bf16_logits;     /* the device's vtable flag, unless JDT_XENT_BF16_LOGITS=0, or
                                  bf16_builtins: the cross-entropy reads bf16 logits (passes.c
                                  fold_bf16_casts' cross-entropy rule) */
    int64_t norm_bwd_partials; /* the device's vtable field: the widest row whose norm
                                  backward sums its affine's gradients (fold_norm_partials) */
    bool gemm_accumulate;      /* the device's vtable flag: GEMMs add an input to their product
                                  (passes.c fold_addends) */
    bool gemm_pitch;           /* the device's vtable flag, unless JDT_GEMM_PITCH=0: padded rows
                                  for GEMM outputs read by the cross-entropy (fuse.c
                                  mark_pitched_rows) */
    bool residual_gemm;        /* gemm_accumulate and bf16_builtins, unless JDT_RESIDUAL_GEMM=0:
                                  bf16 branch outputs added unrounded (fold_residual_gemms) */
    bool merge_launches;       /* the device's vtable flag, unless opts.no_merge_launches or
                                  JDT_MERGE_LAUNCHES=0: independent consecutive kernels run as one
                                  launch (merge.c) */
    /* the device's answer (vt attention_dout16_d), 0 with JDT_ATTENTION_DOUT16=0: the largest
     * head size whose attention backward reads a bf16 dO (fold_attention_dout16) */
    int64_t attention_dout16_d;
    /* attention_dout16_d > 0, unless JDT_ATTENTION_O16=0: the backward reads o's bf16 copy,
     * no f32 o stored (fold_attention_o16) */
    bool attention_o16;
    /* bf16_builtins and norm_bwd_partials, unless JDT_NORM_DY16=0: the norm backwards' dy
     * stored as bf16 by its GEMM (fold_norm_dy16) */
    bool norm_dy16;
    /* norm_dy16, unless JDT_NORM_DY_TERMS=0: a norm backward sums its dy from the bf16 products
     * of the GEMMs computing it instead of their f32 chain through cuBLASLt's C
     * (fold_norm_dy_terms) */
    bool norm_dy_terms;
    /* scratch bytes a builtin node needs on the program's device (NULL: the CPU kernels') */
    int64_t (*scratch_bytes)(const struct cprog_ *c, const cnode *n);
} cprog;

/* The full tensor of an ALL_GATHER (its output) or REDUCE_SCATTER (its input), and the product
 * of its dims before the sharded axis (attrs i[1]): the `outer` of the (outer, k, blk) block
 * order both backends use; 1 when the parts lie back to back. */
static inline const jdt_shape *jdt_coll_full(const cprog *c, const cnode *n)
{
    return n->op == JDT_OP_ALL_GATHER ? &n->shape : &c->nodes[n->in[0]].shape;
}

static inline int64_t jdt_coll_outer(const cprog *c, const cnode *n)
{
    const jdt_shape *full = jdt_coll_full(c, n);
    int64_t outer = 1;
    for (int d = 0; d < (int)n->attrs.i[1]; d++)
        outer *= full->dims[d];
    return outer;
}

/* passes.c: copies g into c->nodes with simplification/CSE (unless no_simplify) and DCE. */
jdt_status jdt_compile_lower(cprog *c, jdt_graph *g, jdt_err *e);
/* fuse.c: groups, schedule and memory plan. */
jdt_status jdt_compile_fuse(cprog *c, jdt_err *e);
jdt_status jdt_compile_plan(cprog *c, jdt_err *e);
/* Sets cstep.merged over the planned schedule: runs of consecutive kernel steps that touch
 * disjoint memory (by the plan's offsets) become one launch each (merge.c). ERR_NOMEM. */
jdt_status jdt_compile_merge_launches(cprog *c, jdt_err *e);
/* ---- nest.c: the device-neutral loop nest of a fused group (the emitters' input) ---------- */

/* A growing text buffer; oom is set (and further output dropped) on allocation failure.
 * bad_node: 1 + the id of the first node no emitter handles (0: none); the emitter that owns
 * the buffer turns it into ERR_UNSUPPORTED (jdt_sb_status), never into generated code. */
typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
    int bad_node;
} jdt_sbuf;
/* JDT_OK, or the error for s's first unhandled node (ERR_UNSUPPORTED naming it and its op) or
 * its allocation failure (ERR_NOMEM); what = the emitter's name for the message. */
jdt_status jdt_sb_status(const jdt_sbuf *s, const cprog *c, const char *what, jdt_err *e);
void jdt_sb_printf(jdt_sbuf *s, const char *fmt, ...) JDT_PRINTF(2, 3);

#define JDT_NEST_MAX_ACC (JDT_GROUP_MAX_READS + JDT_GROUP_MAX_STORES + 2)

/* One memory access of a group: element offset = base + sum(stride[k] * i_k) over the nest's
 * (collapsed) dims. */
typedef struct {
    int64_t stride[JDT_MAX_DIMS];
    int64_t base;
    int node;   /* the buffer's node (read) or the stored node (write) */
    int reader; /* reads through a MAP member: that member; identity/scalar: -1 */
    bool write;
} jdt_access;

typedef struct {
    const cprog *c;
    const cgroup *g;
    int n; /* dims after collapsing (>= 1) */
    int64_t dims[JDT_MAX_DIMS];
    bool kept[JDT_MAX_DIMS]; /* false: the dim is reduced (reduction groups) */
    jdt_access acc[JDT_NEST_MAX_ACC];
    int n_acc;
    int flat; /* access index of the contiguous flat index (`flat` in values), or -1 */
} jdt_nest;

/* Builds the nest of group gi: its accesses, then dims collapsed. ERR_UNSUPPORTED when the
 * group has more accesses than JDT_NEST_MAX_ACC. */
jdt_status jdt_nest_build(const cprog *c, int gi, jdt_nest *N, jdt_err *e);
/* The offset expression of access a ("base + stride * ik ...") into out. */
void jdt_nest_offset(const jdt_nest *N, int a, char *out, size_t n);
/* The expression naming input k of member m: a literal, `v<node>` or a loaded `x<access>`. */
void jdt_nest_operand(const jdt_nest *N, const cnode *m, int k, char *out, size_t n);
/* Statements defining `const T v<id> = ...;` for member id (loads x<a> must be in scope). */
void jdt_nest_value(jdt_sbuf *s, const jdt_nest *N, int id);
/* The C type name of dt ("float", "int32_t", ...) and a typed literal of v. */
const char *jdt_nest_ctype(jdt_dtype dt);
void jdt_nest_lit(char *out, size_t n, jdt_dtype dt, double v);
/* cache.c: builds (or finds) the shared object for src; fills so_path, cc_s, cache_hit and
 * returns the dlopen handle in *handle. */
jdt_status jdt_compile_build(const jdt_compile_opts *o, const char *src, void **handle,
                             jdt_compile_stats *st, jdt_err *e);
/* The build lock of cache entry `key` under dir (flock on <dir>/.jdt-<key>.lock), for every
 * cache of compiled code (the CPU JIT, NVRTC programs, the CUDA builtins): after a miss, take
 * it, look again (another process of this host may have built the entry meanwhile), build,
 * store, release. Returns the lock's fd, or -1 without one (the file cannot be made, or its
 * holder kept it past wait_s: build anyway, entries are renamed into place whole), or
 * JDT_CACHE_LOCK_JOB_LOST when the job this process is a rank of ended while it waited
 * (jdt_job_lost: the holder may be a stopped rank; the caller gives up). */
#define JDT_CACHE_LOCK_JOB_LOST (-2)
int jdt_compile_cache_lock(const char *dir, uint64_t key, double wait_s);
/* Releases lock fd (>= 0) of entry key: the file is unlinked first, so a process arriving now
 * finds the entry, or makes a new lock. fd < 0 is a no-op. */
void jdt_compile_cache_unlock(const char *dir, uint64_t key, int fd);

/* Builds the bytes of a cache entry into *bytes (jdt_malloc'd) and *n_bytes. */
typedef jdt_status (*jdt_cache_build_fn)(void *ctx, unsigned char **bytes, size_t *n_bytes,
                                         jdt_err *e);
typedef enum {
    JDT_CACHE_HIT,    /* the entry was there */
    JDT_CACHE_WAITED, /* another process of this host built it while this one waited */
    JDT_CACHE_BUILT   /* built here (and stored, when dir is given) */
} jdt_cache_how;
/* The bytes of entry (key, kind) in dir (jdt_compile_cache_get), else, under the host's build
 * lock (waiting at most wait_s), another process's fresh entry, else build(ctx)'s bytes, stored
 * (jdt_compile_cache_put, pruning to max_bytes; a failed store is a warning: the next run
 * builds again; dir is created if missing). dir NULL or "": always built, never stored. *bytes is
 * the caller's (jdt_free); *how says where it came from. The builder's failure is returned as is.
 */
jdt_status jdt_compile_cache_fetch(const char *dir, uint64_t key, const char *kind, double wait_s,
                                   int64_t max_bytes, jdt_cache_build_fn build, void *ctx,
                                   unsigned char **bytes, size_t *n_bytes, jdt_cache_how *how,
                                   jdt_err *e);
/* For a caller whose point is the stored entry (an ahead-of-time compile): ERR_IO naming entry
 * (key, kind) of dir when it is not there, e.g. after jdt_compile_cache_fetch built it but its
 * store failed, which fetch only warns about. */
jdt_status jdt_compile_cache_require(const char *dir, uint64_t key, const char *kind, jdt_err *e);

/* The node a read of x really touches: x, or for absorbed strided reads the first node down
 * the chain that is materialised (or a splat). */
static inline int cnode_read_src(const cprog *c, int x)
{
    while (c->nodes[x].absorbed)
        x = c->nodes[x].in[0];
    return x;
}

/* Bytes of one element of n as stored (bf16 storage: 2, though computed in f32). */
static inline int64_t cnode_elem_size(const cnode *n)
{
    return n->bf16 ? 2 : (int64_t)jdt_dtype_size(n->dtype);
}

/* A MATMUL cnode's optional inputs after a and b: the bias (N values, passes.c fold_bias_adds)
 * at in[2], and, with attrs i[3] set, a tensor of the output's shape the product is added to,
 * last (the GEMM's C with beta 1: passes.c fold_addends). -1 when absent. */
static inline int cnode_mm_bias(const cnode *n)
{
    return n->n_in - (n->attrs.i[3] ? 1 : 0) - (n->attrs.i[5] ? 1 : 0) > 2 ? n->in[2] : -1;
}
static inline int cnode_mm_acc(const cnode *n)
{
    return n->attrs.i[3] ? n->in[n->n_in - 1 - (n->attrs.i[5] ? 1 : 0)] : -1;
}
/* The GELU backward's aux of a MATMUL (attrs i[5], passes.c fold_dgelu_epilogues): its last
 * input, a MATMUL with the GELU epilogue whose second half is the forward's GELU input. */
static inline int cnode_mm_aux(const cnode *n)
{
    return n->attrs.i[5] ? n->in[n->n_in - 1] : -1;
}
/* A bf16-compute MATMUL rounds its operand k (0: a, 1: b) from f32 at every call: the
 * operand is not stored as bf16 (the flag the backends pass to their GEMMs). */
static inline bool cnode_mm_converts(const cprog *c, const cnode *n, int k)
{
    return n->attrs.i[2] && !c->nodes[n->in[k]].bf16;
}
/* Rows of a MATMUL's product: its shape's, or half of them when the GEMM's GELU epilogue packs
 * GELU(y) and then y into its output (attrs i[4], passes.c fold_gelu_epilogues). */
static inline int64_t cnode_mm_rows(const cnode *n)
{
    const int64_t r = n->shape.dims[n->shape.ndim - 2];
    return n->attrs.i[4] ? r / 2 : r;
}

/* The padded row stride of node x's buffer: the pitch of the node its views lead to (fuse.c
 * mark_pitched_rows), 0 when its rows lie back to back. */
static inline int64_t cnode_pitch(const cprog *c, int x)
{
    while (c->nodes[x].kind == CK_VIEW)
        x = c->nodes[x].in[0];
    return c->nodes[x].pitch;
}

/* Reduce attrs helper: true when axis k of an n-d input is reduced. */
static inline bool cnode_reduces_axis(const cnode *r, int k)
{
    return (r->attrs.i[0] >> k) & 1;
}

/* program.c: "'name'", "node 12 (add)" or the op name, into buf; returns buf. */
const char *jdt_compile_node_label(const cnode *n, char *buf, size_t len);

/* Grows a dynamic array; false on allocation failure. */
bool jdt_compile_grow(void **arr, int *cap, int need, size_t elem);

#endif /* JDT_COMPILE_IMPL_H */
