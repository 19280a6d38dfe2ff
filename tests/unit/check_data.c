/*
 * check_data.c — unit tests for engine/io data (token/array writers, the streaming loader)
 * and datasets/ (byte tokenizer, text preparer, synthetic generators). Every test works in its
 * own temp directory; bad-file tests check for a non-OK status and a message naming the file.
 */
#include "tests/unit/testutil.h"
#include "core/core.h"
#include "datasets/datasets.h"
#include "io/data.h"

#include <check.h>
#include <dirent.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void setup(void)
{
    tu_tmpdir_make("check-data");
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

/* tokens[i] = (i * 7 + i / 13) % vocab: a stream where every window differs */
static uint32_t *make_tokens(int64_t n, uint32_t vocab)
{
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++)
        t[i] = (uint32_t)((i * 7 + i / 13) % vocab);
    return t;
}

static jdt_data *open_tokens(const char *path, const char *split, int64_t T, int64_t B,
                             bool shuffle, uint64_t seed, int prefetch, int64_t r0, int64_t r1)
{
    jdt_data_opts o = {.path = path,
                       .split = split,
                       .kind = JDT_DATA_KIND_TOKENS,
                       .seq_len = T,
                       .global_batch = B,
                       .row_begin = r0,
                       .row_end = r1,
                       .seed = seed,
                       .shuffle = shuffle,
                       .prefetch = prefetch};
    jdt_data *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_data_open(&o, &d, &e);
    ck_assert_msg(st == JDT_OK, "open %s: %s", path, e.msg);
    return d;
}

/* Copies batch k of d into fresh buffers (x then y, each rows*T). */
static int32_t *get_copy(jdt_data *d, int64_t k)
{
    jdt_data_batch b;
    jdt_err e;
    jdt_status st = jdt_data_get(d, k, &b, &e);
    ck_assert_msg(st == JDT_OK, "get %lld: %s", (long long)k, e.msg);
    size_t nx = (size_t)(b.rows * b.x_cols), ny = (size_t)(b.rows * b.y_cols);
    int32_t *c = malloc((nx + ny) * sizeof *c);
    memcpy(c, b.x, nx * 4);
    memcpy(c + nx, b.y, ny * 4);
    return c;
}

START_TEST(test_tokens_roundtrip)
{
    jdt_err e;
    const uint32_t vocabs[2] = {256, 70000};
    for (int v = 0; v < 2; v++) {
        int64_t n = 1001;
        uint32_t *t = make_tokens(n, vocabs[v]);
        for (int64_t i = 0; i < n; i += 97)
            t[i] = vocabs[v] - 1; /* the largest id survives */
        const char *p = path_in(v ? "big.h5" : "small.h5");
        ck_assert_int_eq(jdt_data_write_tokens(p, t, n, vocabs[v], "byte", &e), JDT_OK);
        ck_assert_int_ne(access(path_in(v ? "big.h5.tmp" : "small.h5.tmp"), F_OK), 0);
        jdt_data *d = open_tokens(p, NULL, 10, 4, false, 0, 0, 0, 0);
        jdt_data_info info;
        jdt_data_get_info(d, &info);
        ck_assert_int_eq(info.n_units, n);
        ck_assert_int_eq(info.n_samples, 100);
        ck_assert_int_eq(info.vocab_size, vocabs[v]);
        ck_assert_int_eq(info.token_dtype, v ? JDT_DTYPE_U32 : JDT_DTYPE_U16);
        ck_assert_str_eq(info.tokenizer, "byte");
        /* read every window once in order: the whole stream comes back */
        for (int64_t k = 0; k < 25; k++) {
            jdt_data_batch b;
            ck_assert_int_eq(jdt_data_get(d, k, &b, &e), JDT_OK);
            const int32_t *x = b.x;
            for (int64_t r = 0; r < 4; r++)
                for (int64_t i = 0; i < 10; i++) {
                    int64_t pos = (k * 4 + r) * 10 + i;
                    ck_assert_int_eq(x[r * 10 + i], (int32_t)t[pos]);
                    ck_assert_int_eq(b.y[r * 10 + i], (int32_t)t[pos + 1]);
                }
        }
        jdt_data_close(d);
        free(t);
    }
    /* an independent reader agrees on the on-disk layout */
    char cmd[600];
    snprintf(cmd, sizeof cmd,
             "h5dump -H '%s' | grep -q 'H5T_STD_U16LE' && h5dump -H '%s' | grep -q "
             "'H5T_STD_U32LE' && h5dump -a format '%s' | grep -q jdt-tokens",
             path_in("small.h5"), path_in("big.h5"), path_in("small.h5"));
    if (system("command -v h5dump >/dev/null") == 0) ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_writer_misuse)
{
    jdt_err e;
    uint32_t t[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 300};
    /* an id >= vocab is refused and leaves no file behind */
    ck_assert_int_eq(jdt_data_write_tokens(path_in("v.h5"), t, 10, 256, "byte", &e),
                     JDT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "300"));
    ck_assert_int_ne(access(path_in("v.h5"), F_OK), 0);
    ck_assert_int_ne(access(path_in("v.h5.tmp"), F_OK), 0);
    /* too few or too many tokens for the declared size */
    jdt_data_tokw *w = NULL;
    ck_assert_int_eq(jdt_data_tokw_open(path_in("w.h5"), 5, 256, "byte", NULL, &w, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_tokw_append(w, t, 6, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_data_tokw_append(w, t, 4, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_tokw_commit(w, &e), JDT_ERR_INVALID);
    ck_assert_int_ne(access(path_in("w.h5"), F_OK), 0);
    ck_assert_int_ne(access(path_in("w.h5.tmp"), F_OK), 0);
    /* bad vocab / sizes / labels */
    ck_assert_int_eq(jdt_data_tokw_open(path_in("w.h5"), 0, 256, "byte", NULL, &w, &e),
                     JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_data_tokw_open(path_in("w.h5"), 5, 0, "byte", NULL, &w, &e),
                     JDT_ERR_INVALID);
    float x[4] = {0};
    int32_t y[2] = {0, 3};
    ck_assert_int_eq(jdt_data_write_arrays(path_in("a.h5"), x, y, 2, 2, 3, NULL, &e),
                     JDT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "y[1]"));
}
END_TEST

START_TEST(test_sequential_exact)
{
    jdt_err e;
    int64_t n = 23, T = 5, B = 3; /* N = 22 / 5 = 4 windows */
    uint32_t *t = make_tokens(n, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("s.h5"), t, n, 256, "byte", &e), JDT_OK);
    jdt_data *d = open_tokens(path_in("s.h5"), NULL, T, B, false, 0, 0, 0, 0);
    for (int64_t k = 0; k < 6; k++) {
        jdt_data_batch b;
        ck_assert_int_eq(jdt_data_get(d, k, &b, &e), JDT_OK);
        ck_assert_int_eq(b.rows, B);
        ck_assert_int_eq(b.x_cols, T);
        for (int64_t j = 0; j < B; j++) {
            int64_t w = (k * B + j) % 4;
            ck_assert_int_eq(jdt_data_sample_index(d, k, j), w);
            for (int64_t i = 0; i < T; i++) {
                ck_assert_int_eq(((int32_t *)b.x)[j * T + i], (int32_t)t[w * T + i]);
                ck_assert_int_eq(b.y[j * T + i], (int32_t)t[w * T + i + 1]);
            }
        }
    }
    jdt_data_close(d);
    free(t);
}
END_TEST

START_TEST(test_shards_equal_single)
{
    jdt_err e;
    int64_t n = 3001;
    uint32_t *t = make_tokens(n, 50000);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("one.h5"), t, n, 50000, "byte", &e), JDT_OK);
    char shard_dir[300];
    snprintf(shard_dir, sizeof shard_dir, "%s/shards", tu_tmpdir());
    ck_assert_int_eq(mkdir(shard_dir, 0777), 0);
    /* uneven shard sizes so windows straddle shard boundaries; a val file is filtered out */
    int64_t cuts[5] = {0, 7, 1003, 1004, n};
    for (int i = 0; i < 4; i++) {
        char p[400];
        snprintf(p, sizeof p, "%s/train_%03d.h5", shard_dir, i);
        ck_assert_int_eq(
            jdt_data_write_tokens(p, t + cuts[i], cuts[i + 1] - cuts[i], 50000, "byte", &e),
            JDT_OK);
    }
    char vp[400];
    snprintf(vp, sizeof vp, "%s/val_000.h5", shard_dir);
    ck_assert_int_eq(jdt_data_write_tokens(vp, t, 100, 50000, "byte", &e), JDT_OK);
    /* the same stream compressed, in small chunks */
    jdt_data_write_opts wo = {.compress_level = 6, .chunk_rows = 100};
    jdt_data_tokw *w = NULL;
    ck_assert_int_eq(jdt_data_tokw_open(path_in("z.h5"), n, 50000, "byte", &wo, &w, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_tokw_append(w, t, 1000, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_tokw_append(w, t + 1000, n - 1000, &e), JDT_OK);
    ck_assert_int_eq(jdt_data_tokw_commit(w, &e), JDT_OK);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        jdt_data *a = open_tokens(path_in("one.h5"), NULL, 16, 8, shuffle, 7, 0, 0, 0);
        jdt_data *b = open_tokens(shard_dir, "train", 16, 8, shuffle, 7, 0, 0, 0);
        jdt_data *z = open_tokens(path_in("z.h5"), NULL, 16, 8, shuffle, 7, 1, 0, 0);
        for (int64_t k = 0; k < 30; k++) {
            int32_t *ca = get_copy(a, k), *cz = get_copy(z, k);
            ck_assert_mem_eq(ca, cz, 2 * 8 * 16 * 4);
            free(ca);
            free(cz);
        }
        /* the same stream prints alike, whatever its files and their compression */
        uint64_t pa = 0, pb = 1, pz = 2;
        ck_assert_int_eq(jdt_data_fingerprint(a, &pa, &e), JDT_OK);
        ck_assert_int_eq(jdt_data_fingerprint(b, &pb, &e), JDT_OK);
        ck_assert_int_eq(jdt_data_fingerprint(z, &pz, &e), JDT_OK);
        ck_assert(pa == pb && pa == pz);
        jdt_data_close(z);
        jdt_data_info ia, ib;
        jdt_data_get_info(a, &ia);
        jdt_data_get_info(b, &ib);
        ck_assert_int_eq(ib.n_files, 4);
        ck_assert_int_eq(ia.n_units, ib.n_units);
        for (int64_t k = 0; k < 30; k++) {
            int32_t *ca = get_copy(a, k), *cb = get_copy(b, k);
            ck_assert_mem_eq(ca, cb, 2 * 8 * 16 * 4);
            free(ca);
            free(cb);
        }
        jdt_data_close(a);
        jdt_data_close(b);
    }
    free(t);
}
END_TEST

/* The print of a token stream (n tokens, one file) with token `at` changed (at < 0: none). */
static uint64_t print_changed(int64_t n, int64_t at)
{
    jdt_err e;
    uint32_t *t = make_tokens(n, 50000);
    if (at >= 0) t[at] = (t[at] + 1) % 50000;
    ck_assert_int_eq(jdt_data_write_tokens(path_in("p.h5"), t, n, 50000, "byte", &e), JDT_OK);
    free(t);
    jdt_data *d = open_tokens(path_in("p.h5"), NULL, 16, 8, true, 7, 0, 0, 0);
    uint64_t h = 0;
    ck_assert_int_eq(jdt_data_fingerprint(d, &h, &e), JDT_OK);
    jdt_data_close(d);
    return h;
}

/* jdt_data_fingerprint: a token changed in its first, middle or last window changes the print
 * (the copies a job's ranks read are compared by it); one between windows does not (it is not
 * a checksum: 16 windows of 256 tokens over a file of 100000). */
START_TEST(test_fingerprint)
{
    const int64_t n = 100000;
    const uint64_t base = print_changed(n, -1);
    ck_assert(print_changed(n, -1) == base); /* deterministic */
    ck_assert(print_changed(n, 0) != base);
    ck_assert(print_changed(n, n - 1) != base);
    ck_assert(print_changed(n, (n - 256) * 7 / 15 + 100) != base);  /* inside window 7 */
    ck_assert(print_changed(n, (n - 256) * 7 / 15 + 1000) == base); /* between 7 and 8 */
    ck_assert(print_changed(n - 1, -1) != base);                    /* its length */
}
END_TEST

/* Open file descriptors of this process. */
static int count_fds(void)
{
    int n_fds = 0;
    DIR *dd = opendir("/proc/self/fd");
    if (!dd) return -1;
    while (readdir(dd))
        n_fds++;
    closedir(dd);
    return n_fds;
}

START_TEST(test_many_shards)
{
    /* more shards than the open-file cache holds: with a descriptor limit of 64 the cache keeps
     * 16 (a quarter), so eviction and reopening happen and must be invisible */
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = 64;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    jdt_err e;
    int64_t n = 40 * 37 + 5;
    uint32_t *t = make_tokens(n, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("one.h5"), t, n, 256, "byte", &e), JDT_OK);
    char sd[400];
    snprintf(sd, sizeof sd, "%s/many", tu_tmpdir());
    ck_assert_int_eq(mkdir(sd, 0777), 0);
    for (int i = 0; i < 40; i++) {
        char p[500];
        snprintf(p, sizeof p, "%s/part_%d.h5", sd, i); /* part_9 < part_10: numeric order */
        int64_t b = i * 37, en = i == 39 ? n : b + 37;
        ck_assert_int_eq(jdt_data_write_tokens(p, t + b, en - b, 256, "byte", &e), JDT_OK);
    }
    jdt_data *a = open_tokens(path_in("one.h5"), NULL, 10, 16, true, 21, 0, 0, 0);
    jdt_data *b = open_tokens(sd, NULL, 10, 16, true, 21, 2, 0, 0);
    for (int64_t k = 0; k < 40; k++) {
        int32_t *ca = get_copy(a, k), *cb = get_copy(b, k);
        ck_assert_mem_eq(ca, cb, 2 * 16 * 10 * 4);
        free(ca);
        free(cb);
    }
    int n_fds = count_fds();
    if (n_fds >= 0) ck_assert_int_lt(n_fds, 30); /* 16 shards + stdio + the single file + slack */
    jdt_data_close(a);
    jdt_data_close(b);
    /* a shard replaced after open (and evicted from the cache) is caught on reopen: opening
     * 40 shards leaves part_0 closed, so batch 0 reopens it */
    b = open_tokens(sd, NULL, 10, 2, false, 0, 0, 0, 0);
    char p0[500];
    snprintf(p0, sizeof p0, "%s/part_0.h5", sd);
    ck_assert_int_eq(jdt_data_write_tokens(p0, t, 30, 256, "byte", &e), JDT_OK);
    jdt_data_batch bb;
    ck_assert_int_eq(jdt_data_get(b, 0, &bb, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "part_0.h5"));
    ck_assert_ptr_nonnull(strstr(e.msg, "changed"));
    jdt_data_close(b);
    free(t);
}
END_TEST

START_TEST(test_shards_stay_open)
{
    /* with descriptors to spare every shard stays open (a shuffled read never reopens a file:
     * that made 32-shard loading 10x slower), and the batches are the single file's */
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 1024) return; /* cannot raise it here */
    rl.rlim_cur = 1024;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    jdt_err e;
    int64_t n = 40 * 37 + 5;
    uint32_t *t = make_tokens(n, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("one.h5"), t, n, 256, "byte", &e), JDT_OK);
    char sd[400];
    snprintf(sd, sizeof sd, "%s/open", tu_tmpdir());
    ck_assert_int_eq(mkdir(sd, 0777), 0);
    for (int i = 0; i < 40; i++) {
        char p[500];
        snprintf(p, sizeof p, "%s/part_%d.h5", sd, i);
        int64_t b = i * 37, en = i == 39 ? n : b + 37;
        ck_assert_int_eq(jdt_data_write_tokens(p, t + b, en - b, 256, "byte", &e), JDT_OK);
    }
    int before = count_fds();
    jdt_data *a = open_tokens(path_in("one.h5"), NULL, 10, 16, true, 21, 0, 0, 0);
    jdt_data *b = open_tokens(sd, NULL, 10, 16, true, 21, 0, 0, 0);
    for (int64_t k = 0; k < 20; k++) {
        int32_t *ca = get_copy(a, k), *cb = get_copy(b, k);
        ck_assert_mem_eq(ca, cb, 2 * 16 * 10 * 4);
        free(ca);
        free(cb);
    }
    if (before >= 0) ck_assert_int_ge(count_fds() - before, 41); /* 40 shards + one.h5 */
    jdt_data_close(a);
    jdt_data_close(b);
    if (before >= 0) ck_assert_int_eq(count_fds(), before);
    free(t);
}
END_TEST

START_TEST(test_shuffle_determinism)
{
    jdt_err e;
    int64_t n = 4001, T = 8, B = 7; /* N = 500 windows */
    uint32_t *t = make_tokens(n, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("t.h5"), t, n, 256, "byte", &e), JDT_OK);
    jdt_data *a = open_tokens(path_in("t.h5"), NULL, T, B, true, 1234, 0, 0, 0);
    jdt_data *b = open_tokens(path_in("t.h5"), NULL, T, B, true, 1234, 0, 0, 0);
    jdt_data *c = open_tokens(path_in("t.h5"), NULL, T, B, true, 1235, 0, 0, 0);
    /* separate instances, batches asked for in different orders, agree */
    int64_t order[5] = {9, 0, 3, 200, 1};
    int32_t *cb[5];
    for (int i = 4; i >= 0; i--)
        cb[i] = get_copy(b, order[i]);
    int n_diff = 0;
    for (int i = 0; i < 5; i++) {
        int32_t *ca = get_copy(a, order[i]);
        ck_assert_mem_eq(ca, cb[i], (size_t)2 * B * T * 4);
        int32_t *cc = get_copy(c, order[i]);
        if (memcmp(ca, cc, (size_t)2 * B * T * 4) != 0) n_diff++;
        free(ca);
        free(cb[i]);
        free(cc);
    }
    ck_assert_int_ge(n_diff, 4); /* another seed gives another order */
    /* each epoch is a permutation of the 500 windows, and epochs differ */
    char *seen = calloc(500, 1);
    int64_t first_epoch[500];
    int64_t same_pos = 0, in_order = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, 500);
        for (int64_t g = epoch * 500; g < (epoch + 1) * 500; g++) {
            int64_t w = jdt_data_sample_index(a, g / B, g % B);
            ck_assert(w >= 0 && w < 500);
            ck_assert_msg(!seen[w], "window %lld twice in epoch %d", (long long)w, epoch);
            seen[w] = 1;
            if (epoch == 0)
                first_epoch[g] = w;
            else if (first_epoch[g - 500] == w)
                same_pos++;
            if (w == g % 500) in_order++;
        }
    }
    ck_assert_int_lt(same_pos, 20);
    ck_assert_int_lt(in_order, 20);
    free(seen);
    jdt_data_close(a);
    jdt_data_close(b);
    jdt_data_close(c);
    free(t);
}
END_TEST

START_TEST(test_rank_slices)
{
    jdt_err e;
    int64_t n = 2001, T = 6, B = 6;
    uint32_t *t = make_tokens(n, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("t.h5"), t, n, 256, "byte", &e), JDT_OK);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        jdt_data *full = open_tokens(path_in("t.h5"), NULL, T, B, shuffle, 5, 0, 0, 0);
        jdt_data *r0 = open_tokens(path_in("t.h5"), NULL, T, B, shuffle, 5, 2, 0, 3);
        jdt_data *r1 = open_tokens(path_in("t.h5"), NULL, T, B, shuffle, 5, 0, 3, 6);
        for (int64_t k = 0; k < 12; k++) {
            jdt_data_batch bf, b0, b1;
            ck_assert_int_eq(jdt_data_get(full, k, &bf, &e), JDT_OK);
            ck_assert_int_eq(jdt_data_get(r0, k, &b0, &e), JDT_OK);
            ck_assert_int_eq(jdt_data_get(r1, k, &b1, &e), JDT_OK);
            ck_assert_int_eq(b0.rows, 3);
            size_t half = (size_t)(3 * T) * 4;
            ck_assert_mem_eq(bf.x, b0.x, half);
            ck_assert_mem_eq((char *)bf.x + half, b1.x, half);
            ck_assert_mem_eq(bf.y, b0.y, half);
            ck_assert_mem_eq((char *)bf.y + half, b1.y, half);
            /* three ranks of two rows through the synchronous path agree too */
            int32_t x3[6 * 6], y3[6 * 6];
            for (int r = 0; r < 3; r++)
                ck_assert_int_eq(jdt_data_read_rows(full, k, 2 * r, 2 * r + 2, x3 + 2 * r * T,
                                                    y3 + 2 * r * T, &e),
                                 JDT_OK);
            ck_assert_mem_eq(bf.x, x3, sizeof x3);
            ck_assert_mem_eq(bf.y, y3, sizeof y3);
            /* a rank's loader can still read the whole batch synchronously */
            ck_assert_int_eq(jdt_data_read_rows(r0, k, 0, 6, x3, y3, &e), JDT_OK);
            ck_assert_mem_eq(bf.x, x3, sizeof x3);
        }
        jdt_data_close(full);
        jdt_data_close(r0);
        jdt_data_close(r1);
    }
    free(t);
}
END_TEST

START_TEST(test_prefetch_same)
{
    jdt_err e;
    int64_t n = 5001, T = 12, B = 5;
    uint32_t *t = make_tokens(n, 1000);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("t.h5"), t, n, 1000, "byte", &e), JDT_OK);
    jdt_data *plain = open_tokens(path_in("t.h5"), NULL, T, B, true, 3, 0, 0, 0);
    jdt_data *pf = open_tokens(path_in("t.h5"), NULL, T, B, true, 3, 3, 0, 0);
    /* in order, then a jump back (resume), then in order again, then forward jump */
    int64_t ks[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 2, 3, 4, 50, 51, 52, 7};
    for (size_t i = 0; i < JDT_ARRAY_LEN(ks); i++) {
        int32_t *a = get_copy(plain, ks[i]), *b = get_copy(pf, ks[i]);
        ck_assert_mem_eq(a, b, (size_t)2 * B * T * 4);
        free(a);
        free(b);
    }
    jdt_data_close(plain);
    jdt_data_close(pf);
    /* closing with batches in flight, right after open, is clean */
    for (int i = 0; i < 5; i++)
        jdt_data_close(open_tokens(path_in("t.h5"), NULL, T, B, true, 3, 4, 0, 0));
    free(t);
}
END_TEST

START_TEST(test_arrays)
{
    jdt_err e;
    int64_t N = 50, D = 3;
    float *x = malloc((size_t)(N * D) * sizeof *x);
    int32_t *y = malloc((size_t)N * sizeof *y);
    for (int64_t i = 0; i < N * D; i++)
        x[i] = (float)i * 0.5f - 3.0f;
    for (int64_t i = 0; i < N; i++)
        y[i] = (int32_t)(i % 4);
    ck_assert_int_eq(jdt_data_write_arrays(path_in("a.h5"), x, y, N, D, 4, NULL, &e), JDT_OK);
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        jdt_data_opts o = {.path = path_in("a.h5"),
                           .global_batch = 8,
                           .seed = 9,
                           .shuffle = shuffle,
                           .prefetch = shuffle ? 2 : 0};
        jdt_data *d = NULL;
        ck_assert_int_eq(jdt_data_open(&o, &d, &e), JDT_OK);
        jdt_data_info info;
        jdt_data_get_info(d, &info);
        ck_assert_int_eq(info.kind, JDT_DATA_KIND_ARRAYS);
        ck_assert_int_eq(info.dim, D);
        ck_assert_int_eq(info.n_classes, 4);
        ck_assert_int_eq(info.n_samples, N);
        for (int64_t k = 0; k < 14; k++) {
            jdt_data_batch b;
            ck_assert_int_eq(jdt_data_get(d, k, &b, &e), JDT_OK);
            ck_assert_int_eq(b.x_dtype, JDT_DTYPE_F32);
            for (int64_t j = 0; j < 8; j++) {
                int64_t s = jdt_data_sample_index(d, k, j);
                if (!shuffle) ck_assert_int_eq(s, (k * 8 + j) % N);
                ck_assert_mem_eq((float *)b.x + j * D, x + s * D, (size_t)D * 4);
                ck_assert_int_eq(b.y[j], y[s]);
            }
        }
        jdt_data_close(d);
    }
    /* the fingerprint reads features and labels: the last row's label changed prints apart */
    uint64_t print[2] = {0, 0};
    for (int changed = 0; changed < 2; changed++) {
        y[N - 1] = (int32_t)((N - 1 + changed) % 4);
        ck_assert_int_eq(jdt_data_write_arrays(path_in("f.h5"), x, y, N, D, 4, NULL, &e), JDT_OK);
        jdt_data_opts o = {.path = path_in("f.h5"), .global_batch = 8, .seed = 9};
        jdt_data *d = NULL;
        ck_assert_int_eq(jdt_data_open(&o, &d, &e), JDT_OK);
        ck_assert_int_eq(jdt_data_fingerprint(d, &print[changed], &e), JDT_OK);
        jdt_data_close(d);
    }
    ck_assert(print[0] != print[1]);
    /* asking for tokens from an array file is a clear error */
    jdt_data_opts o = {
        .path = path_in("a.h5"), .kind = JDT_DATA_KIND_TOKENS, .seq_len = 4, .global_batch = 2};
    jdt_data *d = NULL;
    ck_assert_int_eq(jdt_data_open(&o, &d, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "a.h5"));
    free(x);
    free(y);
}
END_TEST

/* Sets (replaces) the int64 root attribute name of the HDF5 file at path. */
static void set_attr_i64(const char *path, const char *name, int64_t v)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    if (H5Aexists(f, name) > 0) ck_assert(H5Adelete(f, name) >= 0);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    ck_assert(H5Fclose(f) >= 0);
}

/* Writes a 40x3 array file at name with labels i % label_mod and n_classes attribute n_classes
 * (0: unchecked by the writer), then overrides attribute attr with v (attr NULL: none). */
static char *bad_arrays(const char *name, int label_mod, int64_t n_classes, const char *attr,
                        int64_t v)
{
    float x[40 * 3];
    int32_t y[40];
    for (int i = 0; i < 40 * 3; i++)
        x[i] = (float)i;
    for (int i = 0; i < 40; i++)
        y[i] = i % label_mod;
    jdt_err e;
    char *p = path_in(name);
    ck_assert_int_eq(jdt_data_write_arrays(p, x, y, 40, 3, n_classes, NULL, &e), JDT_OK);
    if (attr) set_attr_i64(p, attr, v);
    return p;
}

/* Opens path as arrays (B=4) with the model's class count n_classes (0: none). */
static jdt_status open_arrays(const char *path, int64_t n_classes, jdt_err *e)
{
    jdt_data_opts o = {
        .path = path, .kind = JDT_DATA_KIND_ARRAYS, .global_batch = 4, .n_classes = n_classes};
    jdt_data *d = NULL;
    jdt_err_clear(e);
    jdt_status st = jdt_data_open(&o, &d, e);
    ck_assert(st == JDT_OK || d == NULL);
    jdt_data_close(d);
    return st;
}

/* Attributes of an array file that disagree with its datasets, its labels or the model are
 * refused at open with one message naming the file and the attribute (they were accepted, or
 * failed at a later step in the loss without the file's name). */
START_TEST(test_arrays_bad_attrs)
{
    jdt_err e;
    static const struct {
        const char *name, *attr;
        int64_t v;
        int label_mod;
        int64_t file_classes, model_classes;
        const char *must_say;
    } cases[] = {
        {"rows.h5", "n_rows", 5, 4, 4, 0, "attribute n_rows is 5 but /x and /y hold 40 rows"},
        {"dim.h5", "dim", 100, 4, 4, 0, "attribute dim is 100 but /x has 3 columns"},
        {"neg.h5", "n_classes", -3, 4, 4, 0, "attribute n_classes is -3; expected 1 to 2^31"},
        {"huge.h5", "n_classes", 1LL << 40, 4, 4, 0, "attribute n_classes is 1099511627776"},
        {"model.h5", "n_classes", 1000, 4, 4, 4,
         "attribute n_classes is 1000 but the model has 4 classes"},
        /* labels beyond the attribute: caught at open, not at the step that draws the row */
        {"lab.h5", "n_classes", 4, 6, 0, 0, "/y[4] = 4 is outside [0, 4)"},
        /* labels beyond the model's classes where the file does not say (n_classes 0) */
        {"lab0.h5", NULL, 0, 6, 0, 4, "/y[4] = 4 is outside [0, 4)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *p = bad_arrays(cases[i].name, cases[i].label_mod, cases[i].file_classes,
                             cases[i].attr, cases[i].v);
        ck_assert_int_eq(open_arrays(p, cases[i].model_classes, &e), JDT_ERR_FORMAT);
        ck_assert_msg(strstr(e.msg, p) && strstr(e.msg, cases[i].must_say),
                      "%s: message '%s' lacks the file or '%s'", cases[i].name, e.msg,
                      cases[i].must_say);
        ck_assert_ptr_null(strchr(e.msg, '\n'));
    }
    /* what agrees opens: n_classes equal to the model's, or 0 with labels in range */
    ck_assert_int_eq(open_arrays(bad_arrays("ok.h5", 4, 4, NULL, 0), 4, &e), JDT_OK);
    ck_assert_int_eq(open_arrays(bad_arrays("ok0.h5", 4, 0, NULL, 0), 4, &e), JDT_OK);
    ck_assert_int_eq(open_arrays(bad_arrays("free.h5", 6, 0, NULL, 0), 0, &e), JDT_OK);
    ck_assert_int_eq(open_arrays(path_in("ok.h5"), -1, &e), JDT_ERR_INVALID);
}
END_TEST

/* ---- bad files ---------------------------------------------------------------------------- */

/* Opens path as tokens (T=8, B=2) expecting failure; returns the status, checks the message
 * names `must_name` and contains `must_say`. */
static jdt_status expect_open_fail(const char *path, const char *must_name, const char *must_say)
{
    jdt_data_opts o = {.path = path, .kind = JDT_DATA_KIND_TOKENS, .seq_len = 8, .global_batch = 2};
    jdt_data *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_data_open(&o, &d, &e);
    ck_assert_msg(st != JDT_OK, "%s opened but should not", path);
    ck_assert_ptr_null(d);
    ck_assert_msg(strstr(e.msg, must_name), "message '%s' does not name '%s'", e.msg, must_name);
    if (must_say)
        ck_assert_msg(strstr(e.msg, must_say), "message '%s' lacks '%s'", e.msg, must_say);
    return st;
}

/* Writes a token-like file by hand: /tokens of file type ftype with n values, and the given
 * attributes (skip one by name with `omit`). */
static void write_custom(const char *path, hid_t ftype, int64_t n, int64_t vocab, int64_t version,
                         const char *omit)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(f >= 0);
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t ds = H5Dcreate2(f, "tokens", ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int32_t *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        v[i] = (int32_t)(i % 200);
    ck_assert(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
    free(v);
    hid_t ss = H5Screate(H5S_SCALAR);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 16);
    const char *names[] = {"format", "version", "vocab_size", "tokenizer", "n_tokens"};
    for (int i = 0; i < 5; i++) {
        if (omit && strcmp(omit, names[i]) == 0) continue;
        bool str = i == 0 || i == 3;
        hid_t a = H5Acreate2(f, names[i], str ? st : H5T_STD_I64LE, ss, H5P_DEFAULT, H5P_DEFAULT);
        char sbuf[16] = {0};
        int64_t iv = i == 1 ? version : i == 2 ? vocab : n;
        strcpy(sbuf, i == 0 ? "jdt-tokens" : "byte");
        ck_assert(H5Awrite(a, str ? st : H5T_NATIVE_INT64, str ? (void *)sbuf : (void *)&iv) >= 0);
        H5Aclose(a);
    }
    H5Tclose(st);
    H5Sclose(ss);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(f);
}

START_TEST(test_bad_files)
{
    jdt_err e;
    /* missing file, missing dir shards */
    ck_assert_int_eq(expect_open_fail(path_in("nope.h5"), "nope.h5", NULL), JDT_ERR_NOT_FOUND);
    ck_assert_int_eq(expect_open_fail(tu_tmpdir(), tu_tmpdir(), "no "), JDT_ERR_NOT_FOUND);
    /* garbage bytes */
    FILE *f = fopen(path_in("garbage.h5"), "wb");
    for (int i = 0; i < 5000; i++)
        fputc((i * 31 + 7) & 255, f);
    fclose(f);
    ck_assert_int_eq(expect_open_fail(path_in("garbage.h5"), "garbage.h5", "not an HDF5"),
                     JDT_ERR_FORMAT);
    /* truncated: a valid file cut in half */
    uint32_t *t = make_tokens(20000, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("good.h5"), t, 20000, 256, "byte", &e), JDT_OK);
    free(t);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s' && truncate -s 20000 '%s'", path_in("good.h5"),
             path_in("cut.h5"), path_in("cut.h5"));
    ck_assert_int_eq(system(cmd), 0);
    /* HDF5's own words, not a stale errno ("Inappropriate ioctl for device") */
    ck_assert_int_eq(expect_open_fail(path_in("cut.h5"), "cut.h5", "truncated file: eof = 20000"),
                     JDT_ERR_FORMAT);
    /* wrong dtypes: signed i32 tokens, or u32 tokens for a 256-token vocab */
    write_custom(path_in("i32.h5"), H5T_STD_I32LE, 100, 256, 1, NULL);
    expect_open_fail(path_in("i32.h5"), "i32.h5", "/tokens has element type i32, expected u16");
    write_custom(path_in("u32.h5"), H5T_STD_U32LE, 100, 256, 1, NULL);
    expect_open_fail(path_in("u32.h5"), "u32.h5", "expected u16");
    /* missing attribute, bad version, too short */
    write_custom(path_in("noattr.h5"), H5T_STD_U16LE, 100, 256, 1, "vocab_size");
    expect_open_fail(path_in("noattr.h5"), "noattr.h5", "missing attribute 'vocab_size'");
    /* someone else's HDF5 (no jdt attributes): named as such, with what a token file holds */
    write_custom(path_in("foreign.h5"), H5T_STD_U16LE, 100, 256, 1, "format");
    expect_open_fail(path_in("foreign.h5"), "foreign.h5",
                     "not a jdt dataset (no 'format' attribute)");
    write_custom(path_in("v2.h5"), H5T_STD_U16LE, 100, 256, 2, NULL);
    expect_open_fail(path_in("v2.h5"), "v2.h5", "version 2");
    write_custom(path_in("short.h5"), H5T_STD_U16LE, 8, 256, 1, NULL);
    expect_open_fail(path_in("short.h5"), "short.h5", "too short");
    /* exactly T+1 tokens is enough */
    write_custom(path_in("exact.h5"), H5T_STD_U16LE, 9, 256, 1, NULL);
    jdt_data_opts o = {.path = path_in("exact.h5"), .seq_len = 8, .global_batch = 2};
    jdt_data *d = NULL;
    ck_assert_int_eq(jdt_data_open(&o, &d, &e), JDT_OK);
    jdt_data_close(d);
    /* a directory whose second shard is bad names that shard */
    char sd[400];
    snprintf(sd, sizeof sd, "%s/sh", tu_tmpdir());
    mkdir(sd, 0777);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/a_000.h5' && cp '%s' '%s/a_001.h5'", path_in("good.h5"),
             sd, path_in("garbage.h5"), sd);
    ck_assert_int_eq(system(cmd), 0);
    expect_open_fail(sd, "a_001.h5", NULL);
    /* without an error context the status is still exact */
    jdt_data_opts on = {.path = path_in("cut.h5"), .seq_len = 8, .global_batch = 2};
    ck_assert_int_eq(jdt_data_open(&on, &d, NULL), JDT_ERR_FORMAT);
    on.path = path_in("nope.h5");
    ck_assert_int_eq(jdt_data_open(&on, &d, NULL), JDT_ERR_NOT_FOUND);
    /* bad options */
    jdt_data_opts bad = {
        .path = path_in("good.h5"), .seq_len = 8, .global_batch = 4, .row_begin = 2, .row_end = 6};
    ck_assert_int_eq(jdt_data_open(&bad, &d, &e), JDT_ERR_INVALID);
}
END_TEST

START_TEST(test_read_error_reaches_get)
{
    /* ids beyond vocab_size are caught on read; with prefetch the error surfaces at get */
    write_custom(path_in("oov.h5"), H5T_STD_U16LE, 1000, 150, 1, NULL); /* ids up to 199 */
    for (int prefetch = 0; prefetch < 3; prefetch += 2) {
        jdt_data *d = open_tokens(path_in("oov.h5"), NULL, 4, 2, false, 0, prefetch, 0, 0);
        jdt_data_batch b;
        jdt_err e;
        ck_assert_int_eq(jdt_data_get(d, 0, &b, &e), JDT_OK); /* tokens 0..8 are fine */
        jdt_status st = JDT_OK;
        int64_t k;
        for (k = 1; k < 40 && st == JDT_OK; k++)
            st = jdt_data_get(d, k, &b, &e);
        ck_assert_int_eq(st, JDT_ERR_FORMAT);
        ck_assert_int_eq(k - 1, 150 / 8); /* the first batch holding id 150 */
        ck_assert_ptr_nonnull(strstr(e.msg, "oov.h5"));
        ck_assert_ptr_nonnull(strstr(e.msg, "outside the vocabulary"));
        jdt_data_close(d);
    }
}
END_TEST

/* ---- preparation -------------------------------------------------------------------------- */

START_TEST(test_prepare_text)
{
    jdt_err e;
    int64_t n = 10000;
    char *text = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++)
        text[i] = (char)("hello, world. "[i % 14] + (i / 1000));
    FILE *f = fopen(path_in("in.txt"), "wb");
    ck_assert_int_eq(fwrite(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    char out[400];
    snprintf(out, sizeof out, "%s/out", tu_tmpdir());
    jdt_prep_text_opts o = {.text_path = path_in("in.txt"),
                            .out_dir = out,
                            .val_fraction = 0.1,
                            .n_shards = 3,
                            .compress_level = 4};
    jdt_prep_result r;
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_OK);
    ck_assert_int_eq(r.n_train_tokens, 9000);
    ck_assert_int_eq(r.n_val_tokens, 1000);
    /* train ++ val == the text, byte for byte */
    jdt_data *tr = open_tokens(out, "train", 8999, 1, false, 0, 0, 0, 0);
    jdt_data *va = open_tokens(out, "val", 999, 1, false, 0, 0, 0, 0);
    jdt_data_info it;
    jdt_data_get_info(tr, &it);
    ck_assert_int_eq(it.n_files, 3);
    ck_assert_str_eq(it.tokenizer, "byte");
    jdt_data_batch b;
    ck_assert_int_eq(jdt_data_get(tr, 0, &b, &e), JDT_OK);
    char dec[9000];
    jdt_prep_byte_decode((const uint32_t *)b.x, 0, dec);
    for (int64_t i = 0; i < 8999; i++)
        ck_assert_int_eq(((int32_t *)b.x)[i], (unsigned char)text[i]);
    ck_assert_int_eq(b.y[8998], (unsigned char)text[8999]);
    ck_assert_int_eq(jdt_data_get(va, 0, &b, &e), JDT_OK);
    for (int64_t i = 0; i < 999; i++)
        ck_assert_int_eq(((int32_t *)b.x)[i], (unsigned char)text[9000 + i]);
    jdt_data_close(tr);
    jdt_data_close(va);
    /* a second run with fewer shards leaves no stale third shard */
    o.n_shards = 2;
    o.val_fraction = 0;
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_OK);
    char p[500];
    snprintf(p, sizeof p, "%s/train_002.h5", out);
    ck_assert_int_ne(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/val_000.h5", out);
    ck_assert_int_ne(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/train_001.h5", out);
    ck_assert_int_eq(access(p, F_OK), 0);
    /* val in a directory of its own (data.val_path apart from train_path): created there, the
     * same tail; the out dir keeps no val shard of the run before, the val dir no stale one */
    char vdir[420];
    snprintf(vdir, sizeof vdir, "%s/val/a", tu_tmpdir());
    o.val_dir = vdir;
    o.val_fraction = 0.1;
    o.n_shards = 3;
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_OK);
    ck_assert_int_eq(r.n_val_tokens, 1000);
    snprintf(p, sizeof p, "%s/val_000.h5", out);
    ck_assert_int_ne(access(p, F_OK), 0);
    jdt_data *va2 = open_tokens(vdir, "val", 999, 1, false, 0, 0, 0, 0);
    ck_assert_int_eq(jdt_data_get(va2, 0, &b, &e), JDT_OK);
    for (int64_t i = 0; i < 999; i++)
        ck_assert_int_eq(((int32_t *)b.x)[i], (unsigned char)text[9000 + i]);
    jdt_data_close(va2);
    o.val_fraction = 0; /* no val now: the val dir's old shard goes */
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_OK);
    snprintf(p, sizeof p, "%s/val_000.h5", vdir);
    ck_assert_int_ne(access(p, F_OK), 0);
    /* ... and a val dir that does not exist, with no val due, is left so (it failed: "No such
     * file or directory" from the stale-shard sweep) */
    char none[440];
    snprintf(none, sizeof none, "%s/val/none", tu_tmpdir());
    o.val_dir = none;
    ck_assert_msg(jdt_prep_text(&o, &r, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_ne(access(none, F_OK), 0);
    /* the out dir under another name is the out dir: the val shard written there stays */
    char same[440];
    snprintf(same, sizeof same, "%s/./", out);
    o.val_dir = same;
    o.val_fraction = 0.1;
    ck_assert_msg(jdt_prep_text(&o, &r, &e) == JDT_OK, "%s", e.msg);
    snprintf(p, sizeof p, "%s/val_000.h5", out);
    ck_assert_int_eq(access(p, F_OK), 0);
    o.val_fraction = 0;
    o.val_dir = NULL;
    o.n_shards = 2;
    /* errors: missing text, empty text */
    o.text_path = path_in("missing.txt");
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "missing.txt"));
    fclose(fopen(path_in("empty.txt"), "wb"));
    o.text_path = path_in("empty.txt");
    ck_assert_int_eq(jdt_prep_text(&o, &r, &e), JDT_ERR_INVALID);
    /* byte tokenizer round trip */
    uint32_t toks[5];
    char back[5];
    ck_assert_int_eq(jdt_prep_byte_encode("\xffz\0ab", 5, toks), 5);
    ck_assert_uint_eq(toks[0], 255);
    jdt_prep_byte_decode(toks, 5, back);
    ck_assert_mem_eq(back, "\xffz\0ab", 5);
    free(text);
}
END_TEST

static void file_bytes_equal(const char *a, const char *b, bool want_equal)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd,
             "h5dump -d /%s '%s' | tail -n +3 > '%s.dump' && h5dump -d /%s '%s' "
             "| tail -n +3 > '%s.dump' && cmp -s '%s.dump' '%s.dump'",
             strstr(a, "arr") ? "x" : "tokens", a, a, strstr(b, "arr") ? "x" : "tokens", b, b, a,
             b);
    if (system("command -v h5dump >/dev/null") != 0) return;
    ck_assert_int_eq(system(cmd) == 0, want_equal);
}

START_TEST(test_synthetic)
{
    jdt_err e;
    ck_assert_int_eq(jdt_prep_synth_tokens(path_in("s1.h5"), 5000, 100, 11, &e), JDT_OK);
    ck_assert_int_eq(jdt_prep_synth_tokens(path_in("s2.h5"), 5000, 100, 11, &e), JDT_OK);
    ck_assert_int_eq(jdt_prep_synth_tokens(path_in("s3.h5"), 5000, 100, 12, &e), JDT_OK);
    jdt_data *a = open_tokens(path_in("s1.h5"), NULL, 4999, 1, false, 0, 0, 0, 0);
    jdt_data *b = open_tokens(path_in("s2.h5"), NULL, 4999, 1, false, 0, 0, 0, 0);
    jdt_data *c = open_tokens(path_in("s3.h5"), NULL, 4999, 1, false, 0, 0, 0, 0);
    int32_t *ca = get_copy(a, 0), *cb = get_copy(b, 0), *cc = get_copy(c, 0);
    ck_assert_mem_eq(ca, cb, 2 * 4999 * 4);
    ck_assert(memcmp(ca, cc, 2 * 4999 * 4) != 0);
    /* learnable: the most common successor of a token follows it far more than 1/vocab */
    int64_t hits = 0, total = 0;
    int32_t succ0 = -1;
    for (int64_t i = 0; i + 1 < 4999; i++) {
        if (ca[i] != ca[0]) continue;
        if (succ0 < 0) succ0 = ca[i + 1];
        total++;
        hits += ca[i + 1] == succ0;
    }
    ck_assert_int_gt(total, 10);
    ck_assert_int_gt(hits * 2, total);
    free(ca);
    free(cb);
    free(cc);
    jdt_data_close(a);
    jdt_data_close(b);
    jdt_data_close(c);
    ck_assert_int_eq(jdt_prep_synth_arrays(path_in("arr1.h5"), 64, 5, 3, 1, &e), JDT_OK);
    ck_assert_int_eq(jdt_prep_synth_arrays(path_in("arr2.h5"), 64, 5, 3, 1, &e), JDT_OK);
    ck_assert_int_eq(jdt_prep_synth_arrays(path_in("arr3.h5"), 64, 5, 3, 2, &e), JDT_OK);
    file_bytes_equal(path_in("arr1.h5"), path_in("arr2.h5"), true);
    file_bytes_equal(path_in("arr1.h5"), path_in("arr3.h5"), false);
    file_bytes_equal(path_in("s1.h5"), path_in("s2.h5"), true);
}
END_TEST

START_TEST(test_alloc_failures)
{
    /* every allocation failure in open/get/close and the writers is a clean ERR_NOMEM */
    jdt_err e;
    uint32_t *t = make_tokens(3000, 256);
    ck_assert_int_eq(jdt_data_write_tokens(path_in("t.h5"), t, 3000, 256, "byte", &e), JDT_OK);
    int n_nomem = 0;
    for (long n = 1; n < 60; n++) {
        for (int prefetch = 0; prefetch < 3; prefetch += 2) {
            jdt_data_opts o = {.path = tu_tmpdir(),
                               .seq_len = 8,
                               .global_batch = 4,
                               .shuffle = true,
                               .prefetch = prefetch};
            jdt_data *d = NULL;
            jdt_alloc_fail_after(n);
            jdt_status st = jdt_data_open(&o, &d, &e);
            jdt_alloc_fail_after(0);
            ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
            if (st == JDT_OK) {
                jdt_data_batch b;
                ck_assert_int_eq(jdt_data_get(d, 3, &b, &e), JDT_OK);
            } else {
                ck_assert_ptr_null(d);
                n_nomem++;
            }
            jdt_data_close(d);
        }
        jdt_alloc_fail_after(n);
        jdt_status st = jdt_data_write_tokens(path_in("w.h5"), t, 3000, 256, "byte", &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
    }
    ck_assert_int_gt(n_nomem, 10);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "! ls '%s' | grep -q tmp", tu_tmpdir());
    ck_assert_int_eq(system(cmd), 0);
    free(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("data");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tokens_roundtrip);
    tcase_add_test(tc, test_writer_misuse);
    tcase_add_test(tc, test_sequential_exact);
    tcase_add_test(tc, test_shards_equal_single);
    tcase_add_test(tc, test_fingerprint);
    tcase_add_test(tc, test_many_shards);
    tcase_add_test(tc, test_shards_stay_open);
    tcase_add_test(tc, test_shuffle_determinism);
    tcase_add_test(tc, test_rank_slices);
    tcase_add_test(tc, test_prefetch_same);
    tcase_add_test(tc, test_arrays);
    tcase_add_test(tc, test_arrays_bad_attrs);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_read_error_reaches_get);
    tcase_add_test(tc, test_prepare_text);
    tcase_add_test(tc, test_synthetic);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
