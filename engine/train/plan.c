/*
 * plan.c — `jdt-train inspect`: the train step of rank 0 of the configured mesh, planned from
 * shapes alone (train.h jdt_train_inspect). It builds exactly what a rank of the job would
 * build — model graph, partition for the mesh, autodiff, clipping and optimizer, the
 * compiler's passes, fusion and liveness memory plan — with jdt_step_opts.plan_only: no
 * process starts, no parameter, optimizer or arena buffer is allocated, nothing is drawn
 * from the RNG and no code is generated. What it prints is read off that plan: memory per
 * device by kind, every collective of one step (aggregated by op, group and buffer), and each
 * parameter's sharding. A 7B model on a 64 x 8 mesh plans in seconds (docs/sharding.md).
 */
#include "train/train.h"

#include "backend/backend.h"

#include <stdio.h>
#include <string.h>

/* Stand-in communicator: a planned step is never run, but the compiler wants one to accept
 * collective ops. */
static jdt_status plan_collective(void *ctx, int group, int kind, jdt_dtype dt, void *buf,
                                  size_t n_elems, jdt_err *e)
{
    (void)ctx, (void)group, (void)kind, (void)dt, (void)buf, (void)n_elems;
    return jdt_err_set(e, JDT_ERR_INTERNAL, "inspect: the planned step cannot run");
}

static jdt_status plan_collective_start(void *ctx, int group, int kind, jdt_dtype dt, void *buf,
                                        size_t n_elems, void **handle, jdt_err *e)
{
    (void)ctx, (void)group, (void)kind, (void)dt, (void)buf, (void)n_elems, (void)handle;
    return jdt_err_set(e, JDT_ERR_INTERNAL, "inspect: the planned step cannot run");
}

static jdt_status plan_collective_wait(void *ctx, void *handle, jdt_err *e)
{
    (void)ctx, (void)handle;
    return jdt_err_set(e, JDT_ERR_INTERNAL, "inspect: the planned step cannot run");
}

/* "3.14 GiB" style (binary units) into buf; returns buf. */
static const char *fmt_bytes(double b, char *buf, size_t n)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024.0 && u < 5) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
    return buf;
}

/* One kind of collective of one program: same op, dtype, group and buffer shape. */
typedef struct {
    const char *where; /* "micro", "step", "apply" or "eval" */
    jdt_op op;
    jdt_dtype dtype; /* f32; bf16 for FSDP's gathers of bf16 weight copies */
    unsigned group;  /* mesh-axis mask */
    jdt_shape full;  /* the whole buffer it moves (the gathered / pre-scatter shape) */
    int64_t n_bytes; /* bytes of that buffer */
    int64_t count;   /* per optimizer step (occurrences x runs of its program) */
} coll_row;

typedef struct {
    coll_row *rows;
    int n, cap;
} coll_table;

/* Adds g's collectives, each counted `runs` times, to the table (first appearance keeps the
 * schedule order). ERR_NOMEM. */
static jdt_status collect(coll_table *tab, const jdt_graph *g, const char *where, int64_t runs,
                          jdt_err *e)
{
    if (!g) return JDT_OK;
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        if (jdt_op_class_of(t->op) != JDT_OPC_COLLECTIVE) continue;
        const jdt_shape *full = t->op == JDT_OP_REDUCE_SCATTER ? &t->inputs[0]->shape : &t->shape;
        const unsigned group = (unsigned)t->attrs.i[0];
        coll_row *r = NULL;
        for (int k = 0; k < tab->n && !r; k++) {
            coll_row *q = &tab->rows[k];
            if (q->where == where && q->op == t->op && q->dtype == t->dtype && q->group == group &&
                q->full.ndim == full->ndim &&
                memcmp(q->full.dims, full->dims, sizeof(int64_t) * (size_t)full->ndim) == 0)
                r = q;
        }
        if (!r) {
            if (tab->n == tab->cap) {
                int cap = tab->cap ? 2 * tab->cap : 32;
                coll_row *nr = jdt_realloc(tab->rows, (size_t)cap * sizeof *nr);
                if (!nr) return jdt_err_set(e, JDT_ERR_NOMEM, "inspect: out of memory");
                tab->rows = nr;
                tab->cap = cap;
            }
            r = &tab->rows[tab->n++];
            memset(r, 0, sizeof *r);
            r->where = where;
            r->op = t->op;
            r->dtype = t->dtype;
            r->group = group;
            r->full = *full;
            r->n_bytes = jdt_shape_numel(full) * (int64_t)jdt_dtype_size(t->dtype);
        }
        r->count += runs;
    }
    return JDT_OK;
}

/* Bytes one member of a k-rank ring sends for a collective over a buffer of b bytes:
 * all-reduce = reduce-scatter + all-gather, 2 (k-1)/k b; either half alone (k-1)/k b. */
static double ring_sent_bytes(jdt_op op, double b, int k)
{
    if (k <= 1) return 0;
    double part = b * (double)(k - 1) / (double)k;
    return op == JDT_OP_ALL_REDUCE ? 2.0 * part : part;
}

static void print_collectives(const jdt_step *s, const jdt_config *cfg, FILE *f, jdt_err *e)
{
    const jdt_mesh *m = jdt_step_mesh(s);
    const int64_t n_accum = cfg->data.batch_size / cfg->data.micro_batch_size;
    const bool accum = jdt_step_graph(s, JDT_STEP_PROG_APPLY) != NULL;
    coll_table tab = {0};
    jdt_status st = collect(&tab, jdt_step_graph(s, JDT_STEP_PROG_MAIN), accum ? "micro" : "step",
                            accum ? n_accum : 1, e);
    if (st == JDT_OK) st = collect(&tab, jdt_step_graph(s, JDT_STEP_PROG_APPLY), "apply", 1, e);
    if (st != JDT_OK) {
        fprintf(f, "  collectives: not listed (%s)\n", e->msg);
        jdt_free(tab.rows);
        return;
    }
    char ax[64], sh[96], b1[32], b2[32];
    if (tab.n == 0) {
        fprintf(f, "  collectives of one step: none (one device, or nothing to exchange)\n");
        jdt_free(tab.rows);
        return;
    }
    fprintf(f,
            "  collectives of one optimizer step, in schedule order (%s; bytes of the whole "
            "buffer each one moves):\n",
            accum ? "'micro' runs once per micro-batch, 'apply' once per step"
                  : "one run per step");
    fprintf(f, "    %-5s %-14s %-5s %-13s %5s %9s %12s %12s  %s\n", "prog", "op", "dtype", "group",
            "ranks", "count", "bytes each", "bytes/step", "buffer shape");
    for (int k = 0; k < tab.n; k++) {
        const coll_row *r = &tab.rows[k];
        fprintf(f, "    %-5s %-14s %-5s %-13s %5d %9lld %12s %12s  %s\n", r->where,
                jdt_op_name(r->op), jdt_dtype_name(r->dtype),
                jdt_mesh_axes_str(r->group, ax, sizeof ax), jdt_mesh_group_size(m, r->group),
                (long long)r->count, fmt_bytes((double)r->n_bytes, b1, sizeof b1),
                fmt_bytes((double)r->n_bytes * (double)r->count, b2, sizeof b2),
                jdt_shape_str(&r->full, sh, sizeof sh));
    }
    /* totals per group: how much each axis carries, and what one rank puts on the wire */
    for (unsigned g = 1; g < 8; g++) {
        double moved = 0, sent = 0;
        int64_t count = 0;
        for (int k = 0; k < tab.n; k++) {
            const coll_row *r = &tab.rows[k];
            if (r->group != g) continue;
            moved += (double)r->n_bytes * (double)r->count;
            sent += ring_sent_bytes(r->op, (double)r->n_bytes, jdt_mesh_group_size(m, g)) *
                    (double)r->count;
            count += r->count;
        }
        if (count == 0) continue;
        fprintf(f,
                "    total over %-13s %6lld collectives, %s of buffers; a ring member sends %s "
                "per step\n",
                jdt_mesh_axes_str(g, ax, sizeof ax), (long long)count,
                fmt_bytes(moved, b1, sizeof b1), fmt_bytes(sent, b2, sizeof b2));
    }
    /* what the compiled schedule issues (docs/compiler.md, "Collectives") */
    for (int p = 0; p < 2; p++) {
        const jdt_compile_stats *cs =
            jdt_step_prog_stats(s, p ? JDT_STEP_PROG_APPLY : JDT_STEP_PROG_MAIN);
        if (!cs || cs->n_coll_calls == 0) continue;
        fprintf(f,
                "    issued by the %s program: %d calls per run, %d of them start/wait pairs "
                "under compute, %d collectives coalesced into buckets of <= %d MiB\n",
                p       ? "apply"
                : accum ? "micro-batch"
                        : "train-step",
                cs->n_coll_calls, cs->n_coll_async, cs->n_coll_bucketed, cfg->runtime.bucket_mb);
        if (cs->gather_bytes > 0) { /* after the compiler's CSE: what moves, not graph nodes */
            char gb[32];
            fprintf(f, "    all-gathered per run: %s (gathered tensors)\n",
                    fmt_bytes((double)cs->gather_bytes, gb, sizeof gb));
        }
        if (cs->n_coll_prefetch > 0) { /* planned in the arena above: live from their start */
            char pb[32];
            fprintf(f,
                    "    of which %d calls gather weights ahead of use: at most %s gathered in "
                    "flight (runtime.prefetch_mb %d)\n",
                    cs->n_coll_prefetch, fmt_bytes((double)cs->prefetch_peak_bytes, pb, sizeof pb),
                    cfg->runtime.prefetch_mb);
        }
    }
    jdt_free(tab.rows);
}

static void print_shardings(const jdt_step *s, FILE *f)
{
    fprintf(f, "  parameter shardings (global shape -> this device's block; mesh axes per dim):\n");
    for (int i = 0; i < jdt_step_n_params(s); i++) {
        const char *name;
        float *data;
        jdt_shape local, global;
        int64_t off[JDT_MAX_DIMS];
        jdt_step_tensor(s, i, &name, &data, &local);
        jdt_step_tensor_block(s, i, &global, off);
        const jdt_placement *p = jdt_step_tensor_placement(s, i);
        char g[64], l[64], spec[128] = "", ax[32];
        size_t o = 0;
        for (int d = 0; d < global.ndim && o < sizeof spec; d++)
            o += (size_t)snprintf(spec + o, sizeof spec - o, "%s%s", d ? ", " : "",
                                  p->dim[d] ? jdt_mesh_axes_str(p->dim[d], ax, sizeof ax) : "-");
        fprintf(f, "    %-28s %-14s -> %-14s [%s]\n", name + strlen("params/"),
                jdt_shape_str(&global, g, sizeof g), jdt_shape_str(&local, l, sizeof l), spec);
    }
}

/* Memory per device by kind, read off the plan. */
static void print_memory(const jdt_step *s, const jdt_config *cfg, FILE *f)
{
    const int np = jdt_step_n_params(s), nt = jdt_step_n_tensors(s);
    double param_b = 0, opt_b = 0, param_global = 0;
    for (int i = 0; i < nt; i++) {
        const char *name;
        float *data;
        jdt_shape local, global;
        int64_t off[JDT_MAX_DIMS];
        jdt_step_tensor(s, i, &name, &data, &local);
        double b = (double)jdt_shape_numel(&local) * sizeof(float);
        if (i < np) {
            param_b += b;
            jdt_step_tensor_block(s, i, &global, off);
            param_global += (double)jdt_shape_numel(&global);
        } else {
            opt_b += b;
        }
    }
    const jdt_compile_stats *sm = jdt_step_prog_stats(s, JDT_STEP_PROG_MAIN);
    const jdt_compile_stats *sa = jdt_step_prog_stats(s, JDT_STEP_PROG_APPLY);
    const jdt_compile_stats *se = jdt_step_prog_stats(s, JDT_STEP_PROG_EVAL);
    const bool accum = jdt_step_graph(s, JDT_STEP_PROG_APPLY) != NULL;
    const int64_t n_accum = cfg->data.batch_size / cfg->data.micro_batch_size;
    const double grad_b = accum ? param_b : 0; /* accumulators; else in the arena */
    const double am = sm ? (double)sm->arena_bytes : 0, aa = sa ? (double)sa->arena_bytes : 0,
                 ae = se ? (double)se->arena_bytes : 0;
    /* the apply and eval programs run in the train step's arena when it is large enough */
    const bool a_own = sa && !sa->arena_shared, e_own = se && !se->arena_shared;
    char b[32], b2[32];
    const char *opt = cfg->optimizer.type == JDT_OPTIM_ADAMW ? "AdamW m and v"
                      : cfg->optimizer.momentum > 0          ? "SGD momentum buffer"
                                                             : "plain SGD keeps none";
    fprintf(f, "  per device: %lld bytes of parameters + optimizer state (%.1f MiB)\n",
            (long long)(param_b + opt_b), (param_b + opt_b) / 1048576.0);
    fprintf(f, "  memory per device (f32; this device's blocks and planned arenas):\n");
    fprintf(f, "    parameters       %12s  %.0f of %.0f elements (1/%.4g of the model)\n",
            fmt_bytes(param_b, b, sizeof b), param_b / sizeof(float), param_global,
            param_b > 0 ? param_global * sizeof(float) / param_b : 0.0);
    fprintf(f, "    optimizer state  %12s  %s, split like their parameters\n",
            fmt_bytes(opt_b, b, sizeof b), opt);
    if (accum)
        fprintf(f, "    gradients        %12s  accumulators summed over %lld micro-batches\n",
                fmt_bytes(grad_b, b, sizeof b), (long long)n_accum);
    else
        fprintf(f, "    gradients        %12s  (%s, transient: planned inside the arena below)\n",
                fmt_bytes(0, b, sizeof b), fmt_bytes(param_b, b2, sizeof b2));
    fprintf(f,
            "    activations      %12s  arena of the %s program (activations kept for "
            "backward, gradients, scratch)\n",
            fmt_bytes(am, b, sizeof b), accum ? "micro-batch" : "train-step");
    if (accum)
        fprintf(f, "                     %12s  arena of the apply program (clipping + update)%s\n",
                fmt_bytes(aa, b, sizeof b), a_own ? "" : ", inside the arena above");
    if (se)
        fprintf(f, "                     %12s  arena of the eval program%s\n",
                fmt_bytes(ae, b, sizeof b), e_own ? "" : ", inside the arena above");
    fprintf(f, "    total            %12s  per device, before framework overhead\n",
            fmt_bytes(param_b + opt_b + grad_b + am + (a_own ? aa : 0) + (e_own ? ae : 0), b,
                      sizeof b));
}

/* The plan itself lives here: its graphs, partition maps and compiler tables grow with the
 * number of ops, not with tensor sizes — about 0.5 MiB per GPT block for the train, apply and
 * eval programs together (measured: 1024 blocks in 512 MB peak RSS). A config whose plan
 * would not fit in this machine's memory (bounded at 1 MiB per block) is refused at once
 * instead of swapping for minutes. */
static jdt_status check_planner_memory(const jdt_config *cfg, jdt_err *e)
{
    const char *src;
    const int64_t avail = jdt_mem_available(&src);
    const int64_t layers =
        cfg->model.type == JDT_MODEL_GPT ? cfg->model.n_layer : cfg->model.n_hidden;
    const int64_t need = (layers + 16) << 20;
    if (avail < 0 || need <= avail) return JDT_OK;
    return jdt_err_set(
        e, JDT_ERR_NOMEM,
        "inspect: planning %lld layers needs about %.1f GiB for the graphs alone but "
        "%.1f GiB is available (%s): use a smaller model.n_layer",
        (long long)layers, (double)need / 1073741824.0, (double)avail / 1073741824.0, src);
}

/* The compile and device lines of an ahead-of-time CUDA compile for sm_<arch> (sm: the
 * micro-batch program's stats, NULL under the interpreter). */
static void print_aot_compile(FILE *f, double dt, const jdt_compile_stats *sm, int arch,
                              jdt_device *dev)
{
    char desc[1400];
    fprintf(f,
            "  compile        %.2fs (NVRTC %.2fs for sm_%d), cache %s: %s\n"
            "  device         %s\n",
            dt, sm ? sm->cc_s : 0.0, arch, sm && sm->cache_hit ? "hit" : "miss",
            sm ? sm->so_path : "-", jdt_device_describe(dev, desc, sizeof desc));
}

/* Writes the step's generated source to path (jdt_train_inspect's source_path), whole or not
 * at all (jdt_write_file_atomic). */
static jdt_status write_source(const jdt_step *step, const char *path, FILE *f, jdt_err *e)
{
    const char *src = jdt_step_source(step);
    if (jdt_write_file_atomic(path, src, e) != JDT_OK)
        return jdt_err_prefix(e, "--source %s", path);
    fprintf(f, "  generated source (%zu bytes) written to %s\n", strlen(src), path);
    return JDT_OK;
}

/* One inspect for one CUDA architecture (0: none). brief: only the compile line (a further
 * architecture of a list, after the first printed the summary). */
static jdt_status inspect_one(const jdt_config *cfg, bool compile, int cuda_arch, bool brief,
                              const char *source_path, FILE *f, jdt_err *e)
{
    const int world = jdt_config_mesh_size(cfg);
    if (world == 0)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "mesh: inspect plans a mesh of known size: give mesh.data, mesh.fsdp "
                           "and mesh.tensor (a -1 axis is filled in from the process count only "
                           "when training)");
    const bool cpu = cfg->runtime.backend == JDT_BACKEND_CPU;
    const int sizes[JDT_MESH_AXIS_COUNT] = {cfg->mesh.data, cfg->mesh.fsdp, cfg->mesh.tensor};
    jdt_mesh mesh;
    jdt_status st = jdt_mesh_init(&mesh, sizes, world, 0, e);
    if (st != JDT_OK) return st;
    /* one process on the CPU backend is this machine: refused here as train would refuse it */
    const bool here = world == 1 && cpu;
    if (here && (st = jdt_train_check_memory(cfg, cfg->data.micro_batch_size, NULL, e)) != JDT_OK)
        return st;
    if ((st = check_planner_memory(cfg, e)) != JDT_OK) return st;
    if (world > 1 && (st = jdt_train_check_mesh(cfg, world, e)) != JDT_OK) return st;

    jdt_step_opts so;
    memset(&so, 0, sizeof so);
    so.mesh = world > 1 ? &mesh : NULL;
    so.micro_batch = cfg->data.micro_batch_size;
    so.n_accum = cfg->data.batch_size / cfg->data.micro_batch_size;
    so.use_jit = cfg->runtime.jit || !compile;
    so.plan_only = !compile;
    jdt_train_compile_opts(cfg, &so.copts);
    if (world > 1) {
        so.copts.collective = plan_collective;
        /* the schedule and memory plan the trainer compiles (loop.c make_step) */
        if (cfg->runtime.overlap_comm) {
            so.copts.collective_start = plan_collective_start;
            so.copts.collective_wait = plan_collective_wait;
            so.copts.bucket_bytes = (int64_t)cfg->runtime.bucket_mb << 20;
            so.copts.prefetch_bytes =
                cfg->runtime.prefetch_mb ? (int64_t)cfg->runtime.prefetch_mb << 20 : -1;
        }
    }
    /* a CUDA step is planned (and with compile, emitted as CUDA source) by the CUDA backend
     * without a GPU: its memory plan is that device's */
    jdt_device *dev = NULL;
    if (!cpu && compile && cuda_arch > 0)
        st =
            jdt_device_open_aot(JDT_DEVICE_CUDA, cuda_arch,
                                cfg->runtime.cache_dir[0] ? cfg->runtime.cache_dir : NULL, &dev, e);
    else if (!cpu)
        st = jdt_device_open_emit_only(&dev, e);
    if (st != JDT_OK) return st;
    so.copts.device = dev;
    const double t0 = jdt_now_s();
    jdt_step *step = NULL;
    if ((st = jdt_step_new(cfg, &so, &step, e)) != JDT_OK) {
        jdt_device_close(dev);
        return st;
    }
    const double dt = jdt_now_s() - t0;
    const jdt_compile_stats *sm = jdt_step_prog_stats(step, JDT_STEP_PROG_MAIN);
    const jdt_compile_stats *sa = jdt_step_prog_stats(step, JDT_STEP_PROG_APPLY);
    const jdt_compile_stats *se = jdt_step_prog_stats(step, JDT_STEP_PROG_EVAL);
    if (here && !compile) { /* the exact plan, as the compiler checks it before allocating */
        int64_t arenas = (sm ? sm->arena_bytes : 0) +
                         (sa && !sa->arena_shared ? sa->arena_bytes : 0) +
                         (se && !se->arena_shared ? se->arena_bytes : 0);
        if ((st = jdt_compile_check_arena(arenas, e)) != JDT_OK) goto out;
    }

    if (brief) { /* compile with sm_<cuda_arch> only: the step was printed for the first */
        print_aot_compile(f, dt, sm, cuda_arch, dev);
        goto out;
    }
    const int64_t rows =
        cfg->data.micro_batch_size /
        jdt_mesh_group_size(&mesh, jdt_shard_batch_axes(&mesh, &cfg->sharding.rules));
    if (world > 1)
        fprintf(f,
                "%s step of rank 0 of the mesh data %d x fsdp %d x tensor %d (%d devices; no "
                "process started):\n",
                compile ? "compiled" : "planned", mesh.size[JDT_MESH_DATA],
                mesh.size[JDT_MESH_FSDP], mesh.size[JDT_MESH_TENSOR], world);
    else
        fprintf(f, "%s step (one process):\n", compile ? "compiled" : "planned");
    if (compile)
        fprintf(f,
                "  built and compiled in %.2fs (parameters allocated and initialised as train "
                "does)\n",
                dt);
    else
        fprintf(f,
                "  planned in %.2fs from shapes: no parameter or arena allocated, nothing "
                "initialised, no code generated\n",
                dt);
    if (compile && source_path && (st = write_source(step, source_path, f, e)) != JDT_OK) goto out;
    if (cfg->model.type == JDT_MODEL_GPT)
        fprintf(
            f, "  batch per device: %lld x %d tokens per micro-batch run, %lld run%s per step\n",
            (long long)rows, cfg->model.seq_len, (long long)so.n_accum, so.n_accum == 1 ? "" : "s");
    else
        fprintf(f, "  batch per device: %lld samples per micro-batch run, %lld run%s per step\n",
                (long long)rows, (long long)so.n_accum, so.n_accum == 1 ? "" : "s");
    print_memory(step, cfg, f);
    if (sm) {
        fprintf(f, "  ops            %d -> %d after DCE/CSE/simplification\n", sm->n_ops_in,
                sm->n_ops_out);
        fprintf(f, "  kernels        %d fused loop nests", sm->n_kernels);
        if (sm->n_launch_merged > 0)
            fprintf(f, " (%d launches: independent neighbours share one)",
                    sm->n_kernels - sm->n_launch_merged);
        fprintf(f, " + %d builtin calls (GEMM, attention, ...)", sm->n_builtin);
        if (sm->n_reduce_merged > 0)
            fprintf(f, "; %d elementwise producers computed inside the reductions reading them",
                    sm->n_reduce_merged);
        if (sm->n_reduce_siblings > 0)
            fprintf(f, "; %d copies stored by the reductions reading the same value",
                    sm->n_reduce_siblings);
        if (sm->n_ew_siblings > 0)
            fprintf(f, "; %d elementwise kernels merged into a sibling reading the same value",
                    sm->n_ew_siblings);
        if (sm->n_norm_scales_folded > 0)
            fprintf(f, "; %d norm backwards scale their input themselves",
                    sm->n_norm_scales_folded);
        if (sm->n_gelu_epilogues > 0)
            fprintf(
                f,
                "; %d GELUs applied by their GEMMs (%d backwards too, %d with the bias gradient)",
                sm->n_gelu_epilogues, sm->n_dgelu_epilogues, sm->n_dgelu_bgrads);
        if (sm->n_pitched > 0)
            fprintf(f, "; %d GEMM operands with rows padded to 64 values (logits, dlogits)",
                    sm->n_pitched);
        if (sm->n_norm_affines_folded > 0)
            fprintf(f, "; %d norms apply their affine", sm->n_norm_affines_folded);
        if (sm->n_norm_partials_folded > 0)
            fprintf(f, "; %d norm backwards sum their affine's gradients (%d add the residual's)",
                    sm->n_norm_partials_folded, sm->n_norm_acc_folded);
        if (sm->n_norm_cotangents_folded > 0)
            fprintf(f, "; %d of those sum and/or store the bf16 copy of their output",
                    sm->n_norm_cotangents_folded);
        if (sm->n_widenings_split > 0)
            fprintf(f, "; %d widenings of bf16 values recomputed by a second reader",
                    sm->n_widenings_split);
        if (sm->n_recomputes_split > 0)
            fprintf(f, "; %d cheap functions of stored values recomputed by a second reader",
                    sm->n_recomputes_split);
        if (sm->n_rope_transposes_folded > 0)
            fprintf(f, "; %d RoPEs read the attention's layout", sm->n_rope_transposes_folded);
        if (sm->n_attention_copies > 0)
            fprintf(f, "; %d attentions store the projection's copy of their output",
                    sm->n_attention_copies);
        if (sm->n_attention_groups > 0)
            fprintf(f,
                    "; %d attentions (forward or backward) read grouped-query k and v unrepeated",
                    sm->n_attention_groups);
        if (sm->n_attention_cotangents > 0)
            fprintf(f, "; %d attention backwards store the projections' copies of dq, dk, dv",
                    sm->n_attention_cotangents);
        if (sm->n_ropes_in_attention > 0)
            fprintf(f, " (%d of them rotated: RoPE's backward%s)", sm->n_ropes_in_attention,
                    sm->n_rotated_partials > 0 ? ", their bias partials summed rotated" : "");
        if (sm->n_attention_dout16 > 0)
            fprintf(f, "; %d attention backwards read dO stored as bf16 by its GEMM",
                    sm->n_attention_dout16);
        if (sm->n_norm_dy16 > 0)
            fprintf(f, "; %d norm backwards read dy stored as bf16 by its GEMM", sm->n_norm_dy16);
        if (sm->n_norm_dy_terms > 0)
            fprintf(f, "; %d norm backwards sum dy from several GEMMs' bf16 products",
                    sm->n_norm_dy_terms);
        if (sm->n_attention_o16 > 0)
            fprintf(f, "; %d attention backwards read o's bf16 copy (no f32 o stored)",
                    sm->n_attention_o16);
        if (sm->n_attention_lse > 0)
            fprintf(f, "; %d attention backwards read their forward's log-sum-exp",
                    sm->n_attention_lse);
        if (sm->n_xent_fused > 0)
            fprintf(f, "; %d cross-entropy backwards in their forward's pass over the logits",
                    sm->n_xent_fused);
        if (sm->n_loss_slices > 0)
            fprintf(f, "; %d cross-entropy slices, each backward right after its forward",
                    sm->n_loss_slices);
        if (sm->n_xent_inplace > 0)
            fprintf(f, "; %d dlogits written over their logits", sm->n_xent_inplace);
        if (sm->n_gemm_acc_folded > 0)
            fprintf(f, "; %d adds done by the GEMMs computing an operand", sm->n_gemm_acc_folded);
        if (sm->n_residual_gemms > 0)
            fprintf(f, " (%d residual adds of unrounded bf16 branch outputs)",
                    sm->n_residual_gemms);
        if (sm->n_gemm_acc_inplace > 0)
            fprintf(f, "; %d of those GEMMs add in the buffer of the input they add to",
                    sm->n_gemm_acc_inplace);
        fprintf(f, "\n");
        fprintf(f,
                "  FLOPs/step     %.3g per device (compiler count, per micro-batch run); "
                "model count %.3g per optimizer step, all devices\n",
                sm->flops_per_step, jdt_step_model_flops(step));
        fprintf(f,
                "  traffic        %.3g GB per run at least: %.3g fused kernels, %.3g builtins "
                "(every element of every buffer read or written once)\n",
                (sm->kernel_bytes + sm->builtin_bytes) / 1e9, sm->kernel_bytes / 1e9,
                sm->builtin_bytes / 1e9);
        fprintf(f, "  traffic by    ");
        for (int t = 0; t < 8 && sm->traffic_top[t].name[0]; t++)
            fprintf(f, "%s %s %.3g GB (%d)", t ? "," : "", sm->traffic_top[t].name,
                    sm->traffic_top[t].bytes / 1e9, sm->traffic_top[t].count);
        fprintf(f, "\n");
        fprintf(f,
                "  memory         %.1f MiB planned peak of intermediates (micro-batch program)\n",
                (double)sm->arena_bytes / 1048576.0);
        if (sm->peak_live_bytes > 0) { /* what is live there, for the next engineer */
            fprintf(f,
                    "  memory peak    %.1f MiB live at step %d of %d (%.1f MiB lost to the "
                    "placement's gaps); the largest there:",
                    (double)sm->peak_live_bytes / 1048576.0, sm->peak_step, sm->n_steps,
                    (double)(sm->arena_bytes - sm->peak_live_bytes) / 1048576.0);
            for (int t = 0; t < 4 && sm->peak_top[t].bytes > 0; t++) {
                const jdt_peak_buf *pb = &sm->peak_top[t];
                char b[32];
                fprintf(f, "%s %s %s", t ? ";" : "", fmt_bytes((double)pb->bytes, b, sizeof b),
                        pb->op);
                for (int d = 0; d < pb->ndim; d++)
                    fprintf(f, "%s%lld", d ? ", " : " (", (long long)pb->dims[d]);
                fprintf(f, "%s%s", pb->ndim ? ")" : "", pb->bf16 ? " bf16" : "");
            }
            fprintf(f, "\n");
        }
        if (cfg->precision.compute == JDT_DTYPE_BF16) /* docs/compiler.md, bf16 storage */
            fprintf(
                f,
                "  bf16           %d values stored as bf16, %d bf16 GEMM operands converted "
                "at every call, %d bf16 casts folded into GEMMs, attentions and cross-entropies "
                "(micro-batch program)\n",
                sm->n_bf16_stored, sm->n_bf16_converted, sm->n_bf16_folded);
        if (compile && dev && cuda_arch > 0) {
            print_aot_compile(f, dt, sm, cuda_arch, dev);
        } else if (compile && dev) {
            fprintf(f,
                    "  compile        %.2fs to CUDA source (%zu bytes; NVRTC runs on the GPU "
                    "host, or here with --cuda-arch)\n",
                    dt, strlen(jdt_step_source(step)));
        } else if (compile)
            fprintf(f, "  compile        %.2fs (C compiler %.2fs), cache %s: %s\n", dt, sm->cc_s,
                    sm->cache_hit ? "hit" : "miss", sm->so_path);
    } else {
        fprintf(f, "  runtime.jit is false: the reference interpreter runs the step\n");
    }
    print_collectives(step, cfg, f, e);
    print_shardings(step, f);
out:
    jdt_step_free(step);
    jdt_device_close(dev);
    return st;
}

jdt_status jdt_train_inspect(const jdt_config *cfg, bool compile, const int *cuda_arch, int n_arch,
                             const char *source_path, FILE *f, jdt_err *e)
{
    /* every architecture is checked before any is compiled: a typo in the list's tail is
     * one line, not a minute of NVRTC and then an error */
    for (int i = 0; i < n_arch; i++) {
        jdt_device *d = NULL;
        jdt_status st =
            jdt_device_open_aot(JDT_DEVICE_CUDA, cuda_arch[i],
                                cfg->runtime.cache_dir[0] ? cfg->runtime.cache_dir : NULL, &d, e);
        jdt_device_close(d);
        if (st != JDT_OK) return st;
    }
    jdt_status st =
        inspect_one(cfg, compile, n_arch > 0 ? cuda_arch[0] : 0, false, source_path, f, e);
    for (int i = 1; i < n_arch && st == JDT_OK; i++)
        st = inspect_one(cfg, compile, cuda_arch[i], true, NULL, f, e);
    return st;
}
