/*
 * check_compile.c — the compiler: graph passes (DCE, CSE, folding, simplification) keep the
 * numbers and remove what they should, fusion collapses chains, memory-plan invariants (no two
 * simultaneously live buffers overlap; in-place only over a buffer that dies there; donated
 * updates), and the on-disk cache (hit, miss, concurrent writers, corrupt entries, missing or
 * failing compiler).
 */
#include "tests/unit/testutil.h"
#include "jit-fixture.h"

#include <dirent.h>
#include <signal.h>
#include <sys/time.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "autodiff/autodiff.h"

static void out(fx *f, jdt_tensor *t)
{
    ck_assert_msg(t != NULL, "builder: %s", jdt_graph_error_msg(f->g));
    jdt_graph_add_output(f->g, t);
}

START_TEST(test_passes_simplify_cse_dce)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 4, 6);
    int64_t d46[2] = {4, 6}, d24[2] = {24, 1}, d64[2] = {6, 4};
    jdt_tensor *one = jdt_graph_full(g, JDT_DTYPE_F32, 2, d46, 1.0);
    jdt_tensor *zero = jdt_graph_full(g, JDT_DTYPE_F32, 2, d46, 0.0);
    /* identities: each of these is x itself */
    jdt_tensor *a = jdt_graph_mul(g, x, one);
    a = jdt_graph_add(g, zero, a);
    a = jdt_graph_mul_scalar(g, a, 1.0);
    a = jdt_graph_reshape(g, jdt_graph_reshape(g, a, 2, d24), 2, d46);
    a = jdt_graph_transpose(g, jdt_graph_transpose(g, a, (int[]){1, 0}), (int[]){1, 0});
    a = jdt_graph_broadcast(g, a, 2, d46);
    a = jdt_graph_neg(g, jdt_graph_neg(g, a));
    /* CSE: the same expression twice */
    jdt_tensor *e1 = jdt_graph_exp(g, a), *e2 = jdt_graph_exp(g, x);
    out(&f, jdt_graph_add(g, e1, e2));
    /* folding: splats combine into one literal */
    jdt_tensor *k =
        jdt_graph_mul(g, jdt_graph_add(g, one, one), jdt_graph_full(g, JDT_DTYPE_F32, 2, d46, 3.0));
    out(&f, jdt_graph_mul(g, x, k));
    out(&f, jdt_graph_transpose(g, jdt_graph_transpose(g, x, (int[]){1, 0}), (int[]){1, 0}));
    out(&f, jdt_graph_reshape(g, x, 2, d64));
    /* dead code */
    jdt_graph_tanh(g, jdt_graph_exp(g, jdt_graph_log(g, x)));
    fx_fill(&f, 1);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-6, 1e-6, true);
    const jdt_compile_stats *s = jdt_program_stats(p);
    /* live after the passes: x, exp, add, the 6.0 splat, mul, reshape */
    ck_assert_int_eq(s->n_ops_out, 6);
    ck_assert_int_gt(s->n_ops_in, 20);
    jdt_program_free(p);
    /* without the passes the numbers are the same and more ops remain */
    o.no_simplify = true;
    fx_fill(&f, 1);
    p = fx_check_steps(&f, &o, 1, 1e-6, 1e-6, true);
    ck_assert_int_gt(jdt_program_stats(p)->n_ops_out, 15);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

START_TEST(test_fusion_counts)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 33, 65);
    jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, -1, 1, 33, 65);
    jdt_tensor *c = x;
    for (int i = 0; i < 12; i++)
        c = i % 3 == 0   ? jdt_graph_tanh(g, c)
            : i % 3 == 1 ? jdt_graph_mul(g, c, y)
                         : jdt_graph_add_scalar(g, c, 0.5);
    /* a 12-op chain + its row sum: one kernel */
    out(&f, jdt_graph_reduce_sum(g, c, 2u, false));
    fx_fill(&f, 2);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-5, 1e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 1);
    ck_assert_int_eq(jdt_program_stats(p)->arena_bytes, 64 * 3); /* only the (33) result */
    jdt_program_free(p);
    o.no_fuse = true;
    p = fx_check_steps(&f, &o, 1, 1e-5, 1e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 13);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* Checks the plan of p: live arena intervals never overlap unless one took over the other in
 * place at the step where the donor died. */
static void check_plan(const jdt_program *p)
{
    int n = jdt_program_n_buffers(p);
    int64_t arena = jdt_program_stats(p)->arena_bytes, total = 0;
    for (int i = 0; i < n; i++) {
        jdt_buf_info a;
        ck_assert(jdt_program_buffer(p, i, &a));
        if (a.kind != JDT_BUF_ARENA || a.n_bytes == 0) continue;
        total += a.n_bytes;
        ck_assert_int_ge(a.offset, 0);
        ck_assert_int_le(a.offset + a.n_bytes, arena);
        ck_assert_int_le(a.def_step, a.last_step);
        if (a.inplace_of >= 0) {
            jdt_buf_info d;
            jdt_program_buffer(p, a.inplace_of, &d);
            ck_assert_int_eq(d.last_step, a.def_step); /* donor dies where it is overwritten */
            ck_assert_int_eq(d.offset, a.offset);
        }
        for (int j = i + 1; j < n; j++) {
            jdt_buf_info b;
            jdt_program_buffer(p, j, &b);
            if (b.kind != JDT_BUF_ARENA || b.n_bytes == 0) continue;
            bool live = a.def_step <= b.last_step && b.def_step <= a.last_step;
            bool mem = a.offset < b.offset + b.n_bytes && b.offset < a.offset + a.n_bytes;
            if (!live || !mem) continue;
            bool inplace = (b.inplace_of == i && a.last_step == b.def_step) ||
                           (a.inplace_of == j && b.last_step == a.def_step);
            /* chains of in-place takeovers share storage one after another */
            bool chained = a.last_step == b.def_step || b.last_step == a.def_step;
            ck_assert_msg(inplace || (chained && (a.inplace_of >= 0 || b.inplace_of >= 0)),
                          "buffers %d [%lld,+%lld) steps %d..%d and %d [%lld,+%lld) steps %d..%d "
                          "overlap",
                          i, (long long)a.offset, (long long)a.n_bytes, a.def_step, a.last_step, j,
                          (long long)b.offset, (long long)b.n_bytes, b.def_step, b.last_step);
        }
    }
    ck_assert_int_le(arena, total + 64 * n);
}

/* The head and cross-entropy on (B, T, C) rows without flattening them (sequence parallelism's
 * loss, models.c gpt_loss_seq): a shared-weight GEMM to (B, T, V) logits, the cross-entropy
 * over their last axis, its fused backward and the weight's gradient, against the interpreter. */
START_TEST(test_xent_leading_dims)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 2, 8, 12);
    jdt_tensor *tg = FX_INPUT(&f, "tg", JDT_DTYPE_I32, 0, 10, 2, 8);
    jdt_tensor *w = fx_leaf(&f, 0, "w", JDT_DTYPE_F32, 2, (int64_t[]){12, 10}, -0.3, 0.3);
    jdt_tensor *logits = jdt_graph_matmul(g, x, w, false, false);
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tg), 3u, false);
    jdt_tensor *dw;
    jdt_err e;
    ck_assert_msg(jdt_autodiff_grad(g, loss, 1, &w, &dw, &e) == JDT_OK, "%s", e.msg);
    out(&f, loss);
    jdt_graph_add_update(g, w, jdt_graph_sub(g, w, jdt_graph_mul_scalar(g, dw, 0.5)));
    fx_fill(&f, 5);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program_free(fx_check_steps(&f, &o, 3, 1e-5, 1e-6, true));
    fx_free(&f);
}
END_TEST

START_TEST(test_memory_plan_invariants)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 16, 24);
    jdt_tensor *tg = FX_INPUT(&f, "tg", JDT_DTYPE_I32, 0, 10, 16);
    jdt_tensor *w[4];
    int64_t dims[4][2] = {{24, 32}, {32, 32}, {32, 32}, {32, 10}};
    const char *names[4] = {"w0", "w1", "w2", "w3"};
    jdt_tensor *h = x;
    for (int l = 0; l < 4; l++) {
        w[l] = fx_leaf(&f, 0, names[l], JDT_DTYPE_F32, 2, dims[l], -0.3, 0.3);
        h = jdt_graph_matmul(g, h, w[l], false, false);
        if (l < 3) h = jdt_graph_tanh(g, jdt_graph_rms_normalize(g, h, 1e-5));
    }
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, h, tg), 1u, false);
    jdt_tensor *grads[4];
    jdt_err e;
    ck_assert_msg(jdt_autodiff_grad(g, loss, 4, w, grads, &e) == JDT_OK, "%s", e.msg);
    out(&f, loss);
    for (int l = 0; l < 4; l++)
        jdt_graph_add_update(g, w[l],
                             jdt_graph_sub(g, w[l], jdt_graph_mul_scalar(g, grads[l], 0.05)));
    fx_fill(&f, 3);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    /* both placements (fuse.c: the sweep's best fit, and the lifetimes placed largest first),
     * each checked and run against the interpreter; the default takes the lower top */
    int64_t tops[2];
    for (int pm = 0; pm < 2; pm++) {
        setenv("JDT_PLACEMENT", pm ? "size" : "sweep", 1);
        jdt_program *q = fx_check_steps(&f, &o, 2, 1e-4, 1e-5, true);
        unsetenv("JDT_PLACEMENT");
        check_plan(q);
        ck_assert(jdt_program_stats(q)->placed_by_size == (pm == 1));
        tops[pm] = jdt_program_stats(q)->arena_bytes;
        jdt_program_free(q);
    }
    jdt_program *p = fx_check_steps(&f, &o, 2, 1e-4, 1e-5, true);
    check_plan(p);
    const jdt_compile_stats *s = jdt_program_stats(p);
    ck_assert_int_eq(s->arena_bytes, tops[1] < tops[0] ? tops[1] : tops[0]);
    ck_assert_int_eq(s->n_donated + s->n_update_copies, 4);
    ck_assert_int_ge(s->n_donated, 1);
    /* reuse: the arena is smaller than the sum of the buffers */
    int64_t total = 0;
    for (int i = 0; i < jdt_program_n_buffers(p); i++) {
        jdt_buf_info b;
        jdt_program_buffer(p, i, &b);
        if (b.kind == JDT_BUF_ARENA) total += b.n_bytes;
    }
    ck_assert_int_lt(s->arena_bytes, total);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* An update whose old value is still read after the new value is computed must not be donated
 * (the output reads the pre-step parameter). */
START_TEST(test_update_not_donated_when_read_later)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *w = FX_PARAM(&f, "w", -1, 1, 5, 7);
    jdt_tensor *s = fx_leaf(&f, 2, "s", JDT_DTYPE_F32, 2, (int64_t[]){5, 7}, -1, 1);
    jdt_tensor *wn = jdt_graph_mul_scalar(g, w, 0.5);
    jdt_tensor *late =
        jdt_graph_matmul(g, w, jdt_graph_transpose(g, wn, (int[]){1, 0}), false, false);
    out(&f, late);
    out(&f, w); /* an updated leaf as an output: the pre-step value (interpreter semantics) */
    out(&f, jdt_graph_reshape(g, s, 2, (int64_t[]){7, 5}));
    jdt_graph_add_update(g, w, wn);
    /* a swap-like update: s takes w's old value */
    jdt_graph_add_update(g, s, jdt_graph_add(g, w, s));
    fx_fill(&f, 4);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 2, 1e-5, 1e-6, true);
    check_plan(p);
    ck_assert_int_ge(jdt_program_stats(p)->n_update_copies, 1);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

static jdt_graph *small_graph(double c, jdt_tensor **x)
{
    jdt_graph *g = jdt_graph_new();
    *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 1, (int64_t[]){10}, NULL);
    jdt_graph_add_output(g, jdt_graph_add_scalar(g, jdt_graph_exp(g, *x), c));
    return g;
}

static void run_small(jdt_graph *g, jdt_tensor *x, const jdt_compile_opts *o, double c, bool *hit)
{
    float xv[10];
    for (int i = 0; i < 10; i++)
        xv[i] = (float)i * 0.1f;
    x->data = xv;
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_msg(jdt_program_compile(g, o, &p, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(jdt_program_run(p, &e), JDT_OK);
    const float *y = jdt_program_output(p, 0);
    for (int i = 0; i < 10; i++)
        ck_assert_float_eq_tol(y[i], expf(xv[i]) + (float)c, 1e-5);
    if (hit) *hit = jdt_program_stats(p)->cache_hit;
    jdt_program_free(p);
}

static int count_files(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t l = strlen(de->d_name), s = strlen(suffix);
        if (l >= s && strcmp(de->d_name + l - s, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

START_TEST(test_cache_hit_miss)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_tensor *x;
    jdt_graph *g = small_graph(1.0, &x);
    bool hit = true;
    run_small(g, x, &o, 1.0, &hit);
    ck_assert(!hit);
    run_small(g, x, &o, 1.0, &hit);
    ck_assert(hit);
    jdt_graph_free(g);
    g = small_graph(2.0, &x); /* different constant -> different source -> miss */
    run_small(g, x, &o, 2.0, &hit);
    ck_assert(!hit);
    o.cflags = "-O2 -fno-math-errno"; /* different flags -> miss */
    run_small(g, x, &o, 2.0, &hit);
    ck_assert(!hit);
    jdt_graph_free(g);
    ck_assert_int_eq(count_files(f.cache, ".so"), 3);
    ck_assert_int_eq(count_files(f.cache, ".tmp"), 0);
    fx_free(&f);
}
END_TEST

/* N processes compile the same program into an empty cache at once (the ranks of a job on one
 * host): one runs the compiler (the others wait on the entry's build lock and load its shared
 * object), every one computes the right value, and no temporary or lock is left behind. */
START_TEST(test_cache_concurrent_writers)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    char wrap[512], count[512];
    snprintf(wrap, sizeof wrap, "%s/count-cc.sh", f.cache);
    snprintf(count, sizeof count, "%s/builds.txt", f.cache);
    ck_assert(mkdir(f.cache, 0755) == 0 || errno == EEXIST);
    FILE *wf = fopen(wrap, "w");
    ck_assert_ptr_nonnull(wf);
    fprintf(wf, "#!/bin/sh\ncase \"$*\" in *-shared*) echo build >> '%s';; esac\nexec cc \"$@\"\n",
            count);
    fclose(wf);
    ck_assert_int_eq(chmod(wrap, 0755), 0);
    o.cc = wrap;
    enum { N = 4 };
    pid_t kids[N];
    for (int i = 0; i < N; i++) {
        kids[i] = fork();
        ck_assert_int_ge(kids[i], 0);
        if (kids[i] == 0) {
            jdt_tensor *x;
            jdt_graph *g = small_graph(3.0, &x);
            float xv[10] = {0};
            x->data = xv;
            jdt_program *p = NULL;
            jdt_err e;
            int rc = jdt_program_compile(g, &o, &p, &e) == JDT_OK &&
                             jdt_program_run(p, &e) == JDT_OK &&
                             fabsf(((const float *)jdt_program_output(p, 0))[0] - 4.0f) < 1e-6f
                         ? 0
                         : 1;
            _exit(rc);
        }
    }
    for (int i = 0; i < N; i++) {
        int ws;
        ck_assert_int_eq(waitpid(kids[i], &ws, 0), kids[i]);
        ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    }
    jdt_tensor *x;
    jdt_graph *g = small_graph(3.0, &x);
    bool hit = false;
    run_small(g, x, &o, 3.0, &hit);
    ck_assert(hit);
    ck_assert_int_eq(count_files(f.cache, ".so"), 1);
    ck_assert_int_eq(count_files(f.cache, ".tmp"), 0);
    FILE *cf = fopen(count, "r");
    ck_assert_ptr_nonnull(cf);
    int builds = 0;
    for (int ch; (ch = fgetc(cf)) != EOF;)
        builds += ch == '\n';
    fclose(cf);
    ck_assert_msg(builds == 1, "%d processes ran the compiler for one entry", builds);
    DIR *d = opendir(f.cache);
    ck_assert_ptr_nonnull(d);
    for (struct dirent *de; (de = readdir(d));)
        ck_assert_msg(strncmp(de->d_name, ".jdt-", 5) != 0, "build lock %s left", de->d_name);
    closedir(d);
    jdt_graph_free(g);
    fx_free(&f);
}
END_TEST

static void corrupt(const char *path, bool truncate_half)
{
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    if (truncate_half) {
        ck_assert_int_eq(truncate(path, sb.st_size / 2), 0);
        return;
    }
    FILE *fp = fopen(path, "r+b");
    ck_assert_ptr_nonnull(fp);
    fseek(fp, sb.st_size / 3, SEEK_SET);
    fputs("garbage garbage garbage", fp);
    fclose(fp);
}

START_TEST(test_cache_corrupt_entry_rebuilt)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_tensor *x;
    jdt_graph *g = small_graph(5.0, &x);
    float xv[10] = {0};
    x->data = xv;
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_OK);
    char so[1024];
    snprintf(so, sizeof so, "%s", jdt_program_stats(p)->so_path);
    jdt_program_free(p);
    for (int mode = 0; mode < 2; mode++) {
        corrupt(so, mode == 0);
        bool hit = true;
        run_small(g, x, &o, 5.0, &hit);
        ck_assert_msg(!hit, "corrupt entry (mode %d) was used", mode);
        run_small(g, x, &o, 5.0, &hit);
        ck_assert(hit);
    }
    jdt_graph_free(g);
    fx_free(&f);
}
END_TEST


/* The 8-hex host tag cache.c puts in temporaries (FNV-1a of the host name). */
static void my_host_tag(char *out, size_t n)
{
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    snprintf(out, n, "%08x", (unsigned)(jdt_hash_str(JDT_HASH_INIT, host) & 0xffffffffu));
}

static void touch_file(const char *dir, const char *name, double age_s)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("x", fp);
    fclose(fp);
    struct timeval tv[2];
    gettimeofday(&tv[0], NULL);
    tv[0].tv_sec -= (time_t)age_s;
    tv[1] = tv[0];
    ck_assert_int_eq(utimes(path, tv), 0);
}

static bool file_exists(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* A compile killed with SIGKILL leaves its source, log and output temporaries; the next
 * build removes them (their writer is dead), and pruning keeps what it must. */
START_TEST(test_cache_dead_compiles_swept)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    mkdir(f.cache, 0755);
    char hang[512];
    snprintf(hang, sizeof hang, "%s/hang-cc.sh", f.cache);
    FILE *hf = fopen(hang, "w");
    ck_assert_ptr_nonnull(hf);
    fputs("#!/bin/sh\n[ \"$1\" = --version ] && { echo fake-cc; exit 0; }\nexec sleep 30\n", hf);
    fclose(hf);
    ck_assert_int_eq(chmod(hang, 0755), 0);
    pid_t kid = fork();
    ck_assert_int_ge(kid, 0);
    if (kid == 0) {
        jdt_compile_opts ko = o;
        ko.cc = hang;
        jdt_tensor *x;
        jdt_graph *g = small_graph(8.0, &x);
        jdt_program *p = NULL;
        jdt_err e;
        jdt_program_compile(g, &ko, &p, &e);
        _exit(0);
    }
    for (int i = 0; i < 500 && count_files(f.cache, ".log") == 0; i++) usleep(10000);
    usleep(100000);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    ck_assert_int_ge(count_files(f.cache, ".c"), 1);
    ck_assert_int_ge(count_files(f.cache, ".log"), 1);
    /* other leftovers: a live process's fresh temporary (kept), another host's stale one and
     * an old failure record (removed), a recent failure record (kept) */
    char me[16], name[256];
    my_host_tag(me, sizeof me);
    char live[256];
    snprintf(live, sizeof live, "jdt-00000000000000aa.%s-%d.1.c", me, (int)getppid());
    touch_file(f.cache, live, 10);
    touch_file(f.cache, "jdt-00000000000000bb.0badc0de-12345.1.tmp", 7200);
    touch_file(f.cache, "jdt-00000000000000cc.0badc0de-12345.failed.log", 8 * 86400);
    snprintf(name, sizeof name, "jdt-00000000000000dd.%s-%d.failed.log", me, (int)getppid());
    touch_file(f.cache, name, 3600);
    jdt_tensor *x;
    jdt_graph *g = small_graph(8.0, &x);
    bool hit = true;
    run_small(g, x, &o, 8.0, &hit);
    ck_assert(!hit);
    jdt_graph_free(g);
    ck_assert_msg(file_exists(f.cache, live), "a live process's temporary was removed");
    ck_assert(!file_exists(f.cache, "jdt-00000000000000bb.0badc0de-12345.1.tmp"));
    ck_assert(!file_exists(f.cache, "jdt-00000000000000cc.0badc0de-12345.failed.log"));
    ck_assert(file_exists(f.cache, name));
    /* nothing of the killed compile is left: only the live .c, the recent failure .log */
    ck_assert_int_eq(count_files(f.cache, ".c"), 1);
    ck_assert_int_eq(count_files(f.cache, ".log"), 1);
    ck_assert_int_eq(count_files(f.cache, ".tmp"), 0);
    fx_free(&f);
}
END_TEST

/* The generic API: put/get round trip with a kind, checksum, and the LRU size bound. */
START_TEST(test_cache_generic_lru_bound)
{
    fx f;
    fx_init(&f);
    enum { SZ = 100000 };
    mkdir(f.cache, 0755);
    unsigned char *buf = malloc(SZ);
    jdt_err e;
    char path[1024];
    for (int k = 0; k < 5; k++) {
        memset(buf, 'a' + k, SZ);
        ck_assert_int_eq(jdt_compile_cache_put(f.cache, 0x100 + (uint64_t)k, "cubin", buf, SZ,
                                               -1, &e), JDT_OK);
        /* entries used in order k = 0, 1, ... (mtime), the oldest first */
        jdt_compile_cache_path(f.cache, 0x100 + (uint64_t)k, "cubin", path, sizeof path);
        struct timeval tv[2];
        gettimeofday(&tv[0], NULL);
        tv[0].tv_sec -= 100 - k;
        tv[1] = tv[0];
        ck_assert_int_eq(utimes(path, tv), 0);
    }
    ck_assert_int_eq(count_files(f.cache, ".cubin"), 5);
    /* a use of entry 0 makes it the most recent */
    unsigned char *got = NULL;
    size_t n = 0;
    ck_assert(jdt_compile_cache_get(f.cache, 0x100, "cubin", &got, &n));
    ck_assert_int_eq(n, SZ);
    ck_assert_int_eq(got[0], 'a');
    ck_assert_int_eq(got[SZ - 1], 'a');
    free(got);
    /* a sixth entry with a bound of 3.5 entries: the 3 least recently used go (1, 2, 3) */
    memset(buf, 'z', SZ);
    ck_assert_int_eq(jdt_compile_cache_put(f.cache, 0x200, "cubin", buf, SZ, 350000 + 24 * 6,
                                           &e), JDT_OK);
    ck_assert_int_eq(count_files(f.cache, ".cubin"), 3);
    ck_assert(jdt_compile_cache_get(f.cache, 0x100, "cubin", &got, &n));
    jdt_free(got);
    ck_assert(jdt_compile_cache_get(f.cache, 0x104, "cubin", &got, &n));
    jdt_free(got);
    ck_assert(jdt_compile_cache_get(f.cache, 0x200, "cubin", &got, &n));
    ck_assert_int_eq(got[0], 'z');
    jdt_free(got);
    ck_assert(!jdt_compile_cache_get(f.cache, 0x101, "cubin", &got, &n));
    /* a damaged entry is a miss */
    jdt_compile_cache_path(f.cache, 0x104, "cubin", path, sizeof path);
    corrupt(path, false);
    ck_assert(!jdt_compile_cache_get(f.cache, 0x104, "cubin", &got, &n));
    free(buf);
    fx_free(&f);
}
END_TEST

START_TEST(test_missing_or_failing_compiler)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    o.cc = "/nonexistent/cc";
    jdt_tensor *x;
    jdt_graph *g = small_graph(6.0, &x);
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_ERR_COMPILE);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(e.msg, "/nonexistent/cc"), "%s", e.msg);
    char *log = strstr(e.msg, f.cache);
    ck_assert_msg(log != NULL, "%s", e.msg);
    char path[512];
    ck_assert_int_eq(sscanf(log, "%511[^ ;]", path), 1);
    ck_assert_msg(strstr(path, ".log") != NULL, "%s", path);
    FILE *lf = fopen(path, "r");
    ck_assert_msg(lf != NULL, "log %s missing", path);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, lf);
    buf[n] = 0;
    fclose(lf);
    ck_assert_msg(strstr(buf, "cannot execute"), "%s", buf);
    /* a compiler that hangs is killed after the timeout */
    char hang[512];
    snprintf(hang, sizeof hang, "%s/hang-cc.sh", f.cache);
    FILE *hf = fopen(hang, "w");
    ck_assert_ptr_nonnull(hf);
    fputs("#!/bin/sh\nexec sleep 60\n", hf);
    fclose(hf);
    ck_assert_int_eq(chmod(hang, 0755), 0);
    o.cc = hang;
    o.cc_timeout_s = 1.0;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_ERR_TIMEOUT);
    ck_assert_msg(strstr(e.msg, "killed") && strstr(e.msg, ".log"), "%s", e.msg);
    o.cc_timeout_s = 0;
    /* without the JIT no compiler is needed: the interpreter runs the program */
    o.cc = "/nonexistent/cc";
    o.no_jit = true;
    run_small(g, x, &o, 6.0, NULL);
    o.no_jit = false;
    /* a compiler that runs but rejects the flags */
    o.cc = NULL;
    o.cflags = "-O2 --no-such-flag-for-jdt";
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_ERR_COMPILE);
    ck_assert_msg(strstr(e.msg, ".log"), "%s", e.msg);
    jdt_graph_free(g);
    fx_free(&f);
}
END_TEST

/* An op value outside the op table (only the unchecked constructor can make one) is refused
 * by name before any code is generated, never compiled to zeros. */
START_TEST(test_unknown_op_refused)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_graph *g = jdt_graph_new();
    jdt_shape s = jdt_shape_make(1, (int64_t[]){4});
    jdt_tensor *t = jdt_graph_new_node(g, (jdt_op)(JDT_OP_COUNT + 3), JDT_DTYPE_F32, &s, 0, NULL,
                                       NULL);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(jdt_graph_add_output(g, t), 0);
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(p);
    char want[64];
    snprintf(want, sizeof want, "op %d is not in the op table", JDT_OP_COUNT + 3);
    ck_assert_msg(strstr(e.msg, want), "%s", e.msg);
    jdt_graph_free(g);
    fx_free(&f);
}
END_TEST

/* Wide groups: a sum of 200 slices (200 strided reads) and 40 stored intermediates must split
 * into several kernels and still compute the right thing. */
START_TEST(test_fusion_limits)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 200, 8);
    jdt_tensor *acc = jdt_graph_slice(g, x, 0, 0, 1);
    for (int i = 1; i < 200; i++) {
        acc = jdt_graph_add(g, acc, jdt_graph_slice(g, x, 0, i, i + 1));
        if (i % 5 == 0) out(&f, acc);
    }
    out(&f, acc);
    fx_fill(&f, 6);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-5, 1e-5, true);
    ck_assert_int_gt(jdt_program_stats(p)->n_kernels, 2);
    ck_assert_int_lt(jdt_program_stats(p)->n_kernels, 40);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* Chains of strided reads (slice, transpose, broadcast) compose into one read: no copy kernel
 * for the inner ones, with and without the algebraic passes. */
START_TEST(test_map_chains_absorbed)
{
    for (int simplify = 0; simplify < 2; simplify++) {
        fx f;
        fx_init(&f);
        jdt_graph *g = f.g;
        jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 3, 10, 4);
        jdt_tensor *y = FX_INPUT(&f, "y", JDT_DTYPE_F32, -1, 1, 5, 4, 3, 6);
        /* (3, 10, 4) -slice-> (3, 6, 4) -transpose-> (4, 3, 6) -broadcast-> (5, 4, 3, 6) */
        jdt_tensor *s1 = jdt_graph_slice(g, x, 1, 2, 8);
        jdt_tensor *t1 = jdt_graph_transpose(g, s1, (int[]){2, 0, 1});
        jdt_tensor *b1 = jdt_graph_broadcast(g, t1, 4, (int64_t[]){5, 4, 3, 6});
        out(&f, jdt_graph_mul(g, b1, y));
        /* slice of a transpose, transpose of a transpose, slice of a slice */
        jdt_tensor *t2 = jdt_graph_transpose(g, x, (int[]){1, 2, 0});
        out(&f, jdt_graph_slice(g, t2, 2, 1, 3));
        out(&f,
            jdt_graph_transpose(g, jdt_graph_transpose(g, x, (int[]){2, 0, 1}), (int[]){0, 2, 1}));
        out(&f, jdt_graph_slice(g, jdt_graph_slice(g, x, 1, 1, 9), 1, 3, 5));
        fx_fill(&f, 11);
        jdt_compile_opts o;
        fx_opts(&f, &o);
        o.no_simplify = simplify == 0;
        jdt_program *p = fx_check_steps(&f, &o, 1, 1e-6, 1e-6, true);
        /* one kernel per output: every inner strided read is composed away */
        ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 4);
        jdt_program_free(p);
        fx_free(&f);
    }
}
END_TEST

/* Every allocation of the compiler can fail: fail the n-th one for n = 1, 2, ... until the
 * compile succeeds; each failure must be a clean error (ASan's leak check runs at exit). */
/* Trace hook: one call per executed step, in schedule order, with ordered timestamps and the
 * step's name; matmul builtins and fused kernels both named. */
typedef struct {
    int n, n_matmul, n_fused, n_bad;
    double last_end;
} trace_log;

static void trace_cb(void *ctx, const char *name, double t0, double t1)
{
    trace_log *t = ctx;
    t->n++;
    if (strcmp(name, "matmul") == 0) t->n_matmul++;
    if (strncmp(name, "fused:", 6) == 0 && name[6]) t->n_fused++;
    if (t1 < t0 || t0 < t->last_end) t->n_bad++;
    t->last_end = t1;
}

START_TEST(test_trace_hook)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 8, 16);
    jdt_tensor *w = FX_INPUT(&f, "w", JDT_DTYPE_F32, -1, 1, 16, 4);
    jdt_tensor *h = jdt_graph_tanh(g, jdt_graph_matmul(g, x, w, false, false));
    out(&f, jdt_graph_reduce_sum(g, h, 2u, false));
    fx_fill(&f, 3);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    trace_log t = {0};
    o.trace = trace_cb;
    o.trace_ctx = &t;
    jdt_program *p = fx_check_steps(&f, &o, 2, 1e-5, 1e-5, true);
    int steps = jdt_program_stats(p)->n_steps;
    ck_assert_int_gt(steps, 1);
    ck_assert_int_eq(t.n % steps, 0);
    ck_assert_int_ge(t.n, steps);
    ck_assert_int_eq(t.n_matmul * steps, t.n);
    ck_assert_int_eq(t.n_fused, t.n - t.n_matmul);
    ck_assert_int_eq(t.n_bad, 0);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* x @ w + bias folds into the matmul (bias-initialised GEMM; the add becomes a view): one
 * builtin step and no kernel, same numbers as the interpreter, also for a batched x and a bias
 * leaf created after the matmul. A matmul read elsewhere keeps its separate add. */
START_TEST(test_bias_folded_into_matmul)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 2, 5, 7);
    jdt_tensor *w = FX_INPUT(&f, "w", JDT_DTYPE_F32, -1, 1, 7, 6);
    jdt_tensor *y = jdt_graph_matmul(g, x, w, false, false);
    jdt_tensor *bias = FX_INPUT(&f, "bias", JDT_DTYPE_F32, -1, 1, 6);
    out(&f, jdt_graph_add_bcast(g, y, bias));
    fx_fill(&f, 4);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_program *p = fx_check_steps(&f, &o, 1, 1e-5, 1e-6, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 0);
    ck_assert_int_eq(jdt_program_stats(p)->n_builtin, 1);
    jdt_program_free(p);
    /* the product is also an output: the add stays a kernel */
    out(&f, y);
    p = fx_check_steps(&f, &o, 1, 1e-5, 1e-6, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 1);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

/* Head-major transposes read only by attention are not materialised: the attention builtins
 * read the (B, T, H, D) buffers strided. T = 70 crosses the 64-query block; numbers match the
 * interpreter, and no transpose kernel is left. With no_fuse they are copied as before. */
START_TEST(test_attention_reads_transposed_inputs)
{
    fx f;
    fx_init(&f);
    jdt_graph *g = f.g;
    const int perm[4] = {0, 2, 1, 3};
    jdt_tensor *in[4];
    const char *names[4] = {"q", "k", "v", "do"};
    for (int i = 0; i < 4; i++)
        in[i] = jdt_graph_transpose(
            g, FX_INPUT(&f, names[i], JDT_DTYPE_F32, -1, 1, 2, 70, 3, 8), perm); /* (B, H, T, D) */
    jdt_tensor *o = jdt_graph_attention(g, in[0], in[1], in[2], 0.4);
    out(&f, o);
    out(&f, jdt_graph_attention_bwd(g, in[0], in[1], in[2], o, in[3], 0.4));
    fx_fill(&f, 6);
    jdt_compile_opts opts;
    fx_opts(&f, &opts);
    jdt_program *p = fx_check_steps(&f, &opts, 1, 2e-4, 2e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 0);
    jdt_program_free(p);
    opts.no_fuse = true;
    p = fx_check_steps(&f, &opts, 1, 2e-4, 2e-5, true);
    ck_assert_int_eq(jdt_program_stats(p)->n_kernels, 4);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

START_TEST(test_alloc_failures_clean)
{
    fx f;
    fx_init(&f);
    jdt_compile_opts o;
    fx_opts(&f, &o);
    jdt_graph *g = f.g;
    jdt_tensor *x = FX_INPUT(&f, "x", JDT_DTYPE_F32, -1, 1, 6, 5);
    jdt_tensor *w = FX_PARAM(&f, "w", -1, 1, 5, 4);
    jdt_tensor *h =
        jdt_graph_softmax(g, jdt_graph_matmul(g, jdt_graph_tanh(g, x), w, false, false));
    out(&f, jdt_graph_reduce_sum(g, jdt_graph_exp(g, h), 2u, false));
    jdt_graph_add_update(g, w, jdt_graph_mul_scalar(g, w, 0.5));
    fx_fill(&f, 5);
    fx_bind(&f, true);
    jdt_program *p = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_program_compile(g, &o, &p, &e), JDT_OK); /* fills the cache */
    jdt_program_free(p);
    int n;
    for (n = 1; n < 2000; n++) {
        p = NULL;
        jdt_alloc_fail_after(n);
        jdt_status st = jdt_program_compile(g, &o, &p, &e);
        jdt_alloc_fail_after(0);
        if (st == JDT_OK) break;
        ck_assert_msg(st == JDT_ERR_NOMEM || st == JDT_ERR_IO, "n=%d: %s", n, e.msg);
        ck_assert_ptr_null(p);
    }
    ck_assert_ptr_nonnull(p);
    ck_assert_int_gt(n, 5);
    ck_assert_int_eq(jdt_program_run(p, &e), JDT_OK);
    jdt_program_free(p);
    fx_free(&f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("compile");
    TCase *tc = tcase_create("compile");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_passes_simplify_cse_dce);
    tcase_add_test(tc, test_fusion_counts);
    tcase_add_test(tc, test_fusion_limits);
    tcase_add_test(tc, test_map_chains_absorbed);
    tcase_add_test(tc, test_memory_plan_invariants);
    tcase_add_test(tc, test_xent_leading_dims);
    tcase_add_test(tc, test_update_not_donated_when_read_later);
    tcase_add_test(tc, test_cache_hit_miss);
    tcase_add_test(tc, test_cache_concurrent_writers);
    tcase_add_test(tc, test_cache_corrupt_entry_rebuilt);
    tcase_add_test(tc, test_cache_dead_compiles_swept);
    tcase_add_test(tc, test_cache_generic_lru_bound);
    tcase_add_test(tc, test_missing_or_failing_compiler);
    tcase_add_test(tc, test_unknown_op_refused);
    tcase_add_test(tc, test_alloc_failures_clean);
    tcase_add_test(tc, test_trace_hook);
    tcase_add_test(tc, test_bias_folded_into_matmul);
    tcase_add_test(tc, test_attention_reads_transposed_inputs);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
