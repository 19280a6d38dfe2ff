/*
 * comm.c — collectives over the TCP data mesh, run by one communication thread per rank.
 *
 * Every collective is compiled into a list of steps; a step sends a byte range to one peer
 * and receives a byte range from another (optionally reducing it into place). One engine,
 * run_steps(), drives any step list with non-blocking sockets: it sends and receives at the
 * same time (full duplex), and pipelines across steps by gating each step's send on how much
 * of the previous step's receive has landed, so a ring moves data in chunks without waiting
 * for whole segments. Ring all-reduce = reduce-scatter steps then all-gather steps (bandwidth
 * optimal: each rank sends 2(k-1)/k of the buffer). Broadcast is a pipelined chain, all-to-all
 * a pairwise exchange. Before the data, ring neighbours swap a small header (kind, count,
 * dtype, op, root, group, sequence) so mismatched calls fail with a message instead of hanging.
 *
 * Never a hang: the engine polls in slices of at most 100 ms, checks the job's abort flag
 * (set by the monitor thread when the coordinator reports a lost rank) and the op deadline.
 */
#include "comm/comm-impl.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define JDT_COMM_CHUNK (256u * 1024u) /* reduction slice: stays in L2 */
#define MAX_IO (8u * 1024u * 1024u)   /* bytes per send()/recv() call */
#define HDR_MAGIC 0x4d4d4f43u         /* "COMM" */

typedef enum {
    OP_ALLREDUCE = 1,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER,
    OP_BROADCAST,
    OP_ALLTOALL,
    OP_BARRIER,
} op_kind;

static const char *const OP_NAME[] = {"?", "allreduce", "reduce_scatter", "allgather",
                                      "broadcast", "alltoall", "barrier"};

struct jdt_comm_work {
    jdt_comm_group *g;
    op_kind kind;
    void *buf;
    const void *send;
    size_t n_elems;
    jdt_dtype dt;
    jdt_reduce_op op;
    int root;
    uint64_t seq;
    bool done;
    double t_run0, t_run1; /* when the executor ran it (jdt_now_s) */
    jdt_status st;
    jdt_err err;
    jdt_comm_work *next;
};

typedef enum { GATE_NONE = 0, GATE_PREV, GATE_SAME } gate_kind;

typedef struct {
    int send_rank, recv_rank; /* global ranks, -1: nothing to send/receive */
    const uint8_t *send;
    size_t send_len;
    uint8_t *recv;
    size_t recv_len;
    bool reduce;
    gate_kind gate;
} step;

/* ---- reductions ------------------------------------------------------------------------------ */

static void reduce_f32(float *restrict dst, const float *restrict src, size_t n, jdt_reduce_op op)
{
    if (op == JDT_REDUCE_SUM) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    } else {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = src[i] > dst[i] ? src[i] : dst[i];
    }
}

static void reduce_f64(double *restrict dst, const double *restrict src, size_t n,
                       jdt_reduce_op op)
{
    if (op == JDT_REDUCE_SUM) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] += src[i];
    } else {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = src[i] > dst[i] ? src[i] : dst[i];
    }
}

void jdt_comm_reduce(void *dst, const void *src, size_t n_elems, jdt_dtype dt, jdt_reduce_op op)
{
    if (dt == JDT_DTYPE_F32) reduce_f32(dst, src, n_elems, op);
    else reduce_f64(dst, src, n_elems, op);
}

/* ---- the step engine -------------------------------------------------------------------------- */

/* How long a failed peer connection waits for the job's abort reason before naming that peer. */
#define PEER_EXPLAIN_S 2.0

static jdt_status peer_error(jdt_dist *d, int rank, const char *opname, const char *what,
                             jdt_err *e)
{
    /* If the coordinator explains (that rank was killed, or rank 0 died and that rank left
     * because of it), prefer its words: give its message a moment to arrive. */
    if (jdt_dist_await_abort(d, PEER_EXPLAIN_S)) return jdt_dist_check(d, e);
    return jdt_err_set(e, JDT_ERR_PEER_LOST, "%s: rank %d (host %s) %s", opname, rank,
                       jdt_dist_host(d, rank), what);
}

static jdt_status run_steps(jdt_dist *d, step *steps, int n_steps, size_t esize,
                            jdt_dtype dt, jdt_reduce_op op, const char *opname, jdt_err *e)
{
    int ss = 0, rs = 0;        /* current send / receive step */
    size_t so = 0, ro = 0;     /* bytes sent / committed (received and reduced) in it */
    size_t tmp = 0;            /* bytes in d->scratch not yet reduced */
    double deadline = jdt_now_s() + d->o.op_timeout_s;
    uint8_t *scratch = d->scratch;
    for (;;) {
        while (ss < n_steps && so == steps[ss].send_len) ss++, so = 0;
        while (rs < n_steps && ro == steps[rs].recv_len) rs++, ro = 0, tmp = 0;
        if (ss == n_steps && rs == n_steps) return JDT_OK;
        if (atomic_load(&d->aborted)) return jdt_dist_check(d, e);

        size_t avail = 0;
        int sfd = -1, rfd = -1;
        if (ss < n_steps) {
            const step *s = &steps[ss];
            size_t limit = s->send_len;
            int dep = s->gate == GATE_PREV ? ss - 1 : s->gate == GATE_SAME ? ss : -1;
            if (dep >= 0 && rs <= dep) limit = rs < dep ? 0 : (ro < limit ? ro : limit);
            avail = limit > so ? limit - so : 0;
            sfd = d->data_fd[s->send_rank];
        }
        if (rs < n_steps) rfd = d->data_fd[steps[rs].recv_rank];
        bool progress = false, want_out = false, want_in = false;

        if (avail > 0) {
            size_t len = avail < MAX_IO ? avail : MAX_IO;
            ssize_t w = send(sfd, steps[ss].send + so, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                so += (size_t)w;
                progress = true;
            } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                want_out = true;
            } else if (!(w < 0 && errno == EINTR)) {
                return peer_error(d, steps[ss].send_rank, opname,
                                  w < 0 ? strerror(errno) : "closed the connection", e);
            }
        }
        if (rs < n_steps) {
            step *s = &steps[rs];
            size_t left = s->recv_len - ro;
            ssize_t r;
            if (s->reduce) {
                size_t room = JDT_COMM_CHUNK - tmp;
                size_t want = left - tmp < room ? left - tmp : room;
                r = recv(rfd, scratch + tmp, want, MSG_DONTWAIT);
                if (r > 0) {
                    tmp += (size_t)r;
                    size_t n_el = tmp / esize;
                    jdt_comm_reduce(s->recv + ro, scratch, n_el, dt, op);
                    ro += n_el * esize;
                    size_t rem = tmp - n_el * esize;
                    if (rem) memmove(scratch, scratch + n_el * esize, rem);
                    tmp = rem;
                }
            } else {
                r = recv(rfd, s->recv + ro, left < MAX_IO ? left : MAX_IO, MSG_DONTWAIT);
                if (r > 0) ro += (size_t)r;
            }
            if (r > 0) {
                progress = true;
            } else if (r == 0) {
                return peer_error(d, s->recv_rank, opname, "closed the connection (EOF)", e);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                want_in = true;
            } else if (errno != EINTR) {
                return peer_error(d, s->recv_rank, opname, strerror(errno), e);
            }
        }
        if (progress) continue;
        if (jdt_now_s() > deadline) {
            int who = rs < n_steps ? steps[rs].recv_rank : steps[ss].send_rank;
            return jdt_err_set(e, JDT_ERR_TIMEOUT, "%s: no progress with rank %d (host %s) "
                               "within op_timeout_s = %.1f s", opname, who,
                               jdt_dist_host(d, who), d->o.op_timeout_s);
        }
        struct pollfd p[2];
        nfds_t np = 0;
        if (want_out && want_in && sfd == rfd) {
            p[np++] = (struct pollfd){sfd, POLLOUT | POLLIN, 0};
        } else {
            if (want_out) p[np++] = (struct pollfd){sfd, POLLOUT, 0};
            if (want_in) p[np++] = (struct pollfd){rfd, POLLIN, 0};
        }
        if (np == 0) continue;
        poll(p, np, 100);
    }
}

/* ---- compiling collectives to steps ------------------------------------------------------------ */

void jdt_comm_segment(size_t n_elems, int k, int i, size_t *first, size_t *count)
{
    size_t q = n_elems / (size_t)k, r = n_elems % (size_t)k, ui = (size_t)i;
    *first = ui * q + (ui < r ? ui : r);
    *count = q + (ui < r ? 1 : 0);
}

static int mod(int a, int k) { return ((a % k) + k) % k; }

/* Ring steps: reduce-scatter phase (if rs) then all-gather phase (if ag). */
static int ring_steps(jdt_comm_group *g, uint8_t *buf, size_t n_elems, size_t esize, bool rs,
                      bool ag, step *out)
{
    int k = g->n, i = g->index, n = 0;
    int next = g->ranks[mod(i + 1, k)], prev = g->ranks[mod(i - 1, k)];
    size_t off, cnt;
    for (int s = 0; rs && s < k - 1; s++) {
        step *st = &out[n++];
        memset(st, 0, sizeof *st);
        st->send_rank = next;
        st->recv_rank = prev;
        jdt_comm_segment(n_elems, k, mod(i - s - 1, k), &off, &cnt);
        st->send = buf + off * esize;
        st->send_len = cnt * esize;
        jdt_comm_segment(n_elems, k, mod(i - s - 2, k), &off, &cnt);
        st->recv = buf + off * esize;
        st->recv_len = cnt * esize;
        st->reduce = true;
        st->gate = s == 0 ? GATE_NONE : GATE_PREV;
    }
    for (int t = 0; ag && t < k - 1; t++) {
        step *st = &out[n++];
        memset(st, 0, sizeof *st);
        st->send_rank = next;
        st->recv_rank = prev;
        jdt_comm_segment(n_elems, k, mod(i - t, k), &off, &cnt);
        st->send = buf + off * esize;
        st->send_len = cnt * esize;
        jdt_comm_segment(n_elems, k, mod(i - t - 1, k), &off, &cnt);
        st->recv = buf + off * esize;
        st->recv_len = cnt * esize;
        st->gate = (t == 0 && !rs) ? GATE_NONE : GATE_PREV;
    }
    return n;
}

typedef struct {
    uint32_t magic, kind, dtype, op;
    int32_t root, group_n;
    uint32_t shm_off, reserved; /* disable_shm must agree: the paths speak differently */
    uint64_t n_elems, group_id, seq;
} op_header;

static jdt_status exchange_header(jdt_comm_work *w, jdt_err *e)
{
    jdt_comm_group *g = w->g;
    jdt_dist *d = g->d;
    int k = g->n, i = g->index;
    op_header mine, theirs;
    memset(&mine, 0, sizeof mine);
    mine.magic = HDR_MAGIC;
    mine.kind = w->kind;
    mine.dtype = w->dt;
    mine.op = w->op;
    mine.root = w->root;
    mine.group_n = k;
    mine.shm_off = d->o.disable_shm;
    mine.n_elems = w->n_elems;
    mine.group_id = g->id;
    mine.seq = w->seq;
    step s = {g->ranks[mod(i + 1, k)], g->ranks[mod(i - 1, k)], (const uint8_t *)&mine,
              sizeof mine, (uint8_t *)&theirs, sizeof theirs, false, GATE_NONE};
    const char *name = OP_NAME[w->kind];
    jdt_status st = run_steps(d, &s, 1, 1, w->dt, w->op, name, e);
    if (st) return st;
    int from = s.recv_rank;
    if (theirs.magic != HDR_MAGIC)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "%s: garbage from rank %d (host %s): the data "
                           "streams are out of step", name, from, jdt_dist_host(d, from));
    const char *what = NULL;
    char detail[160] = "";
    if (theirs.group_id != mine.group_id || theirs.group_n != mine.group_n) what = "group";
    else if (theirs.seq != mine.seq) what = "call sequence";
    else if (theirs.kind != mine.kind) {
        what = "collective";
        snprintf(detail, sizeof detail, " (%s there, %s here)",
                 theirs.kind < JDT_ARRAY_LEN(OP_NAME) ? OP_NAME[theirs.kind] : "?", name);
    } else if (theirs.n_elems != mine.n_elems) {
        what = "element count";
        snprintf(detail, sizeof detail, " (%llu there, %llu here)",
                 (unsigned long long)theirs.n_elems, (unsigned long long)mine.n_elems);
    } else if (theirs.dtype != mine.dtype) what = "dtype";
    else if (theirs.op != mine.op) what = "reduce op";
    else if (theirs.root != mine.root) what = "root";
    else if (theirs.shm_off != mine.shm_off) what = "disable_shm option";
    if (what)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "%s: rank %d (host %s) called with a different "
                           "%s%s", name, from, jdt_dist_host(d, from), what, detail);
    return JDT_OK;
}

jdt_status jdt_comm_raw_allgather(jdt_comm_group *g, void *buf, size_t bytes_per_member,
                                  jdt_err *e)
{
    step *steps = jdt_malloc((size_t)(2 * g->n) * sizeof *steps);
    if (!steps) return jdt_err_set(e, JDT_ERR_NOMEM, "set-up exchange");
    int n = ring_steps(g, buf, (size_t)g->n * bytes_per_member, 1, false, true, steps);
    jdt_status st = run_steps(g->d, steps, n, 1, JDT_DTYPE_U8, JDT_REDUCE_SUM, "set-up exchange", e);
    jdt_free(steps);
    return st;
}

static int bcast_step(jdt_comm_group *g, void *buf, size_t bytes, int root, step *s)
{
    int k = g->n, i = g->index, p = mod(i - root, k);
    memset(s, 0, sizeof *s);
    s->send_rank = g->ranks[mod(i + 1, k)];
    s->recv_rank = g->ranks[mod(i - 1, k)];
    s->send = buf;
    s->send_len = p == k - 1 ? 0 : bytes;
    s->recv = buf;
    s->recv_len = p == 0 ? 0 : bytes;
    s->gate = p == 0 ? GATE_NONE : GATE_SAME;
    return 1;
}

jdt_status jdt_comm_raw_broadcast(jdt_comm_group *g, void *buf, size_t n_bytes, jdt_err *e)
{
    step s;
    bcast_step(g, buf, n_bytes, 0, &s);
    return run_steps(g->d, &s, 1, 1, JDT_DTYPE_U8, JDT_REDUCE_SUM, "set-up exchange", e);
}

static jdt_status run_work(jdt_comm_work *w, jdt_err *e)
{
    jdt_comm_group *g = w->g;
    jdt_dist *d = g->d;
    int k = g->n, i = g->index;
    size_t esize = jdt_dtype_size(w->dt);
    const char *name = OP_NAME[w->kind];
    jdt_status st = JDT_OK;
    if (k == 1) {
        if (w->kind == OP_ALLTOALL && w->n_elems)
            memcpy(w->buf, w->send, w->n_elems * esize);
        return jdt_dist_check(d, e);
    }
    st = exchange_header(w, e);
    if (st) return st;
    bool shm_kind = w->kind == OP_ALLREDUCE || w->kind == OP_REDUCE_SCATTER ||
                    w->kind == OP_ALLGATHER;
    if (shm_kind && !d->o.disable_shm && g->shm_state == 0) {
        st = jdt_shm_setup(g, &g->shm, e);
        if (st) return st;
        g->shm_state = g->shm ? 1 : -1;
    }
    step *steps = jdt_malloc((size_t)(2 * k) * sizeof *steps);
    if (!steps) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: step list", name);
    int n = 0;
    uint8_t *barrier_buf = NULL;
    switch (w->kind) {
    case OP_ALLREDUCE:
        if (g->shm) {
            st = jdt_shm_allreduce(d, g->shm, w->buf, w->n_elems, w->dt, w->op, e);
            goto out;
        }
        n = ring_steps(g, w->buf, w->n_elems, esize, true, true, steps);
        break;
    case OP_REDUCE_SCATTER:
        if (g->shm) {
            st = jdt_shm_reduce_scatter(d, g->shm, w->buf, w->n_elems, w->dt, w->op, e);
            goto out;
        }
        n = ring_steps(g, w->buf, w->n_elems, esize, true, false, steps);
        break;
    case OP_ALLGATHER:
        if (g->shm) {
            st = jdt_shm_allgather(d, g->shm, w->buf, w->n_elems, w->dt, e);
            goto out;
        }
        n = ring_steps(g, w->buf, w->n_elems, esize, false, true, steps);
        break;
    case OP_BARRIER:
        /* an all-gather of one byte per member: nobody leaves before everybody's byte came */
        barrier_buf = jdt_calloc((size_t)k, 1);
        if (!barrier_buf) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "barrier");
            goto out;
        }
        n = ring_steps(g, barrier_buf, (size_t)k, 1, false, true, steps);
        break;
    case OP_BROADCAST:
        n = bcast_step(g, w->buf, w->n_elems * esize, w->root, steps);
        break;
    case OP_ALLTOALL: {
        size_t row = w->n_elems * esize;
        if (row) memcpy((uint8_t *)w->buf + (size_t)i * row, (const uint8_t *)w->send + (size_t)i * row, row);
        for (int s = 1; s < k; s++) {
            int to = mod(i + s, k), from = mod(i - s, k);
            step *st2 = &steps[n++];
            memset(st2, 0, sizeof *st2);
            st2->send_rank = g->ranks[to];
            st2->recv_rank = g->ranks[from];
            st2->send = (const uint8_t *)w->send + (size_t)to * row;
            st2->send_len = row;
            st2->recv = (uint8_t *)w->buf + (size_t)from * row;
            st2->recv_len = row;
            st2->gate = GATE_NONE;
        }
        break;
    }
    }
    st = run_steps(d, steps, n, esize, w->dt, w->op, name, e);
out:
    jdt_free(barrier_buf);
    jdt_free(steps);
    return st;
}

/* ---- the communication thread ------------------------------------------------------------------ */

/* Runs one work on the calling thread, which holds the executor role (comm_busy). After a
 * failure the streams are out of step: later works fail with the first error. */
static void execute(jdt_dist *d, jdt_comm_work *w, bool stopping)
{
    jdt_err_clear(&w->err);
    w->t_run0 = jdt_now_s();
    if (stopping) {
        w->st = jdt_err_set(&w->err, JDT_ERR_INTERRUPTED, "%s: the job is shutting down",
                            OP_NAME[w->kind]);
    } else if (d->comm_failed) {
        w->st = d->comm_failed;
        w->err = d->comm_err;
    } else {
        w->st = run_work(w, &w->err);
        if (w->st) {
            d->comm_failed = w->st;
            d->comm_err = w->err;
            /* make sure every rank stops */
            if (!atomic_load(&d->aborted)) jdt_dist_abort(d, w->err.msg);
        }
    }
    w->t_run1 = jdt_now_s();
}

static void *comm_main(void *arg)
{
    jdt_dist *d = arg;
    pthread_mutex_lock(&d->q_mu);
    for (;;) {
        while ((!d->q_head || d->comm_busy) && !d->comm_stop)
            pthread_cond_wait(&d->q_cv, &d->q_mu);
        if (d->comm_busy) { /* stopping while a caller executes inline: let it finish */
            pthread_cond_wait(&d->q_cv, &d->q_mu);
            continue;
        }
        jdt_comm_work *w = d->q_head;
        if (!w) break;
        d->q_head = w->next;
        if (!d->q_head) d->q_tail = NULL;
        bool stopping = d->comm_stop;
        d->comm_busy = true;
        pthread_mutex_unlock(&d->q_mu);
        execute(d, w, stopping);
        pthread_mutex_lock(&d->q_mu);
        d->comm_busy = false;
        w->done = true;
        pthread_cond_broadcast(&d->q_cv);
    }
    pthread_mutex_unlock(&d->q_mu);
    return NULL;
}

static jdt_status group_make(jdt_dist *d, int n, const int *ranks, jdt_comm_group **out,
                             jdt_err *e)
{
    *out = NULL;
    if (n < 1 || n > d->o.world_size)
        return jdt_err_set(e, JDT_ERR_INVALID, "group of %d ranks in a world of %d", n,
                           d->o.world_size);
    jdt_comm_group *g = jdt_calloc(1, sizeof *g);
    int *r = jdt_malloc((size_t)n * sizeof *r);
    if (!g || !r) {
        jdt_free(g);
        jdt_free(r);
        return jdt_err_set(e, JDT_ERR_NOMEM, "group of %d ranks", n);
    }
    g->d = d;
    g->n = n;
    g->ranks = r;
    g->index = -1;
    g->id = JDT_HASH_INIT;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= d->o.world_size) {
            jdt_comm_group_free(g);
            return jdt_err_set(e, JDT_ERR_INVALID, "group member %d: rank %d out of range [0, %d)",
                               i, ranks[i], d->o.world_size);
        }
        for (int j = 0; j < i; j++) {
            if (ranks[j] == ranks[i]) {
                jdt_comm_group_free(g);
                return jdt_err_set(e, JDT_ERR_INVALID, "group lists rank %d twice", ranks[i]);
            }
        }
        r[i] = ranks[i];
        if (ranks[i] == d->o.rank) g->index = i;
        g->id = jdt_hash_u64(g->id, (uint64_t)ranks[i]);
    }
    if (g->index < 0) {
        jdt_comm_group_free(g);
        return jdt_err_set(e, JDT_ERR_INVALID, "rank %d is not a member of the group it creates",
                           d->o.rank);
    }
    *out = g;
    return JDT_OK;
}

jdt_status jdt_comm_start_thread(jdt_dist *d, jdt_err *e)
{
    int n = d->o.world_size;
    int *all = jdt_malloc((size_t)n * sizeof *all);
    if (!all) return jdt_err_set(e, JDT_ERR_NOMEM, "world group");
    for (int r = 0; r < n; r++) all[r] = r;
    jdt_status st = group_make(d, n, all, &d->world, e);
    jdt_free(all);
    if (st) return st;
    d->scratch = jdt_malloc_aligned(JDT_COMM_CHUNK);
    if (!d->scratch) return jdt_err_set(e, JDT_ERR_NOMEM, "communication scratch buffer");
    if (jdt_thread_create(&d->comm_thread, comm_main, d) != 0)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cannot start the communication thread");
    d->comm_started = true;
    return JDT_OK;
}

void jdt_comm_stop_thread(jdt_dist *d)
{
    if (d->comm_started) {
        pthread_mutex_lock(&d->q_mu);
        d->comm_stop = true;
        pthread_cond_broadcast(&d->q_cv);
        pthread_mutex_unlock(&d->q_mu);
        pthread_join(d->comm_thread, NULL);
        d->comm_started = false;
    }
    jdt_comm_group_free(d->world);
    d->world = NULL;
    jdt_free_aligned(d->scratch);
    d->scratch = NULL;
}

/* ---- public API ---------------------------------------------------------------------------------- */

jdt_comm_group *jdt_dist_world(jdt_dist *d) { return d->world; }

jdt_status jdt_comm_group_new(jdt_dist *d, int n, const int *ranks, jdt_comm_group **out,
                              jdt_err *e)
{
    if (!ranks) return jdt_err_set(e, JDT_ERR_INVALID, "group: no rank list");
    return group_make(d, n, ranks, out, e);
}

void jdt_comm_group_free(jdt_comm_group *g)
{
    if (!g) return;
    jdt_shm_free(g->shm);
    jdt_free(g->ranks);
    jdt_free(g);
}

int jdt_comm_group_size(const jdt_comm_group *g) { return g->n; }
int jdt_comm_group_index(const jdt_comm_group *g) { return g->index; }

/* Validates the call and fills w (not yet queued). */
static jdt_status prepare(jdt_comm_group *g, op_kind kind, void *buf, const void *send,
                          size_t n_elems, jdt_dtype dt, jdt_reduce_op op, int root,
                          jdt_comm_work *w, jdt_err *e)
{
    const char *name = OP_NAME[kind];
    if (!g) return jdt_err_set(e, JDT_ERR_INVALID, "%s: no group", name);
    if ((int)dt < 0 || dt >= JDT_DTYPE_COUNT)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: bad dtype %d", name, (int)dt);
    bool reducing = kind == OP_ALLREDUCE || kind == OP_REDUCE_SCATTER;
    if (reducing && dt != JDT_DTYPE_F32 && dt != JDT_DTYPE_F64)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: dtype %s not supported (f32, f64)", name,
                           jdt_dtype_name(dt));
    if (reducing && ((int)op < 0 || op >= JDT_REDUCE_COUNT))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: unknown reduce op %d", name, (int)op);
    if (kind == OP_BROADCAST && (root < 0 || root >= g->n))
        return jdt_err_set(e, JDT_ERR_INVALID, "broadcast: root %d not in a group of %d", root,
                           g->n);
    size_t esize = jdt_dtype_size(dt), rows = kind == OP_ALLTOALL ? (size_t)g->n : 1;
    if (n_elems > SIZE_MAX / esize / rows)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: %zu elements overflow", name, n_elems);
    if (n_elems && kind != OP_BARRIER && !buf)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: NULL buffer", name);
    if (kind == OP_ALLTOALL && n_elems && (!send || send == buf))
        return jdt_err_set(e, JDT_ERR_INVALID, "alltoall: send and recv must be distinct buffers");
    jdt_status st = jdt_dist_check(g->d, e);
    if (st) return st;
    memset(w, 0, sizeof *w);
    w->g = g;
    w->kind = kind;
    w->buf = buf;
    w->send = send;
    w->n_elems = n_elems;
    w->dt = dt;
    w->op = reducing ? op : JDT_REDUCE_SUM;
    w->root = kind == OP_BROADCAST ? root : 0;
    return JDT_OK;
}

/* Queues a prepared work for the comm thread (q_mu held). */
static void enqueue_locked(jdt_dist *d, jdt_comm_work *w)
{
    w->seq = ++w->g->seq;
    if (d->q_tail) d->q_tail->next = w;
    else d->q_head = w;
    d->q_tail = w;
    pthread_cond_broadcast(&d->q_cv);
}

static jdt_status submit(jdt_comm_group *g, op_kind kind, void *buf, const void *send,
                         size_t n_elems, jdt_dtype dt, jdt_reduce_op op, int root,
                         jdt_comm_work **out, jdt_err *e)
{
    *out = NULL;
    jdt_comm_work tmp;
    jdt_status st = prepare(g, kind, buf, send, n_elems, dt, op, root, &tmp, e);
    if (st) return st;
    jdt_comm_work *w = jdt_malloc(sizeof *w);
    if (!w) return jdt_err_set(e, JDT_ERR_NOMEM, "%s", OP_NAME[kind]);
    *w = tmp;
    jdt_dist *d = g->d;
    pthread_mutex_lock(&d->q_mu);
    enqueue_locked(d, w);
    pthread_mutex_unlock(&d->q_mu);
    *out = w;
    return JDT_OK;
}

jdt_status jdt_comm_wait(jdt_comm_work *w, jdt_err *e)
{
    return jdt_comm_wait_timed(w, NULL, NULL, e);
}

jdt_status jdt_comm_wait_timed(jdt_comm_work *w, double *run_start_s, double *run_end_s, jdt_err *e)
{
    if (!w) return jdt_err_set(e, JDT_ERR_INVALID, "wait: no work");
    jdt_dist *d = w->g->d;
    pthread_mutex_lock(&d->q_mu);
    while (!w->done) pthread_cond_wait(&d->q_cv, &d->q_mu);
    pthread_mutex_unlock(&d->q_mu);
    if (run_start_s) *run_start_s = w->t_run0;
    if (run_end_s) *run_end_s = w->t_run1;
    jdt_status st = w->st;
    if (st && e) *e = w->err;
    jdt_free(w);
    return st;
}

/* A blocking collective runs on the caller's thread when nothing is queued or running (two
 * thread hand-offs saved: they dominate small messages), else it queues behind the others. */
static jdt_status run_blocking(jdt_comm_group *g, op_kind kind, void *buf, const void *send,
                               size_t n_elems, jdt_dtype dt, jdt_reduce_op op, int root,
                               jdt_err *e)
{
    jdt_comm_work *w = jdt_malloc(sizeof *w);
    if (!w) return jdt_err_set(e, JDT_ERR_NOMEM, "%s", OP_NAME[kind]);
    jdt_status st = prepare(g, kind, buf, send, n_elems, dt, op, root, w, e);
    if (st) {
        jdt_free(w);
        return st;
    }
    jdt_dist *d = g->d;
    pthread_mutex_lock(&d->q_mu);
    if (!d->q_head && !d->comm_busy && !d->comm_stop) {
        d->comm_busy = true;
        w->seq = ++g->seq;
        pthread_mutex_unlock(&d->q_mu);
        execute(d, w, false);
        pthread_mutex_lock(&d->q_mu);
        d->comm_busy = false;
        w->done = true;
        pthread_cond_broadcast(&d->q_cv);
    } else {
        enqueue_locked(d, w);
    }
    pthread_mutex_unlock(&d->q_mu);
    return jdt_comm_wait(w, e);
}

jdt_status jdt_comm_allreduce(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              jdt_reduce_op op, jdt_err *e)
{
    return run_blocking(g, OP_ALLREDUCE, buf, NULL, n_elems, dt, op, 0, e);
}

jdt_status jdt_comm_reduce_scatter(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                   jdt_reduce_op op, jdt_err *e)
{
    return run_blocking(g, OP_REDUCE_SCATTER, buf, NULL, n_elems, dt, op, 0, e);
}

jdt_status jdt_comm_allgather(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              jdt_err *e)
{
    return run_blocking(g, OP_ALLGATHER, buf, NULL, n_elems, dt, JDT_REDUCE_SUM, 0, e);
}

jdt_status jdt_comm_broadcast(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              int root, jdt_err *e)
{
    return run_blocking(g, OP_BROADCAST, buf, NULL, n_elems, dt, JDT_REDUCE_SUM, root, e);
}

jdt_status jdt_comm_alltoall(jdt_comm_group *g, const void *send, void *recv, size_t n_elems,
                             jdt_dtype dt, jdt_err *e)
{
    return run_blocking(g, OP_ALLTOALL, recv, send, n_elems, dt, JDT_REDUCE_SUM, 0, e);
}

jdt_status jdt_comm_barrier(jdt_comm_group *g, jdt_err *e)
{
    return run_blocking(g, OP_BARRIER, NULL, NULL, 0, JDT_DTYPE_U8, JDT_REDUCE_SUM, 0, e);
}

jdt_status jdt_comm_allreduce_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    jdt_reduce_op op, jdt_comm_work **w, jdt_err *e)
{
    return submit(g, OP_ALLREDUCE, buf, NULL, n_elems, dt, op, 0, w, e);
}

jdt_status jdt_comm_reduce_scatter_start(jdt_comm_group *g, void *buf, size_t n_elems,
                                         jdt_dtype dt, jdt_reduce_op op, jdt_comm_work **w,
                                         jdt_err *e)
{
    return submit(g, OP_REDUCE_SCATTER, buf, NULL, n_elems, dt, op, 0, w, e);
}

jdt_status jdt_comm_allgather_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    jdt_comm_work **w, jdt_err *e)
{
    return submit(g, OP_ALLGATHER, buf, NULL, n_elems, dt, JDT_REDUCE_SUM, 0, w, e);
}

jdt_status jdt_comm_broadcast_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    int root, jdt_comm_work **w, jdt_err *e)
{
    return submit(g, OP_BROADCAST, buf, NULL, n_elems, dt, JDT_REDUCE_SUM, root, w, e);
}

jdt_status jdt_comm_alltoall_start(jdt_comm_group *g, const void *send, void *recv,
                                   size_t n_elems, jdt_dtype dt, jdt_comm_work **w, jdt_err *e)
{
    return submit(g, OP_ALLTOALL, recv, send, n_elems, dt, JDT_REDUCE_SUM, 0, w, e);
}
