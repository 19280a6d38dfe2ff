/*
 * comm-impl.h — internals of engine/comm shared by net.c (sockets), wire.c (the rendezvous
 * protocol), coord.c (the coordinator), dist.c (the rank's client side) and comm.c
 * (collectives). Not for use outside engine/comm.
 */
#ifndef JDT_DIST_IMPL_H
#define JDT_DIST_IMPL_H

#include "comm/comm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- sockets (net.c) ------------------------------------------------------------------------ */

/* Splits "host:port"; host (size host_cap) and port. ERR_INVALID names the address. */
jdt_status jdt_net_parse_addr(const char *addr, char *host, size_t host_cap, int *port,
                              jdt_err *e);
/* Binds and listens on host:port (port 0 = any); *port_out = the bound port. */
jdt_status jdt_net_listen(const char *host, int port, int *fd_out, int *port_out, jdt_err *e);
/* Connects to host:port, retrying refused/unreachable until deadline (jdt_now_s clock).
 * abort_flag (may be NULL) is checked between tries. */
jdt_status jdt_net_connect(const char *host, int port, double deadline, atomic_int *abort_flag,
                           int *fd_out, jdt_err *e);
/* Sets TCP_NODELAY and keepalive; bufs > 0 also sets SO_SNDBUF/SO_RCVBUF. */
void jdt_net_tune(int fd, int bufs);
jdt_status jdt_net_set_nonblock(int fd, bool on, jdt_err *e);
/* Sends/receives exactly n bytes on a (blocking or not) socket, polling in slices of at most
 * 100 ms until deadline, and failing early when *abort_flag is set. what names the peer for
 * messages. recv: EOF is ERR_PEER_LOST. */
jdt_status jdt_net_send_all(int fd, const void *buf, size_t n, double deadline,
                            atomic_int *abort_flag, const char *what, jdt_err *e);
jdt_status jdt_net_recv_all(int fd, void *buf, size_t n, double deadline, atomic_int *abort_flag,
                            const char *what, jdt_err *e);
/* "ip:port" of the remote end (or "?"), for log lines. */
void jdt_net_peer_name(int fd, char *out, size_t cap);
/* The local IP address this host would use to reach addr ("host:port"), written into out
 * (left untouched if it cannot be found). Sends nothing. */
void jdt_net_route_ip(const char *addr, char *out, size_t cap);
/* The local IP address of a connected socket. */
void jdt_net_local_ip(int fd, char *out, size_t cap);
/* Token comparison whose time depends only on the expected token's length. */
bool jdt_net_token_eq(const char *expected, const char *got, size_t got_len);

/* ---- wire protocol (wire.c) ------------------------------------------------------------------
 * A frame: 16-byte header [magic u32 "JDTR"][version u16][type u16][len u32][reserved u32]
 * (little-endian) then len payload bytes, len <= JDT_WIRE_MAX_PAYLOAD. Payload fields are u32,
 * u64 and byte strings (u32 length + bytes), read through a bounds-checked reader. */

#define JDT_WIRE_MAGIC 0x5254444au /* "JDTR" little-endian */
#define JDT_WIRE_VERSION 1
#define JDT_WIRE_HDR 16
#define JDT_WIRE_MAX_PAYLOAD (256u * 1024u)
#define JDT_KV_MAX_KEY 255u
#define JDT_KV_MAX_VALUE (64u * 1024u)
#define JDT_TOKEN_MAX 256u
#define JDT_HOST_MAX 256u

typedef enum {
    JDT_MSG_HELLO = 1,   /* c->s: token, rank, world, host, port, pid */
    JDT_MSG_WELCOME,     /* s->c: world, (host, port) per rank */
    JDT_MSG_REJECT,      /* s->c: status, reason; the coordinator closes the connection */
    JDT_MSG_HEARTBEAT,   /* c->s */
    JDT_MSG_PONG,        /* s->c */
    JDT_MSG_KV_SET,      /* c->s: key, value */
    JDT_MSG_KV_GET,      /* c->s: key, timeout_ms */
    JDT_MSG_KV_VALUE,    /* s->c: found, value */
    JDT_MSG_BARRIER,     /* c->s: seq, timeout_ms */
    JDT_MSG_BARRIER_DONE,/* s->c: ok, message */
    JDT_MSG_ACK,         /* s->c */
    JDT_MSG_ABORT,       /* both: rank (-1 none), status, reason */
    JDT_MSG_BYE,         /* c->s: clean leave */
    JDT_MSG_COUNT
} jdt_msg_type;

typedef struct {
    uint8_t *data;
    size_t len, cap;
    bool oom;
} jdt_wbuf;

void jdt_wbuf_init(jdt_wbuf *b);
void jdt_wbuf_free(jdt_wbuf *b);
/* Starts a frame of the given type (writes a header, patched by jdt_wbuf_finish). */
void jdt_wbuf_begin(jdt_wbuf *b, jdt_msg_type type);
void jdt_wbuf_u32(jdt_wbuf *b, uint32_t v);
void jdt_wbuf_u64(jdt_wbuf *b, uint64_t v);
void jdt_wbuf_bytes(jdt_wbuf *b, const void *p, size_t n);
void jdt_wbuf_str(jdt_wbuf *b, const char *s);
/* Patches the length; ERR_NOMEM if an append failed, ERR_INVALID if over the payload bound. */
jdt_status jdt_wbuf_finish(jdt_wbuf *b, jdt_err *e);

typedef struct {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} jdt_rbuf;

/* Parses a header; ERR_PROTOCOL for a bad magic, version or length (message says which). */
jdt_status jdt_wire_parse_hdr(const uint8_t hdr[JDT_WIRE_HDR], jdt_msg_type *type, uint32_t *len,
                              jdt_err *e);
uint32_t jdt_rbuf_u32(jdt_rbuf *r);
uint64_t jdt_rbuf_u64(jdt_rbuf *r);
/* Points *p at a length-prefixed string of at most max bytes (not NUL-terminated). */
size_t jdt_rbuf_bytes(jdt_rbuf *r, const uint8_t **p, size_t max);
/* Copies a length-prefixed string of at most cap-1 bytes into out, NUL-terminated; a string
 * containing NUL or too long marks the reader bad. */
void jdt_rbuf_str(jdt_rbuf *r, char *out, size_t cap);

/* Blocking frame I/O with a deadline (see jdt_net_send_all). recv: *payload is jdt_malloc'd
 * (caller frees), len bytes. */
jdt_status jdt_wire_send(int fd, jdt_wbuf *b, double deadline, atomic_int *abort_flag,
                         const char *what, jdt_err *e);
jdt_status jdt_wire_recv(int fd, jdt_msg_type *type, uint8_t **payload, uint32_t *len,
                         double deadline, atomic_int *abort_flag, const char *what, jdt_err *e);

/* ---- the rank context (dist.c, comm.c) ------------------------------------------------------ */

typedef struct {
    char host[JDT_HOST_MAX];
    int port;
} jdt_peer;

typedef struct jdt_shm jdt_shm;

struct jdt_comm_group {
    jdt_dist *d;
    int n;        /* members */
    int index;    /* this rank's index */
    int *ranks;   /* (n) global rank of each member, ring order */
    uint64_t id;  /* hash of the member list, checked against the peers' on every call */
    uint64_t seq; /* collectives issued on this group */
    int shm_state; /* 0: not tried yet, 1: shared memory in use, -1: TCP only (comm thread) */
    jdt_shm *shm;
};

struct jdt_dist {
    jdt_dist_opts o;
    char coord_addr[JDT_HOST_MAX + 16]; /* own copy of o.coordinator (host: the bound port) */
    char token[JDT_TOKEN_MAX];
    jdt_peer *peers;       /* (world_size) data listener of each rank */
    int *data_fd;          /* (world_size) socket to each rank, -1 for self */
    jdt_dist_coord *coord; /* the coordinator this rank hosts, or NULL */
    bool formed;           /* the peer table arrived: every rank joined */

    int coord_fd;
    int data_port; /* this rank's data listener (sent in HELLO) */
    pthread_mutex_t send_mu; /* serialises frames on coord_fd */
    pthread_mutex_t req_mu;  /* one request/response at a time */
    pthread_mutex_t mu;      /* guards the response slot and the abort message */
    pthread_cond_t cv;
    bool resp_ready;
    jdt_msg_type resp_type;
    uint8_t *resp;
    uint32_t resp_len;
    uint32_t barrier_seq;

    atomic_int aborted; /* nonzero: the job is dead; abort_code/abort_msg say why */
    jdt_status abort_code;
    char abort_msg[1024];
    atomic_int stop;    /* threads must exit */
    pthread_t monitor;
    bool monitor_started;

    /* communication thread and its FIFO */
    pthread_t comm_thread;
    bool comm_started;
    bool comm_stop; /* guarded by q_mu */
    bool comm_busy; /* a thread is executing a collective (guarded by q_mu) */
    jdt_status comm_failed; /* first collective failure (read/written by the executor only) */
    jdt_err comm_err;
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    jdt_comm_work *q_head, *q_tail;
    jdt_comm_group *world;
    uint8_t *scratch; /* (JDT_COMM_CHUNK) receive buffer for reductions */
};

/* Records the first abort reason (later ones are ignored) and sets the flag. */
void jdt_dist_set_abort(jdt_dist *d, jdt_status code, const char *fmt, ...) JDT_PRINTF(3, 4);

/* The hosting rank's wait before it stops its coordinator (coord.c): returns once every rank
 * of the formed job has said goodbye or been lost, however long that takes (a live rank
 * heartbeats; a dead or silent one is lost within peer_timeout_s), or once the job has been
 * aborted and abort_grace_s have passed since this call. */
void jdt_dist_coord_await(jdt_dist_coord *c, double abort_grace_s);

/* Waits up to secs for an abort reason (the coordinator's ABORT, or the monitor finding the
 * coordinator gone); true if one is recorded. A peer connection that closes is usually the
 * echo of a failure elsewhere (that peer saw rank 0 die and exited): the reason names the
 * rank that failed, where the EOF would name only the messenger. */
bool jdt_dist_await_abort(jdt_dist *d, double secs);

/* Collective building blocks for set-up exchanges (comm.c), run on the comm thread inside
 * a collective: all-gather of bytes_per_member bytes per member (buf: (k, bytes_per_member)),
 * broadcast of n_bytes from group index 0. */
jdt_status jdt_comm_raw_allgather(jdt_comm_group *g, void *buf, size_t bytes_per_member,
                                  jdt_err *e);
jdt_status jdt_comm_raw_broadcast(jdt_comm_group *g, void *buf, size_t n_bytes, jdt_err *e);
/* dst[i] = dst[i] op src[i] for f32/f64 (vectorised). */
void jdt_comm_reduce(void *dst, const void *src, size_t n_elems, jdt_dtype dt, jdt_reduce_op op);

/* Shared-memory all-reduce for single-host groups (shm.c). setup: collective over g (inside a
 * collective, on the comm thread); *out stays NULL (and JDT_OK) when the members are not on
 * one host or shared memory is unavailable. */
jdt_status jdt_shm_setup(jdt_comm_group *g, jdt_shm **out, jdt_err *e);
jdt_status jdt_shm_allreduce(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems, jdt_dtype dt,
                             jdt_reduce_op op, jdt_err *e);
jdt_status jdt_shm_reduce_scatter(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems,
                                  jdt_dtype dt, jdt_reduce_op op, jdt_err *e);
jdt_status jdt_shm_allgather(jdt_dist *d, jdt_shm *s, void *buf, size_t n_elems, jdt_dtype dt,
                             jdt_err *e);
void jdt_shm_free(jdt_shm *s);

/* Comm thread (comm.c): started by jdt_dist_init once the mesh is up, stopped by free. */
jdt_status jdt_comm_start_thread(jdt_dist *d, jdt_err *e);
void jdt_comm_stop_thread(jdt_dist *d);

#endif /* JDT_DIST_IMPL_H */
