/*
 * loop.c — the single-process training loop (see train.h): data, steps, logging, JSONL
 * metrics, eval, checkpoints, exact resume and a clean stop on SIGINT/SIGTERM.
 *
 * Batch k of the data stream is consumed by step k, so the data position is the step number
 * and a resumed run sees exactly the batches the uninterrupted run would have seen. Dropout
 * masks are keyed on the step too: 2N straight steps and N + resume + N give identical losses.
 */
#include "train/train.h"
#include "train/hf.h"

#include "backend/backend.h"
#include "datasets/datasets.h"
#include "io/ckpt.h"
#include "io/data.h"
#include "io/fetch.h"
#include "obs/obs.h"
#include "runtime/runtime.h"
#include "train/trace.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* Rank 0 of a training run holds an flock on run_dir/.lock from the start to the end (*fd; the
 * kernel drops it when the process ends, however it ends), and on checkpoint.dir/.lock when
 * that is set (k: CKPT_DIR there, RUN_DIR for the run's). A second run writing the same directory
 * (a job submitted twice, a requeue while the first still runs) saved its checkpoints between
 * the first's, under the same step names, appended to its metrics and TensorBoard files, and
 * left `resume: auto` a mix of the two: it is refused with the holder's pid and host, which the
 * lock file holds. A file system without flock (some NFS and Lustre mounts) runs unlocked. */
typedef struct {
    const char *what;  /* "run" or "checkpoint" (directory) */
    const char *holds; /* what two runs would interleave there */
    const char *other; /* the keys that give a run another one */
} dir_kind;
static const dir_kind RUN_DIR = {"run", "checkpoints and metrics", "run.name or run.out_dir"};
static const dir_kind CKPT_DIR = {"checkpoint", "checkpoints", "checkpoint.dir"};

static jdt_status lock_run_dir(const char *dir, const dir_kind *k, int *fd, jdt_err *e)
{
    char path[1100], holder[256] = "";
    snprintf(path, sizeof path, "%s/.lock", dir);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) { /* a read-only or full directory: the run's own checks say what is wrong */
        JDT_DEBUG("%s: %s; the %s directory is not locked", path, strerror(errno), k->what);
        return JDT_OK;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err != EWOULDBLOCK) { /* ENOLCK, EOPNOTSUPP: no locks here */
            JDT_DEBUG("%s: flock: %s; the %s directory is not locked", path, strerror(err),
                      k->what);
            return JDT_OK;
        }
        const ssize_t n = pread(*fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(*fd);
        *fd = -1;
        return jdt_err_set(e, JDT_ERR_IO,
                           "%s directory %s is in use by another jdt-train run (%s): two runs "
                           "writing one directory interleave their %s; wait for it or stop it, "
                           "or give this run another %s",
                           k->what, dir, holder[0] ? holder : "its pid unknown", k->holds,
                           k->other);
    }
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    const int len = snprintf(holder, sizeof holder, "pid %d on host %s\n", (int)getpid(), host);
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, holder, (size_t)len, 0) != len)
        JDT_DEBUG("%s: cannot record the holder", path); /* the lock holds all the same */
    return JDT_OK;
}

static void fmt_duration(double s, char *buf, size_t n)
{
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

typedef struct {
    const jdt_config *cfg;
    jdt_dist *dist; /* NULL: single process */
    int rank, world_size;
    jdt_mesh mesh;             /* this rank's place in the device mesh (1 x 1 x 1 alone) */
    jdt_comm_group *groups[8]; /* process group per mesh-axis mask, made on first use */
    int64_t data_shift;        /* global batch index - step (non-zero after resuming with another
                                  batch size) */
    char run_dir[1024];
    char ckpt_dir[1100];
    jdt_step *step;
    jdt_device *device; /* runtime.backend cuda: this rank's GPU; NULL: the CPU */
    jdt_data *train, *val;
    FILE *metrics;
    jdt_tboard *tb; /* rank 0: TensorBoard events in the run directory */
    double s_data, s_step, s_comm, s_ckpt, s_eval; /* seconds spent, for the end-of-run table;
                                                      s_comm: the step waited for collectives */
    double s_comm_moving; /* collectives moving data (blocking ones + started ones' run time) */
    jdt_trace *trace;     /* run.profile: open while the traced steps run */
    bool tracing;
    char trace_path[1200];
    int64_t first;  /* the first step this process runs (the resume point) */
    double t_start; /* when step `first` began */
    /* global throughput numbers: every rank runs its share of the global batch */
    double units_per_step, flops_per_step, peak; /* peak: pref.flops x world size */
    jdt_peak_ref pref;                           /* the MFU reference of one process */
    bool warned_mfu;                             /* the MFU > 100% warning was given */
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

/* http(s):// data and init_from: data.fetch_* and a cache under the JIT cache's folder
 * (runtime.cache_dir, $JDT_CACHE_DIR, ~/.cache/jdt-train); docs/data.md "Remote data". */
static void fetch_opts(const jdt_config *cfg, jdt_fetch_opts *fo, char *cache, size_t n)
{
    jdt_fetch_opts_default(fo);
    jdt_compile_opts co;
    jdt_train_compile_opts(cfg, &co);
    if (jdt_compile_cache_dir(&co, cache, n, NULL) == JDT_OK) fo->cache_dir = cache;
    fo->retries = cfg->data.fetch_retries;
    fo->backoff_s = cfg->data.fetch_backoff_s;
    fo->timeout_s = cfg->data.fetch_timeout_s;
}

static jdt_status open_data(const trainer *tr, const char *path, const char *split, int64_t rows,
                            jdt_data **out, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    jdt_data_opts o;
    memset(&o, 0, sizeof o);
    jdt_fetch_opts fo;
    char cache[1024];
    fetch_opts(cfg, &fo, cache, sizeof cache);
    o.fetch = &fo;
    o.path = path;
    o.split = split;
    o.kind = cfg->model.type == JDT_MODEL_MLP ? JDT_DATA_KIND_ARRAYS : JDT_DATA_KIND_TOKENS;
    if (o.kind == JDT_DATA_KIND_ARRAYS) o.n_classes = cfg->model.n_classes; /* labels bounded */
    o.seq_len = cfg->model.seq_len;
    o.global_batch = rows;
    /* this rank's slice of every batch */
    jdt_shard_batch_rows(&tr->mesh, &cfg->sharding.rules, rows, &o.row_begin, &o.row_end);
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

/* Resolves train/val sources. Synthetic data is generated once into the run directory, under
 * names that carry what generated it (the vocabulary, or the features and classes, and the
 * seed): a run in the same directory whose config changed one of them gets data of its own.
 * With one name for all, a larger vocabulary trained silently on the last run's smaller one's
 * tokens and a smaller one failed on them. */
static jdt_status setup_data(trainer *tr, bool want_train, bool want_val, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    char train_path[1200], val_path[1200];
    const char *train_split = NULL, *val_split = NULL;
    if (cfg->data.format == JDT_DATA_SYNTHETIC) {
        bool mlp = cfg->model.type == JDT_MODEL_MLP;
        char tag[64];
        if (mlp)
            snprintf(tag, sizeof tag, "d%d-c%d-s%lld", cfg->model.in_dim, cfg->model.n_classes,
                     (long long)cfg->run.seed);
        else
            snprintf(tag, sizeof tag, "v%d-s%lld", cfg->model.vocab_size, (long long)cfg->run.seed);
        snprintf(train_path, sizeof train_path, "%s/synthetic_train-%s.h5", tr->run_dir, tag);
        snprintf(val_path, sizeof val_path, "%s/synthetic_val-%s.h5", tr->run_dir, tag);
        struct stat sb;
        jdt_status st = JDT_OK;
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
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "data.train_path is empty (run `jdt-train prepare` first?)");
        snprintf(train_path, sizeof train_path, "%s", cfg->data.train_path);
        snprintf(val_path, sizeof val_path, "%s",
                 cfg->data.val_path[0] ? cfg->data.val_path : cfg->data.train_path);
        struct stat sb;
        if (stat(train_path, &sb) == 0 && S_ISDIR(sb.st_mode)) train_split = "train";
        if (stat(val_path, &sb) == 0 && S_ISDIR(sb.st_mode)) val_split = "val";
        /* a URL's split applies to the names of its listing or manifest */
        if (jdt_fetch_is_url(train_path)) train_split = "train";
        if (jdt_fetch_is_url(val_path)) val_split = "val";
    }
    jdt_status st = JDT_OK;
    if (want_train)
        st = open_data(tr, train_path, train_split, cfg->data.batch_size, &tr->train, e);
    if (st != JDT_OK) return st;
    if (want_val && (cfg->data.val_path[0] || cfg->data.format == JDT_DATA_SYNTHETIC))
        st = open_data(tr, val_path, val_split, cfg->data.micro_batch_size, &tr->val, e);
    else if (want_val && !want_train)
        st = jdt_err_set(e, JDT_ERR_CONFIG, "data.val_path is empty: nothing to evaluate on");
    return st;
}

/* run.profile: where the compiled step spends its time, over the steps since the warm-up step
 * (train_step resets the counts after it, unless it was the run's only one) up to step t. */
static void log_profile(const trainer *tr, int64_t t)
{
    static char buf[16384];
    jdt_step_profile(tr->step, buf, sizeof buf);
    const int64_t from = t > tr->first ? tr->first + 2 : tr->first + 1;
    JDT_INFO("profile of the compiled step, steps %lld-%lld%s:", (long long)from,
             (long long)(t + 1), t > tr->first ? " (after the warm-up step)" : "");
    /* a line at a time: a log line holds 4 KiB, the tables of a large step more */
    for (const char *l = buf; *l;) {
        const char *end = strchr(l, '\n');
        const int len = end ? (int)(end - l) : (int)strlen(l);
        JDT_INFO("%.*s", len, l);
        l += len + (end != NULL);
    }
}

static jdt_status ckpt_barrier(void *ctx, jdt_err *e)
{
    trainer *tr = ctx;
    return jdt_dist_barrier(tr->dist, tr->cfg->dist.connect_timeout_s, e);
}

/* The step's persistent tensors as checkpoint slices (whole tensors); caller frees *out. */
static jdt_status ckpt_tensors(const trainer *tr, jdt_ckpt_tensor **out, int *n_out, jdt_err *e)
{
    /* parameters and moments live on the device: bring the host copies up to date */
    if (jdt_step_sync_host(tr->step, e) != JDT_OK) return jdt_err_prefix(e, "checkpoint");
    int n = jdt_step_n_tensors(tr->step), n_own = 0;
    jdt_ckpt_tensor *ts = jdt_calloc((size_t)(n ? n : 1), sizeof *ts);
    if (!ts) return jdt_err_set(e, JDT_ERR_NOMEM, "checkpoint: out of memory");
    for (int i = 0; i < n; i++) {
        const char *name;
        float *data;
        jdt_shape shape, global;
        int64_t offset[JDT_MAX_DIMS] = {0};
        jdt_step_tensor(tr->step, i, &name, &data, &shape);
        if (!jdt_step_tensor_block(tr->step, i, &global, offset)) continue;
        jdt_ckpt_tensor *t = &ts[n_own++];
        t->name = name;
        t->dtype = JDT_DTYPE_F32;
        t->ndim = shape.ndim;
        for (int d = 0; d < shape.ndim; d++) {
            t->shape[d] = global.dims[d];
            t->offset[d] = offset[d];
            t->extent[d] = shape.dims[d];
        }
        t->data = data;
    }
    *out = ts;
    *n_out = n_own;
    return JDT_OK;
}

/* Before the first step: the checkpoint directory is writable and has room for one
 * checkpoint, so a bad checkpoint.dir fails now rather than at the first save. */
static jdt_status preflight_ckpt(const trainer *tr, jdt_err *e)
{
    jdt_ckpt_tensor *ts;
    int n;
    jdt_status st = ckpt_tensors(tr, &ts, &n, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta = {.config_text = tr->cfg->resolved_yaml};
    st = jdt_ckpt_preflight(tr->ckpt_dir, &meta, ts, (size_t)n, e);
    jdt_free(ts);
    return st;
}

/* The warning that goes with any MFU above 100%: the reference, not the run, is wrong. */
static void warn_mfu(double mfu, const char *over, double peak, const jdt_peak_ref *pref)
{
    if (strcmp(pref->source, "runtime.peak_gflops") == 0)
        JDT_WARN("MFU %.0f%%%s is above 100%%: runtime.peak_gflops (%.6g GFLOP/s per process) is "
                 "below what this run achieves; raise it, or set 0 to measure the machine",
                 mfu, over, pref->flops * 1e-9);
    else
        JDT_WARN("MFU %.0f%%%s is above 100%%: the reference peak %.6g GFLOP/s (%s) is wrong, "
                 "probably measured while the machine was busy; set runtime.peak_gflops%s%s",
                 mfu, over, peak * 1e-9, pref->source, pref->cache_path[0] ? " or delete " : "",
                 pref->cache_path);
}

/* Checkpoint-save progress in MB (jdt_ckpt_save calls back after each tensor, in order). */
typedef struct {
    jdt_progress prog;
    const jdt_ckpt_tensor *ts;
    double done_mb;
} save_progress;

static double slice_mb(const jdt_ckpt_tensor *t)
{
    double n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= (double)(t->extent[d] ? t->extent[d] : t->shape[d]);
    return n * (double)jdt_dtype_size(t->dtype) / 1048576.0;
}

static void on_save_progress(void *ctx, size_t n_done, size_t n_total)
{
    save_progress *sp = ctx;
    (void)n_total;
    sp->done_mb += slice_mb(&sp->ts[n_done - 1]);
    jdt_progress_update(&sp->prog, sp->done_mb);
}

/* A failure of the job rather than of this rank's files: a lost peer, a timed-out barrier. */
static bool comm_failure(jdt_status st)
{
    return st == JDT_ERR_PEER_LOST || st == JDT_ERR_TIMEOUT || st == JDT_ERR_NET ||
           st == JDT_ERR_PROTOCOL;
}

static jdt_status save_ckpt(trainer *tr, int64_t next_step, jdt_err *e)
{
    jdt_ckpt_tensor *ts;
    int n;
    jdt_status st = ckpt_tensors(tr, &ts, &n, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta = {.step = next_step,
                          .rng_state = (uint64_t)tr->cfg->run.seed,
                          .data_position = next_step + tr->data_shift,
                          .config_text = tr->cfg->resolved_yaml};
    jdt_ckpt_save_opts so = {.keep_last = tr->cfg->checkpoint.keep};
    if (tr->dist && tr->world_size > 1) {
        so.rank = tr->rank;
        so.world_size = tr->world_size;
        so.barrier = ckpt_barrier;
        so.barrier_ctx = tr;
    }
    save_progress sp = {.ts = ts};
    if (tr->rank == 0) {
        double total_mb = 0;
        for (int i = 0; i < n; i++)
            total_mb += slice_mb(&ts[i]);
        char what[64];
        snprintf(what, sizeof what, "saving checkpoint step %lld", (long long)next_step);
        jdt_progress_begin(&sp.prog, what, total_mb, "MB");
        so.on_progress = on_save_progress;
        so.progress_ctx = &sp;
    }
    char *saved = NULL;
    double t0 = jdt_now_s();
    st = jdt_ckpt_save(tr->ckpt_dir, &meta, ts, (size_t)n, &so, &saved, e);
    if (tr->rank == 0) jdt_progress_end(&sp.prog);
    tr->s_ckpt += jdt_now_s() - t0;
    jdt_free(ts);
    /* whether this rank knows the outcome: rank 0 commits (its status is the checkpoint's);
     * another rank that lost the job during the save cannot tell whether rank 0 committed */
    bool known = tr->rank == 0 || !comm_failure(st);
    if (tr->dist && tr->world_size > 1) { /* agree on the outcome */
        float bad = st != JDT_OK ? 1.0f : 0.0f;
        jdt_err e2;
        jdt_err_clear(&e2);
        jdt_status cst = jdt_comm_allreduce(jdt_dist_world(tr->dist), &bad, 1, JDT_DTYPE_F32,
                                            JDT_REDUCE_MAX, &e2);
        if (cst != JDT_OK && st == JDT_OK) { /* a rank lost after the save (or during it) */
            *e = e2;
            st = cst;
            if (tr->rank == 0) {
                JDT_INFO("saved checkpoint %s (%.2fs)", saved, jdt_now_s() - t0);
                jdt_err_prefix(e, "after saving checkpoint %s", saved);
                jdt_free(saved);
                return st;
            }
            known = false;
        }
        if (st == JDT_OK && bad != 0.0f)
            st = jdt_err_set(e, JDT_ERR_IO,
                             "checkpoint step %lld: another rank failed to write "
                             "its part (see its log)",
                             (long long)next_step);
    }
    if (st == JDT_OK && tr->rank == 0)
        JDT_INFO("saved checkpoint %s (%.2fs)", saved, jdt_now_s() - t0);
    else if (st != JDT_OK && known)
        jdt_err_prefix(e, "checkpoint at step %lld not saved (the previous one is kept)",
                       (long long)next_step);
    else if (st != JDT_OK)
        jdt_err_prefix(e,
                       "checkpoint at step %lld interrupted (rank 0 commits it only once "
                       "every rank's part is on disk)",
                       (long long)next_step);
    jdt_free(saved);
    return st;
}

/* The global batch index at which a run resumed from a checkpoint continues, with this
 * config's batch size: the checkpoint's data_position counts batches of ITS batch size (from
 * its stored config: b_old, from check_meta), so the stream continues at the same global sample g =
 * position * B_old, i.e. batch g / B_new (docs/data.md). ERR_CONFIG when B_new does not divide g.
 */
static jdt_status resume_batch(const jdt_config *cfg, const jdt_ckpt_meta *meta, const char *path,
                               int64_t b_old, int64_t *batch, jdt_err *e)
{
    const int64_t g = meta->data_position * b_old, b_new = cfg->data.batch_size;
    if (g % b_new)
        return jdt_err_set(
            e, JDT_ERR_CONFIG,
            "%s: the data stream stopped at sample %lld (%lld batches of %lld), which "
            "data.batch_size = %lld does not divide: resume with a batch size that "
            "divides it",
            path, (long long)g, (long long)meta->data_position, (long long)b_old, (long long)b_new);
    *batch = g / b_new;
    return JDT_OK;
}

/* The first model key on which a and b describe different networks (the keys that change the
 * parameters or what the network computes; not dropout, init or the norm's eps), or NULL. */
static const char *model_differs(const jdt_config *a, const jdt_config *b, char *why, size_t n)
{
#define DIFF(f, fmt, va, vb)                                                                       \
    if (a->model.f != b->model.f) {                                                                \
        snprintf(why, n, "the checkpoint's model." #f " is " fmt ", this config's " fmt, vb, va);  \
        return "model." #f;                                                                        \
    }
#define INT(f) DIFF(f, "%d", (int)a->model.f, (int)b->model.f)
#define ENUM(f)                                                                                    \
    DIFF(f, "%s", jdt_config_choice_name("model." #f, (int)a->model.f),                            \
         jdt_config_choice_name("model." #f, (int)b->model.f))
#define BOOL(f) DIFF(f, "%s", a->model.f ? "true" : "false", b->model.f ? "true" : "false")
    ENUM(type)
    INT(vocab_size)
    INT(n_layer)
    INT(n_embd)
    INT(n_head)
    INT(n_kv_head)
    INT(mlp_ratio)
    INT(mlp_dim)
    ENUM(norm)
    ENUM(pos)
    ENUM(activation)
    BOOL(tie_embeddings)
    BOOL(bias)
    INT(in_dim)
    INT(hidden_dim)
    INT(n_hidden)
    INT(n_classes)
#undef DIFF
#undef INT
#undef ENUM
#undef BOOL
    return NULL;
}

/* jdt_train_ckpt_differs on the stored config already parsed (old) */
static const char *stored_differs(const jdt_config *cfg, const jdt_config *old, bool optimizer,
                                  char *why, size_t n)
{
    const char *key = model_differs(cfg, old, why, n);
    if (!key && optimizer && cfg->optimizer.type != old->optimizer.type) {
        snprintf(why, n, "the checkpoint's optimizer.type is %s, this config's %s",
                 jdt_config_choice_name("optimizer.type", (int)old->optimizer.type),
                 jdt_config_choice_name("optimizer.type", (int)cfg->optimizer.type));
        key = "optimizer.type";
    }
    return key;
}

const char *jdt_train_ckpt_differs(const jdt_config *cfg, const char *config_text, const char *path,
                                   bool optimizer, char *why, size_t n)
{
    if (!config_text || !config_text[0]) return NULL;
    jdt_config old;
    jdt_err e2;
    if (jdt_config_load_string(config_text, path, 0, NULL, NULL, &old, &e2) != JDT_OK)
        return NULL; /* written by another version: the tensors' names and shapes decide */
    const char *key = stored_differs(cfg, &old, optimizer, why, n);
    jdt_config_free(&old);
    return key;
}

/* The stored config text without the sections that describe the job that wrote it rather than
 * the run: dist (its coordinator, ranks, token) and mesh, which becomes data: -1 (filled in
 * from the new job's process count). The resolved YAML jdt writes has its sections at column
 * 0, their keys indented below them. jdt_malloc'd; NULL when out of memory. */
static char *job_free_text(const char *text)
{
    size_t n = strlen(text);
    char *out = jdt_malloc(n + 32);
    if (!out) return NULL;
    size_t o = 0;
    bool skip = false;
    for (const char *l = text; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) + 1 : strlen(l);
        if (l[0] != ' ' && l[0] != '\n' && l[0] != '#')
            skip = strncmp(l, "dist:", 5) == 0 || strncmp(l, "mesh:", 5) == 0;
        if (!skip) {
            memcpy(out + o, l, len);
            o += len;
        }
        l += len;
    }
    if (o && out[o - 1] != '\n') out[o++] = '\n';
    strcpy(out + o, "mesh:\n  data: -1\n"); /* n + 32 bytes hold it */
    return out;
}

bool jdt_train_is_ckpt_path(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    return stat(path, &sb) == 0 && (S_ISDIR(sb.st_mode) || (n > 3 && !strcmp(path + n - 3, ".h5")));
}

jdt_status jdt_train_load_stored_config(const char *ckpt, int n_overrides, char *const *overrides,
                                        char *const *envp, jdt_config *out, char **resolved,
                                        jdt_err *e)
{
    *resolved = NULL;
    if (jdt_ckpt_find_latest(ckpt, resolved, NULL, NULL) != JDT_OK &&
        !(*resolved = jdt_strdup(ckpt)))
        return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    jdt_ckpt *ck = NULL;
    char *text = NULL;
    jdt_status st = jdt_ckpt_open(*resolved, &ck, e);
    struct stat sb;
    if (st == JDT_ERR_NOT_FOUND && jdt_hf_is_model_dir(ckpt))
        st = jdt_err_set(e, JDT_ERR_NOT_FOUND,
                         "%s is a Hugging Face model, which stores no jdt config: evaluate it "
                         "under one (jdt-train eval CONFIG --ckpt %s)",
                         ckpt, ckpt);
    else if (st == JDT_ERR_NOT_FOUND && stat(ckpt, &sb) == 0 && S_ISDIR(sb.st_mode))
        st = jdt_err_set(e, JDT_ERR_NOT_FOUND,
                         "%s: no checkpoint (neither a step directory with state.h5 nor a folder "
                         "of complete step_* checkpoints)",
                         ckpt);
    if (st == JDT_OK) {
        jdt_ckpt_meta meta;
        jdt_ckpt_get_meta(ck, &meta);
        char label[1100];
        snprintf(label, sizeof label, "%s (stored config)", *resolved);
        if (!meta.config_text || !meta.config_text[0])
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: the checkpoint stores no config: give one "
                             "(eval CONFIG --ckpt %s)",
                             *resolved, *resolved);
        else if (!(text = job_free_text(meta.config_text)))
            st = jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
        else
            st = jdt_config_load_string(text, label, n_overrides, overrides, envp, out, e);
    }
    jdt_free(text);
    jdt_ckpt_close(ck);
    if (st != JDT_OK) {
        jdt_free(*resolved);
        *resolved = NULL;
    }
    return st;
}

/* The checkpoint's metadata against the run: a step and data position that a save can have
 * written (the step its directory is named for, where it is named step_N), and the model its
 * stored config describes. A checkpoint of another model whose tensors happen to fit (fewer
 * layers, no biases, another head count) would otherwise load in part, silently. *b_old: the
 * stored config's batch size (this config's where it has none, or one this version cannot
 * read). */
static jdt_status check_meta(const jdt_config *cfg, const jdt_ckpt_meta *meta, const char *path,
                             bool optimizer, bool log, int64_t *b_old, jdt_err *e)
{
    *b_old = cfg->data.batch_size;
    if (meta->step < 0 || meta->data_position < 0)
        return jdt_err_set(e, JDT_ERR_FORMAT,
                           "%s: corrupt checkpoint: step %lld, data position %lld", path,
                           (long long)meta->step, (long long)meta->data_position);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    long long named;
    char tail;
    if (sscanf(base, "step_%lld%c", &named, &tail) == 1 && named != meta->step)
        return jdt_err_set(e, JDT_ERR_FORMAT,
                           "%s: corrupt checkpoint: it says step %lld, its directory step %lld",
                           path, (long long)meta->step, named);
    if (!meta->config_text || !meta->config_text[0]) return JDT_OK;
    jdt_config old;
    jdt_err e2;
    if (jdt_config_load_string(meta->config_text, path, 0, NULL, NULL, &old, &e2) != JDT_OK)
        return JDT_OK; /* written by another version: the tensors' names and shapes decide */
    *b_old = old.data.batch_size;
    /* a schedule whose end follows run.steps (optimizer.decay_steps 0) moves when a resume
     * raises run.steps: the learning rate from the checkpoint's step on is not what its run
     * would have used (after a finished run it rises again from lr * min_lr_ratio) */
    const int64_t end_old = jdt_config_decay_steps(&old), end_new = jdt_config_decay_steps(cfg);
    if (log && optimizer && cfg->optimizer.schedule != JDT_SCHED_CONSTANT &&
        cfg->optimizer.decay_steps == 0 && end_old != end_new)
        JDT_WARN("%s: its run decayed the learning rate until step %lld, this one until step %lld "
                 "(run.steps): the schedule from step %lld on is not the checkpoint's run's "
                 "(optimizer.decay_steps: %lld keeps that)",
                 path, (long long)end_old, (long long)end_new, (long long)meta->step,
                 (long long)end_old);
    char why[160];
    const char *key = stored_differs(cfg, &old, optimizer, why, sizeof why);
    jdt_config_free(&old);
    if (key)
        return jdt_err_set(
            e, JDT_ERR_CONFIG,
            "%s: the checkpoint holds another %s (%s): resume with its %s, or "
            "start a new run (checkpoint.resume: none, or another run.name%s)",
            path, strncmp(key, "model.", 6) == 0 ? "model" : "optimizer's state", why, key,
            strncmp(key, "model.", 6) == 0 ? "" : "; checkpoint.init_from takes its weights alone");
    return JDT_OK;
}

/* Whether step tensor `name` is a parameter (not optimizer state). */
static bool is_param(const char *name)
{
    return strncmp(name, "params/", 7) == 0;
}

/* Loads this rank's blocks of params and optimizer state from path; returns the step to
 * continue from and (data_batch not NULL) the global batch of cfg's size to read next. With
 * data_batch NULL (an evaluation) it loads the params alone: the checkpoint's optimizer, which
 * may not be this config's, does not matter. log: warn of a schedule that moved (check_meta). */
static jdt_status load_ckpt(const jdt_config *cfg, jdt_step *step, const char *path,
                            int64_t *next_step, int64_t *data_batch, bool log, jdt_err *e)
{
    const bool resume = data_batch != NULL;
    jdt_ckpt *c = NULL;
    jdt_status st = jdt_ckpt_open(path, &c, e);
    if (st != JDT_OK) return st;
    jdt_ckpt_meta meta;
    jdt_ckpt_get_meta(c, &meta);
    *next_step = meta.step;
    int64_t b_old;
    if ((st = check_meta(cfg, &meta, path, resume, log, &b_old, e)) != JDT_OK ||
        (data_batch && (st = resume_batch(cfg, &meta, path, b_old, data_batch, e)) != JDT_OK)) {
        jdt_ckpt_close(c);
        return st;
    }
    int n = jdt_step_n_tensors(step);
    double total_mb = 0, done_mb = 0;
    for (int i = 0; i < n; i++) {
        const char *name;
        float *data;
        jdt_shape shape;
        jdt_step_tensor(step, i, &name, &data, &shape);
        if (resume || is_param(name))
            total_mb += (double)jdt_shape_numel(&shape) * sizeof(float) / 1048576.0;
    }
    jdt_progress prog;
    jdt_progress_begin(&prog, "loading checkpoint", total_mb, "MB");
    for (int i = 0; i < n && st == JDT_OK; i++) {
        const char *name;
        float *data;
        jdt_shape shape, global;
        int64_t offset[JDT_MAX_DIMS] = {0};
        jdt_step_tensor(step, i, &name, &data, &shape);
        if (!resume && !is_param(name)) continue;
        jdt_step_tensor_block(step, i, &global, offset);
        jdt_ckpt_tensor want; /* this rank's block only: any mesh reads any checkpoint */
        memset(&want, 0, sizeof want);
        want.name = name;
        want.dtype = JDT_DTYPE_F32;
        want.ndim = shape.ndim;
        for (int d = 0; d < shape.ndim; d++) {
            want.shape[d] = global.dims[d];
            want.offset[d] = offset[d];
            want.extent[d] = shape.dims[d];
        }
        st = jdt_ckpt_read(c, &want, data, e);
        done_mb += (double)jdt_shape_numel(&shape) * sizeof(float) / 1048576.0;
        jdt_progress_update(&prog, done_mb);
    }
    jdt_progress_end(&prog);
    jdt_ckpt_close(c);
    jdt_step_host_changed(step); /* a device backend uploads them before the next run */
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

static bool last_step(const jdt_config *cfg, int64_t t)
{
    return t + 1 == cfg->run.steps;
}

static jdt_status train_collective_run(trainer *tr, int group, int kind, jdt_dtype dt, void *buf,
                                       size_t n_elems, jdt_comm_work **w, jdt_err *e);

/* The collective nodes of the step graphs run here. A group id is a mask of mesh axes
 * (engine/shard/shard.h); its comm group is made on first use (creation is local, and every
 * member derives the same ordered rank list). */
static jdt_status train_collective(void *ctx, int group, int kind, jdt_dtype dt, void *buf,
                                   size_t n_elems, jdt_err *e)
{
    trainer *tr = ctx;
    if (group <= 0 || group > 7 || !tr->dist)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "collective on unknown group %d", group);
    double t0 = jdt_now_s();
    jdt_status st_c = train_collective_run(tr, group, kind, dt, buf, n_elems, NULL, e);
    const double dt_s = jdt_now_s() - t0;
    tr->s_comm += dt_s;
    tr->s_comm_moving += dt_s;
    return st_c;
}

/* A collective started by a compiled program (jdt_compile_opts.collective_start): the comm
 * work and what its wait still has to do (a reduce-scatter's part to the front). */
typedef struct {
    jdt_comm_work *w;
    int kind;
    char *buf;
    size_t part_bytes, part_off; /* reduce-scatter: this member's part, moved to the front */
    const char *name;
    double n_bytes;
} train_pending;

static const char *coll_kind_name(int kind)
{
    switch (kind) {
    case JDT_COLL_ALLGATHER:
        return "all_gather";
    case JDT_COLL_REDUCE_SCATTER:
        return "reduce_scatter";
    default:
        return "all_reduce";
    }
}

static jdt_status train_collective_start(void *ctx, int group, int kind, jdt_dtype dt, void *buf,
                                         size_t n_elems, void **handle, jdt_err *e)
{
    trainer *tr = ctx;
    *handle = NULL;
    if (group <= 0 || group > 7 || !tr->dist)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "collective on unknown group %d", group);
    train_pending *h = jdt_calloc(1, sizeof *h);
    if (!h) return jdt_err_set(e, JDT_ERR_NOMEM, "collective: out of memory");
    const double t0 = jdt_now_s();
    jdt_status st = train_collective_run(tr, group, kind, dt, buf, n_elems, &h->w, e);
    tr->s_comm += jdt_now_s() - t0;
    if (st != JDT_OK) {
        jdt_free(h);
        return st;
    }
    const jdt_comm_group *cg = tr->groups[group];
    const int k = jdt_comm_group_size(cg), me = jdt_comm_group_index(cg);
    const size_t esz = jdt_dtype_size(dt), seg = k ? n_elems / (size_t)k : 0;
    h->kind = kind;
    h->buf = buf;
    h->part_bytes = seg * esz;
    h->part_off = (size_t)me * seg * esz;
    h->name = coll_kind_name(kind);
    h->n_bytes = (double)n_elems * (double)esz;
    *handle = h;
    return JDT_OK;
}

static jdt_status train_collective_wait(void *ctx, void *handle, jdt_err *e)
{
    trainer *tr = ctx;
    train_pending *h = handle;
    if (!h) return jdt_err_set(e, JDT_ERR_INTERNAL, "collective wait without a start");
    double r0 = 0, r1 = 0;
    const double t0 = jdt_now_s();
    jdt_status st = jdt_comm_wait_timed(h->w, &r0, &r1, e);
    const double t1 = jdt_now_s();
    tr->s_comm += t1 - t0;
    tr->s_comm_moving += r1 - r0;
    if (tr->tracing) { /* the comm thread's track: when the data moved, against the kernels */
        char name[64];
        snprintf(name, sizeof name, "%s %.2f MB", h->name, h->n_bytes / 1e6);
        jdt_trace_span(tr->trace, name, "comm", 2, r0, r1);
        if (t1 - t0 > 1e-6) jdt_trace_span(tr->trace, "comm wait", "comm", 1, t0, t1);
    }
    if (st == JDT_OK && h->kind == JDT_COLL_REDUCE_SCATTER && h->part_off)
        memmove(h->buf, h->buf + h->part_off, h->part_bytes);
    jdt_free(h);
    return st;
}

/* Runs (w NULL: blocking) or starts (*w set) a collective on group mask `group`. */
static jdt_status train_collective_run(trainer *tr, int group, int kind, jdt_dtype dt, void *buf,
                                       size_t n_elems, jdt_comm_work **w, jdt_err *e)
{
    jdt_comm_group *cg = tr->groups[group];
    if (!cg) {
        const int n = jdt_mesh_group_size(&tr->mesh, (unsigned)group);
        if (n == tr->world_size) {
            cg = jdt_dist_world(tr->dist);
        } else {
            int ranks[64];
            if (n > (int)(sizeof ranks / sizeof ranks[0]))
                return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "process group of %d ranks (at most 64)",
                                   n);
            jdt_mesh_group_ranks(&tr->mesh, (unsigned)group, ranks);
            jdt_status st = jdt_comm_group_new(tr->dist, n, ranks, &cg, e);
            if (st != JDT_OK) return st;
        }
        tr->groups[group] = cg;
    }
    const int k = jdt_comm_group_size(cg), me = jdt_comm_group_index(cg);
    const size_t seg = k ? n_elems / (size_t)k : 0, esz = jdt_dtype_size(dt);
    jdt_status st;
    const jdt_reduce_op rop = kind == JDT_COLL_ALLREDUCE_MAX ? JDT_REDUCE_MAX : JDT_REDUCE_SUM;
    switch (kind) {
    case JDT_COLL_ALLREDUCE_SUM:
    case JDT_COLL_ALLREDUCE_MAX:
        return w ? jdt_comm_allreduce_start(cg, buf, n_elems, dt, rop, w, e)
                 : jdt_comm_allreduce(cg, buf, n_elems, dt, rop, e);
    case JDT_COLL_ALLGATHER: /* this member's part arrives first; the wire wants segment me */
        if (me) memmove((char *)buf + (size_t)me * seg * esz, buf, seg * esz);
        return w ? jdt_comm_allgather_start(cg, buf, n_elems, dt, w, e)
                 : jdt_comm_allgather(cg, buf, n_elems, dt, e);
    case JDT_COLL_REDUCE_SCATTER: /* started: the wait moves the part to the front */
        if (w) return jdt_comm_reduce_scatter_start(cg, buf, n_elems, dt, JDT_REDUCE_SUM, w, e);
        st = jdt_comm_reduce_scatter(cg, buf, n_elems, dt, JDT_REDUCE_SUM, e);
        if (st == JDT_OK && me) memmove(buf, (char *)buf + (size_t)me * seg * esz, seg * esz);
        return st;
    default:
        return jdt_err_set(e, JDT_ERR_INTERNAL, "collective of unknown kind %d", kind);
    }
}

void jdt_train_compile_opts(const jdt_config *cfg, jdt_compile_opts *o)
{
    jdt_compile_opts_init(o);
    o->threads = cfg->runtime.threads;
    o->adaptive_threads = cfg->runtime.adaptive_threads;
    o->cache_dir = cfg->runtime.cache_dir[0] ? cfg->runtime.cache_dir : NULL;
    o->cache_max_bytes =
        cfg->runtime.cache_max_mb > 0 ? (int64_t)cfg->runtime.cache_max_mb << 20 : -1;
    o->cc = cfg->runtime.cc[0] ? cfg->runtime.cc : NULL;
    o->cflags = cfg->runtime.cflags[0] ? cfg->runtime.cflags : NULL;
    o->remat = cfg->runtime.remat == JDT_REMAT_DOTS    ? JDT_COMPILE_REMAT_DOTS
               : cfg->runtime.remat == JDT_REMAT_BLOCK ? JDT_COMPILE_REMAT_BLOCK
                                                       : JDT_COMPILE_REMAT_NONE;
}

void jdt_train_ckpt_dir(const jdt_config *cfg, char *buf, size_t n_bytes)
{
    if (cfg->checkpoint.dir[0])
        snprintf(buf, n_bytes, "%s", cfg->checkpoint.dir);
    else
        snprintf(buf, n_bytes, "%s/%s/ckpt", cfg->run.out_dir, cfg->run.name);
}

/* The ranks of collective group `group` (a mesh-axes mask) in group order, for a device with its
 * own collectives (jdt_device_set_groups); 0 when unknown. */
static int train_group_ranks(void *ctx, int group, int *ranks, int max_ranks)
{
    trainer *tr = ctx;
    if (group <= 0 || group > 7) return 0;
    int n = jdt_mesh_group_size(&tr->mesh, (unsigned)group);
    if (n > max_ranks) return 0;
    jdt_mesh_group_ranks(&tr->mesh, (unsigned)group, ranks);
    return n;
}

/* runtime.backend cuda: opens this rank's GPU (dist.local_rank picks it; one process per GPU)
 * and hands it the job for NCCL; emit_only (inspect) compiles to CUDA source without a GPU.
 * The CPU needs no device object. */
static jdt_status open_device(trainer *tr, bool emit_only, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    tr->device = NULL;
    if (cfg->runtime.backend == JDT_BACKEND_CPU) return JDT_OK;
    if (emit_only) return jdt_device_open_emit_only(&tr->device, e);
    int index = cfg->dist.local_rank >= 0 ? cfg->dist.local_rank : 0;
    jdt_status st =
        jdt_device_open(JDT_DEVICE_CUDA, index,
                        cfg->runtime.cache_dir[0] ? cfg->runtime.cache_dir : NULL, &tr->device, e);
    if (st != JDT_OK) return jdt_err_prefix(e, "runtime.backend cuda");
    jdt_device_set_dist(tr->device, tr->dist);
    jdt_device_set_groups(tr->device, train_group_ranks, tr);
    char desc[300];
    if (tr->rank == 0) JDT_INFO("device: %s", jdt_device_describe(tr->device, desc, sizeof desc));
    return JDT_OK;
}

static jdt_status make_step(trainer *tr, jdt_step **out, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    jdt_step_opts so;
    memset(&so, 0, sizeof so);
    so.mesh = tr->mesh.world_size > 1 ? &tr->mesh : NULL;
    so.micro_batch = cfg->data.micro_batch_size;
    so.n_accum = cfg->data.batch_size / cfg->data.micro_batch_size;
    so.use_jit = cfg->runtime.jit;
    jdt_train_compile_opts(cfg, &so.copts);
    so.copts.device = tr->device;
    so.copts.profile = cfg->run.profile;
    if (cfg->run.profile) {
        so.copts.trace = trace_kernel;
        so.copts.trace_ctx = tr;
    }
    if (tr->dist) {
        so.copts.collective = train_collective;
        so.copts.collective_ctx = tr;
        /* overlapped with compute: the CPU backend through these hooks (a comm thread), the
         * CUDA backend with NCCL on its own stream (the hooks only ask for the schedule) */
        if (cfg->runtime.overlap_comm) {
            so.copts.collective_start = train_collective_start;
            so.copts.collective_wait = train_collective_wait;
            so.copts.bucket_bytes = (int64_t)cfg->runtime.bucket_mb << 20;
            so.copts.prefetch_bytes =
                cfg->runtime.prefetch_mb ? (int64_t)cfg->runtime.prefetch_mb << 20 : -1;
        }
    }
    return jdt_step_new(cfg, &so, out, e);
}

/* The device mesh of this job: mesh.data x mesh.fsdp x mesh.tensor = the world size (one -1
 * filled in), the batch split evenly over the axes the rules give it. */
static jdt_status check_world(trainer *tr, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const int sizes[JDT_MESH_AXIS_COUNT] = {cfg->mesh.data, cfg->mesh.fsdp, cfg->mesh.tensor};
    jdt_status st = jdt_mesh_init(&tr->mesh, sizes, tr->world_size, tr->rank, e);
    if (st != JDT_OK) return st;
    const int ways =
        jdt_mesh_group_size(&tr->mesh, jdt_shard_batch_axes(&tr->mesh, &cfg->sharding.rules));
    if (cfg->data.batch_size % ways || cfg->data.micro_batch_size % ways)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "data.batch_size %d and data.micro_batch_size %d must be multiples of "
                           "the %d ways the batch is split",
                           cfg->data.batch_size, cfg->data.micro_batch_size, ways);
    return JDT_OK;
}

static void trainer_free_groups(trainer *tr)
{
    for (int i = 0; i < 8; i++)
        if (tr->groups[i] && (!tr->dist || tr->groups[i] != jdt_dist_world(tr->dist)))
            jdt_comm_group_free(tr->groups[i]);
    memset(tr->groups, 0, sizeof tr->groups);
}

/* True on every rank when any rank was asked to stop (so all stop after the same step). */
static jdt_status agree_stop(trainer *tr, bool *stop, jdt_err *e)
{
    float flag = jdt_signals_stop_requested() ? 1.0f : 0.0f;
    if (tr->dist) {
        jdt_status st = jdt_comm_allreduce(jdt_dist_world(tr->dist), &flag, 1, JDT_DTYPE_F32,
                                           JDT_REDUCE_MAX, e);
        if (st != JDT_OK) return st;
    }
    *stop = flag != 0.0f;
    return JDT_OK;
}

/* Every rank starts at the same step and data batch: each resolved checkpoint.resume on its
 * own view of checkpoint.dir, which differs where that directory is not shared between hosts
 * or is a relative path from different working directories. Ranks that started apart trained
 * silently on each other's gradients of other steps (one with step 4's weights against step
 * 6's) until a checkpoint save failed for want of a rank's part. Every rank gathers the table
 * and reaches the same verdict, naming the first rank that differs from rank 0. */
static jdt_status agree_start(trainer *tr, int64_t start, jdt_err *e)
{
    if (!tr->dist || tr->world_size < 2) return JDT_OK;
    const size_t n = 2 * (size_t)tr->world_size;
    double *all = jdt_calloc(n, sizeof *all); /* (world_size, 2): step, data batch */
    if (!all) return jdt_err_set(e, JDT_ERR_NOMEM, "resume: out of memory");
    all[2 * tr->rank] = (double)start;
    all[2 * tr->rank + 1] = (double)(start + tr->data_shift);
    jdt_status st = jdt_comm_allgather(jdt_dist_world(tr->dist), all, n, JDT_DTYPE_F64, e);
    for (int r = 1; r < tr->world_size && st == JDT_OK; r++)
        if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
            st = jdt_err_set(e, JDT_ERR_INVALID,
                             "rank %d starts at step %.0f (data batch %.0f), rank 0 at step %.0f "
                             "(data batch %.0f): the ranks see different checkpoints in %s (not "
                             "the same directory on every host, or a relative path from "
                             "different working directories?)",
                             r, all[2 * r], all[2 * r + 1], all[0], all[1], tr->ckpt_dir);
    jdt_free(all);
    return st;
}

/* A fingerprint of a local dataset's content (jdt_data_fingerprint: its length and windows
 * spread over the whole stream). -1 where there is no dataset or it is remote (an http(s)://
 * path: every rank fetches the same URL, and its shards may still be downloading), the hash in
 * [0, 2^52) otherwise (exact in a double). */
static jdt_status data_print(jdt_data *d, const char *path, double *out, jdt_err *e)
{
    *out = -1;
    if (!d || jdt_fetch_is_url(path)) return JDT_OK;
    uint64_t h = 0;
    jdt_status st = jdt_data_fingerprint(d, &h, e);
    if (st == JDT_OK) *out = (double)(h >> 12); /* 52 bits: exact in a double */
    return st;
}

/* Every rank reads the same datasets: data.train_path and data.val_path are set per process
 * (each host may keep its own copy), and a rank given another file (a shorter copy) trained on
 * without a word, its batches drawn from another permutation. Compares the sample counts, then
 * a fingerprint of the content (data_print); every rank reaches the same verdict from the
 * gathered table. */
static jdt_status agree_data(trainer *tr, jdt_err *e)
{
    if (!tr->dist || tr->world_size < 2) return JDT_OK;
    const size_t n = 4 * (size_t)tr->world_size;
    double *all = jdt_calloc(n, sizeof *all); /* (world_size, 4): samples, prints */
    if (!all) return jdt_err_set(e, JDT_ERR_NOMEM, "data: out of memory");
    jdt_data_info info;
    if (tr->train) jdt_data_get_info(tr->train, &info);
    all[4 * tr->rank] = tr->train ? (double)info.n_samples : -1;
    if (tr->val) jdt_data_get_info(tr->val, &info);
    all[4 * tr->rank + 1] = tr->val ? (double)info.n_samples : -1;
    const jdt_config *cfg = tr->cfg;
    jdt_status st = data_print(tr->train, cfg->data.train_path, &all[4 * tr->rank + 2], e);
    if (st == JDT_OK) st = data_print(tr->val, cfg->data.val_path, &all[4 * tr->rank + 3], e);
    if (st == JDT_OK) st = jdt_comm_allgather(jdt_dist_world(tr->dist), all, n, JDT_DTYPE_F64, e);
    for (int i = 4; i < (int)n && st == JDT_OK; i++) {
        const int k = i % 4, r = i / 4;
        if (all[i] == all[k]) continue;
        const bool val = k % 2;
        const char *key = val ? "data.val_path" : "data.train_path";
        if (k < 2)
            st = jdt_err_set(e, JDT_ERR_INVALID,
                             "rank %d's %s data holds %.0f samples, rank 0's %.0f: every rank "
                             "must read the same dataset (%s may differ between processes only "
                             "to name copies of it)",
                             r, val ? "validation" : "training", all[i], all[k], key);
        else if (all[i] >= 0 && all[k] >= 0)
            st = jdt_err_set(e, JDT_ERR_INVALID,
                             "rank %d's %s data differs from rank 0's (the same %.0f samples, "
                             "other content): every rank must read the same dataset (%s may "
                             "differ between processes only to name copies of it)",
                             r, val ? "validation" : "training", all[k - 2], key);
    }
    jdt_free(all);
    return st;
}

static void trainer_init(trainer *tr, const jdt_config *cfg, jdt_dist *dist)
{
    memset(tr, 0, sizeof *tr);
    tr->cfg = cfg;
    tr->dist = dist;
    tr->rank = dist ? jdt_dist_rank(dist) : 0;
    tr->world_size = dist ? jdt_dist_world_size(dist) : 1;
    static const int ones[JDT_MESH_AXIS_COUNT] = {1, 1, 1};
    jdt_mesh_init(&tr->mesh, ones, 1, 0, NULL);
}

/* Compiles the step on this rank's device and restores what the run starts from: a checkpoint
 * to resume (*start = its step, tr->data_shift for a changed batch size) or init_from weights
 * (fine-tuning, *start = 0). */
static jdt_status prepare_step(trainer *tr, int64_t *start, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    double t_compile = jdt_now_s();
    jdt_status st;
    if ((st = open_device(tr, false, e)) != JDT_OK) return st;
    if ((st = make_step(tr, &tr->step, e)) != JDT_OK) return st;
    const jdt_compile_stats *cs = jdt_step_stats(tr->step);
    if (main_rank)
        JDT_INFO("model: %s, %lld parameters; step compiled in %.2fs%s",
                 cfg->model.type == JDT_MODEL_MLP ? "mlp" : "gpt",
                 (long long)jdt_model_param_count(jdt_step_model(tr->step)),
                 jdt_now_s() - t_compile,
                 !cs                ? " (interpreter)"
                 : cs->cache_waited ? " (cache hit: built by another process)"
                 : cs->cache_hit    ? " (cache hit)"
                                    : " (cache miss)");
    if (main_rank && tr->world_size > 1)
        JDT_INFO("mesh: data %d x fsdp %d x tensor %d; rank 0 holds %.2f MiB of parameters and "
                 "optimizer state",
                 tr->mesh.size[JDT_MESH_DATA], tr->mesh.size[JDT_MESH_FSDP],
                 tr->mesh.size[JDT_MESH_TENSOR],
                 (double)jdt_step_state_bytes(tr->step) / 1048576.0);
    *start = 0;
    char *resume = NULL;
    if ((st = jdt_ckpt_resolve(cfg->checkpoint.resume, tr->ckpt_dir, &resume, e)) != JDT_OK)
        return st;
    if (resume) {
        int64_t data_batch = 0;
        st = load_ckpt(cfg, tr->step, resume, start, &data_batch, main_rank, e);
        tr->data_shift = data_batch - *start;
        if (st == JDT_OK && main_rank)
            JDT_INFO("resumed from %s at step %lld (data batch %lld)", resume, (long long)*start,
                     (long long)data_batch);
        if (st == JDT_OK && *start >= cfg->run.steps && tr->rank == 0)
            JDT_WARN("the checkpoint is at step %lld, run.steps is %lld: nothing to train (raise "
                     "run.steps to continue)",
                     (long long)*start, (long long)cfg->run.steps);
        jdt_free(resume);
        return st;
    }
    if (cfg->checkpoint.init_from[0]) { /* fine-tuning: weights only, step 0 */
        const char *from = cfg->checkpoint.init_from;
        char *fetched = NULL, cache[1024];
        if (jdt_fetch_is_url(from)) { /* a folder over HTTP(S): mirrored into the cache first */
            jdt_fetch_opts fo;
            fetch_opts(cfg, &fo, cache, sizeof cache);
            if ((st = jdt_fetch_mirror(&fo, from, &fetched, e)) != JDT_OK) return st;
            from = fetched;
        }
        st = jdt_hf_init_from(tr->step, cfg, from, e);
        jdt_free(fetched);
        if (st != JDT_OK) return st;
        if (main_rank) JDT_INFO("initialised params from %s", cfg->checkpoint.init_from);
    }
    return JDT_OK;
}

/* The MFU denominator of one process: on a GPU the part's dense tensor-core peak for the
 * step's precision (TF32 for f32, bf16), on the CPU the cached or measured peak of the GEMM the
 * step runs (the SGEMM, or oneDNN's bf16 GEMM under bf16 compute; engine/obs);
 * runtime.peak_gflops pins either. */
static jdt_status mfu_reference(trainer *tr, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    if (tr->device) {
        char desc[300];
        jdt_device_describe(tr->device, desc, sizeof desc);
        jdt_peak_reference_gpu(desc, cfg->precision.compute == JDT_DTYPE_BF16,
                               cfg->runtime.peak_gflops, &tr->pref);
        if (tr->rank == 0 && tr->pref.guessed)
            JDT_WARN("MFU: %s is not in the datasheet table (engine/obs/peak.c); MFU assumes %.1f "
                     "TFLOP/s: set runtime.peak_gflops to the part's dense peak",
                     desc, tr->pref.flops * 1e-12);
        return JDT_OK;
    }
    char cache_dir[1024];
    jdt_compile_opts co;
    jdt_train_compile_opts(cfg, &co);
    if (jdt_compile_cache_dir(&co, cache_dir, sizeof cache_dir, NULL) != JDT_OK)
        cache_dir[0] = '\0';
    /* bf16 compute through oneDNN runs its GEMMs at the bf16 rate (1.7-1.8x the SGEMM's on an
     * AMD EPYC): against the SGEMM a healthy run read MFU 170% and was told its reference was
     * wrong. Elsewhere bf16 GEMMs are SGEMMs on rounded inputs, and the SGEMM is the ceiling. */
    const jdt_peak_gemm bf16 = {"bf16", "oneDNN bf16 GEMMs", jdt_rt_bf16_peak_measure};
    const jdt_peak_gemm f32 = {"dnnl-f32", "oneDNN f32 GEMMs", jdt_rt_sgemm_peak_measure};
    const bool use_bf16 = cfg->precision.compute == JDT_DTYPE_BF16 && jdt_rt_bf16_native();
    /* the GEMM the step's products run on: oneDNN's bf16, oneDNN's f32 tiles, else OpenBLAS */
    const jdt_peak_gemm *gemm = use_bf16 ? &bf16 : jdt_rt_sgemm_dnnl_on() ? &f32 : NULL;
    return jdt_peak_reference(cache_dir, cfg->runtime.threads, cfg->runtime.peak_gflops, gemm,
                              &tr->pref, e);
}

/* Rank 0's outputs: run_dir/config.yaml, metrics.jsonl (appended on a resume, after dropping
 * the lines of the steps after the checkpoint: they are trained again), the TensorBoard events
 * with the resolved config as text (and on a resume a restart event that hides the earlier
 * files' events of those steps), and the MFU reference line. */
static jdt_status open_outputs(trainer *tr, int64_t start, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    char path[1100];
    snprintf(path, sizeof path, "%s/config.yaml", tr->run_dir);
    FILE *f = fopen(path, "w");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    fputs(cfg->resolved_yaml, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/metrics.jsonl", tr->run_dir);
    if (start > 0) { /* steps logged after the checkpoint resumed from are trained again */
        int64_t dropped = 0;
        jdt_status ts = jdt_metrics_truncate(path, start, &dropped, e);
        if (ts != JDT_OK) return ts;
        if (dropped)
            JDT_INFO("metrics.jsonl: dropped %lld line(s) of the steps after %lld (trained "
                     "again from its checkpoint)",
                     (long long)dropped, (long long)start);
    }
    tr->metrics = fopen(path, start > 0 ? "a" : "w");
    if (!tr->metrics) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    JDT_INFO("MFU reference: %.6g GFLOP/s for %d process(es) (%s%s%s)%s%s%s", tr->peak * 1e-9,
             tr->world_size, tr->pref.source, tr->pref.cache_path[0] ? ": " : "",
             tr->pref.cache_path,
             tr->pref.gemm[0]        ? "; "
             : tr->pref.blas_core[0] ? "; OpenBLAS "
                                     : "",
             tr->pref.gemm[0] ? tr->pref.gemm : tr->pref.blas_core,
             !tr->pref.gemm[0] && tr->pref.blas_core[0] ? " kernels" : "");
    if (tr->pref.provisional)
        JDT_WARN("the MFU reference was measured on a busy machine (its threads held %.3f of "
                 "%g cores): MFU may be overstated; set runtime.peak_gflops to pin it",
                 tr->pref.cores_held, tr->pref.cores_wanted);
    jdt_status st = jdt_tboard_open(tr->run_dir, &tr->tb, e);
    if (st != JDT_OK) return st;
    /* TensorBoard drops the earlier files' events from step start + 1 on (trained again) */
    if (start > 0 && (st = jdt_tboard_restart(tr->tb, start + 1, e)) != JDT_OK) return st;
    size_t n = strlen(cfg->resolved_yaml) + 16;
    char *md = jdt_malloc(n);
    if (md) {
        snprintf(md, n, "```\n%s\n```", cfg->resolved_yaml);
        jdt_tboard_text(tr->tb, "config", start, md, NULL);
        jdt_free(md);
    }
    return JDT_OK;
}

/* Rank 0's line for step t (averages over the steps since the last one), the same figures in
 * metrics.jsonl and TensorBoard; one warning the first time MFU exceeds 100%. */
static void log_window(trainer *tr, int64_t t, double loss, double lr, double gnorm)
{
    const jdt_config *cfg = tr->cfg;
    const bool mlp = cfg->model.type == JDT_MODEL_MLP;
    double dt = tr->window_time / (double)tr->window_steps;
    char eta[32];
    fmt_duration(dt * (double)(cfg->run.steps - t - 1), eta, sizeof eta);
    const double mfu = 100.0 * tr->flops_per_step / dt / tr->peak;
    const double rss_mb = (double)jdt_obs_peak_rss_bytes() / 1048576.0;
    const double wait_ms = tr->window_wait / (double)tr->window_steps * 1e3;
    jdt_device_mem dm; /* a GPU's memory: our allocations' peak (engine/backend) */
    const bool dev = jdt_device_memory(tr->device, &dm);
    const double dev_mb = (double)dm.peak_bytes / 1048576.0;
    char dev_txt[64] = "";
    if (dev) snprintf(dev_txt, sizeof dev_txt, " | peak device %.0f MB", dev_mb);
    char dev_json[64] = "";
    if (dev) snprintf(dev_json, sizeof dev_json, "\"peak_device_mb\": %.1f, ", dev_mb);
    JDT_INFO("step %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f %s/s | MFU %.1f%%%s | "
             "%.1f ms/step (data %.1f) | peak RSS %.0f MB%s | ETA %s",
             (long long)(t + 1), (long long)cfg->run.steps, loss, lr, gnorm,
             tr->units_per_step / dt, mlp ? "samples" : "tok", mfu, mfu > 100 ? " (!)" : "",
             dt * 1e3, wait_ms, rss_mb, dev_txt, eta);
    if (mfu > 100 && !tr->warned_mfu) {
        tr->warned_mfu = true;
        warn_mfu(mfu, "", tr->peak, &tr->pref);
    }
    /* "step" last: the resume test compares lines matching '"step": N,' */
    fprintf(tr->metrics,
            "{\"tokens_per_s\": %.6g, \"mfu\": %.4g, \"step_ms\": %.6g, "
            "\"data_ms\": %.6g, \"peak_rss_mb\": %.1f, %s\"elapsed_s\": %.3f, \"step\": %lld}\n",
            tr->units_per_step / dt, mfu, dt * 1e3, wait_ms, rss_mb, dev_json,
            jdt_now_s() - tr->t_start, (long long)(t + 1));
    jdt_tboard_scalar(tr->tb, "perf/tokens_per_s", t + 1, tr->units_per_step / dt, NULL);
    jdt_tboard_scalar(tr->tb, "perf/mfu_percent", t + 1, mfu, NULL);
    jdt_tboard_scalar(tr->tb, "perf/step_ms", t + 1, dt * 1e3, NULL);
    jdt_tboard_scalar(tr->tb, "perf/data_wait_ms", t + 1, wait_ms, NULL);
    jdt_tboard_scalar(tr->tb, "memory/peak_rss_mb", t + 1, rss_mb, NULL);
    if (dev) jdt_tboard_scalar(tr->tb, "memory/peak_device_mb", t + 1, dev_mb, NULL);
    tr->window_steps = 0; /* the caller flushes (flush_metrics) */
    tr->window_time = tr->window_wait = 0;
}

/* Rank 0: flushes metrics.jsonl and the TensorBoard events; a write that failed (a full disk)
 * ends the run with the file named, instead of a run whose metrics silently stop. */
static jdt_status flush_metrics(trainer *tr, jdt_err *e)
{
    jdt_status st = jdt_tboard_flush(tr->tb, e);
    if (st != JDT_OK) return st;
    errno = 0;
    if (fflush(tr->metrics) != 0 || ferror(tr->metrics))
        return jdt_err_set(e, JDT_ERR_IO, "%s/metrics.jsonl: cannot write: %s", tr->run_dir,
                           errno ? strerror(errno) : "a write failed");
    return JDT_OK;
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
                 "ui.perfetto.dev or chrome://tracing)",
                 tr->trace_path, (long long)(tr->first + 2), (long long)(t + 1));
    return JDT_OK;
}

/* Step t: its batch, the compiled step, the trace spans, rank 0's metrics and log line. */
static jdt_status train_step(trainer *tr, int64_t t, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    tr->tracing = tr->trace && t > tr->first && t <= tr->first + cfg->run.profile_steps;
    double t0 = jdt_now_s();
    jdt_data_batch b;
    jdt_status st = jdt_data_get(tr->train, t + tr->data_shift, &b, e);
    if (st != JDT_OK) return st;
    double t_data = jdt_now_s();
    tr->window_wait += t_data - t0;
    tr->s_data += t_data - t0;
    if (tr->tracing) jdt_trace_span(tr->trace, "data wait", "data", 0, t0, t_data);
    double lr = jdt_train_lr(cfg, t), loss = NAN, gnorm = NAN;
    st = jdt_step_run(tr->step, t, lr, b.x, b.y, &loss, &gnorm, e);
    if (st == JDT_ERR_NUMERIC && cfg->optimizer.nan_policy == JDT_NAN_SKIP) {
        JDT_WARN("%s; update skipped", e->msg);
        st = JDT_OK;
    }
    if (st != JDT_OK) return st;
    /* the profile, like the trace, leaves out the warm-up step (first calls' setup) */
    if (cfg->run.profile && t == tr->first && !last_step(cfg, t)) jdt_step_profile_reset(tr->step);
    tr->window_steps++;
    tr->window_time += jdt_now_s() - t0;
    tr->s_step += jdt_now_s() - t_data;
    if (tr->tracing) {
        char name[64];
        snprintf(name, sizeof name, "step %lld", (long long)(t + 1));
        jdt_trace_span(tr->trace, name, "step", 0, t_data, jdt_now_s());
        if (t == tr->first + cfg->run.profile_steps || last_step(cfg, t))
            if ((st = end_trace(tr, t, e)) != JDT_OK) return st;
    }
    if (!main_rank) return JDT_OK;
    fprintf(tr->metrics,
            "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens\": %.0f}\n",
            (long long)(t + 1), loss, lr, gnorm, tr->units_per_step * (double)(t + 1));
    jdt_tboard_scalar(tr->tb, "loss/train", t + 1, loss, NULL);
    jdt_tboard_scalar(tr->tb, "optim/lr", t + 1, lr, NULL);
    jdt_tboard_scalar(tr->tb, "optim/grad_norm", t + 1, gnorm, NULL);
    if ((t + 1) % cfg->run.log_every == 0 || last_step(cfg, t) || t == tr->first) {
        log_window(tr, t, loss, lr, gnorm);
        if ((st = flush_metrics(tr, e)) != JDT_OK) return st;
    }
    return JDT_OK;
}

/* Rank 0's end-of-run table after step t: throughput, MFU, where the time went, peak memory
 * against the planner's figures. */
static void log_summary(const trainer *tr, int64_t t)
{
    const bool mlp = tr->cfg->model.type == JDT_MODEL_MLP;
    const double wall = jdt_now_s() - tr->t_start, n_run = (double)(t + 1 - tr->first);
    JDT_INFO("done: %lld steps in %.1fs", (long long)(t + 1 - tr->first), wall);
    double state_bytes = 0;
    for (int i = 0; i < jdt_step_n_tensors(tr->step); i++) {
        const char *nm;
        float *d;
        jdt_shape sh;
        jdt_step_tensor(tr->step, i, &nm, &d, &sh);
        state_bytes += (double)jdt_shape_numel(&sh) * sizeof(float);
    }
    const jdt_compile_stats *cs = jdt_step_stats(tr->step);
    const double pct = wall > 0 ? 100.0 / wall : 0;
    const double run_mfu = 100.0 * tr->flops_per_step * n_run / tr->s_step / tr->peak;
    if (run_mfu > 100 && !tr->warned_mfu) warn_mfu(run_mfu, " over the run", tr->peak, &tr->pref);
    /* a device with its own collectives (CUDA: NCCL) times them with its events */
    double comm_s = tr->s_comm, moving_s = tr->s_comm_moving, dev_waited_s, dev_moving_s;
    if (jdt_device_comm_times(tr->device, &dev_waited_s, &dev_moving_s)) {
        comm_s += dev_waited_s;
        moving_s += dev_moving_s;
    }
    jdt_device_mem dm;
    char dev_txt[200] = "";
    if (jdt_device_memory(tr->device, &dm))
        snprintf(dev_txt, sizeof dev_txt,
                 "\n  device memory  %.1f MiB peak of our allocations (programs, parameters/state, "
                 "GEMM workspace); %.2f of %.2f GiB in use on the GPU",
                 (double)dm.peak_bytes / 1048576.0, (double)dm.used_bytes / 1073741824.0,
                 (double)dm.total_bytes / 1073741824.0);
    JDT_INFO(
        "summary of this run (rank 0):\n"
        "  throughput     %.0f %s/s, MFU %.1f%%%s (reference %.6g GFLOP/s, %s)\n"
        "  compute        %8.2fs %5.1f%%  (train steps, excluding communication)\n"
        "  communication  %8.2fs %5.1f%%  (waited for; %d calls per program run, %.2fs "
        "moving data, %.0f%% of it hidden under compute)\n"
        "  data wait      %8.2fs %5.1f%%\n"
        "  eval           %8.2fs %5.1f%%\n"
        "  checkpointing  %8.2fs %5.1f%%\n"
        "  peak memory    %.1f MiB resident; planner: %.1f MiB arena + %.1f MiB params/state%s",
        tr->units_per_step * n_run / tr->s_step, mlp ? "samples" : "tok", run_mfu,
        run_mfu > 100 ? " (!)" : "", tr->peak * 1e-9, tr->pref.source, tr->s_step - comm_s,
        (tr->s_step - comm_s) * pct, comm_s, comm_s * pct, cs ? cs->n_coll_calls : 0, moving_s,
        moving_s > 0 ? 100.0 * fmax(0.0, 1.0 - comm_s / moving_s) : 0.0, tr->s_data,
        tr->s_data * pct, tr->s_eval, tr->s_eval * pct, tr->s_ckpt, tr->s_ckpt * pct,
        (double)jdt_obs_peak_rss_bytes() / 1048576.0,
        cs ? (double)cs->arena_bytes / 1048576.0 : 0.0, state_bytes / 1048576.0, dev_txt);
}

/* After step t: evaluation, periodic and final checkpoints (every rank saves its slices), the
 * profile table, the end-of-run summary. */
static jdt_status after_step(trainer *tr, int64_t t, jdt_err *e)
{
    const jdt_config *cfg = tr->cfg;
    const bool main_rank = tr->rank == 0;
    const bool last = last_step(cfg, t);
    jdt_status st;
    if (tr->val && ((t + 1) % cfg->run.eval_every == 0 || last)) {
        double vl, t_ev = jdt_now_s();
        if ((st = run_eval(tr, &vl, e)) != JDT_OK) return st;
        tr->s_eval += jdt_now_s() - t_ev;
        /* every rank holds the same mean: all stop, before this step's checkpoint */
        if (!isfinite(vl))
            return jdt_err_set(e, JDT_ERR_NUMERIC,
                               "step %lld: the validation loss is %g: the parameters have "
                               "diverged (nothing saved at this step)",
                               (long long)(t + 1), vl);
        if (main_rank) {
            JDT_INFO("step %lld/%lld | val loss %.4f", (long long)(t + 1),
                     (long long)cfg->run.steps, vl);
            fprintf(tr->metrics, "{\"step\": %lld, \"val_loss\": %.17g}\n", (long long)(t + 1), vl);
            jdt_tboard_scalar(tr->tb, "loss/val", t + 1, vl, NULL);
            if ((st = flush_metrics(tr, e)) != JDT_OK) return st;
        }
    }
    if (cfg->checkpoint.every > 0 && (t + 1) % cfg->checkpoint.every == 0 && !last)
        if ((st = save_ckpt(tr, t + 1, e)) != JDT_OK) return st;
    if (cfg->run.profile && main_rank && cfg->run.profile_steps > 0 &&
        (t - tr->first == cfg->run.profile_steps ||
         (last && t - tr->first < cfg->run.profile_steps)))
        log_profile(tr, t);
    if (last) {
        if ((st = save_ckpt(tr, t + 1, e)) != JDT_OK) return st;
        if (main_rank) log_summary(tr, t);
    }
    return JDT_OK;
}

/* A signal stopped the run after `done` steps: checkpoint (every rank its slices), then
 * ERR_INTERRUPTED. */
static jdt_status stop_run(trainer *tr, int64_t done, jdt_err *e)
{
    int sig = jdt_signals_stop_requested();
    if (!sig) sig = SIGTERM; /* another rank's signal */
    if (tr->rank == 0)
        JDT_WARN("received %s at step %lld: %s", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 (long long)done,
                 tr->cfg->checkpoint.save_on_signal
                     ? "saving a checkpoint and stopping"
                     : "stopping without a checkpoint (checkpoint.save_on_signal: false)");
    jdt_status st;
    if (tr->cfg->checkpoint.save_on_signal && (st = save_ckpt(tr, done, e)) != JDT_OK) return st;
    return jdt_err_set(e, JDT_ERR_INTERRUPTED, "stopped by %s after step %lld",
                       sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)done);
}

jdt_status jdt_train_run(const jdt_config *cfg, jdt_dist *dist, jdt_err *e)
{
    trainer tr;
    trainer_init(&tr, cfg, dist);
    jdt_status st;
    if ((st = check_world(&tr, e)) != JDT_OK) return st;
    if ((st = jdt_train_check_mesh(cfg, tr.world_size, e)) != JDT_OK) return st;
    const bool main_rank = tr.rank == 0;
    int lock_fd[2] = {-1, -1}; /* rank 0: the run and checkpoint directories' locks */
    /* before the first collective, so a signal during compilation is not lost; the signal
     * thread (jdt_signals_init, in main) takes it, and no worker thread is interrupted */
    jdt_signals_stop_begin();

    snprintf(tr.run_dir, sizeof tr.run_dir, "%s/%s", cfg->run.out_dir, cfg->run.name);
    jdt_train_ckpt_dir(cfg, tr.ckpt_dir, sizeof tr.ckpt_dir);
    if ((st = mkdir_p(tr.run_dir, e)) != JDT_OK) goto out_signals;
    if (main_rank && (st = lock_run_dir(tr.run_dir, &RUN_DIR, &lock_fd[0], e)) != JDT_OK)
        goto out_signals;
    if (main_rank && cfg->checkpoint.dir[0]) { /* one it cannot make: preflight_ckpt says so */
        jdt_err ignored;
        if (mkdir_p(tr.ckpt_dir, &ignored) == JDT_OK &&
            (st = lock_run_dir(tr.ckpt_dir, &CKPT_DIR, &lock_fd[1], e)) != JDT_OK)
            goto out_signals;
    }
    if ((st = setup_data(&tr, true, cfg->run.eval_every > 0, e)) != JDT_OK) goto out_signals;
    if ((st = agree_data(&tr, e)) != JDT_OK) goto out_signals;
    int64_t start = 0;
    if ((st = prepare_step(&tr, &start, e)) != JDT_OK) goto out_signals;
    if ((st = agree_start(&tr, start, e)) != JDT_OK) goto out_signals;
    if (main_rank && (st = preflight_ckpt(&tr, e)) != JDT_OK) goto out_signals;

    /* global numbers: every rank runs its share of the global batch in the same time */
    const bool mlp = cfg->model.type == JDT_MODEL_MLP;
    tr.units_per_step = (double)cfg->data.batch_size * (mlp ? 1 : cfg->model.seq_len);
    tr.flops_per_step = jdt_step_model_flops(tr.step);
    if ((st = mfu_reference(&tr, e)) != JDT_OK) goto out_signals;
    tr.peak = tr.pref.flops * tr.world_size;
    if (main_rank && (st = open_outputs(&tr, start, e)) != JDT_OK) goto out_signals;

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
    jdt_signals_stop_end();
    if (tr.metrics) fclose(tr.metrics);
    jdt_tboard_close(tr.tb);
    jdt_step_free(tr.step);
    jdt_device_close(tr.device);
    trainer_free_groups(&tr);
    jdt_data_close(tr.train);
    jdt_data_close(tr.val);
    for (int i = 0; i < 2; i++) /* releases the directories, their holder's lines cleared */
        if (lock_fd[i] >= 0) {
            if (ftruncate(lock_fd[i], 0) != 0) JDT_DEBUG("a run lock: cannot clear it");
            close(lock_fd[i]);
        }
    return st;
}

jdt_status jdt_train_eval(const jdt_config *cfg, jdt_dist *dist, const char *ckpt_path,
                          double *loss, jdt_err *e)
{
    trainer tr;
    trainer_init(&tr, cfg, dist);
    jdt_status st;
    int64_t step = 0;
    if ((st = check_world(&tr, e)) != JDT_OK) return st;
    if ((st = jdt_train_check_mesh(cfg, tr.world_size, e)) != JDT_OK) return st;
    snprintf(tr.run_dir, sizeof tr.run_dir, "%s/%s", cfg->run.out_dir, cfg->run.name);
    if ((st = mkdir_p(tr.run_dir, e)) != JDT_OK) return st;
    if ((st = setup_data(&tr, false, true, e)) != JDT_OK) goto out;
    if ((st = open_device(&tr, false, e)) != JDT_OK) goto out;
    if ((st = make_step(&tr, &tr.step, e)) != JDT_OK) goto out;
    /* a Hugging Face model directory (GPT-2 from the hub: its loss on this data) loads as
     * checkpoint.init_from does; anything else is a jdt checkpoint */
    if (jdt_hf_is_model_dir(ckpt_path))
        st = jdt_hf_init_from(tr.step, cfg, ckpt_path, e);
    else
        st = load_ckpt(cfg, tr.step, ckpt_path, &step, NULL, false, e);
    if (st != JDT_OK) goto out;
    st = run_eval(&tr, loss, e);
out:
    jdt_step_free(tr.step);
    jdt_device_close(tr.device);
    trainer_free_groups(&tr);
    jdt_data_close(tr.val);
    return st;
}
