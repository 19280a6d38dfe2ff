/*
 * dist.c — one rank's side of the job: joining (one rank, 0 by default, hosts the coordinator),
 * the peer table, the data mesh (rank j connects to every i < j and authenticates with the job
 * token), the monitor thread (heartbeats out, responses and ABORT in, coordinator silence
 * detection), the KV store and barrier requests, and clean shutdown.
 *
 * Thread safety: every public call may come from any thread; KV/barrier requests are
 * serialised (one in flight per context), collectives execute one at a time in issue order.
 */
#include "comm/comm-impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void jdt_dist_opts_default(jdt_dist_opts *o)
{
    memset(o, 0, sizeof *o);
    o->rank = 0;
    o->world_size = 1;
    o->coordinator = "127.0.0.1:0";
    o->token = "";
    o->host_coordinator = true;
    o->coordinator_rank = 0;
    o->coord_listen_fd = -1;
    o->connect_timeout_s = 60;
    o->heartbeat_s = 1;
    o->peer_timeout_s = 10;
    o->op_timeout_s = 600;
    o->advertise_host = NULL;
}

void jdt_dist_set_abort(jdt_dist *d, jdt_status code, const char *fmt, ...)
{
    pthread_mutex_lock(&d->mu);
    if (!atomic_load(&d->aborted)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->abort_msg, sizeof d->abort_msg, fmt, ap);
        va_end(ap);
        d->abort_code = code;
        atomic_store(&d->aborted, 1);
        jdt_job_lost_set(d->abort_msg); /* a wait for a compile elsewhere ends too */
        /* a warning now, not an error: the call that meets the abort fails with this message
         * and the process's closing line is the error; this one is for a process that does not
         * get to print it (a scheduler's kill: srun ends a step's other tasks once one fails) */
        JDT_WARN("the job is ending: %s", d->abort_msg);
    }
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Waits on d->cv (d->mu held) for at most 20 ms: callers loop on a deadline of the monotonic
 * clock (jdt_now_s), the condvar's timeout is on the realtime clock. */
static void cv_wait_short(jdt_dist *d)
{
    struct timespec abs;
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_nsec += 20 * 1000 * 1000;
    if (abs.tv_nsec >= 1000000000L) {
        abs.tv_sec++;
        abs.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&d->cv, &d->mu, &abs);
}

bool jdt_dist_await_abort(jdt_dist *d, double secs)
{
    const double deadline = jdt_now_s() + secs;
    pthread_mutex_lock(&d->mu);
    while (!atomic_load(&d->aborted) && jdt_now_s() < deadline)
        cv_wait_short(d);
    pthread_mutex_unlock(&d->mu);
    return atomic_load(&d->aborted);
}

jdt_status jdt_dist_check(jdt_dist *d, jdt_err *e)
{
    if (!atomic_load(&d->aborted)) return JDT_OK;
    pthread_mutex_lock(&d->mu);
    jdt_status st = jdt_err_set(e, d->abort_code, "%s", d->abort_msg);
    pthread_mutex_unlock(&d->mu);
    return st;
}

int jdt_dist_rank(const jdt_dist *d) { return d->o.rank; }
int jdt_dist_world_size(const jdt_dist *d) { return d->o.world_size; }

const char *jdt_dist_host(const jdt_dist *d, int rank)
{
    if (!d->peers || rank < 0 || rank >= d->o.world_size) return "?";
    return d->peers[rank].host;
}

static jdt_status coord_send(jdt_dist *d, jdt_wbuf *b, jdt_err *e)
{
    pthread_mutex_lock(&d->send_mu);
    jdt_status st = d->coord_fd >= 0
                        ? jdt_wire_send(d->coord_fd, b, jdt_now_s() + d->o.peer_timeout_s, NULL,
                                        "coordinator", e)
                        : jdt_err_set(e, JDT_ERR_NET, "no coordinator connection");
    pthread_mutex_unlock(&d->send_mu);
    return st;
}

/* "ADDR, hosted by rank R at HOST" where this rank knows which rank hosts the coordinator, else
 * "ADDR" (the address names its host): for the messages about losing it. */
static void coord_desc(const jdt_dist *d, char *buf, size_t cap)
{
    int r = d->o.coordinator_rank;
    if (d->o.host_coordinator && r >= 0)
        snprintf(buf, cap, "%s, hosted by rank %d at %s", d->o.coordinator, r, jdt_dist_host(d, r));
    else
        snprintf(buf, cap, "%s", d->o.coordinator);
}

static void *monitor_main(void *arg)
{
    jdt_dist *d = arg;
    char coord[2 * JDT_HOST_MAX + 64];
    coord_desc(d, coord, sizeof coord);
    double now = jdt_now_s(), next_hb = now + d->o.heartbeat_s, last_heard = now;
    jdt_wbuf hb;
    jdt_wbuf_init(&hb);
    while (!atomic_load(&d->stop)) {
        struct pollfd p = {d->coord_fd, POLLIN, 0};
        int rc = poll(&p, 1, 50);
        now = jdt_now_s();
        if (rc > 0) {
            jdt_msg_type t;
            uint8_t *payload = NULL;
            uint32_t len = 0;
            jdt_err e;
            jdt_status st = jdt_wire_recv(d->coord_fd, &t, &payload, &len,
                                          now + d->o.peer_timeout_s, &d->stop, "coordinator", &e);
            if (st) {
                if (atomic_load(&d->stop)) break;
                jdt_dist_set_abort(d, st == JDT_ERR_NOMEM ? st : JDT_ERR_PEER_LOST,
                                   "lost the coordinator (%s): %s", coord, e.msg);
                break;
            }
            last_heard = jdt_now_s();
            if (t == JDT_MSG_ABORT) {
                jdt_rbuf rb = {payload, len, 0, false};
                jdt_rbuf_u32(&rb);
                uint32_t code = jdt_rbuf_u32(&rb);
                char reason[900];
                jdt_rbuf_str(&rb, reason, sizeof reason);
                if (rb.bad || code == 0 || code >= JDT_STATUS_COUNT) {
                    code = JDT_ERR_PROTOCOL;
                    snprintf(reason, sizeof reason, "the coordinator sent a malformed ABORT");
                }
                jdt_dist_set_abort(d, (jdt_status)code, "job aborted by the coordinator: %s",
                                   reason);
                jdt_free(payload);
            } else if (t == JDT_MSG_PONG) {
                jdt_free(payload);
            } else {
                pthread_mutex_lock(&d->mu);
                jdt_free(d->resp);
                d->resp = payload;
                d->resp_len = len;
                d->resp_type = t;
                d->resp_ready = true;
                pthread_cond_broadcast(&d->cv);
                pthread_mutex_unlock(&d->mu);
            }
        } else if (now - last_heard > d->o.peer_timeout_s) {
            jdt_dist_set_abort(d, JDT_ERR_PEER_LOST, "lost the coordinator (%s): silent for %.1f s",
                               coord, now - last_heard);
            break;
        }
        if (now >= next_hb) {
            jdt_err e;
            jdt_wbuf_begin(&hb, JDT_MSG_HEARTBEAT);
            if (coord_send(d, &hb, &e) && !atomic_load(&d->stop)) {
                jdt_dist_set_abort(d, JDT_ERR_PEER_LOST, "lost the coordinator (%s): %s", coord,
                                   e.msg);
                break;
            }
            next_hb = now + d->o.heartbeat_s;
        }
    }
    jdt_wbuf_free(&hb);
    return NULL;
}

/* Sends b and waits for the response (any non-PONG, non-ABORT frame) up to wait_s. *resp is
 * jdt_malloc'd. */
static jdt_status request(jdt_dist *d, jdt_wbuf *b, double wait_s, jdt_msg_type want,
                          uint8_t **resp, uint32_t *resp_len, jdt_err *e)
{
    jdt_status st;
    pthread_mutex_lock(&d->req_mu);
    st = jdt_dist_check(d, e);
    if (st) goto out_unlock_req;
    pthread_mutex_lock(&d->mu);
    jdt_free(d->resp);
    d->resp = NULL;
    d->resp_ready = false;
    pthread_mutex_unlock(&d->mu);
    st = coord_send(d, b, e);
    if (st) goto out_unlock_req;
    double deadline = jdt_now_s() + wait_s;
    pthread_mutex_lock(&d->mu);
    while (!d->resp_ready && !atomic_load(&d->aborted) && jdt_now_s() < deadline)
        cv_wait_short(d);
    if (d->resp_ready) {
        d->resp_ready = false;
        if (d->resp_type != want) {
            st = jdt_err_set(e, JDT_ERR_PROTOCOL, "coordinator answered with message type %d, "
                             "expected %d", (int)d->resp_type, (int)want);
        } else {
            *resp = d->resp;
            *resp_len = d->resp_len;
            d->resp = NULL;
        }
    } else if (atomic_load(&d->aborted)) {
        st = jdt_err_set(e, d->abort_code, "%s", d->abort_msg);
    } else {
        st = jdt_err_set(e, JDT_ERR_TIMEOUT, "no answer from the coordinator within %.1f s",
                         wait_s);
    }
    pthread_mutex_unlock(&d->mu);
out_unlock_req:
    pthread_mutex_unlock(&d->req_mu);
    return st;
}

jdt_status jdt_dist_kv_set(jdt_dist *d, const char *key, const void *value, size_t n_bytes,
                           jdt_err *e)
{
    if (!key || !*key || strlen(key) > JDT_KV_MAX_KEY)
        return jdt_err_set(e, JDT_ERR_INVALID, "kv_set: key empty or over %u bytes", JDT_KV_MAX_KEY);
    if (n_bytes > JDT_KV_MAX_VALUE)
        return jdt_err_set(e, JDT_ERR_INVALID, "kv_set '%s': value of %zu bytes over %u", key,
                           n_bytes, JDT_KV_MAX_VALUE);
    jdt_wbuf b;
    jdt_wbuf_init(&b);
    jdt_wbuf_begin(&b, JDT_MSG_KV_SET);
    jdt_wbuf_str(&b, key);
    jdt_wbuf_bytes(&b, value, n_bytes);
    uint8_t *resp = NULL;
    uint32_t len;
    jdt_status st = request(d, &b, d->o.peer_timeout_s, JDT_MSG_ACK, &resp, &len, e);
    if (st) jdt_err_prefix(e, "kv_set '%s'", key);
    jdt_free(resp);
    jdt_wbuf_free(&b);
    return st;
}

jdt_status jdt_dist_kv_get(jdt_dist *d, const char *key, double timeout_s, void **value,
                           size_t *n_bytes, jdt_err *e)
{
    *value = NULL;
    *n_bytes = 0;
    if (!key || !*key || strlen(key) > JDT_KV_MAX_KEY)
        return jdt_err_set(e, JDT_ERR_INVALID, "kv_get: key empty or over %u bytes", JDT_KV_MAX_KEY);
    if (timeout_s < 0 || timeout_s > 86400)
        return jdt_err_set(e, JDT_ERR_INVALID, "kv_get '%s': timeout %g s out of range", key,
                           timeout_s);
    jdt_wbuf b;
    jdt_wbuf_init(&b);
    jdt_wbuf_begin(&b, JDT_MSG_KV_GET);
    jdt_wbuf_str(&b, key);
    jdt_wbuf_u32(&b, (uint32_t)(timeout_s * 1000));
    uint8_t *resp = NULL;
    uint32_t len;
    jdt_status st = request(d, &b, timeout_s + d->o.peer_timeout_s, JDT_MSG_KV_VALUE, &resp, &len, e);
    if (st) {
        jdt_err_prefix(e, "kv_get '%s'", key);
        goto out;
    }
    jdt_rbuf rb = {resp, len, 0, false};
    uint32_t found = jdt_rbuf_u32(&rb);
    const uint8_t *p;
    size_t n = jdt_rbuf_bytes(&rb, &p, JDT_KV_MAX_VALUE);
    if (rb.bad) {
        st = jdt_err_set(e, JDT_ERR_PROTOCOL, "kv_get '%s': malformed answer", key);
        goto out;
    }
    if (!found) {
        st = jdt_err_set(e, JDT_ERR_TIMEOUT, "kv_get '%s': key not set within %.1f s", key,
                         timeout_s);
        goto out;
    }
    *value = jdt_malloc(n ? n : 1);
    if (!*value) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "kv_get '%s'", key);
        goto out;
    }
    memcpy(*value, p, n);
    *n_bytes = n;
out:
    jdt_free(resp);
    jdt_wbuf_free(&b);
    return st;
}

jdt_status jdt_dist_barrier(jdt_dist *d, double timeout_s, jdt_err *e)
{
    if (timeout_s < 0 || timeout_s > 86400)
        return jdt_err_set(e, JDT_ERR_INVALID, "barrier: timeout %g s out of range", timeout_s);
    jdt_wbuf b;
    jdt_wbuf_init(&b);
    jdt_wbuf_begin(&b, JDT_MSG_BARRIER);
    jdt_wbuf_u32(&b, ++d->barrier_seq);
    jdt_wbuf_u32(&b, (uint32_t)(timeout_s * 1000));
    uint8_t *resp = NULL;
    uint32_t len;
    jdt_status st = request(d, &b, timeout_s + d->o.peer_timeout_s, JDT_MSG_BARRIER_DONE, &resp,
                            &len, e);
    if (st) {
        jdt_err_prefix(e, "barrier");
        goto out;
    }
    jdt_rbuf rb = {resp, len, 0, false};
    uint32_t ok = jdt_rbuf_u32(&rb);
    char msg[600];
    jdt_rbuf_str(&rb, msg, sizeof msg);
    if (rb.bad) st = jdt_err_set(e, JDT_ERR_PROTOCOL, "barrier: malformed answer");
    else if (!ok) st = jdt_err_set(e, JDT_ERR_TIMEOUT, "%s", msg);
out:
    jdt_free(resp);
    jdt_wbuf_free(&b);
    return st;
}

void jdt_dist_abort(jdt_dist *d, const char *reason)
{
    if (!atomic_load(&d->aborted) && d->coord_fd >= 0) {
        jdt_wbuf b;
        jdt_err e;
        jdt_wbuf_init(&b);
        jdt_wbuf_begin(&b, JDT_MSG_ABORT);
        jdt_wbuf_u32(&b, (uint32_t)d->o.rank);
        jdt_wbuf_u32(&b, JDT_ERR_PEER_LOST);
        jdt_wbuf_str(&b, reason);
        coord_send(d, &b, &e);
        jdt_wbuf_free(&b);
    }
    jdt_dist_set_abort(d, JDT_ERR_PEER_LOST, "aborted locally: %s", reason);
}

/* ---- start-up -------------------------------------------------------------------------------- */

static jdt_status check_opts(const jdt_dist_opts *o, jdt_err *e)
{
    if (o->world_size < 1 || o->world_size > 65536)
        return jdt_err_set(e, JDT_ERR_INVALID, "world size %d out of range [1, 65536]", o->world_size);
    if (o->rank < 0 || o->rank >= o->world_size)
        return jdt_err_set(e, JDT_ERR_INVALID, "rank %d out of range [0, %d)", o->rank, o->world_size);
    if (!o->token || strlen(o->token) >= JDT_TOKEN_MAX)
        return jdt_err_set(e, JDT_ERR_INVALID, "job token missing or over %u bytes", JDT_TOKEN_MAX - 1);
    if (!(o->connect_timeout_s > 0) || !(o->heartbeat_s > 0) || !(o->peer_timeout_s > o->heartbeat_s) ||
        !(o->op_timeout_s > 0))
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "timeouts must be positive and peer_timeout_s (%g) > heartbeat_s (%g)",
                           o->peer_timeout_s, o->heartbeat_s);
    if (!o->coordinator || strlen(o->coordinator) >= JDT_HOST_MAX)
        return jdt_err_set(e, JDT_ERR_INVALID, "coordinator address missing or over %u bytes",
                           JDT_HOST_MAX - 1);
    if (o->host_coordinator && (o->coordinator_rank < -1 || o->coordinator_rank >= o->world_size))
        return jdt_err_set(e, JDT_ERR_INVALID, "coordinator rank %d out of range [-1, %d)",
                           o->coordinator_rank, o->world_size);
    return JDT_OK;
}

static jdt_status join_once(jdt_dist *d, const char *host, int port, double deadline, jdt_err *e);

static jdt_status join(jdt_dist *d, double deadline, jdt_err *e)
{
    const jdt_dist_opts *o = &d->o;
    char host[JDT_HOST_MAX];
    int port;
    jdt_status st = jdt_net_parse_addr(o->coordinator, host, sizeof host, &port, e);
    if (st) return st;
    /* A connection the coordinator closes before answering (it dropped us as the oldest of
     * too many silent connections during a flood, or it is restarting) is retried until the
     * deadline; a refusal with a reason, garbage or the deadline are final. */
    for (int attempt = 0;; attempt++) {
        st = join_once(d, host, port, deadline, e);
        if (st != JDT_ERR_PEER_LOST || jdt_now_s() >= deadline) break;
        JDT_DEBUG("rank %d: the coordinator closed the connection before answering (%s); "
                  "retrying", o->rank, e ? e->msg : "");
        if (d->coord_fd >= 0) close(d->coord_fd);
        d->coord_fd = -1;
        struct timespec ts = {0, (attempt < 10 ? 20 : 200) * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return st;
}

/* One attempt of join: connect, HELLO, wait for the peer table (or a refusal) until the
 * deadline. ERR_PEER_LOST: the connection was closed before any answer. */
static jdt_status join_once(jdt_dist *d, const char *host, int port, double deadline, jdt_err *e)
{
    const jdt_dist_opts *o = &d->o;
    jdt_status st = jdt_net_connect(host, port, deadline, NULL, &d->coord_fd, e);
    if (st) return jdt_err_prefix(e, "rank %d: cannot reach the coordinator", o->rank);
    jdt_net_tune(d->coord_fd, 0);
    char adv[JDT_HOST_MAX];
    if (o->advertise_host) snprintf(adv, sizeof adv, "%s", o->advertise_host);
    else jdt_net_local_ip(d->coord_fd, adv, sizeof adv);

    jdt_wbuf b;
    jdt_wbuf_init(&b);
    jdt_wbuf_begin(&b, JDT_MSG_HELLO);
    jdt_wbuf_str(&b, d->token);
    jdt_wbuf_u32(&b, (uint32_t)o->rank);
    jdt_wbuf_u32(&b, (uint32_t)o->world_size);
    jdt_wbuf_str(&b, adv);
    jdt_wbuf_u32(&b, (uint32_t)d->data_port);
    jdt_wbuf_u32(&b, (uint32_t)getpid());
    st = jdt_wire_send(d->coord_fd, &b, deadline, NULL, "coordinator", e);
    jdt_wbuf_free(&b);
    if (st) return st;

    /* the coordinator gives up 0.1 s before our deadline and says which ranks never came;
     * we wait exactly until our own deadline (dist.connect_timeout_s), not a moment longer */
    jdt_msg_type t;
    uint8_t *p = NULL;
    uint32_t len;
    for (;;) {
        st = jdt_wire_recv(d->coord_fd, &t, &p, &len, deadline, NULL, "coordinator", e);
        if (st) {
            if (st == JDT_ERR_TIMEOUT)
                return jdt_err_set(e, JDT_ERR_TIMEOUT,
                                   "rank %d: start-up timed out after %.1f s (dist.connect_timeout_s) "
                                   "waiting for the peer table from the coordinator at %s",
                                   o->rank, o->connect_timeout_s, o->coordinator);
            if (st == JDT_ERR_PROTOCOL)
                return jdt_err_prefix(e, "rank %d: %s does not answer as a jdt-train coordinator "
                                      "(another program on that port?)", o->rank, o->coordinator);
            return jdt_err_prefix(e, "rank %d: joining", o->rank);
        }
        if (t != JDT_MSG_PONG) break;
        jdt_free(p);
    }
    jdt_rbuf rb = {p, len, 0, false};
    if (t == JDT_MSG_REJECT || t == JDT_MSG_ABORT) {
        if (t == JDT_MSG_ABORT) jdt_rbuf_u32(&rb);
        uint32_t code = jdt_rbuf_u32(&rb);
        char reason[900];
        jdt_rbuf_str(&rb, reason, sizeof reason);
        if (rb.bad || code == 0 || code >= JDT_STATUS_COUNT) code = JDT_ERR_PROTOCOL;
        st = jdt_err_set(e, (jdt_status)code, "rank %d: the coordinator at %s %s: %s", o->rank,
                         o->coordinator, t == JDT_MSG_REJECT ? "refused us" : "aborted the job",
                         rb.bad ? "(malformed message)" : reason);
        goto out_free;
    }
    if (t != JDT_MSG_WELCOME) {
        st = jdt_err_set(e, JDT_ERR_PROTOCOL, "rank %d: unexpected message type %d from the "
                         "coordinator during start-up", o->rank, (int)t);
        goto out_free;
    }
    uint32_t world = jdt_rbuf_u32(&rb);
    if (world != (uint32_t)o->world_size) rb.bad = true;
    for (int r = 0; r < o->world_size && !rb.bad; r++) {
        jdt_rbuf_str(&rb, d->peers[r].host, sizeof d->peers[r].host);
        d->peers[r].port = (int)jdt_rbuf_u32(&rb);
    }
    if (rb.bad) st = jdt_err_set(e, JDT_ERR_PROTOCOL, "rank %d: malformed peer table", o->rank);
out_free:
    jdt_free(p);
    return st;
}

/* Data mesh: connect to every lower rank, accept every higher one; each connection starts
 * with a HELLO carrying the token and the connector's rank, answered by an ACK. */
static jdt_status mesh(jdt_dist *d, int listen_fd, double deadline, jdt_err *e)
{
    const jdt_dist_opts *o = &d->o;
    jdt_status st = JDT_OK;
    jdt_wbuf b;
    jdt_wbuf_init(&b);
    char what[JDT_HOST_MAX + 64];
    for (int r = 0; r < o->rank; r++) {
        snprintf(what, sizeof what, "rank %d (%s:%d)", r, d->peers[r].host, d->peers[r].port);
        int fd;
        st = jdt_net_connect(d->peers[r].host, d->peers[r].port, deadline, &d->aborted, &fd, e);
        if (st) goto out;
        d->data_fd[r] = fd;
        jdt_wbuf_begin(&b, JDT_MSG_HELLO);
        jdt_wbuf_str(&b, d->token);
        jdt_wbuf_u32(&b, (uint32_t)o->rank);
        jdt_wbuf_u32(&b, (uint32_t)o->world_size);
        st = jdt_wire_send(fd, &b, deadline, &d->aborted, what, e);
        if (st) goto out;
    }
    int need = o->world_size - 1 - o->rank;
    while (need > 0) {
        st = jdt_dist_check(d, e);
        if (st) goto out;
        if (jdt_now_s() > deadline) {
            st = jdt_err_set(e, JDT_ERR_TIMEOUT, "%d higher rank(s) never connected", need);
            goto out;
        }
        struct pollfd p = {listen_fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        char name[64];
        jdt_net_peer_name(fd, name, sizeof name);
        jdt_msg_type t;
        uint8_t *pl = NULL;
        uint32_t len;
        jdt_err e2;
        double hs_deadline = jdt_now_s() + 5 < deadline ? jdt_now_s() + 5 : deadline;
        if (jdt_wire_recv(fd, &t, &pl, &len, hs_deadline, &d->aborted, name, &e2)) {
            JDT_WARN("rank %d: refused data connection from %s: %s", o->rank, name, e2.msg);
            close(fd);
            continue;
        }
        jdt_rbuf rb = {pl, len, 0, false};
        const uint8_t *tok;
        size_t tl = jdt_rbuf_bytes(&rb, &tok, JDT_TOKEN_MAX);
        uint32_t r = jdt_rbuf_u32(&rb), w = jdt_rbuf_u32(&rb);
        bool ok = !rb.bad && t == JDT_MSG_HELLO && jdt_net_token_eq(d->token, (const char *)tok, tl) &&
                  w == (uint32_t)o->world_size && r > (uint32_t)o->rank &&
                  r < (uint32_t)o->world_size && d->data_fd[r] < 0;
        jdt_free(pl);
        if (!ok) {
            JDT_WARN("rank %d: refused data connection from %s: bad handshake or token", o->rank, name);
            close(fd);
            continue;
        }
        d->data_fd[r] = fd;
        need--;
    }
out:
    jdt_wbuf_free(&b);
    return st;
}

jdt_status jdt_dist_init(const jdt_dist_opts *o, jdt_dist **out, jdt_err *e)
{
    *out = NULL;
    /* the coordinator socket is ours on every path: a failure before the coordinator takes it
     * over closes it here, so a retrying caller does not leak one socket per try */
    const bool hosting = o->host_coordinator && o->rank == o->coordinator_rank;
    bool own_listen = hosting && o->coord_listen_fd >= 0;
    jdt_status st = check_opts(o, e);
    if (st) {
        if (own_listen) close(o->coord_listen_fd);
        return st;
    }
    double deadline = jdt_now_s() + o->connect_timeout_s;
    jdt_dist *d = jdt_calloc(1, sizeof *d);
    if (!d) {
        if (own_listen) close(o->coord_listen_fd);
        return jdt_err_set(e, JDT_ERR_NOMEM, "dist context");
    }
    d->o = *o;
    snprintf(d->token, sizeof d->token, "%s", o->token);
    /* own copies of the strings used after init; advertise_host is only read during init */
    snprintf(d->coord_addr, sizeof d->coord_addr, "%s", o->coordinator);
    d->o.coordinator = d->coord_addr;
    d->o.token = d->token;
    d->coord_fd = -1;
    pthread_mutex_init(&d->send_mu, NULL);
    pthread_mutex_init(&d->req_mu, NULL);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    pthread_mutex_init(&d->q_mu, NULL);
    pthread_cond_init(&d->q_cv, NULL);
    int listen_fd = -1;
    d->peers = jdt_calloc((size_t)o->world_size, sizeof *d->peers);
    d->data_fd = jdt_malloc((size_t)o->world_size * sizeof *d->data_fd);
    if (!d->peers || !d->data_fd) {
        if (own_listen) close(o->coord_listen_fd);
        st = jdt_err_set(e, JDT_ERR_NOMEM, "peer table of %d ranks", o->world_size);
        goto out_fail;
    }
    for (int r = 0; r < o->world_size; r++) d->data_fd[r] = -1;

    if (hosting) {
        char bind_addr[JDT_HOST_MAX + 16];
        snprintf(bind_addr, sizeof bind_addr, "%s", o->coordinator);
        int port = 0;
        st = jdt_dist_coord_start(bind_addr, o->coord_listen_fd, o->world_size, o->token,
                                  o->connect_timeout_s, o->peer_timeout_s, &d->coord, &port, e);
        if (st) goto out_fail;
        /* serve on the address given, but with the port actually bound (it may have been 0) */
        char host[JDT_HOST_MAX];
        int given;
        if (jdt_net_parse_addr(o->coordinator, host, sizeof host, &given, NULL) == JDT_OK &&
            given != port) {
            snprintf(d->coord_addr, sizeof d->coord_addr, "%s:%d", host, port);
            d->o.coordinator = d->coord_addr;
        }
    }
    /* Listen for data connections only where peers will come from: the address this host
     * uses to reach the coordinator (loopback for a local job), which is also the address
     * advertised to them. An explicit advertise_host may be a name: listen on every address. */
    int data_port = 0;
    char data_host[JDT_HOST_MAX] = "0.0.0.0";
    if (!o->advertise_host) jdt_net_route_ip(d->o.coordinator, data_host, sizeof data_host);
    st = jdt_net_listen(data_host, 0, &listen_fd, &data_port, e);
    if (st) {
        jdt_err_prefix(e, "rank %d: data listener", o->rank);
        goto out_fail;
    }
    d->data_port = data_port;
    st = join(d, deadline, e);
    if (st) goto out_fail;
    d->formed = true;
    if (jdt_thread_create(&d->monitor, monitor_main, d) != 0) {
        st = jdt_err_set(e, JDT_ERR_INTERNAL, "cannot start the monitor thread");
        goto out_fail;
    }
    d->monitor_started = true;
    st = mesh(d, listen_fd, deadline, e);
    if (st) {
        jdt_err_prefix(e, "rank %d: connecting the data mesh", o->rank);
        goto out_fail;
    }
    close(listen_fd);
    listen_fd = -1;
    for (int r = 0; r < o->world_size; r++) {
        if (d->data_fd[r] < 0) continue;
        jdt_net_tune(d->data_fd[r], 0); /* kernel autotuning beats a fixed size here */
        st = jdt_net_set_nonblock(d->data_fd[r], true, e);
        if (st) goto out_fail;
    }
    st = jdt_comm_start_thread(d, e);
    if (st) goto out_fail;
    jdt_log_set_rank(o->rank, o->world_size);
    *out = d;
    return JDT_OK;
out_fail:
    if (listen_fd >= 0) close(listen_fd);
    /* the others already joined: tell them, so they stop now instead of at their deadline */
    if (d->formed) jdt_dist_abort(d, e ? e->msg : jdt_status_str(st));
    jdt_dist_free(d);
    return st;
}

void jdt_dist_free(jdt_dist *d)
{
    if (!d) return;
    jdt_comm_stop_thread(d);
    atomic_store(&d->stop, 1);
    if (d->monitor_started) pthread_join(d->monitor, NULL);
    if (d->coord_fd >= 0) {
        jdt_wbuf b;
        jdt_err e;
        jdt_wbuf_init(&b);
        jdt_wbuf_begin(&b, JDT_MSG_BYE);
        jdt_wire_send(d->coord_fd, &b, jdt_now_s() + 1, NULL, "coordinator", &e);
        jdt_wbuf_free(&b);
        close(d->coord_fd);
    }
    /* a formed job: the coordinator serves the others until they have left (this rank may
     * finish first: it need not be rank 0); else stop now so they fail fast */
    if (d->coord && d->formed) jdt_dist_coord_await(d->coord, d->o.connect_timeout_s);
    jdt_dist_coord_free(d->coord, 0);
    if (d->data_fd)
        for (int r = 0; r < d->o.world_size; r++)
            if (d->data_fd[r] >= 0) close(d->data_fd[r]);
    jdt_free(d->data_fd);
    jdt_free(d->peers);
    jdt_free(d->resp);
    pthread_mutex_destroy(&d->send_mu);
    pthread_mutex_destroy(&d->req_mu);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->q_mu);
    pthread_cond_destroy(&d->q_cv);
    jdt_free(d);
}
