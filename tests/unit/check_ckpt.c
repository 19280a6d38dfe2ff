/*
 * check_ckpt.c — unit tests for engine/io checkpoints: bitwise round trip, slice writes and
 * reads, atomic rename and resume, keep-K pruning, clear errors for corrupt files, missing
 * tensors and wrong shapes, and kill -9 of a child during a save.
 */
#include "tests/unit/testutil.h"
#include "core/core.h"
#include "io/ckpt.h"
#include "io/data.h"

#include <check.h>
#include <hdf5.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void setup(void)
{
    tu_tmpdir_make("check-ckpt");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static void teardown(void)
{
    tu_tmpdir_remove();
}

static char *path_in(const char *name)
{
    return tu_path(name);
}

static jdt_ckpt_tensor whole(const char *name, jdt_dtype dt, int ndim, const int64_t *shape,
                             const void *data)
{
    jdt_ckpt_tensor t = {.name = name, .dtype = dt, .ndim = ndim, .data = data};
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    return t;
}

/* A small "model state" whose contents depend on step. */
enum { N_T = 7 };
typedef struct {
    float wte[10 * 4]; /* (V, C) */
    float wq[4 * 4];   /* (C, C) */
    float m_wte[10 * 4];
    float v_wte[10 * 4];
    uint16_t emb_bf16[3 * 5];
    int32_t counter;
    double w64[2 * 3 * 2];
    jdt_ckpt_tensor t[N_T];
} state;

static void make_state(state *s, int64_t step)
{
    jdt_rng_normal(jdt_rng_key((uint64_t)step, "wte"), 0, 40, s->wte);
    jdt_rng_normal(jdt_rng_key((uint64_t)step, "wq"), 0, 16, s->wq);
    jdt_rng_normal(jdt_rng_key((uint64_t)step, "m"), 0, 40, s->m_wte);
    jdt_rng_uniform(jdt_rng_key((uint64_t)step, "v"), 0, 40, s->v_wte);
    s->wte[3] = -0.0f;
    for (int i = 0; i < 15; i++)
        s->emb_bf16[i] = (uint16_t)(0x3f80 + i * 37 + step);
    s->counter = (int32_t)(step * 3 + 1);
    for (int i = 0; i < 12; i++)
        s->w64[i] = 1.0 / (i + 1) + (double)step;
    static const int64_t s_wte[] = {10, 4}, s_wq[] = {4, 4}, s_bf[] = {3, 5}, s_64[] = {2, 3, 2};
    s->t[0] = whole("params/wte", JDT_DTYPE_F32, 2, s_wte, s->wte);
    s->t[1] = whole("/params/blocks.0.attn.wq", JDT_DTYPE_F32, 2, s_wq, s->wq);
    s->t[2] = whole("opt/m/wte", JDT_DTYPE_F32, 2, s_wte, s->m_wte);
    s->t[3] = whole("opt/v/wte", JDT_DTYPE_F32, 2, s_wte, s->v_wte);
    s->t[4] = whole("params/emb-bf16", JDT_DTYPE_BF16, 2, s_bf, s->emb_bf16);
    s->t[5] = whole("opt/count", JDT_DTYPE_I32, 0, NULL, &s->counter);
    s->t[6] = whole("params/w64", JDT_DTYPE_F64, 3, s_64, s->w64);
}

static jdt_status save_state(const char *dir, int64_t step, int keep, jdt_err *e)
{
    state s;
    make_state(&s, step);
    jdt_ckpt_meta m = {.step = step,
                       .rng_state = 0xFEDCBA9876543210ULL + (uint64_t)step,
                       .data_position = step * 10,
                       .config_text = "model:\n  d_model: 4\n"};
    jdt_ckpt_save_opts o = {.keep_last = keep};
    return jdt_ckpt_save(dir, &m, s.t, N_T, &o, NULL, e);
}

/* Loads every tensor of the checkpoint at path and compares bitwise with make_state(step). */
static void check_state(const char *path, int64_t step)
{
    jdt_err e;
    jdt_ckpt *c = NULL;
    ck_assert_msg(jdt_ckpt_open(path, &c, &e) == JDT_OK, "%s", e.msg);
    jdt_ckpt_meta m;
    jdt_ckpt_get_meta(c, &m);
    ck_assert_int_eq(m.step, step);
    ck_assert(m.rng_state == 0xFEDCBA9876543210ULL + (uint64_t)step);
    ck_assert_int_eq(m.data_position, step * 10);
    ck_assert_str_eq(m.config_text, "model:\n  d_model: 4\n");
    state s;
    make_state(&s, step);
    for (int i = 0; i < N_T; i++) {
        char buf[1024];
        size_t n = jdt_dtype_size(s.t[i].dtype);
        for (int d = 0; d < s.t[i].ndim; d++)
            n *= (size_t)s.t[i].shape[d];
        memset(buf, 0xAB, sizeof buf);
        ck_assert_msg(jdt_ckpt_read(c, &s.t[i], buf, &e) == JDT_OK, "%s", e.msg);
        ck_assert_mem_eq(buf, s.t[i].data, n);
    }
    jdt_ckpt_close(c);
}

START_TEST(test_roundtrip_bitwise)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    ck_assert_msg(save_state(ck, 123, 0, &e) == JDT_OK, "%s", e.msg);
    check_state(path_in("ck/step_000123"), 123);
    check_state(path_in("ck/step_000123/state.h5"), 123);
    jdt_ckpt *c = NULL;
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000123"), &c, &e), JDT_OK);
    char **names;
    size_t n;
    ck_assert_int_eq(jdt_ckpt_list(c, &names, &n, &e), JDT_OK);
    ck_assert_uint_eq(n, N_T);
    ck_assert_str_eq(names[0], "opt/count");
    ck_assert_str_eq(names[3], "params/blocks.0.attn.wq");
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    jdt_dtype dt;
    int ndim;
    int64_t shape[JDT_CKPT_MAX_DIMS];
    ck_assert_int_eq(jdt_ckpt_tensor_info(c, "params/emb-bf16", &dt, &ndim, shape, &e), JDT_OK);
    ck_assert_int_eq(dt, JDT_DTYPE_BF16);
    ck_assert_int_eq(ndim, 2);
    ck_assert_int_eq(shape[1], 5);
    ck_assert_int_eq(jdt_ckpt_tensor_info(c, "opt/count", &dt, &ndim, shape, &e), JDT_OK);
    ck_assert_int_eq(ndim, 0);
    jdt_ckpt_close(c);
    /* an independent reader sees global names, shapes and the attributes */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "h5dump -H '%s' > '%s' && grep -q 'DATASET \"wte\"' '%s' && "
             "grep -q 'SIMPLE { ( 10, 4 )' '%s' && grep -q 'H5T_IEEE_F64LE' '%s' && "
             "h5dump -a format '%s' | grep -q jdt-ckpt",
             path_in("ck/step_000123/state.h5"), path_in("dump.txt"), path_in("dump.txt"),
             path_in("dump.txt"), path_in("dump.txt"), path_in("ck/step_000123/state.h5"));
    if (system("command -v h5dump >/dev/null") == 0) ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_slices)
{
    jdt_err e;
    enum { R = 6, C = 8 };
    float full[R * C];
    for (int i = 0; i < R * C; i++)
        full[i] = (float)i * 1.5f;
    /* four uneven tiles: rows [0,2)+[2,6) x cols [0,5)+[5,8), each row-major */
    int rs[3] = {0, 2, 6}, cs[3] = {0, 5, 8};
    float tiles[4][R * C];
    jdt_ckpt_tensor ts[4];
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++) {
            int q = a * 2 + b, h = rs[a + 1] - rs[a], w = cs[b + 1] - cs[b];
            for (int i = 0; i < h; i++)
                for (int j = 0; j < w; j++)
                    tiles[q][i * w + j] = full[(rs[a] + i) * C + cs[b] + j];
            ts[q] = (jdt_ckpt_tensor){.name = "params/w",
                                      .dtype = JDT_DTYPE_F32,
                                      .ndim = 2,
                                      .shape = {R, C},
                                      .offset = {rs[a], cs[b]},
                                      .extent = {h, w},
                                      .data = tiles[q]};
        }
    jdt_ckpt_meta m = {.step = 7};
    ck_assert_msg(jdt_ckpt_save(path_in("ck"), &m, ts, 4, NULL, NULL, &e) == JDT_OK, "%s", e.msg);
    jdt_ckpt *c = NULL;
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000007"), &c, &e), JDT_OK);
    float back[R * C];
    jdt_ckpt_tensor want = {.name = "params/w", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {R, C}};
    ck_assert_int_eq(jdt_ckpt_read(c, &want, back, &e), JDT_OK);
    ck_assert_mem_eq(back, full, sizeof full);
    /* another "mesh": a (4, 3) slice at (1, 3) */
    want.offset[0] = 1;
    want.offset[1] = 3;
    want.extent[0] = 4;
    want.extent[1] = 3;
    float part[12];
    ck_assert_int_eq(jdt_ckpt_read(c, &want, part, &e), JDT_OK);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            ck_assert_float_eq(part[i * 3 + j], full[(1 + i) * C + 3 + j]);
    want.offset[1] = 6; /* 6 + 3 > 8 */
    ck_assert_int_eq(jdt_ckpt_read(c, &want, part, &e), JDT_ERR_SHAPE);
    ck_assert_ptr_nonnull(strstr(e.msg, "params/w"));
    jdt_ckpt_close(c);
    /* overlapping or incomplete slices are refused before anything is written */
    ts[1].offset[1] = 4;
    m.step = 8;
    ck_assert_int_eq(jdt_ckpt_save(path_in("ck"), &m, ts, 4, NULL, NULL, &e), JDT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "overlap"));
    ck_assert_int_eq(jdt_ckpt_save(path_in("ck"), &m, ts, 3, NULL, NULL, &e), JDT_ERR_INVALID);
    ts[1].offset[1] = 5;
    ck_assert_int_eq(jdt_ckpt_save(path_in("ck"), &m, ts, 3, NULL, NULL, &e), JDT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "cover"));
    ck_assert_int_ne(access(path_in("ck/step_000008"), F_OK), 0);
    ck_assert_int_ne(access(path_in("ck/step_000008.tmp"), F_OK), 0);
}
END_TEST

START_TEST(test_atomic_resume)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    char *p = NULL;
    /* nothing yet: auto starts fresh, a named path must exist */
    ck_assert_int_eq(jdt_ckpt_resolve("auto", ck, &p, &e), JDT_OK);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, NULL, &e), JDT_ERR_NOT_FOUND);
    ck_assert_int_eq(jdt_ckpt_resolve(path_in("ck/step_000001"), ck, &p, &e), JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "step_000001"));
    for (int64_t s = 1; s <= 3; s++)
        ck_assert_int_eq(save_state(ck, s, 0, &e), JDT_OK);
    ck_assert_int_ne(access(path_in("ck/step_000003.tmp"), F_OK), 0);
    /* a leftover temp dir of a newer step (a crashed save) is ignored ... */
    ck_assert_int_eq(mkdir(path_in("ck/step_000009.tmp"), 0777), 0);
    FILE *f = fopen(path_in("ck/step_000009.tmp/state.h5"), "wb");
    fputs("half a checkpoint", f);
    fclose(f);
    int64_t step = -1;
    ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, &step, &e), JDT_OK);
    ck_assert_int_eq(step, 3);
    ck_assert_str_eq(p, path_in("ck/step_000003"));
    free(p);
    ck_assert_int_eq(jdt_ckpt_resolve("auto", ck, &p, &e), JDT_OK);
    ck_assert_str_eq(p, path_in("ck/step_000003"));
    free(p);
    ck_assert_int_eq(jdt_ckpt_resolve("none", ck, &p, &e), JDT_OK);
    ck_assert_ptr_null(p);
    /* ... and removed by the next save; step numbers compare numerically past 6 digits */
    ck_assert_int_eq(save_state(ck, 1234567, 0, &e), JDT_OK);
    ck_assert_int_ne(access(path_in("ck/step_000009.tmp"), F_OK), 0);
    ck_assert_int_eq(save_state(ck, 999999, 0, &e), JDT_OK);
    ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, &step, &e), JDT_OK);
    ck_assert_int_eq(step, 1234567);
    free(p);
    check_state(path_in("ck/step_1234567"), 1234567);
    /* re-saving a step replaces it atomically */
    state s;
    make_state(&s, 2);
    s.wte[0] = 42.0f;
    jdt_ckpt_meta m = {.step = 2, .config_text = "new"};
    char *saved = NULL;
    ck_assert_int_eq(jdt_ckpt_save(ck, &m, s.t, N_T, NULL, &saved, &e), JDT_OK);
    ck_assert_str_eq(saved, path_in("ck/step_000002"));
    free(saved);
    ck_assert_int_ne(access(path_in("ck/step_000002.tmp"), F_OK), 0);
    jdt_ckpt *c = NULL;
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000002"), &c, &e), JDT_OK);
    float wte[40];
    ck_assert_int_eq(jdt_ckpt_read(c, &s.t[0], wte, &e), JDT_OK);
    ck_assert_float_eq(wte[0], 42.0f);
    jdt_ckpt_close(c);
}
END_TEST

START_TEST(test_keep_k)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    for (int64_t s = 10; s <= 50; s += 10)
        ck_assert_int_eq(save_state(ck, s, 2, &e), JDT_OK);
    ck_assert_int_ne(access(path_in("ck/step_000010"), F_OK), 0);
    ck_assert_int_ne(access(path_in("ck/step_000030"), F_OK), 0);
    ck_assert_int_eq(access(path_in("ck/step_000040"), F_OK), 0);
    ck_assert_int_eq(access(path_in("ck/step_000050"), F_OK), 0);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "test $(ls '%s' | wc -l) -eq 2", ck);
    ck_assert_int_eq(system(cmd), 0);
    check_state(path_in("ck/step_000040"), 40);
    /* keep 0 keeps everything */
    ck_assert_int_eq(save_state(ck, 60, 0, &e), JDT_OK);
    ck_assert_int_eq(access(path_in("ck/step_000040"), F_OK), 0);
    ck_assert_int_eq(jdt_ckpt_prune(ck, 1, &e), JDT_OK);
    ck_assert_int_ne(access(path_in("ck/step_000050"), F_OK), 0);
    ck_assert_int_eq(access(path_in("ck/step_000060"), F_OK), 0);
    /* a run restarted from an older step never prunes the checkpoint it just wrote, even when
     * a newer one (of the abandoned run) exists */
    ck_assert_int_eq(save_state(ck, 55, 1, &e), JDT_OK);
    ck_assert_int_eq(access(path_in("ck/step_000055"), F_OK), 0);
    ck_assert_int_ne(access(path_in("ck/step_000060"), F_OK), 0);
    check_state(path_in("ck/step_000055"), 55);
}
END_TEST

/* Opens path expecting failure code `code` with a message containing a and b. */
static void expect_fail(jdt_status code, jdt_status got, const jdt_err *e, const char *a,
                        const char *b)
{
    ck_assert_msg(got == code, "got %s want %s: %s", jdt_status_name(got), jdt_status_name(code),
                  e->msg);
    ck_assert_msg(strstr(e->msg, a), "'%s' lacks '%s'", e->msg, a);
    if (b) ck_assert_msg(strstr(e->msg, b), "'%s' lacks '%s'", e->msg, b);
}

START_TEST(test_errors)
{
    jdt_err e;
    jdt_ckpt *c = NULL;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    ck_assert_int_eq(save_state(ck, 5, 0, &e), JDT_OK);
    char file[512];
    snprintf(file, sizeof file, "%s", path_in("ck/step_000005/state.h5"));
    /* missing */
    expect_fail(JDT_ERR_NOT_FOUND, jdt_ckpt_open(path_in("ck/step_000006"), &c, &e), &e,
                "step_000006", NULL);
    ck_assert_ptr_null(c);
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000006"), &c, NULL), JDT_ERR_NOT_FOUND);
    /* missing tensor, wrong shape, wrong dtype */
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000005"), &c, &e), JDT_OK);
    float buf[64];
    jdt_ckpt_tensor w = {.name = "params/wpe", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {10, 4}};
    expect_fail(JDT_ERR_NOT_FOUND, jdt_ckpt_read(c, &w, buf, &e), &e, file, "params/wpe");
    w.name = "nothere/at/all";
    expect_fail(JDT_ERR_NOT_FOUND, jdt_ckpt_read(c, &w, buf, &e), &e, file, "nothere/at/all");
    w.name = "params/wte";
    w.shape[0] = 4;
    w.shape[1] = 10;
    expect_fail(JDT_ERR_SHAPE, jdt_ckpt_read(c, &w, buf, &e), &e, file, "(10, 4)");
    ck_assert_ptr_nonnull(strstr(e.msg, "(4, 10)"));
    ck_assert_ptr_nonnull(strstr(e.msg, "params/wte"));
    w.shape[0] = 10;
    w.shape[1] = 4;
    w.dtype = JDT_DTYPE_BF16;
    expect_fail(JDT_ERR_FORMAT, jdt_ckpt_read(c, &w, buf, &e), &e, file, "params/wte");
    jdt_ckpt_close(c);
    /* garbage, truncated, and a non-checkpoint HDF5 file */
    char cmd[1500];
    ck_assert_int_eq(mkdir(path_in("bad"), 0777), 0);
    FILE *f = fopen(path_in("bad/state.h5"), "wb");
    for (int i = 0; i < 3000; i++)
        fputc(i * 13 & 255, f);
    fclose(f);
    expect_fail(JDT_ERR_FORMAT, jdt_ckpt_open(path_in("bad"), &c, &e), &e, "bad/state.h5",
                "not an HDF5");
    snprintf(cmd, sizeof cmd,
             "mkdir '%s' && cp '%s' '%s/state.h5' && truncate -s 3000 '%s/state.h5'",
             path_in("cut"), file, path_in("cut"), path_in("cut"));
    ck_assert_int_eq(system(cmd), 0);
    expect_fail(JDT_ERR_FORMAT, jdt_ckpt_open(path_in("cut"), &c, &e), &e, "cut/state.h5",
                "truncated file: eof = 3000"); /* HDF5's words, not a stale errno */
    uint32_t toks[20] = {0};
    ck_assert_int_eq(jdt_data_write_tokens(path_in("tok.h5"), toks, 20, 256, "byte", &e), JDT_OK);
    expect_fail(JDT_ERR_FORMAT, jdt_ckpt_open(path_in("tok.h5"), &c, &e), &e, "tok.h5",
                "jdt-tokens");
    /* corrupt tensor bytes: flip bytes inside the chunk of params/wte; the checksum catches it */
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", path_in("ck/step_000005"), path_in("rot"));
    ck_assert_int_eq(system(cmd), 0);
    hid_t h = H5Fopen(path_in("rot/state.h5"), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(h, "params/wte", H5P_DEFAULT);
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0, off[2];
    unsigned mask;
    hid_t fsp = H5Dget_space(ds);
    ck_assert(H5Dget_chunk_info(ds, fsp, 0, off, &mask, &addr, &size) >= 0);
    H5Sclose(fsp);
    H5Dclose(ds);
    H5Fclose(h);
    ck_assert(addr != HADDR_UNDEF && size >= 160);
    f = fopen(path_in("rot/state.h5"), "r+b");
    fseek(f, (long)addr + 20, SEEK_SET);
    fputc(0x5A, f);
    fputc(0xA5, f);
    fclose(f);
    ck_assert_int_eq(jdt_ckpt_open(path_in("rot"), &c, &e), JDT_OK);
    w.dtype = JDT_DTYPE_F32;
    jdt_status st = jdt_ckpt_read(c, &w, buf, &e);
    expect_fail(JDT_ERR_FORMAT, st, &e, "rot/state.h5", "params/wte");
    jdt_ckpt_close(c);
    /* bad names and shapes on save: nothing is created */
    float x[4] = {0};
    const char *bad_names[] = {"", "/", "a//b", "../x", "a/./b", "a b", "x/"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(bad_names); i++) {
        jdt_ckpt_tensor t = {
            .name = bad_names[i], .dtype = JDT_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x};
        jdt_ckpt_meta m = {.step = 77};
        ck_assert_int_eq(jdt_ckpt_save(ck, &m, &t, 1, NULL, NULL, &e), JDT_ERR_INVALID);
    }
    jdt_ckpt_tensor t0 = {.name = "z", .dtype = JDT_DTYPE_F32, .ndim = 1, .shape = {0}, .data = x};
    jdt_ckpt_meta m = {.step = 77};
    ck_assert_int_eq(jdt_ckpt_save(ck, &m, &t0, 1, NULL, NULL, &e), JDT_ERR_INVALID);
    ck_assert_int_ne(access(path_in("ck/step_000077"), F_OK), 0);
}
END_TEST

/* A tensor stored as 32-bit integers under a dtype attribute of "f32" (as wide, another
 * type): an error naming it, not integers converted to floats */
START_TEST(test_stored_type_mismatch)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ty"));
    ck_assert_int_eq(save_state(ck, 5, 0, &e), JDT_OK);
    hid_t h = H5Fopen(path_in("ty/step_000005/state.h5"), H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(h >= 0);
    ck_assert(H5Ldelete(h, "params/wte", H5P_DEFAULT) >= 0);
    hsize_t dims[2] = {10, 4};
    hid_t sp = H5Screate_simple(2, dims, NULL);
    hid_t ds =
        H5Dcreate2(h, "params/wte", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(ds >= 0);
    int32_t ints[40];
    for (int i = 0; i < 40; i++)
        ints[i] = i;
    ck_assert(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, ints) >= 0);
    hid_t st = H5Tcopy(H5T_C_S1), asp = H5Screate(H5S_SCALAR);
    H5Tset_size(st, 4);
    hid_t at = H5Acreate2(ds, "dtype", st, asp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(at >= 0 && H5Awrite(at, st, "f32") >= 0);
    H5Aclose(at), H5Sclose(asp), H5Tclose(st), H5Dclose(ds), H5Sclose(sp), H5Fclose(h);
    jdt_ckpt *c = NULL;
    ck_assert_int_eq(jdt_ckpt_open(path_in("ty/step_000005"), &c, &e), JDT_OK);
    float buf[40];
    jdt_ckpt_tensor w = {.name = "params/wte", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {10, 4}};
    expect_fail(JDT_ERR_FORMAT, jdt_ckpt_read(c, &w, buf, &e), &e, "params/wte",
                "does not match its element type");
    jdt_ckpt_close(c);
}
END_TEST

/* ---- kill -9 during a save ------------------------------------------------------------------ */

typedef struct {
    int fd;
    size_t stop_after;
} hang_ctx;

static void hang_after(void *ctx, size_t done, size_t total)
{
    hang_ctx *h = ctx;
    (void)total;
    if (done != h->stop_after) return;
    char b = 'x';
    if (write(h->fd, &b, 1) != 1) _exit(3);
    for (;;)
        pause();
}

enum { BIG_N = 8, BIG_ELEMS = 1 << 16 };

/* Saves a checkpoint of BIG_N tensors of BIG_ELEMS floats whose values encode the step. */
static jdt_status save_big(const char *dir, int64_t step, const jdt_ckpt_save_opts *o, float *buf,
                           jdt_err *e)
{
    char names[BIG_N][32];
    jdt_ckpt_tensor t[BIG_N];
    for (int i = 0; i < BIG_N; i++) {
        snprintf(names[i], sizeof names[i], "params/layer.%d", i);
        for (int j = 0; j < BIG_ELEMS; j++)
            buf[i * BIG_ELEMS + j] = (float)(step * 1000 + i) + (float)j * 1e-3f;
        t[i] = (jdt_ckpt_tensor){.name = names[i],
                                 .dtype = JDT_DTYPE_F32,
                                 .ndim = 2,
                                 .shape = {256, BIG_ELEMS / 256},
                                 .data = buf + i * BIG_ELEMS};
    }
    jdt_ckpt_meta m = {.step = step, .data_position = step};
    return jdt_ckpt_save(dir, &m, t, BIG_N, o, NULL, e);
}

static void verify_big(const char *path)
{
    jdt_err e;
    jdt_ckpt *c = NULL;
    ck_assert_msg(jdt_ckpt_open(path, &c, &e) == JDT_OK, "%s", e.msg);
    jdt_ckpt_meta m;
    jdt_ckpt_get_meta(c, &m);
    float *buf = malloc(BIG_ELEMS * sizeof *buf);
    for (int i = 0; i < BIG_N; i++) {
        char name[32];
        snprintf(name, sizeof name, "params/layer.%d", i);
        jdt_ckpt_tensor w = {
            .name = name, .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {256, BIG_ELEMS / 256}};
        ck_assert_msg(jdt_ckpt_read(c, &w, buf, &e) == JDT_OK, "%s", e.msg);
        for (int j = 0; j < BIG_ELEMS; j += 511)
            ck_assert_float_eq(buf[j], (float)(m.step * 1000 + i) + (float)j * 1e-3f);
    }
    free(buf);
    jdt_ckpt_close(c);
}

START_TEST(test_kill_during_save)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    float *buf = malloc((size_t)BIG_N * BIG_ELEMS * sizeof *buf);
    ck_assert_int_eq(save_big(ck, 1, NULL, buf, &e), JDT_OK);
    /* 1. deterministic: the child stops after writing 3 of 8 tensors and is killed there */
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        hang_ctx h = {fds[1], 3};
        jdt_ckpt_save_opts o = {.keep_last = 1, .on_progress = hang_after, .progress_ctx = &h};
        save_big(ck, 2, &o, buf, &e);
        _exit(4); /* not reached */
    }
    close(fds[1]);
    char b;
    ck_assert_int_eq(read(fds[0], &b, 1), 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ck_assert_int_eq(access(path_in("ck/step_000002.tmp/state.h5"), F_OK), 0); /* half written */
    ck_assert_int_ne(access(path_in("ck/step_000002"), F_OK), 0);
    char *p = NULL;
    int64_t step;
    ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, &step, &e), JDT_OK);
    ck_assert_int_eq(step, 1);
    verify_big(p);
    free(p);
    /* 2. undirected: a child saving in a loop is killed at some moment; whatever resume auto
     * finds is complete and correct. */
    for (int round = 0; round < 3; round++) {
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            jdt_ckpt_save_opts o = {.keep_last = 2};
            for (int64_t s = 100 * (round + 1);; s++)
                if (save_big(ck, s, &o, buf, &e) != JDT_OK) _exit(5);
        }
        usleep(30000 + 45000 * (useconds_t)round);
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFSIGNALED(status));
        ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, &step, &e), JDT_OK);
        verify_big(p);
        free(p);
    }
    /* the next save cleans up whatever was left behind */
    ck_assert_int_eq(save_big(ck, 100000, NULL, buf, &e), JDT_OK);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "! ls '%s' | grep -q tmp", ck);
    ck_assert_int_eq(system(cmd), 0);
    free(buf);
}
END_TEST

START_TEST(test_save_while_prefetching)
{
    /* the training loop's shape: a prefetch thread reads HDF5 data while the main thread
     * writes checkpoints; batches stay identical to a loader without prefetch */
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    enum { N = 20001 };
    uint32_t *t = malloc(N * sizeof *t);
    for (int i = 0; i < N; i++)
        t[i] = (uint32_t)(i * 31 % 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("d.h5"), t, N, 256, "byte", &e), JDT_OK);
    jdt_data_opts o = {.path = path_in("d.h5"),
                       .seq_len = 32,
                       .global_batch = 8,
                       .shuffle = true,
                       .seed = 4,
                       .prefetch = 4};
    jdt_data *pf = NULL, *ref = NULL;
    ck_assert_int_eq(jdt_data_open(&o, &pf, &e), JDT_OK);
    o.prefetch = 0;
    ck_assert_int_eq(jdt_data_open(&o, &ref, &e), JDT_OK);
    for (int64_t k = 0; k < 40; k++) {
        jdt_data_batch a, b;
        ck_assert_int_eq(jdt_data_get(pf, k, &a, &e), JDT_OK);
        ck_assert_int_eq(jdt_data_get(ref, k, &b, &e), JDT_OK);
        ck_assert_mem_eq(a.x, b.x, 8 * 32 * 4);
        ck_assert_mem_eq(a.y, b.y, 8 * 32 * 4);
        if (k % 10 == 9) ck_assert_msg(save_state(ck, k, 2, &e) == JDT_OK, "%s", e.msg);
    }
    jdt_data_close(pf);
    jdt_data_close(ref);
    check_state(path_in("ck/step_000039"), 39);
    free(t);
}
END_TEST

/* ---- multi-process save ------------------------------------------------------------------- */

static jdt_status shm_barrier(void *ctx, jdt_err *e)
{
    (void)e;
    pthread_barrier_wait(ctx);
    return JDT_OK;
}

enum { W_RANKS = 3 };

/* The global state of the multi-rank test: w (6, 8) row-sharded over 3 ranks, b (8) saved by
 * rank 0, count (scalar) by rank 1, emb (4, 6) column-sharded over ranks 0 and 2. */
static void global_state(int64_t step, float *w, float *b, int32_t *count, float *emb)
{
    for (int i = 0; i < 48; i++)
        w[i] = (float)(step * 100 + i);
    for (int i = 0; i < 8; i++)
        b[i] = -(float)i - (float)step;
    *count = (int32_t)(step + 5);
    for (int i = 0; i < 24; i++)
        emb[i] = 0.25f * (float)i + (float)step;
}

/* Rank r's save; omit_w: rank 2 "forgets" its rows of w. Returns the status. */
static jdt_status rank_save(const char *ck, int r, int64_t step, pthread_barrier_t *bar,
                            bool omit_w)
{
    float w[48], b[8], emb[24], wl[16], el[12];
    int32_t count;
    global_state(step, w, b, &count, emb);
    jdt_ckpt_tensor ts[4];
    size_t n = 0;
    if (!(omit_w && r == 2)) {
        memcpy(wl, w + r * 16, sizeof wl);
        ts[n++] = (jdt_ckpt_tensor){.name = "params/w",
                                    .dtype = JDT_DTYPE_F32,
                                    .ndim = 2,
                                    .shape = {6, 8},
                                    .offset = {2 * r, 0},
                                    .extent = {2, 8},
                                    .data = wl};
    }
    if (r == 0)
        ts[n++] = (jdt_ckpt_tensor){
            .name = "params/b", .dtype = JDT_DTYPE_F32, .ndim = 1, .shape = {8}, .data = b};
    if (r == 1)
        ts[n++] = (jdt_ckpt_tensor){
            .name = "opt/count", .dtype = JDT_DTYPE_I32, .ndim = 0, .data = &count};
    if (r != 1) {
        int c0 = r == 0 ? 0 : 3;
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++)
                el[i * 3 + j] = emb[i * 6 + c0 + j];
        ts[n++] = (jdt_ckpt_tensor){.name = "params/emb",
                                    .dtype = JDT_DTYPE_F32,
                                    .ndim = 2,
                                    .shape = {4, 6},
                                    .offset = {0, c0},
                                    .extent = {4, 3},
                                    .data = el};
    }
    jdt_ckpt_meta m = {.step = step, .rng_state = 7, .data_position = step, .config_text = "x"};
    jdt_ckpt_save_opts o = {.keep_last = 3,
                            .rank = r,
                            .world_size = W_RANKS,
                            .barrier = shm_barrier,
                            .barrier_ctx = bar};
    jdt_err e;
    jdt_status st = jdt_ckpt_save(ck, &m, ts, n, &o, NULL, &e);
    if (st != JDT_OK && !omit_w) fprintf(stderr, "rank %d: %s\n", r, e.msg);
    return st;
}

typedef struct {
    const char *ck;
    int64_t step;
    pthread_barrier_t *bar;
    bool omit_w;
} save_job;

static int save_rank(int r, void *p)
{
    const save_job *j = p;
    return (int)rank_save(j->ck, r, j->step, j->bar, j->omit_w);
}

/* Forks W_RANKS ranks saving step; fills their exit statuses. */
static void run_ranks(const char *ck, int64_t step, bool omit_w, int *codes)
{
    pthread_barrier_t *bar =
        mmap(NULL, sizeof *bar, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(bar != MAP_FAILED);
    pthread_barrierattr_t ba;
    pthread_barrierattr_init(&ba);
    pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
    pthread_barrier_init(bar, &ba, W_RANKS);
    save_job j = {ck, step, bar, omit_w};
    tu_run_procs(W_RANKS, save_rank, &j, -1, 120, codes);
    for (int r = 0; r < W_RANKS; r++)
        ck_assert_msg(codes[r] < 99, "rank %d died (%d)", r, codes[r]);
    pthread_barrier_destroy(bar);
    munmap(bar, sizeof *bar);
}

START_TEST(test_multi_rank_save)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    int codes[W_RANKS];
    run_ranks(ck, 4, false, codes);
    for (int r = 0; r < W_RANKS; r++)
        ck_assert_int_eq(codes[r], JDT_OK);
    ck_assert_int_eq(access(path_in("ck/step_000004/rank_00002.h5"), F_OK), 0);
    ck_assert_int_ne(access(path_in("ck/step_000004.tmp"), F_OK), 0);
    float w[48], b[8], emb[24], got[48];
    int32_t count, gc = 0;
    global_state(4, w, b, &count, emb);
    jdt_ckpt *c = NULL;
    ck_assert_int_eq(jdt_ckpt_open(path_in("ck/step_000004"), &c, &e), JDT_OK);
    char **names;
    size_t nn;
    ck_assert_int_eq(jdt_ckpt_list(c, &names, &nn, &e), JDT_OK);
    ck_assert_uint_eq(nn, 4);
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    jdt_ckpt_tensor q = {.name = "params/w", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {6, 8}};
    ck_assert_msg(jdt_ckpt_read(c, &q, got, &e) == JDT_OK, "%s", e.msg);
    ck_assert_mem_eq(got, w, sizeof w);
    /* a slice across the three ranks' rows, as another mesh would read it */
    q.offset[0] = 1;
    q.offset[1] = 2;
    q.extent[0] = 4;
    q.extent[1] = 5;
    ck_assert_int_eq(jdt_ckpt_read(c, &q, got, &e), JDT_OK);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++)
            ck_assert_float_eq(got[i * 5 + j], w[(1 + i) * 8 + 2 + j]);
    q = (jdt_ckpt_tensor){.name = "params/emb", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {4, 6}};
    ck_assert_int_eq(jdt_ckpt_read(c, &q, got, &e), JDT_OK);
    ck_assert_mem_eq(got, emb, sizeof emb);
    q = (jdt_ckpt_tensor){.name = "params/b", .dtype = JDT_DTYPE_F32, .ndim = 1, .shape = {8}};
    ck_assert_int_eq(jdt_ckpt_read(c, &q, got, &e), JDT_OK);
    ck_assert_mem_eq(got, b, sizeof b);
    q = (jdt_ckpt_tensor){.name = "opt/count", .dtype = JDT_DTYPE_I32, .ndim = 0};
    ck_assert_int_eq(jdt_ckpt_read(c, &q, &gc, &e), JDT_OK);
    ck_assert_int_eq(gc, count);
    jdt_ckpt_close(c);
    /* h5dump (another reader, run from elsewhere) sees whole arrays through the virtual
     * datasets, also after the directory moves */
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "cp -r '%s' '%s' && cd / && h5dump -d /params/w '%s/state.h5' | "
             "grep -q '446, 447'",
             path_in("ck/step_000004"), path_in("moved"), path_in("moved"));
    if (system("command -v h5dump >/dev/null") == 0) ck_assert_int_eq(system(cmd), 0);
    /* a missing rank file is an error, not zeros */
    snprintf(cmd, sizeof cmd, "rm '%s/rank_00001.h5'", path_in("moved"));
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(jdt_ckpt_open(path_in("moved"), &c, &e), JDT_OK);
    q = (jdt_ckpt_tensor){.name = "params/w", .dtype = JDT_DTYPE_F32, .ndim = 2, .shape = {6, 8}};
    ck_assert_int_eq(jdt_ckpt_read(c, &q, got, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "rank_00001.h5"));
    jdt_ckpt_close(c);
    /* a hole in the coverage: rank 0 refuses to commit, nothing is left behind */
    run_ranks(ck, 5, true, codes);
    ck_assert_int_eq(codes[0], JDT_ERR_INVALID);
    ck_assert_int_ne(access(path_in("ck/step_000005"), F_OK), 0);
    ck_assert_int_ne(access(path_in("ck/step_000005.tmp"), F_OK), 0);
    char *p = NULL;
    int64_t step;
    ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, &step, &e), JDT_OK);
    ck_assert_int_eq(step, 4);
    free(p);
}
END_TEST

START_TEST(test_alloc_failures)
{
    jdt_err e;
    char ck[512];
    snprintf(ck, sizeof ck, "%s", path_in("ck"));
    int n_nomem = 0;
    bool any_saved = false;
    for (long n = 1; n < 80; n++) {
        jdt_alloc_fail_after(n);
        jdt_status st = save_state(ck, n, 2, &e);
        jdt_alloc_fail_after(0);
        ck_assert_msg(st == JDT_OK || st == JDT_ERR_NOMEM, "%s", e.msg);
        n_nomem += st == JDT_ERR_NOMEM;
        any_saved = any_saved || st == JDT_OK;
        char *p = NULL;
        jdt_status want = any_saved ? JDT_OK : JDT_ERR_NOT_FOUND;
        ck_assert_int_eq(jdt_ckpt_find_latest(ck, &p, NULL, &e), want);
        free(p);
        jdt_ckpt *c = NULL;
        jdt_alloc_fail_after(n);
        st = jdt_ckpt_resolve("auto", ck, &p, &e);
        if (st == JDT_OK && p) st = jdt_ckpt_open(p, &c, &e);
        if (st == JDT_OK && c) {
            char **names = NULL;
            size_t nn = 0;
            st = jdt_ckpt_list(c, &names, &nn, &e);
            for (size_t i = 0; i < nn; i++)
                free(names[i]);
            free(names);
        }
        jdt_alloc_fail_after(0);
        ck_assert_msg(st == JDT_OK || st == JDT_ERR_NOMEM, "%s", e.msg);
        jdt_ckpt_close(c);
        free(p);
    }
    ck_assert_int_gt(n_nomem, 5);
}
END_TEST

int main(void)
{
    jdt_log_set_level(JDT_LOG_ERROR); /* the cleanup notices and warnings are expected here */
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("ckpt");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_roundtrip_bitwise);
    tcase_add_test(tc, test_slices);
    tcase_add_test(tc, test_atomic_resume);
    tcase_add_test(tc, test_keep_k);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_stored_type_mismatch);
    tcase_add_test(tc, test_kill_during_save);
    tcase_add_test(tc, test_save_while_prefetching);
    tcase_add_test(tc, test_multi_rank_save);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
