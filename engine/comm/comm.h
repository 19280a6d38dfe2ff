/*
 * comm.h — the distributed runtime: rendezvous (coordinator, peer table, KV store, barriers,
 * heartbeats, abort broadcast) and TCP collectives (process groups; ring all-reduce,
 * reduce-scatter, all-gather, broadcast, all-to-all, barrier; blocking and start/wait).
 *
 * One process per rank. jdt_dist_init() connects to the coordinator (one rank hosts it in a
 * thread, rank 0 unless told otherwise), receives the peer table and opens a full mesh of TCP
 * data connections. Collectives execute one at a time in issue order (on a per-context
 * communication thread, or inline on the caller's thread when nothing is queued); every member
 * of a group must issue the same collectives on it in the same order (like one NCCL stream).
 * Groups whose members share one host do all-reduce, reduce-scatter and all-gather through
 * shared memory instead of loopback TCP (same results, same API). A lost peer (EOF, reset, missed
 * heartbeats) makes every pending and later call return JDT_ERR_PEER_LOST with a message naming the
 * rank and its host, never a hang.
 *
 * Segments: reduce-scatter and all-gather split n_elems into world-size contiguous segments,
 * segment i = [i*n/k + min(i, n%k) ...) of length n/k (+1 for the first n%k); see
 * jdt_comm_segment(). Any n_elems is valid, including 0 and n < group size.
 */
#ifndef JDT_COMM_H
#define JDT_COMM_H

#include "core/core.h"

typedef struct jdt_dist jdt_dist;             /* one rank's view of the job */
typedef struct jdt_dist_coord jdt_dist_coord; /* a running coordinator (server side) */
typedef struct jdt_comm_group jdt_comm_group; /* an ordered subset of ranks */
typedef struct jdt_comm_work jdt_comm_work;   /* a pending non-blocking collective */

typedef enum { JDT_REDUCE_SUM = 0, JDT_REDUCE_MAX = 1, JDT_REDUCE_COUNT } jdt_reduce_op;

typedef struct {
    int rank, world_size;
    const char *coordinator;   /* "host:port" of the coordinator */
    const char *token;         /* job token; every rank and the coordinator must agree */
    bool host_coordinator;     /* a rank runs the coordinator in a thread (default true);
                                  false: it runs elsewhere (jdt_dist_coord_start) */
    int coordinator_rank;      /* with host_coordinator, the rank that runs it (default 0). A
                                  process that knows only that it is not the one (under SLURM
                                  the first task of the first node hosts it) sets -1 */
    int coord_listen_fd;       /* the hosting rank: a pre-bound listening socket to serve on,
                                  or -1; jdt_dist_init takes it over (closed on failure too) */
    double connect_timeout_s;  /* start-up: connect retries and waiting for all ranks (60) */
    double heartbeat_s;        /* heartbeat interval (1) */
    double peer_timeout_s;     /* a rank silent this long is declared lost (10) */
    double op_timeout_s;       /* one collective or KV wait may take at most this long (600) */
    const char *advertise_host;/* data address others use to reach this rank; NULL = the local
                                  address of the connection to the coordinator */
    bool disable_shm;          /* TCP even when a group shares one host (all ranks must agree) */
} jdt_dist_opts;

/* Fills o with the defaults above (rank 0, world 1, coordinator "127.0.0.1:0" invalid until
 * set, token "", host_coordinator true, coordinator_rank 0, coord_listen_fd -1). */
void jdt_dist_opts_default(jdt_dist_opts *o);

/* Joins the job. Every rank calls it once. Connects to o->coordinator (retrying until
 * connect_timeout_s), authenticates with the token, waits for all world_size ranks, receives
 * the peer table and connects the data mesh. Returns JDT_OK and a context in *out (owned by
 * the caller, release with jdt_dist_free), or: ERR_INVALID (bad options), ERR_NET (cannot
 * bind/connect), ERR_AUTH (token refused), ERR_TIMEOUT (start-up timeout; the message lists
 * the ranks that never arrived), ERR_PROTOCOL (the coordinator spoke garbage), ERR_PEER_LOST
 * (another rank or the coordinator failed during start-up). */
jdt_status jdt_dist_init(const jdt_dist_opts *o, jdt_dist **out, jdt_err *e);

/* Leaves the job cleanly: stops the communication and heartbeat threads, tells the
 * coordinator goodbye (so this is not reported as a lost rank) and closes every socket. The
 * rank that hosts the coordinator first waits, once the job has formed, for every other rank
 * to say goodbye or be lost (a killed rank at once, a silent one after peer_timeout_s), however
 * long they take, so the coordinator outlives the job's last use of it even when its host
 * finishes first; once the job is aborted, at most connect_timeout_s. NULL is a no-op. Not a
 * collective, but ranks should finish their collectives (e.g. a barrier) before freeing. */
void jdt_dist_free(jdt_dist *d);

/* This process's rank and the job's world size (as given in the options). */
int jdt_dist_rank(const jdt_dist *d);
int jdt_dist_world_size(const jdt_dist *d);
/* Host (as advertised) of a rank, for messages; "?" if out of range. Owned by d. */
const char *jdt_dist_host(const jdt_dist *d, int rank);

/* Returns JDT_OK while the job is healthy; otherwise the abort status (usually
 * ERR_PEER_LOST) with the reason (lost rank and host) copied into e. Cheap; never blocks. */
jdt_status jdt_dist_check(jdt_dist *d, jdt_err *e);

/* Aborts the job: tells the coordinator, which tells every other rank (they get
 * ERR_PEER_LOST naming this rank and reason). Local calls fail from now on. */
void jdt_dist_abort(jdt_dist *d, const char *reason);

/* KV store on the coordinator. Keys are strings up to 255 bytes, values up to 64 KiB.
 * kv_set overwrites. kv_get waits up to timeout_s (0: no wait) for the key to appear; on
 * success *value (jdt_malloc'd, caller frees with jdt_free) and *n_bytes are set; ERR_TIMEOUT
 * if it did not appear in time. Any rank may call these in any order. */
jdt_status jdt_dist_kv_set(jdt_dist *d, const char *key, const void *value, size_t n_bytes,
                           jdt_err *e);
jdt_status jdt_dist_kv_get(jdt_dist *d, const char *key, double timeout_s, void **value,
                           size_t *n_bytes, jdt_err *e);

/* Barrier through the coordinator over all ranks. Every rank must call it the same number of
 * times. ERR_TIMEOUT after timeout_s lists the ranks that had not arrived. */
jdt_status jdt_dist_barrier(jdt_dist *d, double timeout_s, jdt_err *e);

/* ---- standalone coordinator (for a launcher that runs it outside the ranks) ----------------- */

/* Starts a coordinator thread serving on bind_addr ("host:port", port 0 = any) or on
 * listen_fd when >= 0 (taken over: closed by jdt_dist_coord_free). Start-up deadline,
 * heartbeat timeout as in jdt_dist_opts. *port_out (may be NULL) receives the bound port. */
jdt_status jdt_dist_coord_start(const char *bind_addr, int listen_fd, int world_size,
                                const char *token, double connect_timeout_s,
                                double peer_timeout_s, jdt_dist_coord **out, int *port_out,
                                jdt_err *e);
/* Waits up to grace_s for every rank to say goodbye (or be lost), then stops the thread and
 * frees. NULL is a no-op. */
void jdt_dist_coord_free(jdt_dist_coord *c, double grace_s);

/* ---- process groups and collectives --------------------------------------------------------- */

/* The group of all ranks in rank order. Owned by d. */
jdt_comm_group *jdt_dist_world(jdt_dist *d);

/* Creates a group of n ranks in the given order (the ring order). The caller must be one of
 * them; every member must create the same groups in the same order. No communication. Returns
 * ERR_INVALID for duplicates, out-of-range ranks or a caller that is not a member. Release
 * with jdt_comm_group_free (before jdt_dist_free). */
jdt_status jdt_comm_group_new(jdt_dist *d, int n, const int *ranks, jdt_comm_group **out,
                              jdt_err *e);
/* Frees a group made by jdt_comm_group_new (no collective on it may be pending). NULL is a
 * no-op; never pass the world group. */
void jdt_comm_group_free(jdt_comm_group *g);
/* Number of members. */
int jdt_comm_group_size(const jdt_comm_group *g);
/* This rank's index within the group. */
int jdt_comm_group_index(const jdt_comm_group *g);

/* Segment i of n_elems split over k parts (see the file comment). */
void jdt_comm_segment(size_t n_elems, int k, int i, size_t *first, size_t *count);

/* The collectives. All are collective over the group: every member calls with the same
 * n_elems/dtype/op/root in the same order. They return JDT_OK, or ERR_PEER_LOST (a member or
 * the coordinator was lost, named in e), ERR_TIMEOUT (op_timeout_s), ERR_PROTOCOL (members
 * disagree on the call: the message says which argument), ERR_UNSUPPORTED (dtype/op). After a
 * failure the data plane is unusable and the job is aborted for everyone.
 *
 * allreduce:      buf (n_elems) becomes the elementwise op over all members. f32, f64.
 * reduce_scatter: in place; on return segment index of buf (jdt_comm_segment) holds the
 *                 reduction, the rest of buf is clobbered. f32, f64.
 * allgather:      in place; on entry segment index of buf holds this member's part, on
 *                 return buf holds every part. Any dtype.
 * broadcast:      buf (n_elems) from group index root to every member. Any dtype.
 * alltoall:       send and recv are (k, n_elems) row-major: row j of send goes to member j,
 *                 row j of recv comes from member j. Any dtype; send != recv.
 * barrier:        returns once every member has entered. */
jdt_status jdt_comm_allreduce(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              jdt_reduce_op op, jdt_err *e);
jdt_status jdt_comm_reduce_scatter(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                   jdt_reduce_op op, jdt_err *e);
jdt_status jdt_comm_allgather(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              jdt_err *e);
jdt_status jdt_comm_broadcast(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                              int root, jdt_err *e);
jdt_status jdt_comm_alltoall(jdt_comm_group *g, const void *send, void *recv, size_t n_elems,
                             jdt_dtype dt, jdt_err *e);
jdt_status jdt_comm_barrier(jdt_comm_group *g, jdt_err *e);

/* Non-blocking variants: queue the collective on the communication thread and return at once
 * with *w set (the buffers must stay valid and untouched until jdt_comm_wait returns).
 * jdt_comm_wait blocks until it finishes, returns its status (detail in e) and frees w.
 * Every started work must be waited on, in any order, before jdt_dist_free. Blocking calls
 * run on the caller's thread when no work is pending, else they queue behind the started ones
 * (so issue order is execution order either way). */
jdt_status jdt_comm_allreduce_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    jdt_reduce_op op, jdt_comm_work **w, jdt_err *e);
jdt_status jdt_comm_reduce_scatter_start(jdt_comm_group *g, void *buf, size_t n_elems,
                                         jdt_dtype dt, jdt_reduce_op op, jdt_comm_work **w,
                                         jdt_err *e);
jdt_status jdt_comm_allgather_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    jdt_comm_work **w, jdt_err *e);
jdt_status jdt_comm_broadcast_start(jdt_comm_group *g, void *buf, size_t n_elems, jdt_dtype dt,
                                    int root, jdt_comm_work **w, jdt_err *e);
jdt_status jdt_comm_alltoall_start(jdt_comm_group *g, const void *send, void *recv,
                                   size_t n_elems, jdt_dtype dt, jdt_comm_work **w, jdt_err *e);
jdt_status jdt_comm_wait(jdt_comm_work *w, jdt_err *e);
/* jdt_comm_wait that also reports when the work ran (jdt_now_s() as it started and ended on
 * the communication thread, or inline): the time it moved data, as opposed to the time the
 * caller waited for it. Either pointer may be NULL. */
jdt_status jdt_comm_wait_timed(jdt_comm_work *w, double *run_start_s, double *run_end_s,
                               jdt_err *e);

#endif /* JDT_COMM_H */
