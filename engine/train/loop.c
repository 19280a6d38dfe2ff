/*
 * loop.c — the single-process training loop (see train.h): data, steps, logging, JSONL
 * metrics, eval, checkpoints, exact resume and a clean stop on SIGINT/SIGTERM.
 *
 * Batch k of the data stream is consumed by step k, so the data position is the step number
 * and a resumed run sees exactly the batches the uninterrupted run would have seen. Dropout
 * masks are keyed on the step too: 2N straight steps and N + resume + N give identical losses.
 */
#include "train/train.h"

#include "datasets/datasets.h"
#include "io/ckpt.h"
#include "io/data.h"
#include "train/trace.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* The stop request from a signal handler: the only state a handler may touch. */
static volatile sig_atomic_t g_stop_signal = 0;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

static void install_signals(struct sigaction *old_int, struct sigaction *old_term)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old_int);
    sigaction(SIGTERM, &sa, old_term);
}

static jdt_status mkdir_p(const char *path, jdt_err *e)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return jdt_err_set(e, JDT_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST)
        return jdt_err_set(e, JDT_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
    return JDT_OK;
}

/* Measured SGEMM throughput of this process's thread budget: the MFU denominator. */
static double measure_peak_flops(void)
{
    enum { N = 1024 }; /* big enough for OpenBLAS to reach its steady-state rate */
    float *a = jdt_malloc_aligned(N * N * sizeof(float));
    float *b = jdt_malloc_aligned(N * N * sizeof(float));
    float *c = jdt_malloc_aligned(N * N * sizeof(float));
    double best = 0;
    if (a && b && c) {
        for (int i = 0; i < N * N; i++) a[i] = b[i] = 1e-3f * (float)(i % 97);
        for (int r = 0; r < 8; r++) {
            double t0 = jdt_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c, N);
            double dt = jdt_now_s() - t0;
            double f = 2.0 * N * N * N / dt;
            if (r > 0 && f > best) best = f;
        }
    }
    jdt_free_aligned(a);
    jdt_free_aligned(b);
    jdt_free_aligned(c);
    return best;
}

static void fmt_duration(double s, char *buf, size_t n)
{
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

typedef struct {
    const jdt_config *cfg;
    jdt_dist *dist;      /* NULL: single process */
    int rank, world_size;
    char run_dir[1024];
    char ckpt_dir[1100];
    jdt_step *step;
    jdt_data *train, *val;
    FILE *metrics;
    jdt_trace *trace;    /* run.profile: open while the traced steps run */
    bool tracing;
    char trace_path[1200];
    int64_t first;       /* the first step this process runs (the resume point) */
    double t_start;      /* when step `first` began */
    /* global throughput numbers: every rank runs its share of the global batch */
    double units_per_step, flops_per_step, peak_flops;
    /* the log window: steps since the last log line, their seconds in data + step, of which data */
    int64_t window_steps;
    double window_time, window_wait;
} trainer;

/* compiled-program step hook (jdt_compile_opts.trace): one span per kernel while tracing */
static void trace_kernel(void *ctx, const char *name, double t0, double t1)
{
    trainer *tr = ctx;
    if (tr->tracing) jdt_trace_span(tr->trace, name, "kernel", 1, t0, t1);
}

static jdt_status open_data(const trainer *tr, const char *path, const char *split,
                            int64_t rows, jdt_data **out, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    jdt_data_opts o;
    memset(&o, 0, sizeof o);
    o.path = path;
    o.split = split;
    o.kind = cfg->model.type == JDT_MODEL_MLP ? JDT_DATA_KIND_ARRAYS : JDT_DATA_KIND_TOKENS;
    o.seq_len = cfg->model.seq_len;
    o.global_batch = rows;
    o.row_begin = rows / tr->world_size * tr->rank; /* this rank's slice of every batch */
    o.row_end = rows / tr->world_size * (tr->rank + 1);
    o.seed = (uint64_t)cfg->run.seed;
    o.shuffle = cfg->data.shuffle;
    o.prefetch = cfg->data.prefetch;
    jdt_status st = jdt_data_open(&o, out, e);
    if (st != JDT_OK) return st;
    jdt_data_info info;
    jdt_data_get_info(*out, &info);
    if (o.kind == JDT_DATA_KIND_TOKENS && info.vocab_size > cfg->model.vocab_size)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "%s: dataset vocab_size %lld exceeds model.vocab_size %d", path,
                           (long long)info.vocab_size, cfg->model.vocab_size);
    if (o.kind == JDT_DATA_KIND_ARRAYS && info.dim != cfg->model.in_dim)
        return jdt_err_set(e, JDT_ERR_CONFIG, "%s: dataset has %lld features, model.in_dim is %d",
                           path, (long long)info.dim, cfg->model.in_dim);
    return JDT_OK;
}

/* Resolves train/val sources; synthetic data is generated once into the run directory. */
static jdt_status setup_data(trainer *tr, bool want_train, bool want_val, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    char train_path[1100], val_path[1100];
    const char *train_split = NULL, *val_split = NULL;
    if (cfg->data.format == JDT_DATA_SYNTHETIC) {
        snprintf(train_path, sizeof train_path, "%s/synthetic_train.h5", tr->run_dir);
        snprintf(val_path, sizeof val_path, "%s/synthetic_val.h5", tr->run_dir);
        struct stat sb;
        jdt_status st = JDT_OK;
        bool mlp = cfg->model.type == JDT_MODEL_MLP;
        for (int i = 0; i < 2 && st == JDT_OK && tr->rank == 0; i++) {
            const char *p = i ? val_path : train_path;
            if (stat(p, &sb) == 0) continue;
            /* one seed for both: the same Markov chain (val is a prefix of the train stream) */
            uint64_t seed = (uint64_t)cfg->run.seed;
            st = mlp ? jdt_prep_synth_arrays(p, i ? 2048 : 16384, cfg->model.in_dim,
                                             cfg->model.n_classes, (uint64_t)cfg->run.seed, e)
                     : jdt_prep_synth_tokens(p, i ? 1 << 16 : 1 << 20,
                                             (uint32_t)cfg->model.vocab_size, seed, e);
        }
        if (st != JDT_OK) return st;
        /* the other ranks open the files rank 0 generated */
        if (tr->dist && (st = jdt_dist_barrier(tr->dist, cfg->dist.connect_timeout_s, e)) != JDT_OK)
            return st;
    } else {
        if (!cfg->data.train_path[0])
            return jdt_err_set(e, JDT_ERR_CONFIG, "data.train_path is empty (run `jdt-train prepare` first?)");
        snprintf(train_path, sizeof train_path, "%s", cfg->data.train_path);
        snprintf(val_path, sizeof val_path, "%s",
                 cfg->data.val_path[0] ? cfg->data.val_path : cfg->data.train_path);
        struct stat sb;
        if (stat(train_path, &sb) == 0 && S_ISDIR(sb.st_mode)) train_split = "train";
        if (stat(val_path, &sb) == 0 && S_ISDIR(sb.st_mode)) val_split = "val";
    }
    jdt_status st = JDT_OK;
    if (want_train) st = open_data(tr, train_path, train_split, cfg->data.batch_size, &tr->train, e);
    if (st != JDT_OK) return st;
    if (want_val && (cfg->data.val_path[0] || cfg->data.format == JDT_DATA_SYNTHETIC))
        st = open_data(tr, val_path, val_split, cfg->data.micro_batch_size, &tr->val, e);
    else if (want_val && !want_train)
        st = jdt_err_set(e, JDT_ERR_CONFIG, "data.val_path is empty: nothing to evaluate on");
    return st;
}

/* run.profile: where the compiled step spends its time, over the steps run so far. */
static void log_profile(const trainer *tr)
{
    static char buf[16384];
    jdt_step_profile(tr->step, buf, sizeof buf);
    JDT_INFO("profile of the compiled step:\n%s", buf);
}

static jdt_status save_ckpt(trainer *tr, int64_t next_step, jdt_err *e)
{
    int n = jdt_step_n_tensors(tr->step);
    jdt_ckpt_tensor *ts = jdt_calloc((size_t)n, sizeof *ts);
    if (!ts) return jdt_err_set(e, JDT_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < n; i++) {
        const char *name;
        float *data;
        jdt_shape shape;
        jdt_step_tensor(tr->step, i, &name, &data, &shape);
        ts[i].name = name;
        ts[i].dtype = JDT_DTYPE_F32;
        ts[i].ndim = shape.ndim;
        for (int d = 0; d < shape.ndim; d++) ts[i].shape[d] = shape.dims[d];
        ts[i].data = data;
    }
    jdt_ckpt_meta meta = {.step = next_step, .rng_state = (uint64_t)tr->cfg->run.seed,
                          .data_position = next_step, .config_text = tr->cfg->resolved_yaml};
    jdt_ckpt_save_opts so = {.keep_last = tr->cfg->checkpoint.keep};
    char *saved = NULL;
    double t0 = jdt_now_s();
    jdt_status st = jdt_ckpt_save(tr->ckpt_dir, &meta, ts, (size_t)n, &so, &saved, e);
    if (st == JDT_OK) JDT_INFO("saved checkpoint %s (%.2fs)", saved, jdt_now_s() - t0);
    jdt_free(saved);
    jdt_free(ts);
    return st;
}

/* Loads params and optimizer state from path; returns the step to continue from. */
static jdt_status load_ckpt(jdt_step *step, const char *path, int64_t *next_step, jdt_err *e)
{
    jdt_ckpt *c = NULL;
    jdt_status st = jdt_ckpt_open(path, &c, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta;
    jdt_ckpt_get_meta(c, &meta);
    *next_step = meta.step;
    int n = jdt_step_n_tensors(step);
    for (int i = 0; i < n && st == JDT_OK; i++) {
        const char *name;
        float *data;
        jdt_shape shape;
        jdt_step_tensor(step, i, &name, &data, &shape);
        jdt_ckpt_tensor want;
        memset(&want, 0, sizeof want);
        want.name = name;
        want.dtype = JDT_DTYPE_F32;
        want.ndim = shape.ndim;
        for (int d = 0; d < shape.ndim; d++) want.shape[d] = shape.dims[d];
        st = jdt_ckpt_read(c, &want, data, e);
    }
    jdt_ckpt_close(c);
    return st;
}

static jdt_status run_eval(trainer *tr, double *loss, jdt_err *e)
{
    double sum = 0;
    int64_t n = tr->cfg->run.eval_steps;
    for (int64_t k = 0; k < n; k++) {
        jdt_data_batch b;
        jdt_status st = jdt_data_get(tr->val, k, &b, e);
        if (st != JDT_OK) return st;
        double l;
        if ((st = jdt_step_eval(tr->step, b.x, b.y, &l, e)) != JDT_OK) return st;
        sum += l;
    }
    *loss = sum / (double)n;
    return JDT_OK;
}

static bool last_step(const jdt_config *cfg, int64_t t) { return t + 1 == cfg->run.steps; }

/* ALL_REDUCE nodes of the step graphs run here: group 0 is the data-parallel world. */
static jdt_status train_collective(void *ctx, int group, int reduce_op, jdt_dtype dt, void *buf,
                                   size_t n_elems, jdt_err *e)
{
    trainer *tr = ctx;
    if (group != 0 || !tr->dist)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "collective on unknown group %d", group);
    return jdt_comm_allreduce(jdt_dist_world(tr->dist), buf, n_elems, dt,
                              reduce_op ? JDT_REDUCE_MAX : JDT_REDUCE_SUM, e);
}

void jdt_train_compile_opts(const jdt_config *cfg, jdt_compile_opts *o)
{
    jdt_compile_opts_init(o);
    o->threads = cfg->runtime.threads;
    o->cache_dir = cfg->runtime.cache_dir[0] ? cfg->runtime.cache_dir : NULL;
    o->cc = cfg->runtime.cc[0] ? cfg->runtime.cc : NULL;
    o->cflags = cfg->runtime.cflags[0] ? cfg->runtime.cflags : NULL;
    o->remat = cfg->runtime.remat == JDT_REMAT_BLOCK ? JDT_COMPILE_REMAT_BLOCK : JDT_COMPILE_REMAT_NONE;
}

void jdt_train_ckpt_dir(const jdt_config *cfg, char *buf, size_t n_bytes)
{
    if (cfg->checkpoint.dir[0]) snprintf(buf, n_bytes, "%s", cfg->checkpoint.dir);
    else snprintf(buf, n_bytes, "%s/%s/ckpt", cfg->run.out_dir, cfg->run.name);
}

static jdt_status make_step(trainer *tr, jdt_step **out, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    jdt_step_opts so;
    memset(&so, 0, sizeof so);
    so.world_size = tr->world_size;
    so.micro_batch = cfg->data.micro_batch_size / tr->world_size;
    so.n_accum = cfg->data.batch_size / cfg->data.micro_batch_size;
    so.use_jit = cfg->runtime.jit;
    jdt_train_compile_opts(cfg, &so.copts);
    so.copts.profile = cfg->run.profile;
    if (cfg->run.profile) {
        so.copts.trace = trace_kernel;
        so.copts.trace_ctx = tr;
    }
    if (tr->dist) {
        so.copts.collective = train_collective;
        so.copts.collective_ctx = tr;
    }
    return jdt_step_new(cfg, &so, out, e);
}

/* The job matches the mesh: mesh.data ranks, each a whole model copy (mesh.fsdp/tensor > 1 are
 * refused before any work by jdt_train_check_capabilities). */
static jdt_status check_world(const trainer *tr, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const int W = tr->world_size;
    if (cfg->mesh.data != W)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "mesh.data = %d but the job has %d process(es): start one process per "
                           "device (e.g. jdt-train --nproc %d ...)", cfg->mesh.data, W, cfg->mesh.data);
    if (cfg->data.batch_size % W || cfg->data.micro_batch_size % W)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "data.batch_size %d and data.micro_batch_size %d must be multiples of "
                           "the %d data-parallel ranks", cfg->data.batch_size,
                           cfg->data.micro_batch_size, W);
    return JDT_OK;
}

/* True on every rank when any rank was asked to stop (so all stop after the same step). */
static jdt_status agree_stop(trainer *tr, bool *stop, jdt_err *e)
{
    float flag = g_stop_signal ? 1.0f : 0.0f;
    if (tr->dist) {
        jdt_status st = jdt_comm_allreduce(jdt_dist_world(tr->dist), &flag, 1, JDT_DTYPE_F32,
                                           JDT_REDUCE_MAX, e);
        if (st != JDT_OK) return st;
    }
    *stop = flag != 0.0f;
    return JDT_OK;
}

static void trainer_init(trainer *tr, const jdt_config *cfg, jdt_dist *dist)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    tr->dist = dist;
    tr->rank = dist ? jdt_dist_rank(dist) : 0;
    tr->world_size = dist ? jdt_dist_world_size(dist) : 1;
}

/* Compiles the step and restores the checkpoint to resume from, if any: *start is the first
 * step to run (0 on a fresh start). */
static jdt_status prepare_step(trainer *tr, int64_t *start, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    double t_compile = jdt_now_s();
    jdt_status st = make_step(tr, &tr->step, e);
    if (st != JDT_OK) return st;
    const jdt_compile_stats *cs = jdt_step_stats(tr->step);
    if (main_rank)
        JDT_INFO("model: %s, %lld parameters; step compiled in %.2fs%s", cfg->model.type == JDT_MODEL_MLP ? "mlp" : "gpt",
             (long long)jdt_model_param_count(jdt_step_model(tr->step)), jdt_now_s() - t_compile,
             cs ? (cs->cache_hit ? " (cache hit)" : " (cache miss)") : " (interpreter)");

    *start = 0;
    char *resume = NULL;
    if ((st = jdt_ckpt_resolve(cfg->checkpoint.resume, tr->ckpt_dir, &resume, e)) != JDT_OK) return st;
    if (resume) {
        st = load_ckpt(tr->step, resume, start, e);
        if (st == JDT_OK && main_rank)
            JDT_INFO("resumed from %s at step %lld", resume, (long long)*start);
        jdt_free(resume);
    }
    return st;
}

/* Rank 0 only: writes run_dir/config.yaml and opens metrics.jsonl (appended on a resume). */
static jdt_status open_outputs(trainer *tr, int64_t start, jdt_err *e)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.yaml", tr->run_dir);
    FILE *f = fopen(path, "w");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    fputs(tr->cfg->resolved_yaml, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/metrics.jsonl", tr->run_dir);
    tr->metrics = fopen(path, start > 0 ? "a" : "w");
    if (!tr->metrics) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    return JDT_OK;
}

/* Rank 0's console line for step t: averages over the steps since the last line. */
static void log_step(trainer *tr, int64_t t, double loss, double lr, double gnorm)
{
    const jdt_config *cfg = tr->cfg;
    double dt = tr->window_time / (double)tr->window_steps;
    char eta[32];
    fmt_duration(dt * (double)(cfg->run.steps - t - 1), eta, sizeof eta);
    JDT_INFO("step %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f %s/s | MFU %.1f%% | "
             "%.1f ms/step (data %.1f) | ETA %s",
             (long long)(t + 1), (long long)cfg->run.steps, loss, lr, gnorm,
             tr->units_per_step / dt, cfg->model.type == JDT_MODEL_MLP ? "samples" : "tok",
             100.0 * tr->flops_per_step / dt / tr->peak_flops,
             dt * 1e3, tr->window_wait / (double)tr->window_steps * 1e3, eta);
    fflush(tr->metrics);
    tr->window_steps = 0;
    tr->window_time = tr->window_wait = 0;
}

/* run.profile: closes the Chrome trace after its last traced step (step t). */
static jdt_status end_trace(trainer *tr, int64_t t, jdt_err *e)
{
    tr->tracing = false;
    jdt_status st = jdt_trace_close(tr->trace, e);
    tr->trace = NULL;
    if (st != JDT_OK) return st;
    if (tr->rank == 0)
        JDT_INFO("wrote %s: a Chrome trace of steps %lld-%lld (open it in "
                 "ui.perfetto.dev or chrome://tracing)", tr->trace_path,
                 (long long)(tr->first + 2), (long long)(t + 1));
    return JDT_OK;
}

/* Step t: its batch, the compiled step, the trace spans, the metrics record and log line. */
static jdt_status train_step(trainer *tr, int64_t t, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    tr->tracing = tr->trace && t > tr->first && t <= tr->first + cfg->run.profile_steps;
    double t0 = jdt_now_s();
    jdt_data_batch b;
    jdt_status st = jdt_data_get(tr->train, t, &b, e);
    if (st != JDT_OK) return st;
    double t_data = jdt_now_s();
    tr->window_wait += t_data - t0;
    if (tr->tracing) jdt_trace_span(tr->trace, "data wait", "data", 0, t0, t_data);
    double lr = jdt_train_lr(cfg, t), loss = NAN, gnorm = NAN;
    st = jdt_step_run(tr->step, t, lr, b.x, b.y, &loss, &gnorm, e);
    if (st == JDT_ERR_NUMERIC && cfg->optimizer.nan_policy == JDT_NAN_SKIP) {
        JDT_WARN("%s; update skipped", e->msg);
        st = JDT_OK;
    }
    if (st != JDT_OK) return st;
    tr->window_steps++;
    tr->window_time += jdt_now_s() - t0;
    if (tr->tracing) {
        char name[64];
        snprintf(name, sizeof name, "step %lld", (long long)(t + 1));
        jdt_trace_span(tr->trace, name, "step", 0, t_data, jdt_now_s());
        if (t == tr->first + cfg->run.profile_steps || last_step(cfg, t))
            if ((st = end_trace(tr, t, e)) != JDT_OK) return st;
    }
    if (main_rank)
        fprintf(tr->metrics, "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.9g}\n",
            (long long)(t + 1), loss, lr, gnorm);
    if (main_rank && ((t + 1) % cfg->run.log_every == 0 || last_step(cfg, t) || t == tr->first))
        log_step(tr, t, loss, lr, gnorm);
    return JDT_OK;
}

/* After step t: evaluation, periodic and final checkpoints, the profile table. */
static jdt_status after_step(trainer *tr, int64_t t, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    const bool last = last_step(cfg, t);
    jdt_status st;
    if (tr->val && ((t + 1) % cfg->run.eval_every == 0 || last)) {
        double vl;
        if ((st = run_eval(tr, &vl, e)) != JDT_OK) return st;
        if (main_rank) {
            JDT_INFO("step %lld/%lld | val loss %.4f", (long long)(t + 1), (long long)cfg->run.steps, vl);
            fprintf(tr->metrics, "{\"step\": %lld, \"val_loss\": %.17g}\n", (long long)(t + 1), vl);
            fflush(tr->metrics);
        }
    }
    if (main_rank && cfg->checkpoint.every > 0 && (t + 1) % cfg->checkpoint.every == 0 && !last) {
        if ((st = save_ckpt(tr, t + 1, e)) != JDT_OK) return st;
    }
    if (cfg->run.profile && main_rank && t + 1 - tr->first == cfg->run.profile_steps)
        log_profile(tr);
    if (last && main_rank) {
        if ((st = save_ckpt(tr, t + 1, e)) != JDT_OK) return st;
        JDT_INFO("done: %lld steps in %.1fs", (long long)(t + 1 - tr->first), jdt_now_s() - tr->t_start);
    }
    return JDT_OK;
}

/* A signal stopped the run after `done` steps: checkpoint (rank 0), then ERR_INTERRUPTED. */
static jdt_status stop_run(trainer *tr, int64_t done, jdt_err *e)
{
    const bool main_rank = tr->rank == 0;
    int sig = g_stop_signal ? g_stop_signal : SIGTERM; /* another rank's signal */
    if (main_rank)
        JDT_WARN("received %s at step %lld: saving a checkpoint and stopping",
             sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)done);
    jdt_status st;
    if (main_rank && tr->cfg->checkpoint.save_on_signal && (st = save_ckpt(tr, done, e)) != JDT_OK)
        return st;
    return jdt_err_set(e, JDT_ERR_INTERRUPTED, "stopped by %s after step %lld",
                       sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)done);
}

jdt_status jdt_train_run(const jdt_config *cfg, jdt_dist *dist, jdt_err *e)
{
    trainer tr;
    trainer_init(&tr, cfg, dist);
    jdt_status st;
    struct sigaction old_int, old_term;
    g_stop_signal = 0;
    if ((st = check_world(&tr, e)) != JDT_OK) return st;
    const bool main_rank = tr.rank == 0;
    /* before the first collective, so a signal during compilation is not lost */
    install_signals(&old_int, &old_term);

    snprintf(tr.run_dir, sizeof tr.run_dir, "%s/%s", cfg->run.out_dir, cfg->run.name);
    jdt_train_ckpt_dir(cfg, tr.ckpt_dir, sizeof tr.ckpt_dir);
    if ((st = mkdir_p(tr.run_dir, e)) != JDT_OK) goto out_signals;
    if ((st = setup_data(&tr, true, cfg->run.eval_every > 0, e)) != JDT_OK) goto out_signals;
    int64_t start = 0;
    if ((st = prepare_step(&tr, &start, e)) != JDT_OK) goto out_signals;
    if (main_rank && (st = open_outputs(&tr, start, e)) != JDT_OK) goto out_signals;

    /* global numbers: every rank runs its share of the global batch in the same time */
    const bool mlp = cfg->model.type == JDT_MODEL_MLP;
    tr.units_per_step = (double)cfg->data.batch_size * (mlp ? 1 : cfg->model.seq_len);
    tr.flops_per_step = jdt_step_model_flops(tr.step);
    tr.peak_flops = measure_peak_flops() * tr.world_size;
    if (main_rank)
        JDT_INFO("MFU is measured against the SGEMM peak of %d process(es): %.1f GFLOP/s",
                 tr.world_size, tr.peak_flops * 1e-9);

    tr.first = start;
    if (cfg->run.profile) { /* trace steps first+1 .. first+profile_steps (after warm-up) */
        snprintf(tr.trace_path, sizeof tr.trace_path, "%s/trace.rank%d.json", tr.run_dir, tr.rank);
        if ((st = jdt_trace_open(tr.trace_path, tr.rank, &tr.trace, e)) != JDT_OK) goto out_signals;
    }
    tr.t_start = jdt_now_s();
    bool stop = false;
    for (int64_t t = start; t < cfg->run.steps; t++) {
        if ((st = agree_stop(&tr, &stop, e)) != JDT_OK) goto out_signals;
        if (stop) break;
        if ((st = train_step(&tr, t, e)) != JDT_OK) goto out_signals;
        if ((st = after_step(&tr, t, e)) != JDT_OK) goto out_signals;
        start = t + 1; /* steps completed */
    }
    if (stop) st = stop_run(&tr, start, e);
out_signals:
    if (tr.trace) jdt_trace_close(tr.trace, NULL); /* run ended inside the traced window */
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (tr.metrics) fclose(tr.metrics);
    jdt_step_free(tr.step);
    jdt_data_close(tr.train);
    jdt_data_close(tr.val);
    return st;
}

jdt_status jdt_train_eval(const jdt_config *cfg, const char *ckpt_path, double *loss, jdt_err *e)
{
    trainer tr;
    trainer_init(&tr, cfg, NULL);
    jdt_status st;
    int64_t step = 0;
    snprintf(tr.run_dir, sizeof tr.run_dir, "%s/%s", cfg->run.out_dir, cfg->run.name);
    if ((st = mkdir_p(tr.run_dir, e)) != JDT_OK) return st;
    if ((st = setup_data(&tr, false, true, e)) != JDT_OK) goto out;
    if ((st = make_step(&tr, &tr.step, e)) != JDT_OK) goto out;
    if ((st = load_ckpt(tr.step, ckpt_path, &step, e)) != JDT_OK) goto out;
    st = run_eval(&tr, loss, e);
out:
    jdt_step_free(tr.step);
    jdt_data_close(tr.val);
    return st;
}

jdt_status jdt_train_inspect(const jdt_config *cfg, FILE *f, jdt_err *e)
{
    trainer tr;
    trainer_init(&tr, cfg, NULL);
    jdt_step *step = NULL;
    double t0 = jdt_now_s();
    jdt_status st = make_step(&tr, &step, e);
    if (st != JDT_OK) return st;
    double dt = jdt_now_s() - t0;
    const jdt_compile_stats *cs = jdt_step_stats(step);
    double state_bytes = 0;
    for (int i = 0; i < jdt_step_n_tensors(step); i++) {
        const char *name;
        float *data;
        jdt_shape shape;
        jdt_step_tensor(step, i, &name, &data, &shape);
        state_bytes += (double)jdt_shape_numel(&shape) * sizeof(float);
    }
    fprintf(f, "compiled step (one process%s):\n",
            jdt_config_mesh_size(cfg) > 1 ? "; the per-device step of the mesh adds all-reduces" : "");
    if (cs) {
        fprintf(f, "  ops            %d -> %d after DCE/CSE/simplification\n", cs->n_ops_in, cs->n_ops_out);
        fprintf(f, "  kernels        %d fused loop nests + %d builtin calls (GEMM, attention, ...)\n",
                cs->n_kernels, cs->n_builtin);
        fprintf(f, "  FLOPs/step     %.3g (compiler count, per micro-batch run); model count %.3g per "
                   "optimizer step\n", cs->flops_per_step, jdt_step_model_flops(step));
        fprintf(f, "  memory         %.1f MiB planned peak of intermediates; %.1f MiB parameters + "
                   "optimizer state\n", (double)cs->arena_bytes / 1048576.0, state_bytes / 1048576.0);
        fprintf(f, "  compile        %.2fs (C compiler %.2fs), cache %s: %s\n", dt, cs->cc_s,
                cs->cache_hit ? "hit" : "miss", cs->so_path);
    } else {
        fprintf(f, "  runtime.jit is false: the reference interpreter runs the step\n");
    }
    jdt_step_free(step);
    return JDT_OK;
}
