/*
 * loader.c — throughput of the HDF5 token loader alone (no training), over a directory of many
 * shards, read the way data-parallel ranks read it: each rank a separate process holding only
 * its rows [r*B/R, (r+1)*B/R) of every global batch (one hyperslab per window and shard).
 *
 *   build/bench/loader write DIR SHARDS TOKENS_PER_SHARD VOCAB [COMPRESS_LEVEL]
 *   build/bench/loader read DIR SEQ_LEN BATCH RANKS BATCHES [shuffle 0|1] [prefetch]
 *
 * `write` makes DIR/train_000.h5 .. train_<SHARDS-1>.h5 of random token ids (the format
 * `prepare` writes: CRC attribute, ~64 KiB chunks, deflate+shuffle when COMPRESS_LEVEL > 0).
 * `read` forks RANKS processes that all start together; each opens the directory (which checks
 * every shard's CRC) and reads global batches 0..BATCHES-1 of its row slice. It prints one line
 * per rank and a summary line:
 *   loader: ranks R open_s X read_s Y tokens N tok_s Z per_rank_tok_s W
 * where tok_s is all ranks' tokens over the slowest rank's read time (what the ranks deliver
 * together, sharing the machine's cores) and per_rank_tok_s the slowest rank's own rate.
 * scripts/bench/loader.sh compares these with training's consumption (docs/perf.md).
 */
#include "io/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int64_t parse_i64(const char *s, const char *what, int64_t lo)
{
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (!end || end == s || *end || v < lo) {
        fprintf(stderr, "loader: bad %s '%s' (need an integer >= %lld)\n", what, s, (long long)lo);
        exit(2);
    }
    return v;
}

static int write_shards(const char *dir, int64_t n_shards, int64_t n_tokens, int64_t vocab,
                        int level)
{
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && !(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))) {
        perror(dir);
        return 1;
    }
    enum { BLOCK = 1 << 16 };
    uint32_t *blk = malloc(BLOCK * sizeof *blk);
    if (!blk) return 1;
    jdt_data_write_opts wo = {.compress_level = level, .chunk_rows = 0};
    uint64_t key = jdt_rng_key(1, "bench.loader");
    double t0 = jdt_now_s();
    for (int64_t s = 0; s < n_shards; s++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/train_%03lld.h5", dir, (long long)s);
        jdt_err e;
        jdt_data_tokw *w = NULL;
        if (jdt_data_tokw_open(path, n_tokens, (uint32_t)vocab, "synthetic", &wo, &w, &e)) {
            fprintf(stderr, "loader: %s\n", e.msg);
            free(blk);
            return 1;
        }
        for (int64_t pos = 0; pos < n_tokens;) {
            int64_t m = n_tokens - pos < BLOCK ? n_tokens - pos : BLOCK;
            for (int64_t i = 0; i < m; i++)
                blk[i] = jdt_philox(key, (uint64_t)s, (uint64_t)(pos + i)).v[0] % (uint32_t)vocab;
            if (jdt_data_tokw_append(w, blk, m, &e)) {
                fprintf(stderr, "loader: %s\n", e.msg);
                jdt_data_tokw_abort(w);
                free(blk);
                return 1;
            }
            pos += m;
        }
        if (jdt_data_tokw_commit(w, &e)) {
            fprintf(stderr, "loader: %s\n", e.msg);
            free(blk);
            return 1;
        }
    }
    free(blk);
    printf("loader: wrote %lld shards x %lld tokens (vocab %lld, compress %d) in %.2f s\n",
           (long long)n_shards, (long long)n_tokens, (long long)vocab, level, jdt_now_s() - t0);
    return 0;
}

/* One rank: open, then read `batches` batches of rows [r0, r1); writes "open_s read_s" to fd. */
static int rank_main(const char *dir, int64_t T, int64_t B, int64_t r0, int64_t r1, int64_t batches,
                     bool shuffle, int prefetch, int fd)
{
    jdt_data_opts o = {.path = dir,
                       .split = "train",
                       .kind = JDT_DATA_KIND_TOKENS,
                       .seq_len = T,
                       .global_batch = B,
                       .row_begin = r0,
                       .row_end = r1,
                       .seed = 1337,
                       .shuffle = shuffle,
                       .prefetch = prefetch};
    jdt_err e;
    jdt_data *d = NULL;
    double t0 = jdt_now_s();
    if (jdt_data_open(&o, &d, &e)) {
        fprintf(stderr, "loader: %s\n", e.msg);
        return 1;
    }
    double t1 = jdt_now_s();
    uint64_t sum = 0; /* touch the tokens so nothing is optimised away */
    for (int64_t k = 0; k < batches; k++) {
        jdt_data_batch b;
        if (jdt_data_get(d, k, &b, &e)) {
            fprintf(stderr, "loader: %s\n", e.msg);
            jdt_data_close(d);
            return 1;
        }
        sum += (uint32_t)((int32_t *)b.x)[0] + (uint32_t)b.y[b.rows * b.y_cols - 1];
    }
    double t2 = jdt_now_s();
    jdt_data_close(d);
    char line[128];
    int n =
        snprintf(line, sizeof line, "%.6f %.6f %llu\n", t1 - t0, t2 - t1, (unsigned long long)sum);
    return write(fd, line, (size_t)n) == n ? 0 : 1;
}

static int read_bench(int argc, char **argv)
{
    if (argc < 7) {
        fprintf(stderr,
                "usage: loader read DIR SEQ_LEN BATCH RANKS BATCHES [shuffle] [prefetch]\n");
        return 2;
    }
    const char *dir = argv[2];
    int64_t T = parse_i64(argv[3], "SEQ_LEN", 1), B = parse_i64(argv[4], "BATCH", 1);
    int64_t R = parse_i64(argv[5], "RANKS", 1), K = parse_i64(argv[6], "BATCHES", 1);
    bool shuffle = argc > 7 ? parse_i64(argv[7], "shuffle", 0) != 0 : true;
    int prefetch = argc > 8 ? (int)parse_i64(argv[8], "prefetch", 0) : 0;
    if (B % R != 0 || R > 64) {
        fprintf(stderr, "loader: BATCH %lld is not divisible by RANKS %lld (or RANKS > 64)\n",
                (long long)B, (long long)R);
        return 2;
    }
    int fds[64][2];
    pid_t pids[64];
    for (int64_t r = 0; r < R; r++) {
        if (pipe(fds[r]) != 0) return 1;
        pids[r] = fork();
        if (pids[r] < 0) return 1;
        if (pids[r] == 0) {
            close(fds[r][0]);
            _exit(rank_main(dir, T, B, r * (B / R), (r + 1) * (B / R), K, shuffle, prefetch,
                            fds[r][1]));
        }
        close(fds[r][1]);
    }
    double open_max = 0, read_max = 0;
    int rc = 0;
    for (int64_t r = 0; r < R; r++) {
        char buf[128] = {0};
        ssize_t n = read(fds[r][0], buf, sizeof buf - 1);
        close(fds[r][0]);
        int ws = 0;
        waitpid(pids[r], &ws, 0);
        double o = 0, rd = 0;
        if (n <= 0 || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0 ||
            sscanf(buf, "%lf %lf", &o, &rd) != 2) {
            fprintf(stderr, "loader: rank %lld failed\n", (long long)r);
            rc = 1;
            continue;
        }
        printf("loader: rank %lld rows [%lld, %lld): open %.3f s, %lld batches in %.3f s, %.0f "
               "tok/s\n",
               (long long)r, (long long)(r * (B / R)), (long long)((r + 1) * (B / R)), o,
               (long long)K, rd, (double)K * (double)(B / R) * (double)T / rd);
        if (o > open_max) open_max = o;
        if (rd > read_max) read_max = rd;
    }
    if (rc) return rc;
    double tokens = (double)K * (double)B * (double)T;
    printf("loader: ranks %lld open_s %.3f read_s %.3f tokens %.0f tok_s %.0f per_rank_tok_s "
           "%.0f\n",
           (long long)R, open_max, read_max, tokens, tokens / read_max,
           tokens / (double)R / read_max);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "write") == 0) {
        if (argc < 6) {
            fprintf(stderr, "usage: loader write DIR SHARDS TOKENS_PER_SHARD VOCAB [LEVEL]\n");
            return 2;
        }
        return write_shards(
            argv[2], parse_i64(argv[3], "SHARDS", 1), parse_i64(argv[4], "TOKENS_PER_SHARD", 2),
            parse_i64(argv[5], "VOCAB", 2), argc > 6 ? (int)parse_i64(argv[6], "LEVEL", 0) : 0);
    }
    if (argc >= 2 && strcmp(argv[1], "read") == 0) return read_bench(argc, argv);
    fprintf(stderr, "usage: loader write DIR SHARDS TOKENS_PER_SHARD VOCAB [LEVEL]\n"
                    "       loader read DIR SEQ_LEN BATCH RANKS BATCHES [shuffle] [prefetch]\n");
    return 2;
}
