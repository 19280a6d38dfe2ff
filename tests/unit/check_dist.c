/*
 * check_dist.c — unit tests for the rendezvous (engine/comm: wire.c, net.c, coord.c, dist.c):
 * the frame codec, token comparison, KV store and barriers, late joiners, a wrong token,
 * garbage sent to the coordinator, a start-up timeout that lists the missing ranks, a hung
 * rank (SIGSTOP) and a lost coordinator; hardening (issue 11): a start-up flood of idle
 * connections, connect_timeout_s against a silent foreign server, a barrier after a peer left,
 * no leaked coordinator socket on early failures. Multi-process tests fork ranks on 127.0.0.1; the
 * coordinator's port comes from binding port 0 in the parent, never a fixed port.
 */
#include "tests/unit/testutil.h"
#include "comm/comm-impl.h"

#include <check.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOKEN "dist-test-token"

/* ---- codec and helpers ------------------------------------------------------------------------ */

START_TEST(test_wire_codec)
{
    jdt_wbuf b;
    jdt_err e;
    jdt_wbuf_init(&b);
    jdt_wbuf_begin(&b, JDT_MSG_KV_SET);
    jdt_wbuf_str(&b, "key");
    jdt_wbuf_u64(&b, 0x123456789abcdefULL);
    jdt_wbuf_u32(&b, 7);
    ck_assert_int_eq(jdt_wbuf_finish(&b, &e), JDT_OK);
    jdt_msg_type t;
    uint32_t len;
    ck_assert_int_eq(jdt_wire_parse_hdr(b.data, &t, &len, &e), JDT_OK);
    ck_assert_int_eq(t, JDT_MSG_KV_SET);
    ck_assert_uint_eq(len, b.len - JDT_WIRE_HDR);
    jdt_rbuf r = {b.data + JDT_WIRE_HDR, len, 0, false};
    char key[8];
    jdt_rbuf_str(&r, key, sizeof key);
    ck_assert_str_eq(key, "key");
    ck_assert(jdt_rbuf_u64(&r) == 0x123456789abcdefULL);
    ck_assert_uint_eq(jdt_rbuf_u32(&r), 7);
    ck_assert(!r.bad);
    jdt_rbuf_u32(&r); /* past the end */
    ck_assert(r.bad);

    /* a string longer than its bound, or a length past the payload, marks the reader bad */
    jdt_rbuf r2 = {b.data + JDT_WIRE_HDR, len, 0, false};
    char small[3];
    jdt_rbuf_str(&r2, small, sizeof small);
    ck_assert(r2.bad);
    uint8_t lie[8] = {0xff, 0xff, 0, 0, 'a', 'b', 'c', 'd'};
    jdt_rbuf r3 = {lie, sizeof lie, 0, false};
    const uint8_t *p;
    jdt_rbuf_bytes(&r3, &p, 1u << 20);
    ck_assert(r3.bad);

    /* bad magic, version, type, oversize length */
    uint8_t h[JDT_WIRE_HDR];
    memcpy(h, b.data, sizeof h);
    h[0] ^= 1;
    ck_assert_int_eq(jdt_wire_parse_hdr(h, &t, &len, &e), JDT_ERR_PROTOCOL);
    ck_assert(strstr(e.msg, "magic"));
    memcpy(h, b.data, sizeof h);
    h[4] = 99;
    ck_assert_int_eq(jdt_wire_parse_hdr(h, &t, &len, &e), JDT_ERR_PROTOCOL);
    ck_assert(strstr(e.msg, "version"));
    memcpy(h, b.data, sizeof h);
    h[6] = 200;
    ck_assert_int_eq(jdt_wire_parse_hdr(h, &t, &len, &e), JDT_ERR_PROTOCOL);
    memcpy(h, b.data, sizeof h);
    h[8] = h[9] = h[10] = h[11] = 0xff;
    ck_assert_int_eq(jdt_wire_parse_hdr(h, &t, &len, &e), JDT_ERR_PROTOCOL);
    ck_assert(strstr(e.msg, "bound"));

    /* the writer refuses to build an oversized frame */
    jdt_wbuf_begin(&b, JDT_MSG_KV_SET);
    char *big = calloc(JDT_WIRE_MAX_PAYLOAD + 1, 1);
    jdt_wbuf_bytes(&b, big, JDT_WIRE_MAX_PAYLOAD + 1);
    ck_assert_int_eq(jdt_wbuf_finish(&b, &e), JDT_ERR_INVALID);
    free(big);
    jdt_wbuf_free(&b);
}
END_TEST

START_TEST(test_token_and_addr)
{
    ck_assert(jdt_net_token_eq("secret", "secret", 6));
    ck_assert(!jdt_net_token_eq("secret", "secreT", 6));
    ck_assert(!jdt_net_token_eq("secret", "secret!", 7));
    ck_assert(!jdt_net_token_eq("secret", "sec", 3));
    ck_assert(!jdt_net_token_eq("secret", "", 0));
    ck_assert(jdt_net_token_eq("", "", 0));
    char host[64];
    int port;
    jdt_err e;
    ck_assert_int_eq(jdt_net_parse_addr("10.0.0.1:29500", host, sizeof host, &port, &e), JDT_OK);
    ck_assert_str_eq(host, "10.0.0.1");
    ck_assert_int_eq(port, 29500);
    ck_assert_int_eq(jdt_net_parse_addr("nohost", host, sizeof host, &port, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_net_parse_addr("h:99999", host, sizeof host, &port, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_net_parse_addr("h:12x", host, sizeof host, &port, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_net_parse_addr(":80", host, sizeof host, &port, &e), JDT_ERR_INVALID);
}
END_TEST

START_TEST(test_bad_opts)
{
    jdt_dist_opts o;
    jdt_dist *d = NULL;
    jdt_err e;
    jdt_dist_opts_default(&o);
    o.rank = 3;
    o.world_size = 2;
    ck_assert_int_eq(jdt_dist_init(&o, &d, &e), JDT_ERR_INVALID);
    ck_assert_ptr_null(d);
    ck_assert(strstr(e.msg, "rank 3"));
    jdt_dist_opts_default(&o);
    o.coordinator = "no-port-here";
    ck_assert_int_eq(jdt_dist_init(&o, &d, &e), JDT_ERR_INVALID);
    jdt_dist_opts_default(&o);
    o.peer_timeout_s = 0.5; /* below the heartbeat interval */
    ck_assert_int_eq(jdt_dist_init(&o, &d, &e), JDT_ERR_INVALID);
    /* a world of one with no listening socket given picks its own port */
    jdt_dist_opts_default(&o);
    o.token = TOKEN;
    ck_assert_int_eq(jdt_dist_init(&o, &d, &e), JDT_OK);
    ck_assert_int_eq(jdt_dist_world_size(d), 1);
    ck_assert_int_eq(jdt_dist_check(d, &e), JDT_OK);
    jdt_dist_free(d);
}
END_TEST

/* Fails each allocation of a one-rank job's life in turn: every failure is a clean error (or
 * is absorbed), never a crash or a leak (ASan build). */
START_TEST(test_alloc_failures)
{
    int n_ok = 0;
    for (long n = 1; n <= 200 && n_ok < 3; n++) {
        jdt_dist_opts o;
        jdt_dist *d = NULL;
        jdt_err e;
        jdt_dist_opts_default(&o);
        o.token = TOKEN;
        o.connect_timeout_s = 1;
        jdt_alloc_fail_after(n);
        jdt_status st = jdt_dist_init(&o, &d, &e);
        if (st == JDT_OK) {
            float f[3] = {1, 2, 3};
            st = jdt_comm_allreduce(jdt_dist_world(d), f, 3, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e);
            if (st == JDT_OK) st = jdt_dist_kv_set(d, "k", "v", 1, &e);
            jdt_dist_free(d);
        }
        long seen = jdt_alloc_fail_after(0);
        if (getenv("JDT_TEST_VERBOSE")) fprintf(stderr, "n=%ld st=%s seen=%ld t=%.2f %s\n", n, jdt_status_name(st), seen, jdt_now_s(), st ? e.msg : "");
        if (st == JDT_OK && seen < n) n_ok++; /* past the last allocation: must succeed */
        else ck_assert_msg(st != JDT_OK || seen >= n, "n=%ld", n);
    }
    ck_assert_int_ge(n_ok, 1);
}
END_TEST

/* ---- multi-process harness -------------------------------------------------------------------- */

typedef struct {
    int rank, world;
    jdt_dist_opts o;
    char addr[64];
    int port;
} proc_ctx;

typedef int (*proc_fn)(proc_ctx *c, void *arg);

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* One process of run_procs: default test options for rank i of the job, then fn. */
typedef struct {
    int world, port, lfd;
    proc_fn fn;
    void *arg;
} proc_job;

static int proc_main(int i, void *p)
{
    const proc_job *j = p;
    proc_ctx c;
    memset(&c, 0, sizeof c);
    c.rank = i;
    c.world = j->world;
    c.port = j->port;
    snprintf(c.addr, sizeof c.addr, "127.0.0.1:%d", j->port);
    jdt_dist_opts_default(&c.o);
    c.o.rank = i;
    c.o.world_size = j->world;
    c.o.coordinator = c.addr;
    c.o.token = TOKEN;
    c.o.coord_listen_fd = i == 0 ? j->lfd : -1;
    if (i != 0) close(j->lfd);
    c.o.connect_timeout_s = 20;
    c.o.heartbeat_s = 0.25;
    c.o.peer_timeout_s = 2;
    return j->fn(&c, j->arg);
}

/* Forks n_procs processes; process i gets rank i (fn may change it) and default test options
 * for a job of world ranks. codes[i] = exit code, 100 + signal, or 99 after timeout_s. */
static void run_procs(int n_procs, int world, proc_fn fn, void *arg, double timeout_s, int *codes)
{
    int port, lfd = tu_free_listener(&port);
    proc_job j = {world, port, lfd, fn, arg};
    tu_run_procs(n_procs, proc_main, &j, lfd, timeout_s, codes);
}

#define FAIL_IF(cond, ...)                                                                        \
    do {                                                                                          \
        if (cond) {                                                                               \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

static void expect_codes(int n, const int *codes, const int *want)
{
    for (int i = 0; i < n; i++)
        ck_assert_msg(codes[i] == want[i], "process %d exited %d, expected %d", i, codes[i], want[i]);
}

/* ---- KV store and barriers, with a late joiner ------------------------------------------------ */

static int kv_barrier(proc_ctx *c, void *arg)
{
    double late = arg ? *(double *)arg : 0;
    if (c->rank == c->world - 1 && late > 0) sleep_s(late);
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init: %s", c->rank, e.msg);
    FAIL_IF(jdt_dist_rank(d) != c->rank, "rank");
    for (int r = 0; r < c->world; r++)
        FAIL_IF(strcmp(jdt_dist_host(d, r), "127.0.0.1") != 0, "host of %d: %s", r, jdt_dist_host(d, r));
    char key[32], val[64];
    snprintf(key, sizeof key, "hello/%d", c->rank);
    snprintf(val, sizeof val, "from rank %d", c->rank);
    FAIL_IF(jdt_dist_kv_set(d, key, val, strlen(val) + 1, &e), "kv_set: %s", e.msg);
    /* read every other rank's key, waiting for it */
    for (int r = 0; r < c->world; r++) {
        void *got;
        size_t n;
        snprintf(key, sizeof key, "hello/%d", r);
        FAIL_IF(jdt_dist_kv_get(d, key, 10, &got, &n, &e), "kv_get %s: %s", key, e.msg);
        snprintf(val, sizeof val, "from rank %d", r);
        FAIL_IF(n != strlen(val) + 1 || memcmp(got, val, n) != 0, "kv value for %s", key);
        jdt_free(got);
    }
    void *got;
    size_t n;
    FAIL_IF(jdt_dist_kv_get(d, "never-set", 0.2, &got, &n, &e) != JDT_ERR_TIMEOUT,
            "missing key: %s", e.msg);
    FAIL_IF(jdt_dist_kv_set(d, "", "x", 1, &e) != JDT_ERR_INVALID, "empty key accepted");
    for (int i = 0; i < 5; i++) FAIL_IF(jdt_dist_barrier(d, 10, &e), "barrier %d: %s", i, e.msg);
    /* an overwritten key: the barrier orders the set before the gets */
    if (c->rank == 0) FAIL_IF(jdt_dist_kv_set(d, "shared", "v2", 3, &e), "kv_set: %s", e.msg);
    FAIL_IF(jdt_dist_barrier(d, 10, &e), "barrier: %s", e.msg);
    FAIL_IF(jdt_dist_kv_get(d, "shared", 1, &got, &n, &e), "shared: %s", e.msg);
    FAIL_IF(n != 3 || strcmp(got, "v2") != 0, "shared value");
    jdt_free(got);
    FAIL_IF(jdt_comm_barrier(jdt_dist_world(d), &e), "comm barrier: %s", e.msg);
    FAIL_IF(jdt_dist_check(d, &e), "unhealthy: %s", e.msg);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_kv_barrier)
{
    int codes[4], want[4] = {0};
    run_procs(4, 4, kv_barrier, NULL, 60, codes);
    expect_codes(4, codes, want);
}
END_TEST

START_TEST(test_late_joiner)
{
    double late = 1.0;
    int codes[3], want[3] = {0};
    run_procs(3, 3, kv_barrier, &late, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- ranks advertise different addresses (all loopback): the mesh uses the peer table ------- */

static int advertised(proc_ctx *c, void *arg)
{
    char mine[32];
    snprintf(mine, sizeof mine, "127.0.0.%d", c->rank + 1);
    c->o.advertise_host = mine;
    c->o.disable_shm = true;
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init: %s", c->rank, e.msg);
    for (int r = 0; r < c->world; r++) {
        char want[32];
        snprintf(want, sizeof want, "127.0.0.%d", r + 1);
        FAIL_IF(strcmp(jdt_dist_host(d, r), want) != 0, "host of %d: %s", r, jdt_dist_host(d, r));
    }
    double v[3] = {c->rank, 1, -c->rank};
    FAIL_IF(jdt_comm_allreduce(jdt_dist_world(d), v, 3, JDT_DTYPE_F64, JDT_REDUCE_SUM, &e),
            "allreduce: %s", e.msg);
    FAIL_IF(v[0] != 3 || v[1] != 3 || v[2] != -3, "allreduce values");
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_advertised_hosts)
{
    int codes[3], want[3] = {0};
    run_procs(3, 3, advertised, NULL, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- a barrier that times out names the ranks that did not come ------------------------------- */

static int barrier_timeout(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "init: %s", e.msg);
    if (c->rank == 0) {
        jdt_status st = jdt_dist_barrier(d, 1.5, &e);
        FAIL_IF(st != JDT_ERR_TIMEOUT, "barrier: %s", jdt_status_name(st));
        /* rank 2 never comes; rank 1 normally has arrived (unless it was very slow to start) */
        FAIL_IF(!strstr(e.msg, "not arrived: 2") && !strstr(e.msg, "not arrived: 1, 2"),
                "message: %s", e.msg);
        FAIL_IF(jdt_dist_kv_set(d, "done", "1", 1, &e), "kv_set: %s", e.msg);
    } else if (c->rank == 1) {
        jdt_status st = jdt_dist_barrier(d, 3, &e);
        FAIL_IF(st != JDT_ERR_TIMEOUT, "barrier: %s", jdt_status_name(st));
    }
    void *v;
    size_t n;
    FAIL_IF(jdt_dist_kv_get(d, "done", 10, &v, &n, &e), "kv_get: %s", e.msg);
    jdt_free(v);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_barrier_timeout)
{
    int codes[3], want[3] = {0};
    run_procs(3, 3, barrier_timeout, NULL, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- a stranger with the wrong token is refused; the job still forms --------------------------- */

static int wrong_token(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    if (c->rank == 2) { /* the stranger: claims rank 1 with a bad token */
        c->o.rank = 1;
        c->o.token = "not-the-token";
        jdt_status st = jdt_dist_init(&c->o, &d, &e);
        FAIL_IF(st != JDT_ERR_AUTH, "stranger: status %s: %s", jdt_status_name(st), e.msg);
        FAIL_IF(!strstr(e.msg, "token"), "stranger: message: %s", e.msg);
        return 0;
    }
    if (c->rank == 1) sleep_s(1.0); /* let the stranger go first */
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init: %s", c->rank, e.msg);
    FAIL_IF(jdt_comm_barrier(jdt_dist_world(d), &e), "barrier: %s", e.msg);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_wrong_token)
{
    int codes[3], want[3] = {0};
    run_procs(3, 2, wrong_token, NULL, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- garbage sent to the coordinator is refused without harm ----------------------------------- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < 100; i++) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        sleep_s(0.05);
    }
    return -1;
}

/* True when the coordinator closed fd (EOF) within 5 s. */
static bool closed_by_peer(int fd)
{
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r == 0) return true;
        if (r < 0) return errno == ECONNRESET;
    }
}

static int garbage(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    if (c->rank == 2) {
        signal(SIGPIPE, SIG_IGN);
        /* 1: an HTTP request */
        int fd = raw_connect(c->port);
        FAIL_IF(fd < 0, "connect");
        const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        FAIL_IF(send(fd, http, strlen(http), 0) < 0, "send");
        FAIL_IF(!closed_by_peer(fd), "HTTP garbage not refused");
        close(fd);
        /* 2: a valid header announcing a 4 GiB payload */
        fd = raw_connect(c->port);
        uint8_t h[JDT_WIRE_HDR] = {'J', 'D', 'T', 'R', JDT_WIRE_VERSION, 0, JDT_MSG_HELLO, 0,
                                   0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
        FAIL_IF(send(fd, h, sizeof h, 0) < 0, "send");
        FAIL_IF(!closed_by_peer(fd), "oversized frame not refused");
        close(fd);
        /* 3: a HELLO whose payload is random bytes */
        fd = raw_connect(c->port);
        uint8_t m[JDT_WIRE_HDR + 40];
        memcpy(m, h, sizeof h);
        m[8] = 40;
        m[9] = m[10] = m[11] = 0;
        uint32_t x = 12345;
        for (int i = 0; i < 40; i++) m[JDT_WIRE_HDR + i] = (uint8_t)((x = x * 1103515245u + 12345u) >> 24);
        FAIL_IF(send(fd, m, sizeof m, 0) < 0, "send");
        FAIL_IF(!closed_by_peer(fd), "malformed HELLO not refused");
        close(fd);
        /* 4: a first message that is not a HELLO */
        fd = raw_connect(c->port);
        h[6] = JDT_MSG_KV_SET;
        h[8] = h[9] = h[10] = h[11] = 0;
        FAIL_IF(send(fd, h, sizeof h, 0) < 0, "send");
        FAIL_IF(!closed_by_peer(fd), "KV_SET before HELLO not refused");
        close(fd);
        /* 5: connect and vanish */
        fd = raw_connect(c->port);
        close(fd);
        return 0;
    }
    if (c->rank == 1) sleep_s(1.0);
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init: %s", c->rank, e.msg);
    FAIL_IF(jdt_dist_barrier(d, 10, &e), "barrier: %s", e.msg);
    float f = 1;
    FAIL_IF(jdt_comm_allreduce(jdt_dist_world(d), &f, 1, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e),
            "allreduce: %s", e.msg);
    FAIL_IF(f != 2, "allreduce value");
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_garbage)
{
    int codes[3], want[3] = {0};
    run_procs(3, 2, garbage, NULL, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- start-up timeout lists the ranks that never arrived ---------------------------------------- */

static int startup_timeout(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    c->o.connect_timeout_s = 1.5;
    double t0 = jdt_now_s();
    jdt_status st = jdt_dist_init(&c->o, &d, &e);
    double dt = jdt_now_s() - t0;
    FAIL_IF(st != JDT_ERR_TIMEOUT, "rank %d: status %s: %s", c->rank, jdt_status_name(st), e.msg);
    FAIL_IF(!strstr(e.msg, "never arrived: 2, 3"), "rank %d: message: %s", c->rank, e.msg);
    FAIL_IF(dt > 10, "rank %d: took %.1f s", c->rank, dt);
    return 0;
}

START_TEST(test_startup_timeout)
{
    int codes[2], want[2] = {0};
    run_procs(2, 4, startup_timeout, NULL, 60, codes);
    expect_codes(2, codes, want);
}
END_TEST

/* ---- a hung rank (SIGSTOP) is declared lost after peer_timeout_s -------------------------------- */

static int hung_rank(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "init: %s", e.msg);
    int pid = (int)getpid();
    char key[32];
    snprintf(key, sizeof key, "pid/%d", c->rank);
    FAIL_IF(jdt_dist_kv_set(d, key, &pid, sizeof pid, &e), "kv_set: %s", e.msg);
    FAIL_IF(jdt_dist_barrier(d, 10, &e), "barrier: %s", e.msg);
    int victim = 0;
    if (c->rank == 0) {
        void *v;
        size_t n;
        FAIL_IF(jdt_dist_kv_get(d, "pid/2", 10, &v, &n, &e) || n != sizeof victim, "pid: %s", e.msg);
        memcpy(&victim, v, sizeof victim);
        jdt_free(v);
    }
    if (c->rank == 2) {
        raise(SIGSTOP);
        return 0;
    }
    double t0 = jdt_now_s();
    jdt_status st = jdt_dist_barrier(d, 30, &e);
    double dt = jdt_now_s() - t0;
    FAIL_IF(st != JDT_ERR_PEER_LOST, "rank %d: status %s: %s", c->rank, jdt_status_name(st), e.msg);
    FAIL_IF(!strstr(e.msg, "rank 2 (host 127.0.0.1)"), "rank %d: message: %s", c->rank, e.msg);
    FAIL_IF(!strstr(e.msg, "heartbeat"), "rank %d: message: %s", c->rank, e.msg);
    /* peer_timeout_s = 2: loose bound, limit + slack */
    FAIL_IF(dt > 10, "rank %d: took %.1f s", c->rank, dt);
    FAIL_IF(jdt_dist_check(d, &e) != JDT_ERR_PEER_LOST, "check after loss");
    void *v;
    size_t n;
    FAIL_IF(jdt_dist_kv_get(d, "pid/0", 0, &v, &n, &e) == JDT_OK, "kv works after the abort");
    if (c->rank == 0) kill(victim, SIGKILL);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_hung_rank)
{
    int codes[3];
    run_procs(3, 3, hung_rank, NULL, 20, codes);
    ck_assert_msg(codes[0] == 0, "rank 0 exited %d", codes[0]);
    ck_assert_msg(codes[1] == 0, "rank 1 exited %d", codes[1]);
    ck_assert_int_eq(codes[2], 100 + SIGKILL);
}
END_TEST

/* ---- the coordinator's host (rank 0) dies ------------------------------------------------------ */

static int coordinator_lost(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "init: %s", e.msg);
    /* everyone must be past the barrier (its answer comes from rank 0's thread) before rank 0 dies */
    if (c->rank != 0) {
        char key[16];
        snprintf(key, sizeof key, "ready/%d", c->rank);
        FAIL_IF(jdt_dist_kv_set(d, key, "1", 1, &e), "kv_set: %s", e.msg);
    } else {
        void *v;
        size_t n;
        FAIL_IF(jdt_dist_kv_get(d, "ready/1", 10, &v, &n, &e), "kv_get: %s", e.msg);
        jdt_free(v);
        FAIL_IF(jdt_dist_kv_get(d, "ready/2", 10, &v, &n, &e), "kv_get: %s", e.msg);
        jdt_free(v);
        raise(SIGKILL);
    }
    double t0 = jdt_now_s();
    float f = 1;
    jdt_status st = jdt_comm_allreduce(jdt_dist_world(d), &f, 1, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e);
    double dt = jdt_now_s() - t0;
    FAIL_IF(st != JDT_ERR_PEER_LOST, "rank %d: status %s: %s", c->rank, jdt_status_name(st), e.msg);
    FAIL_IF(!strstr(e.msg, "rank 0"), "rank %d: message: %s", c->rank, e.msg);
    FAIL_IF(dt > 10, "rank %d: took %.1f s", c->rank, dt);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_coordinator_lost)
{
    int codes[3], want[3] = {100 + SIGKILL, 0, 0};
    run_procs(3, 3, coordinator_lost, NULL, 30, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* ---- a standalone coordinator (not hosted by rank 0) ------------------------------------------ */

START_TEST(test_standalone_coordinator)
{
    int port, lfd = tu_free_listener(&port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        ck_assert_int_ge(pids[r], 0);
        if (pids[r] == 0) {
            close(lfd);
            jdt_dist_opts o;
            jdt_dist_opts_default(&o);
            o.rank = r;
            o.world_size = 2;
            o.coordinator = addr;
            o.token = TOKEN;
            o.host_coordinator = false;
            o.connect_timeout_s = 20;
            jdt_dist *d;
            jdt_err e;
            if (jdt_dist_init(&o, &d, &e)) {
                fprintf(stderr, "rank %d: %s\n", r, e.msg);
                _exit(1);
            }
            double v = r + 1;
            int rc = jdt_comm_allreduce(jdt_dist_world(d), &v, 1, JDT_DTYPE_F64, JDT_REDUCE_SUM, &e) ||
                     v != 3 || jdt_dist_barrier(d, 10, &e);
            jdt_dist_free(d);
            _exit(rc);
        }
    }
    jdt_dist_coord *c = NULL;
    jdt_err e;
    int bound = 0;
    ck_assert_int_eq(jdt_dist_coord_start(NULL, lfd, 2, TOKEN, 20, 2, &c, &bound, &e), JDT_OK);
    ck_assert_int_eq(bound, port);
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d failed", r);
    }
    jdt_dist_coord_free(c, 5);
    /* bad arguments */
    ck_assert_int_eq(jdt_dist_coord_start("127.0.0.1:0", -1, 0, TOKEN, 1, 1, &c, NULL, &e), JDT_ERR_INVALID);
    ck_assert_int_eq(jdt_dist_coord_start("bad", -1, 2, TOKEN, 1, 1, &c, NULL, &e), JDT_ERR_INVALID);
}
END_TEST

/* ---- hardening: floods, exact timeouts, barriers after a clean leave, socket ownership ------- */

#define FLOOD_CONNS 100

/* The flooder holds FLOOD_CONNS idle connections to the coordinator (never sending a byte) and
 * re-opens every one the coordinator drops, for 12 s. */
static int flooder(proc_ctx *c)
{
    int fds[FLOOD_CONNS];
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)c->port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < FLOOD_CONNS; i++) fds[i] = -1;
    long reopened = 0;
    double until = jdt_now_s() + 12;
    while (jdt_now_s() < until) {
        for (int i = 0; i < FLOOD_CONNS; i++) {
            if (fds[i] >= 0) {
                struct pollfd p = {fds[i], POLLIN, 0};
                char b;
                if (poll(&p, 1, 0) > 0 && recv(fds[i], &b, 1, MSG_DONTWAIT) <= 0) {
                    close(fds[i]);
                    fds[i] = -1;
                }
            }
            if (fds[i] < 0) {
                fds[i] = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(fds[i], (struct sockaddr *)&sa, sizeof sa) != 0) {
                    close(fds[i]);
                    fds[i] = -1;
                } else {
                    reopened++;
                }
            }
        }
        sleep_s(0.01);
    }
    fprintf(stderr, "flooder: opened %ld connections\n", reopened);
    return 0;
}

static int flood(proc_ctx *c, void *arg)
{
    if (c->rank == 2) return flooder(c);
    sleep_s(0.5 + 0.3 * c->rank); /* the flood is on before either rank arrives */
    c->o.connect_timeout_s = 10;
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init under a flood: %s", c->rank, e.msg);
    float f = 1;
    FAIL_IF(jdt_comm_allreduce(jdt_dist_world(d), &f, 1, JDT_DTYPE_F32, JDT_REDUCE_SUM, &e),
            "allreduce: %s", e.msg);
    FAIL_IF(f != 2, "allreduce value");
    FAIL_IF(jdt_dist_barrier(d, 10, &e), "barrier: %s", e.msg);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_startup_flood)
{
    int codes[3], want[3] = {0};
    run_procs(3, 2, flood, NULL, 60, codes);
    expect_codes(3, codes, want);
}
END_TEST

/* A program that accepts connections and never answers sits on the coordinator's port: the rank
 * gives up at its connect_timeout_s (1.5 s), not seconds later. */
START_TEST(test_connect_timeout_exact)
{
    int port, lfd = tu_free_listener(&port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.rank = 1;
    o.world_size = 2;
    o.coordinator = addr;
    o.token = TOKEN;
    o.host_coordinator = false;
    o.connect_timeout_s = 1.5;
    jdt_dist *d = NULL;
    jdt_err e;
    double t0 = jdt_now_s();
    jdt_status st = jdt_dist_init(&o, &d, &e);
    double dt = jdt_now_s() - t0;
    ck_assert_msg(st == JDT_ERR_TIMEOUT, "status %s: %s", jdt_status_name(st), e.msg);
    ck_assert_msg(strstr(e.msg, "dist.connect_timeout_s"), "message: %s", e.msg);
    ck_assert_msg(dt >= 1.45 && dt < 2.0, "gave up after %.2f s with a 1.5 s timeout", dt);
    close(lfd);
}
END_TEST

static int barrier_after_leave(proc_ctx *c, void *arg)
{
    jdt_dist *d;
    jdt_err e;
    FAIL_IF(jdt_dist_init(&c->o, &d, &e), "rank %d init: %s", c->rank, e.msg);
    FAIL_IF(jdt_dist_barrier(d, 10, &e), "first barrier: %s", e.msg);
    if (c->rank == 1) { /* finishes cleanly: BYE */
        jdt_dist_free(d);
        return 0;
    }
    sleep_s(0.5);
    double t0 = jdt_now_s();
    jdt_status st = jdt_dist_barrier(d, 30, &e);
    double dt = jdt_now_s() - t0;
    FAIL_IF(st == JDT_OK, "barrier without rank 1 succeeded");
    FAIL_IF(dt > 5, "barrier waited %.1f s for a rank that had left (timeout 30 s)", dt);
    FAIL_IF(!strstr(e.msg, "rank 1"), "message does not name rank 1: %s", e.msg);
    jdt_dist_free(d);
    return 0;
}

START_TEST(test_barrier_after_leave)
{
    int codes[2], want[2] = {0};
    run_procs(2, 2, barrier_after_leave, NULL, 60, codes);
    expect_codes(2, codes, want);
}
END_TEST

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1 || errno != EBADF;
}

/* The coordinator socket handed to jdt_dist_init / jdt_dist_coord_start is closed on every
 * failure path, so a caller that retries does not leak one socket per attempt. */
START_TEST(test_listen_fd_not_leaked)
{
    int port;
    jdt_err e;
    jdt_dist *d = NULL;
    jdt_dist_opts o;
    int lfd = tu_free_listener(&port);
    jdt_dist_opts_default(&o);
    o.world_size = 2;
    o.token = TOKEN;
    o.coord_listen_fd = lfd;
    o.peer_timeout_s = 0.5; /* invalid: fails before the coordinator starts */
    ck_assert_int_eq(jdt_dist_init(&o, &d, &e), JDT_ERR_INVALID);
    ck_assert_msg(!fd_open(lfd), "jdt_dist_init leaked the coordinator socket");
    lfd = tu_free_listener(&port);
    jdt_dist_coord *c = NULL;
    ck_assert_int_eq(jdt_dist_coord_start(NULL, lfd, 0, TOKEN, 1, 1, &c, NULL, &e), JDT_ERR_INVALID);
    ck_assert_msg(!fd_open(lfd), "jdt_dist_coord_start leaked the socket (bad world size)");
    lfd = tu_free_listener(&port);
    ck_assert_int_eq(jdt_dist_coord_start(NULL, lfd, 2, NULL, 1, 1, &c, NULL, &e), JDT_ERR_INVALID);
    ck_assert_msg(!fd_open(lfd), "jdt_dist_coord_start leaked the socket (no token)");
}
END_TEST

static Suite *dist_suite(void)
{
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, test_wire_codec);
    tcase_add_test(tc, test_token_and_addr);
    tcase_add_test(tc, test_bad_opts);
    tcase_add_test(tc, test_alloc_failures);
    tcase_set_timeout(tc, 120);
    suite_add_tcase(s, tc);
    tc = tcase_create("rendezvous");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_kv_barrier);
    tcase_add_test(tc, test_late_joiner);
    tcase_add_test(tc, test_advertised_hosts);
    tcase_add_test(tc, test_barrier_timeout);
    tcase_add_test(tc, test_wrong_token);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_startup_timeout);
    tcase_add_test(tc, test_hung_rank);
    tcase_add_test(tc, test_coordinator_lost);
    tcase_add_test(tc, test_standalone_coordinator);
    suite_add_tcase(s, tc);
    tc = tcase_create("hardening");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, test_startup_flood);
    tcase_add_test(tc, test_connect_timeout_exact);
    tcase_add_test(tc, test_barrier_after_leave);
    tcase_add_test(tc, test_listen_fd_not_leaked);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    return tu_run_suite(dist_suite());
}
