/*
 * allreduce.c — benchmark driver for the TCP ring all-reduce (engine/comm): forks --nproc ranks
 * on 127.0.0.1, all-reduces f32 buffers from --min to --max bytes (doubling) and prints, from
 * rank 0, one line per size: bytes, mean time, algorithm and bus bandwidth (busbw = bytes *
 * 2(n-1)/n / time, the nccl-tests convention), so it can be compared with torch gloo by
 * scripts/bench/allreduce.sh. Also checks the result of the last iteration.
 *
 *   build/bench/allreduce [--nproc 2] [--min 1024] [--max 67108864] [--time 0.5]
 *   JDT_BENCH_NO_SHM=1: all-reduce over TCP even on one host.
 */
#include "comm/comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int nproc;
    long min_bytes, max_bytes;
    double secs; /* target time per size */
} bench_opts;

static bool parse_long(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0) return false;
    *out = v;
    return true;
}

static int run_rank(int rank, const bench_opts *b, const char *addr, int lfd)
{
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.rank = rank;
    o.world_size = b->nproc;
    o.coordinator = addr;
    o.token = "bench";
    o.coord_listen_fd = rank == 0 ? lfd : -1;
    o.connect_timeout_s = 30;
    const char *no_shm = getenv("JDT_BENCH_NO_SHM");
    o.disable_shm = no_shm && strcmp(no_shm, "0") != 0;
    jdt_dist *d;
    jdt_err e;
    if (jdt_dist_init(&o, &d, &e)) {
        fprintf(stderr, "rank %d: %s\n", rank, e.msg);
        return 1;
    }
    jdt_comm_group *g = jdt_dist_world(d);
    size_t max_n = (size_t)b->max_bytes / sizeof(float);
    float *buf = jdt_malloc_aligned(max_n * sizeof(float) + 64);
    int rc = 0;
    if (!buf) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        rc = 1;
        goto out;
    }
    if (rank == 0)
        printf("%12s %12s %10s %10s\n", "bytes", "time_us", "algbw_GBs", "busbw_GBs");
    for (long bytes = b->min_bytes; bytes <= b->max_bytes; bytes *= 2) {
        size_t n = (size_t)bytes / sizeof(float);
        for (size_t i = 0; i < n; i++) buf[i] = 1;
        /* warm up, then pick an iteration count from the measured time (rank 0 decides) */
        double t0 = jdt_now_s();
        for (int w = 0; w < 3; w++)
            if (jdt_comm_allreduce(g, buf, n, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e)) goto fail;
        double per = (jdt_now_s() - t0) / 3;
        float iters_f = (float)(b->secs / (per > 1e-7 ? per : 1e-7));
        if (jdt_comm_broadcast(g, &iters_f, 1, JDT_DTYPE_F32, 0, &e)) goto fail;
        int iters = iters_f < 5 ? 5 : iters_f > 10000 ? 10000 : (int)iters_f;
        for (size_t i = 0; i < n; i++) buf[i] = 1;
        if (jdt_comm_barrier(g, &e)) goto fail;
        t0 = jdt_now_s();
        for (int it = 0; it < iters; it++)
            if (jdt_comm_allreduce(g, buf, n, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e)) goto fail;
        double dt = (jdt_now_s() - t0) / iters;
        /* buf started at 1 and was multiplied by nproc each iteration */
        double want = 1;
        for (int it = 0; it < iters && want < 1e30; it++) want *= b->nproc;
        if (n && want < 1e30 && (double)buf[n - 1] != want) {
            fprintf(stderr, "rank %d: wrong result %g != %g at %ld bytes\n", rank, buf[n - 1], want,
                    bytes);
            rc = 1;
            goto out;
        }
        if (rank == 0) {
            double alg = (double)bytes / dt / 1e9;
            double bus = alg * 2.0 * (b->nproc - 1) / b->nproc;
            printf("%12ld %12.1f %10.3f %10.3f\n", bytes, dt * 1e6, alg, bus);
            fflush(stdout);
        }
    }
    goto out;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, e.msg);
    rc = 1;
out:
    jdt_free_aligned(buf);
    jdt_dist_free(d);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts b = {2, 1024, 64L << 20, 0.5};
    for (int i = 1; i < argc; i++) {
        long v;
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(a, "--nproc") == 0 && parse_long(val, &v) && v <= 64) b.nproc = (int)v;
        else if (strcmp(a, "--min") == 0 && parse_long(val, &v)) b.min_bytes = v;
        else if (strcmp(a, "--max") == 0 && parse_long(val, &v)) b.max_bytes = v;
        else if (strcmp(a, "--time") == 0 && (b.secs = strtod(val, NULL)) > 0) {
        } else {
            fprintf(stderr, "usage: %s [--nproc N] [--min BYTES] [--max BYTES] [--time SECS]\n",
                    argv[0]);
            return 2;
        }
        i++;
    }
    if (b.min_bytes < 4 || b.max_bytes < b.min_bytes) {
        fprintf(stderr, "need 4 <= --min <= --max\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) || listen(lfd, 128) ||
        getsockname(lfd, (struct sockaddr *)&sa, &sl)) {
        perror("listen");
        return 1;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    pid_t pids[64];
    for (int r = 0; r < b.nproc; r++) {
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
        if (pids[r] == 0) {
            if (r != 0) close(lfd);
            fflush(stdout);
            _exit(run_rank(r, &b, addr, lfd));
        }
    }
    close(lfd);
    int rc = 0;
    for (int r = 0; r < b.nproc; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
    }
    return rc;
}
