/*
 * coord.c — the rendezvous coordinator: one thread, one poll() loop over a listening socket
 * and every connection, all non-blocking. It admits ranks that present the job token (compared
 * in constant time), hands out the peer table once all have arrived, serves the KV store and
 * barriers, and watches heartbeats. When a rank is lost (EOF/reset, silence past
 * peer_timeout_s, garbage) or the start-up deadline passes, it broadcasts ABORT to every rank
 * still connected, naming the lost rank and host or listing the ranks that never arrived.
 * Strangers and malformed frames are refused and logged; they never take the coordinator down.
 */
#include "comm/comm-impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PENDING 64
#define HELLO_MAX 4096
#define PENDING_TIMEOUT_S 10.0
#define SEND_TIMEOUT_S 2.0

typedef enum { RANK_ABSENT = 0, RANK_JOINED, RANK_LEFT, RANK_LOST } rank_state;
typedef enum { WAIT_NONE = 0, WAIT_KV, WAIT_BARRIER } wait_kind;

typedef struct {
    int fd;
    int rank; /* -1 while pending (no HELLO yet) */
    bool dead;
    char dead_why[128];
    double since;
    char name[64]; /* remote ip:port */
    uint8_t hdr[JDT_WIRE_HDR];
    size_t hdr_got;
    jdt_msg_type type;
    uint8_t *body;
    uint32_t body_len, body_got;
} conn;

typedef struct {
    rank_state state;
    int conn; /* index into conns or -1 */
    char host[JDT_HOST_MAX];
    int port;
    double last_seen;
    wait_kind wait;
    char key[JDT_KV_MAX_KEY + 1];
    uint32_t seq;
    double deadline;
} rank_info;

typedef struct {
    char *key;
    uint8_t *val;
    uint32_t len;
} kv_entry;

/* Warnings about strangers (floods, scanners, garbage) are rate-limited: one per second, with a
 * count of the ones held back, so a flood of refused connections is not a flood of log lines. */
typedef struct {
    double last;
    int held;
} warn_limit;

struct jdt_dist_coord {
    int listen_fd;
    int world;
    char token[JDT_TOKEN_MAX];
    double connect_timeout_s, peer_timeout_s;
    double start;
    pthread_t thread;
    bool thread_started;
    atomic_int stop;
    atomic_int all_done; /* every rank left or was lost (after forming), or start-up failed */
    atomic_int n_in_job; /* ranks joined and not yet left or lost */
    atomic_int job_aborted; /* ABORT was broadcast (a rank lost or aborting, start-up timeout) */

    conn *conns;
    int n_conns, cap_conns;
    rank_info *ranks; /* (world) */
    bool formed, aborted;
    kv_entry *kv;
    int n_kv, cap_kv;
    jdt_wbuf wb;
    warn_limit stranger_warn;
};

#define STRANGER_WARN_EVERY_S 1.0

static void stranger_warn(jdt_dist_coord *c, const char *fmt, ...) JDT_PRINTF(2, 3);
static void stranger_warn(jdt_dist_coord *c, const char *fmt, ...)
{
    double now = jdt_now_s();
    warn_limit *w = &c->stranger_warn;
    if (w->last > 0 && now - w->last < STRANGER_WARN_EVERY_S) {
        w->held++;
        return;
    }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->held > 0)
        JDT_WARN("coordinator: %s (and %d similar in the last %.0f s)", msg, w->held, now - w->last);
    else
        JDT_WARN("coordinator: %s", msg);
    w->last = now;
    w->held = 0;
}

static void conn_kill(conn *c, const char *fmt, ...) JDT_PRINTF(2, 3);
static void conn_kill(conn *c, const char *fmt, ...)
{
    if (c->dead) return;
    c->dead = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->dead_why, sizeof c->dead_why, fmt, ap);
    va_end(ap);
}

static void coord_send(jdt_dist_coord *c, conn *cn)
{
    if (cn->dead) return;
    jdt_err e;
    if (jdt_wire_send(cn->fd, &c->wb, jdt_now_s() + SEND_TIMEOUT_S, &c->stop, cn->name, &e))
        conn_kill(cn, "%s", e.msg);
}

static void send_to_rank(jdt_dist_coord *c, int r)
{
    if (c->ranks[r].state == RANK_JOINED && c->ranks[r].conn >= 0)
        coord_send(c, &c->conns[c->ranks[r].conn]);
}

static void broadcast_abort(jdt_dist_coord *c, int lost_rank, jdt_status code, const char *msg)
{
    if (c->aborted) return;
    c->aborted = true;
    /* debug only: the coordinator runs in a rank, whose closing line names the same end */
    JDT_DEBUG("coordinator: aborting the job: %s", msg);
    jdt_wbuf_begin(&c->wb, JDT_MSG_ABORT);
    jdt_wbuf_u32(&c->wb, (uint32_t)lost_rank);
    jdt_wbuf_u32(&c->wb, (uint32_t)code);
    jdt_wbuf_str(&c->wb, msg);
    for (int r = 0; r < c->world; r++)
        if (r != lost_rank) send_to_rank(c, r);
}

static void rank_lost(jdt_dist_coord *c, int r, const char *why)
{
    rank_info *ri = &c->ranks[r];
    if (ri->state != RANK_JOINED) return;
    ri->state = RANK_LOST;
    char msg[512];
    snprintf(msg, sizeof msg, "rank %d (host %s) lost: %s", r, ri->host, why);
    broadcast_abort(c, r, JDT_ERR_PEER_LOST, msg);
}

static void conn_close(jdt_dist_coord *c, int i)
{
    conn *cn = &c->conns[i];
    if (cn->rank >= 0 && c->ranks[cn->rank].conn == i) c->ranks[cn->rank].conn = -1;
    close(cn->fd);
    jdt_free(cn->body);
    /* swap-remove, fixing the moved conn's back-reference */
    int last = c->n_conns - 1;
    if (i != last) {
        c->conns[i] = c->conns[last];
        if (c->conns[i].rank >= 0 && c->ranks[c->conns[i].rank].conn == last)
            c->ranks[c->conns[i].rank].conn = i;
    }
    c->n_conns--;
}

static void send_reject(jdt_dist_coord *c, conn *cn, jdt_status code, const char *reason)
{
    jdt_wbuf_begin(&c->wb, JDT_MSG_REJECT);
    jdt_wbuf_u32(&c->wb, (uint32_t)code);
    jdt_wbuf_str(&c->wb, reason);
    coord_send(c, cn);
}

static void list_missing(jdt_dist_coord *c, char *out, size_t cap, int *n_missing, bool barrier,
                         uint32_t seq)
{
    size_t n = 0;
    *n_missing = 0;
    out[0] = 0;
    for (int r = 0; r < c->world; r++) {
        bool missing = barrier ? !(c->ranks[r].wait == WAIT_BARRIER && c->ranks[r].seq == seq)
                               : c->ranks[r].state == RANK_ABSENT;
        if (!missing) continue;
        (*n_missing)++;
        if (n + 16 < cap) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? ", " : "", r);
        else if (n + 4 < cap && out[n - 1] != '.') n += (size_t)snprintf(out + n, cap - n, "...");
    }
}

static void handle_hello(jdt_dist_coord *c, int ci, jdt_rbuf *rb)
{
    conn *cn = &c->conns[ci];
    const uint8_t *tok;
    size_t tok_len = jdt_rbuf_bytes(rb, &tok, JDT_TOKEN_MAX);
    uint32_t rank = jdt_rbuf_u32(rb), world = jdt_rbuf_u32(rb);
    char host[JDT_HOST_MAX];
    jdt_rbuf_str(rb, host, sizeof host);
    uint32_t port = jdt_rbuf_u32(rb);
    uint32_t pid = jdt_rbuf_u32(rb);
    if (rb->bad) {
        stranger_warn(c, "refused connection from %s: malformed HELLO", cn->name);
        conn_kill(cn, "malformed HELLO");
        return;
    }
    if (!jdt_net_token_eq(c->token, (const char *)tok, tok_len)) {
        stranger_warn(c, "refused connection from %s (claims rank %u): wrong job token", cn->name,
                      rank);
        send_reject(c, cn, JDT_ERR_AUTH, "wrong job token");
        conn_kill(cn, "wrong token");
        return;
    }
    char why[512] = "";
    if ((int)world != c->world)
        snprintf(why, sizeof why, "world size %u does not match the coordinator's %d", world,
                 c->world);
    else if (rank >= (uint32_t)c->world)
        snprintf(why, sizeof why, "rank %u out of range [0, %d)", rank, c->world);
    else if (port == 0 || port > 65535)
        snprintf(why, sizeof why, "bad data port %u", port);
    else if (c->ranks[rank].state != RANK_ABSENT)
        snprintf(why, sizeof why, "rank %u already joined (from host %s)", rank,
                 c->ranks[rank].host);
    else if (c->aborted)
        snprintf(why, sizeof why, "the job has already been aborted (start-up timeout?)");
    if (why[0]) {
        stranger_warn(c, "refused connection from %s: %s", cn->name, why);
        send_reject(c, cn, JDT_ERR_INVALID, why);
        conn_kill(cn, "%s", why);
        return;
    }
    rank_info *ri = &c->ranks[rank];
    ri->state = RANK_JOINED;
    ri->conn = ci;
    snprintf(ri->host, sizeof ri->host, "%s", host);
    ri->port = (int)port;
    ri->last_seen = jdt_now_s();
    cn->rank = (int)rank;
    JDT_DEBUG("coordinator: rank %u joined from %s (pid %u, data %s:%u)", rank, cn->name, pid,
              host, port);
    for (int r = 0; r < c->world; r++)
        if (c->ranks[r].state != RANK_JOINED) return;
    c->formed = true;
    jdt_wbuf_begin(&c->wb, JDT_MSG_WELCOME);
    jdt_wbuf_u32(&c->wb, (uint32_t)c->world);
    for (int r = 0; r < c->world; r++) {
        jdt_wbuf_str(&c->wb, c->ranks[r].host);
        jdt_wbuf_u32(&c->wb, (uint32_t)c->ranks[r].port);
    }
    double now = jdt_now_s();
    for (int r = 0; r < c->world; r++) {
        c->ranks[r].last_seen = now;
        send_to_rank(c, r);
    }
    JDT_DEBUG("coordinator: all %d ranks joined", c->world);
}

static kv_entry *kv_find(jdt_dist_coord *c, const char *key)
{
    for (int i = 0; i < c->n_kv; i++)
        if (strcmp(c->kv[i].key, key) == 0) return &c->kv[i];
    return NULL;
}

static void reply_kv(jdt_dist_coord *c, int r, const kv_entry *kv)
{
    jdt_wbuf_begin(&c->wb, JDT_MSG_KV_VALUE);
    jdt_wbuf_u32(&c->wb, kv ? 1 : 0);
    jdt_wbuf_bytes(&c->wb, kv ? kv->val : NULL, kv ? kv->len : 0);
    send_to_rank(c, r);
}

static void reply_barrier(jdt_dist_coord *c, int r, bool ok, const char *msg)
{
    jdt_wbuf_begin(&c->wb, JDT_MSG_BARRIER_DONE);
    jdt_wbuf_u32(&c->wb, ok ? 1 : 0);
    jdt_wbuf_str(&c->wb, msg);
    send_to_rank(c, r);
}

/* A barrier needs every rank: once one has left (BYE) or been lost, the ranks waiting in it
 * (and any that enter it later) fail now instead of waiting out their timeout. */
static void fail_barriers_without(jdt_dist_coord *c)
{
    int gone = -1;
    for (int r = 0; r < c->world && gone < 0; r++)
        if (c->ranks[r].state == RANK_LEFT || c->ranks[r].state == RANK_LOST) gone = r;
    if (gone < 0) return;
    char msg[256];
    snprintf(msg, sizeof msg, "barrier cannot complete: rank %d %s", gone,
             c->ranks[gone].state == RANK_LEFT ? "has already left the job (it finished or "
                                                  "stopped cleanly)"
                                                : "was lost");
    for (int r = 0; r < c->world; r++) {
        if (c->ranks[r].wait != WAIT_BARRIER || c->ranks[r].state != RANK_JOINED) continue;
        c->ranks[r].wait = WAIT_NONE;
        reply_barrier(c, r, false, msg);
    }
}

static void check_barrier(jdt_dist_coord *c, uint32_t seq)
{
    for (int r = 0; r < c->world; r++)
        if (!(c->ranks[r].wait == WAIT_BARRIER && c->ranks[r].seq == seq)) return;
    for (int r = 0; r < c->world; r++) {
        c->ranks[r].wait = WAIT_NONE;
        reply_barrier(c, r, true, "");
    }
}

static void handle_ranked(jdt_dist_coord *c, int ci, jdt_rbuf *rb)
{
    conn *cn = &c->conns[ci];
    int r = cn->rank;
    rank_info *ri = &c->ranks[r];
    ri->last_seen = jdt_now_s();
    switch (cn->type) {
    case JDT_MSG_HEARTBEAT:
        jdt_wbuf_begin(&c->wb, JDT_MSG_PONG);
        coord_send(c, cn);
        return;
    case JDT_MSG_KV_SET: {
        char key[JDT_KV_MAX_KEY + 1];
        jdt_rbuf_str(rb, key, sizeof key);
        const uint8_t *val;
        size_t n = jdt_rbuf_bytes(rb, &val, JDT_KV_MAX_VALUE);
        if (rb->bad) break;
        kv_entry *kv = kv_find(c, key);
        uint8_t *copy = jdt_malloc(n ? n : 1);
        if (!copy) break;
        memcpy(copy, val, n);
        if (!kv) {
            if (c->n_kv == c->cap_kv) {
                int cap = c->cap_kv ? 2 * c->cap_kv : 16;
                kv_entry *nk = jdt_realloc(c->kv, (size_t)cap * sizeof *nk);
                if (!nk) {
                    jdt_free(copy);
                    break;
                }
                c->kv = nk;
                c->cap_kv = cap;
            }
            kv = &c->kv[c->n_kv];
            kv->key = jdt_strdup(key);
            if (!kv->key) {
                jdt_free(copy);
                break;
            }
            kv->val = NULL;
            c->n_kv++;
        }
        jdt_free(kv->val);
        kv->val = copy;
        kv->len = (uint32_t)n;
        jdt_wbuf_begin(&c->wb, JDT_MSG_ACK);
        coord_send(c, cn);
        for (int w = 0; w < c->world; w++) {
            if (c->ranks[w].wait == WAIT_KV && strcmp(c->ranks[w].key, key) == 0) {
                c->ranks[w].wait = WAIT_NONE;
                reply_kv(c, w, kv);
            }
        }
        return;
    }
    case JDT_MSG_KV_GET: {
        jdt_rbuf_str(rb, ri->key, sizeof ri->key);
        uint32_t ms = jdt_rbuf_u32(rb);
        if (rb->bad) break;
        kv_entry *kv = kv_find(c, ri->key);
        if (kv || ms == 0) {
            reply_kv(c, r, kv);
        } else {
            ri->wait = WAIT_KV;
            ri->deadline = jdt_now_s() + ms / 1000.0;
        }
        return;
    }
    case JDT_MSG_BARRIER: {
        uint32_t seq = jdt_rbuf_u32(rb), ms = jdt_rbuf_u32(rb);
        if (rb->bad) break;
        ri->wait = WAIT_BARRIER;
        ri->seq = seq;
        ri->deadline = jdt_now_s() + ms / 1000.0;
        check_barrier(c, seq);
        fail_barriers_without(c);
        return;
    }
    case JDT_MSG_ABORT: {
        jdt_rbuf_u32(rb);
        jdt_rbuf_u32(rb);
        char reason[512];
        jdt_rbuf_str(rb, reason, sizeof reason);
        if (rb->bad) break;
        char msg[900];
        snprintf(msg, sizeof msg, "rank %d (host %s) aborted: %s", r, ri->host, reason);
        broadcast_abort(c, r, JDT_ERR_PEER_LOST, msg);
        return;
    }
    case JDT_MSG_BYE:
        ri->state = RANK_LEFT;
        ri->wait = WAIT_NONE;
        JDT_DEBUG("coordinator: rank %d left", r);
        conn_kill(cn, "left");
        fail_barriers_without(c);
        return;
    case JDT_MSG_HELLO:
    case JDT_MSG_WELCOME:
    case JDT_MSG_REJECT:
    case JDT_MSG_PONG:
    case JDT_MSG_KV_VALUE:
    case JDT_MSG_BARRIER_DONE:
    case JDT_MSG_ACK:
    case JDT_MSG_COUNT:
        break;
    }
    JDT_WARN("coordinator: rank %d (%s) sent a malformed or unexpected message (type %d)", r,
             cn->name, (int)cn->type);
    conn_kill(cn, "protocol violation (message type %d)", (int)cn->type);
}

/* Reads what is available on conn ci; dispatches complete frames. */
static void conn_read(jdt_dist_coord *c, int ci)
{
    for (;;) {
        conn *cn = &c->conns[ci];
        if (cn->dead) return;
        ssize_t got;
        if (cn->hdr_got < JDT_WIRE_HDR) {
            got = recv(cn->fd, cn->hdr + cn->hdr_got, JDT_WIRE_HDR - cn->hdr_got, MSG_DONTWAIT);
        } else {
            got = recv(cn->fd, cn->body + cn->body_got, cn->body_len - cn->body_got, MSG_DONTWAIT);
        }
        if (got == 0 && !(cn->hdr_got == JDT_WIRE_HDR && cn->body_len == 0)) {
            conn_kill(cn, "connection closed (EOF)");
            return;
        }
        if (got < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            conn_kill(cn, "%s", strerror(errno));
            return;
        }
        if (cn->hdr_got < JDT_WIRE_HDR) {
            cn->hdr_got += (size_t)got;
            if (cn->hdr_got < JDT_WIRE_HDR) continue;
            jdt_err e;
            if (jdt_wire_parse_hdr(cn->hdr, &cn->type, &cn->body_len, &e)) {
                if (cn->rank >= 0)
                    JDT_WARN("coordinator: refused rank %d's connection (%s): %s", cn->rank,
                             cn->name, e.msg);
                else
                    stranger_warn(c, "refused connection from %s: %s", cn->name, e.msg);
                conn_kill(cn, "garbage: %s", e.msg);
                return;
            }
            if (cn->rank < 0 && (cn->type != JDT_MSG_HELLO || cn->body_len > HELLO_MAX)) {
                stranger_warn(c, "refused connection from %s: expected HELLO", cn->name);
                conn_kill(cn, "no HELLO");
                return;
            }
            cn->body = jdt_malloc(cn->body_len ? cn->body_len : 1);
            if (!cn->body) {
                conn_kill(cn, "out of memory");
                return;
            }
            cn->body_got = 0;
        } else {
            cn->body_got += (uint32_t)got;
        }
        if (cn->body_got < cn->body_len) continue;
        jdt_rbuf rb = {cn->body, cn->body_len, 0, false};
        if (cn->rank < 0) handle_hello(c, ci, &rb);
        else handle_ranked(c, ci, &rb);
        cn = &c->conns[ci];
        jdt_free(cn->body);
        cn->body = NULL;
        cn->hdr_got = 0;
        cn->body_len = cn->body_got = 0;
    }
}

static void accept_new(jdt_dist_coord *c)
{
    for (;;) {
        int fd = accept4(c->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        /* Too many connections without a HELLO: drop the OLDEST one, not the newcomer. A
         * client holding idle connections open then cannot lock the real ranks out: a rank
         * sends its HELLO right after connecting, so it is never the oldest for long (and a
         * rank whose connection was dropped reconnects until its deadline). */
        int pending = 0, oldest = -1;
        for (int i = 0; i < c->n_conns; i++) {
            conn *p = &c->conns[i];
            if (p->rank >= 0 || p->dead) continue;
            pending++;
            if (oldest < 0 || p->since < c->conns[oldest].since) oldest = i;
        }
        char name[64];
        jdt_net_peer_name(fd, name, sizeof name);
        if (pending >= MAX_PENDING && oldest >= 0) {
            stranger_warn(c, "%d connections sent no HELLO; dropped the oldest (%s)", pending,
                          c->conns[oldest].name);
            conn_kill(&c->conns[oldest], "evicted: too many pending connections");
            /* close it now (not at the end of the loop turn), so the cap holds */
            conn_close(c, oldest);
        }
        if (c->n_conns == c->cap_conns) {
            int cap = c->cap_conns ? 2 * c->cap_conns : 16;
            conn *nc = jdt_realloc(c->conns, (size_t)cap * sizeof *nc);
            if (!nc) {
                close(fd);
                continue;
            }
            c->conns = nc;
            c->cap_conns = cap;
        }
        jdt_net_tune(fd, 0);
        conn *cn = &c->conns[c->n_conns++];
        memset(cn, 0, sizeof *cn);
        cn->fd = fd;
        cn->rank = -1;
        cn->since = jdt_now_s();
        snprintf(cn->name, sizeof cn->name, "%s", name);
    }
}

static void timers(jdt_dist_coord *c)
{
    double now = jdt_now_s();
    for (int i = 0; i < c->n_conns; i++) {
        conn *cn = &c->conns[i];
        if (cn->rank < 0 && now - cn->since > PENDING_TIMEOUT_S) {
            stranger_warn(c, "dropped connection from %s: no HELLO within %.0f s", cn->name,
                          PENDING_TIMEOUT_S);
            conn_kill(cn, "no HELLO");
        }
    }
    if (!c->formed && !c->aborted && now - c->start > c->connect_timeout_s) {
        char list[512];
        int n_missing;
        list_missing(c, list, sizeof list, &n_missing, false, 0);
        char msg[900];
        snprintf(msg, sizeof msg,
                 "start-up timed out after %.1f s: %d of %d ranks never arrived: %s",
                 c->connect_timeout_s, n_missing, c->world, list);
        broadcast_abort(c, -1, JDT_ERR_TIMEOUT, msg);
    }
    for (int r = 0; r < c->world; r++) {
        rank_info *ri = &c->ranks[r];
        if (ri->state != RANK_JOINED) continue;
        if (c->formed && now - ri->last_seen > c->peer_timeout_s) {
            char why[128];
            snprintf(why, sizeof why, "no heartbeat for %.1f s (hung or unreachable)",
                     now - ri->last_seen);
            rank_lost(c, r, why);
            if (ri->conn >= 0) conn_kill(&c->conns[ri->conn], "timed out");
            continue;
        }
        if (ri->wait != WAIT_NONE && now > ri->deadline) {
            if (ri->wait == WAIT_KV) {
                reply_kv(c, r, NULL);
            } else {
                char list[512], msg[600];
                int n_missing;
                list_missing(c, list, sizeof list, &n_missing, true, ri->seq);
                snprintf(msg, sizeof msg, "barrier timed out; ranks not arrived: %s", list);
                reply_barrier(c, r, false, msg);
            }
            ri->wait = WAIT_NONE;
        }
    }
}

static void *coord_main(void *arg)
{
    jdt_dist_coord *c = arg;
    struct pollfd *pfd = NULL;
    int cap_pfd = 0;
    while (!atomic_load(&c->stop)) {
        if (cap_pfd < c->n_conns + 1) {
            int cap = c->n_conns + 16;
            struct pollfd *np = jdt_realloc(pfd, (size_t)cap * sizeof *np);
            if (!np) { /* transient out of memory: try again shortly, never exit silently */
                struct timespec ts = {0, 50 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            pfd = np;
            cap_pfd = cap;
        }
        pfd[0] = (struct pollfd){c->listen_fd, POLLIN, 0};
        for (int i = 0; i < c->n_conns; i++) pfd[i + 1] = (struct pollfd){c->conns[i].fd, POLLIN, 0};
        int n = c->n_conns;
        int rc = poll(pfd, (nfds_t)n + 1, 50);
        if (rc > 0) {
            for (int i = 0; i < n; i++)
                if (pfd[i + 1].revents) conn_read(c, i);
            if (pfd[0].revents & POLLIN) accept_new(c);
        }
        timers(c);
        for (int i = c->n_conns - 1; i >= 0; i--) {
            if (!c->conns[i].dead) continue;
            int r = c->conns[i].rank;
            if (r >= 0) rank_lost(c, r, c->conns[i].dead_why);
            conn_close(c, i);
        }
        bool done = true;
        int in_job = 0;
        for (int r = 0; r < c->world; r++) {
            if (c->ranks[r].state == RANK_JOINED || (c->ranks[r].state == RANK_ABSENT && !c->aborted))
                done = false;
            in_job += c->ranks[r].state == RANK_JOINED;
        }
        atomic_store(&c->n_in_job, in_job);
        atomic_store(&c->job_aborted, c->aborted ? 1 : 0);
        atomic_store(&c->all_done, done ? 1 : 0);
    }
    jdt_free(pfd);
    return NULL;
}

jdt_status jdt_dist_coord_start(const char *bind_addr, int listen_fd, int world_size,
                                const char *token, double connect_timeout_s,
                                double peer_timeout_s, jdt_dist_coord **out, int *port_out,
                                jdt_err *e)
{
    jdt_status st = JDT_OK;
    *out = NULL;
    /* listen_fd is ours from here on, on every path: closed on failure, never leaked */
    if (world_size < 1) {
        st = jdt_err_set(e, JDT_ERR_INVALID, "coordinator: world size %d < 1", world_size);
        goto out_close_fd;
    }
    if (!token || strlen(token) >= JDT_TOKEN_MAX) {
        st = jdt_err_set(e, JDT_ERR_INVALID, "coordinator: token missing or over %u bytes",
                         JDT_TOKEN_MAX - 1);
        goto out_close_fd;
    }
    jdt_dist_coord *c = jdt_calloc(1, sizeof *c);
    if (!c) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "coordinator");
        goto out_close_fd;
    }
    c->listen_fd = -1;
    c->world = world_size;
    snprintf(c->token, sizeof c->token, "%s", token);
    c->connect_timeout_s = connect_timeout_s;
    c->peer_timeout_s = peer_timeout_s;
    jdt_wbuf_init(&c->wb);
    c->ranks = jdt_calloc((size_t)world_size, sizeof *c->ranks);
    if (!c->ranks) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "coordinator rank table");
        goto out_free;
    }
    for (int r = 0; r < world_size; r++) c->ranks[r].conn = -1;
    if (listen_fd >= 0) {
        c->listen_fd = listen_fd;
        listen_fd = -1;
        if (port_out) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            getsockname(c->listen_fd, (struct sockaddr *)&ss, &sl);
            *port_out = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    } else {
        char host[JDT_HOST_MAX];
        int port;
        st = jdt_net_parse_addr(bind_addr, host, sizeof host, &port, e);
        if (st) goto out_free;
        st = jdt_net_listen(host, port, &c->listen_fd, port_out, e);
        if (st) {
            jdt_err_prefix(e, "coordinator");
            goto out_free;
        }
    }
    st = jdt_net_set_nonblock(c->listen_fd, true, e);
    if (st) goto out_free;
    /* 0.1 s early: the ranks started with the coordinator then hear which ranks never arrived
     * just before their own connect_timeout_s deadline, instead of a bare timeout */
    c->start = jdt_now_s() - 0.1;
    if (jdt_thread_create(&c->thread, coord_main, c) != 0) {
        st = jdt_err_set(e, JDT_ERR_INTERNAL, "coordinator: cannot start thread");
        goto out_free;
    }
    c->thread_started = true;
    *out = c;
    return JDT_OK;
out_free:
    jdt_dist_coord_free(c, 0);
out_close_fd:
    if (listen_fd >= 0) close(listen_fd);
    return st;
}

void jdt_dist_coord_await(jdt_dist_coord *c, double abort_grace_s)
{
    if (!c || !c->thread_started) return;
    const double start = jdt_now_s();
    bool told = false;
    while (!atomic_load(&c->all_done)) {
        double waited = jdt_now_s() - start;
        if (atomic_load(&c->job_aborted) && waited >= abort_grace_s) return;
        if (!told && waited >= abort_grace_s) {
            JDT_INFO("this rank hosts the job's coordinator: it stays until the %d rank(s) "
                     "still in the job leave",
                     atomic_load(&c->n_in_job));
            told = true;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void jdt_dist_coord_free(jdt_dist_coord *c, double grace_s)
{
    if (!c) return;
    if (c->thread_started) {
        double until = jdt_now_s() + grace_s;
        while (!atomic_load(&c->all_done) && jdt_now_s() < until) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        atomic_store(&c->stop, 1);
        pthread_join(c->thread, NULL);
    }
    while (c->n_conns > 0) conn_close(c, c->n_conns - 1);
    if (c->listen_fd >= 0) close(c->listen_fd);
    for (int i = 0; i < c->n_kv; i++) {
        jdt_free(c->kv[i].key);
        jdt_free(c->kv[i].val);
    }
    jdt_free(c->kv);
    jdt_free(c->conns);
    jdt_free(c->ranks);
    jdt_wbuf_free(&c->wb);
    jdt_free(c);
}
