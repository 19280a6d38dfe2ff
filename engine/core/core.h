/*
 * core.h — the engine's foundation: status codes, the error context, logging with a rank
 * prefix, the one allocation hook, dtypes, hashing and the counter-based RNG.
 *
 * Every other subsystem includes this header and nothing in it includes another subsystem.
 * Library code reports failure by returning a jdt_status and filling a jdt_err with the
 * detail (file, line, key, rank, dataset ...); only cmd/ decides to exit.
 */
#ifndef JDT_CORE_H
#define JDT_CORE_H

#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define JDT_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define JDT_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#define JDT_UNUSED __attribute__((unused))
#else
#define JDT_PRINTF(fmt_idx, arg_idx)
#define JDT_UNUSED
#endif

#define JDT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- status codes: one list, the enum and the strings are generated from it ---------------- */

#define JDT_STATUS_LIST(X)                                                                         \
    X(OK, "ok")                                                                                    \
    X(ERR_NOMEM, "out of memory")                                                                  \
    X(ERR_USAGE, "bad command-line usage")                                                         \
    X(ERR_CONFIG, "invalid configuration")                                                         \
    X(ERR_INVALID, "invalid argument")                                                             \
    X(ERR_IO, "input/output error")                                                                \
    X(ERR_FORMAT, "corrupt or unsupported file format")                                            \
    X(ERR_NOT_FOUND, "not found")                                                                  \
    X(ERR_SHAPE, "shape mismatch")                                                                 \
    X(ERR_UNSUPPORTED, "unsupported operation")                                                    \
    X(ERR_COMPILE, "kernel compilation failed")                                                    \
    X(ERR_NUMERIC, "non-finite value")                                                             \
    X(ERR_NET, "network error")                                                                    \
    X(ERR_PROTOCOL, "protocol violation")                                                          \
    X(ERR_AUTH, "authentication failed")                                                           \
    X(ERR_TIMEOUT, "timed out")                                                                    \
    X(ERR_PEER_LOST, "peer lost")                                                                  \
    X(ERR_INTERRUPTED, "interrupted")                                                              \
    X(ERR_INTERNAL, "internal error")

typedef enum {
#define JDT_STATUS_ENUM_(name, str) JDT_##name,
    JDT_STATUS_LIST(JDT_STATUS_ENUM_)
#undef JDT_STATUS_ENUM_
        JDT_STATUS_COUNT
} jdt_status;

/* Returns a static, human-readable string for s ("unknown status" if out of range). */
const char *jdt_status_str(jdt_status s);

/* Returns the enum's short name, e.g. "ERR_CONFIG". */
const char *jdt_status_name(jdt_status s);

/* The error context: the status plus a message that carries the detail. Functions that can
 * fail take a jdt_err * (may be NULL when the caller does not want the detail). */
typedef struct {
    jdt_status code;
    char msg[2048];
} jdt_err;

/* Sets e (if non-NULL) to code with a printf-formatted message and returns code, so a caller
 * can write `return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));`. The message
 * is always one printable line: control characters (from a config, an override, a peer) are
 * escaped as \n, \r, \t, \xNN, and a trailing ": " with nothing after it is dropped. */
jdt_status jdt_err_set(jdt_err *e, jdt_status code, const char *fmt, ...) JDT_PRINTF(3, 4);
jdt_status jdt_err_vset(jdt_err *e, jdt_status code, const char *fmt, va_list ap);

/* Prepends "prefix: " to e's message (context from an outer layer), keeping it one printable
 * line; returns e->code. */
jdt_status jdt_err_prefix(jdt_err *e, const char *fmt, ...) JDT_PRINTF(2, 3);

/* Resets e to JDT_OK with an empty message. */
void jdt_err_clear(jdt_err *e);

/* ---- logging ------------------------------------------------------------------------------ */

typedef enum {
    JDT_LOG_DEBUG = 0,
    JDT_LOG_INFO = 1,
    JDT_LOG_WARN = 2,
    JDT_LOG_ERROR = 3,
    JDT_LOG_QUIET = 4
} jdt_log_level;

/* Process-wide logger settings. These are set once at start-up by cmd/ (the rank is known only
 * after rendezvous) and are the one deliberate exception to "no mutable globals": a log line
 * must be writable from any layer without threading a context through every call. */
void jdt_log_set_level(jdt_log_level level);
jdt_log_level jdt_log_get_level(void);
void jdt_log_set_rank(int rank, int world_size);
/* Parses "debug|info|warn|error|quiet"; returns false on an unknown name. */
bool jdt_log_parse_level(const char *name, jdt_log_level *out);

/* Writes one line to stderr: "[rank r/w] LEVEL message\n" (the rank part only when
 * world_size > 1). Thread-safe: a line is written with a single write(2). */
void jdt_log(jdt_log_level level, const char *fmt, ...) JDT_PRINTF(2, 3);

#define JDT_DEBUG(...) jdt_log(JDT_LOG_DEBUG, __VA_ARGS__)
#define JDT_INFO(...) jdt_log(JDT_LOG_INFO, __VA_ARGS__)
#define JDT_WARN(...) jdt_log(JDT_LOG_WARN, __VA_ARGS__)
#define JDT_ERROR(...) jdt_log(JDT_LOG_ERROR, __VA_ARGS__)

/* ---- allocation --------------------------------------------------------------------------- */

/* All engine allocation goes through these. They return NULL on failure (never abort).
 * jdt_free(NULL) is a no-op. jdt_malloc(0) returns a valid unique pointer. */
void *jdt_malloc(size_t n_bytes);
void *jdt_calloc(size_t n_elems, size_t elem_size);
void *jdt_realloc(void *p, size_t n_bytes);
void jdt_free(void *p);
char *jdt_strdup(const char *s);
/* 64-byte aligned allocation for tensor buffers (2 MiB aligned, with huge pages advised, from
 * 2 MiB up); release with jdt_free_aligned. */
void *jdt_malloc_aligned(size_t n_bytes);
void jdt_free_aligned(void *p);

/* Test hook: make the n-th allocation from now fail (n >= 1); 0 disables. Returns the number of
 * allocations seen since the last call (so a test can count a function's allocations). */
long jdt_alloc_fail_after(long n);

/* ---- dtypes ------------------------------------------------------------------------------- */

#define JDT_DTYPE_LIST(X)                                                                          \
    X(F32, "f32", 4)                                                                               \
    X(F64, "f64", 8)                                                                               \
    X(BF16, "bf16", 2)                                                                             \
    X(I32, "i32", 4)                                                                               \
    X(U16, "u16", 2)                                                                               \
    X(U32, "u32", 4)                                                                               \
    X(U8, "u8", 1)

typedef enum {
#define JDT_DTYPE_ENUM_(name, str, size) JDT_DTYPE_##name,
    JDT_DTYPE_LIST(JDT_DTYPE_ENUM_)
#undef JDT_DTYPE_ENUM_
        JDT_DTYPE_COUNT
} jdt_dtype;

const char *jdt_dtype_name(jdt_dtype dt);
size_t jdt_dtype_size(jdt_dtype dt);
/* x rounded to the nearest bf16 value (ties to even; NaN stays NaN, overflow gives Inf),
 * returned as f32: what a bf16 compute path feeds its multipliers (MATMUL attrs i[2]). */
float jdt_bf16_round(float x);
/* RoPE's angle per position for pair i of a head of D features: theta^(-2i/D), in double. With
 * sc (NULL: none) and sc[0] > 0 the frequencies are scaled as Llama 3.1's rope_scaling
 * ("rope_type": "llama3") does, sc = {factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}: a wavelength 2 pi / f above original / low_freq_factor
 * gives f / factor, one below original / high_freq_factor keeps f, and in between f is blended
 * linearly in original / wavelength. The one formula of the interpreter, the CPU kernels and the
 * KV-cache decoder (the CUDA kernels' cuk_rope_freq is its device copy). */
double jdt_rope_freq(double theta, int64_t i, int64_t D, const double *sc);
/* Parses a dtype name ("f32", ...); returns false if unknown. */
bool jdt_dtype_parse(const char *name, jdt_dtype *out);

/* ---- memory ------------------------------------------------------------------------------ */

/* Bytes this process may still allocate: /proc/meminfo MemAvailable, or the cgroup's limit
 * minus its usage (v1 memory.limit_in_bytes or v2 memory.max), or the address-space limit
 * (ulimit -v) minus what is mapped, whichever is lowest. -1 when
 * neither can be read. *source (may be NULL) names the bound used, for messages. */
int64_t jdt_mem_available(const char **source);

/* ---- CPUs ---------------------------------------------------------------------------------- */

/* The CPUs this process may use: the calling thread's affinity mask, widened by every OpenMP
 * place (OMP_PROC_BIND / OMP_PLACES: libgomp binds the main thread to the first place before
 * main, though the process's threads may use them all). Fills *set and returns its count; 0
 * when the mask cannot be read (the set is then empty). */
int jdt_cpus_allowed(cpu_set_t *set);

/* ---- hashing ------------------------------------------------------------------------------ */

/* 64-bit FNV-1a over n_bytes, continuing from h (start with JDT_HASH_INIT). Not cryptographic:
 * used for cache keys and CSE, where a collision costs a recompile or is re-checked. */
#define JDT_HASH_INIT 0xcbf29ce484222325ULL
uint64_t jdt_hash_bytes(uint64_t h, const void *data, size_t n_bytes);
uint64_t jdt_hash_str(uint64_t h, const char *s);
uint64_t jdt_hash_u64(uint64_t h, uint64_t v);

/* ---- counter-based RNG -------------------------------------------------------------------- */

/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
 * Output is a pure function of (key, counter): initialisation, dropout and data order derive
 * their streams from (seed, global index), never from rank or world size, so every mesh shape
 * draws the same numbers. */
typedef struct {
    uint32_t v[4];
} jdt_philox_ctr;

/* Returns 4 random 32-bit words for (key, counter). */
jdt_philox_ctr jdt_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo);

/* Uniform float in [0, 1) from a 32-bit word (24 bits of mantissa). */
float jdt_u32_to_unit_float(uint32_t x);

/* Fills out[0..n) with N(0, 1) samples for stream `key`, indices [first, first+n): the value at
 * global index i is the same whatever `first` and `n` are (Box-Muller on Philox words). */
void jdt_rng_normal(uint64_t key, uint64_t first, size_t n, float *out);
/* Uniform [0,1) likewise. */
void jdt_rng_uniform(uint64_t key, uint64_t first, size_t n, float *out);
/* Derives a stream key from a seed and a name (e.g. a parameter name). */
uint64_t jdt_rng_key(uint64_t seed, const char *name);

/* Moves k blocks of blk floats between the layouts (k, outer, blk) and (outer, k, blk):
 * to_outer true: (k, outer, blk) -> (outer, k, blk), else the inverse. dst != src. The wire
 * order of all-gather / reduce-scatter (member-major) against a tensor split along a middle
 * axis. */
void jdt_permute_blocks_f32(const float *src, float *dst, int64_t k, int64_t outer, int64_t blk,
                            bool to_outer);
/* The same for blocks of blk_bytes bytes (any element type: a bf16 all-gather). */
void jdt_permute_blocks_bytes(const void *src, void *dst, int64_t k, int64_t outer,
                              int64_t blk_bytes, bool to_outer);

/* ---- time --------------------------------------------------------------------------------- */

/* Monotonic clock in seconds. */
double jdt_now_s(void);
/* CPU time of the whole process (all its threads, user + system) in seconds, nanosecond
 * resolution (CLOCK_PROCESS_CPUTIME_ID); over a wall interval it says how many cores the
 * process ran on, on average. */
double jdt_cpu_s(void);
/* The best rate (flops per second) of n_rep runs of run(ctx), each doing flops, after one
 * untimed run (primitives made, caches warm): the CPU's MFU references (obs/peak.c, the
 * runtime's GEMMs). cores (may be NULL): the process's CPU seconds per wall second over the
 * timed runs, i.e. how many cores its threads held; below the thread count, something else took
 * them. The kernel brings another running thread's CPU time up to date only at its scheduler
 * tick (1-10 ms), so the timed runs go on past n_rep until 0.2 s have passed (a 1024^3 bf16
 * product takes 1.4 ms on AMX): then a tick's lag per thread is a few percent of the window. */
double jdt_best_rate(double flops, int n_rep, void (*run)(void *), void *ctx, double *cores);

/* Reads the whole file at path into *text (jdt_malloc'd, NUL-terminated, *len bytes). Only a
 * regular file is read, and with allow_pipe also a pipe or FIFO (`<(gen)`): a FIFO without a
 * writer, a device such as /dev/zero or a directory would block forever, read garbage or grow
 * memory without bound. The open does not block. JDT_ERR_IO with *err_no: the open's errno,
 * EISDIR, EINVAL (neither a regular file nor an allowed pipe), EFBIG (over max_bytes; *len is
 * then a regular file's size, found before reading, or 0 for a pipe), or a read's errno;
 * JDT_ERR_NOMEM. */
jdt_status jdt_read_file(const char *path, bool allow_pipe, size_t max_bytes, char **text,
                         size_t *len, int *err_no);

/* Writes text (NUL-terminated) to path whole or not at all: into path.tmp, flushed and
 * fsynced, then renamed over path; on any failure path.tmp is removed and path is untouched.
 * JDT_ERR_IO naming the file and the cause (a full disk is a failed write). */
jdt_status jdt_write_file_atomic(const char *path, const char *text, jdt_err *e);

/* pthread_create with SIGINT and SIGTERM blocked in the new thread, so a stop signal is never
 * handled on a helper thread (data prefetch, communication, rendezvous), even in a process that
 * did not call jdt_signals_init (dist-check, the unit tests). Returns pthread_create's result. */
int jdt_thread_create(void *thread, void *(*fn)(void *), void *arg);

/* ---- signals ------------------------------------------------------------------------------ */

/* SIGINT and SIGTERM never run a handler on a worker thread. jdt_signals_init, called by main
 * before any thread exists, blocks both in the calling thread, so every thread made afterwards
 * (OpenMP's, OpenBLAS's and oneDNN's workers too) inherits the block, and starts one thread,
 * "jdt-signals", that takes them with sigwaitinfo. Between jdt_signals_stop_begin and _end a
 * signal only records itself for jdt_signals_stop_requested; otherwise it does what its
 * disposition says, as if nothing blocked it: by default the process ends by the signal (a
 * signal the parent ignored stays ignored; one it blocked stays blocked and is not taken).
 * Process-wide state: there is one set of signal dispositions. A second call does nothing.
 * JDT_ERR_INTERNAL (the thread could not start): the mask is as it was, and signals are taken
 * by whichever thread the kernel picks, as without this call. */
jdt_status jdt_signals_init(jdt_err *e);

/* In a child between fork and exec (async-signal-safe): gives back the signal mask the process
 * started with, so an exec'd program (the C compiler) gets SIGINT and SIGTERM as usual. Does
 * nothing without jdt_signals_init. */
void jdt_signals_reset_child(void);

/* The training loop's clean stop: from _begin (which clears the request) to _end, SIGINT and
 * SIGTERM record themselves instead of ending the process, and a second signal is recorded
 * again; _end puts back the dispositions _begin found. Without jdt_signals_init a handler
 * records them, on whichever thread the kernel picks. Not nested; the main thread's to call. */
void jdt_signals_stop_begin(void);
void jdt_signals_stop_end(void);
/* The signal that asked for a stop since jdt_signals_stop_begin (SIGINT or SIGTERM), 0: none.
 * Any thread may ask. */
int jdt_signals_stop_requested(void);

/* The job this process is a rank of has ended under it (engine/comm: a lost peer or
 * coordinator, an abort): waits that no collective bounds, for another process's compile (the
 * compile cache's lock) or for this process's compiler, end early instead of running to their
 * timeouts. Set once (jdt_dist_set_abort, with the job's end in one line: `why`), never
 * cleared; any thread. jdt_job_lost_why: that line once jdt_job_lost() is true, else "" (the
 * messages of the waits it ends carry it: the process reports the job's end once, in its
 * closing line). */
void jdt_job_lost_set(const char *why);
bool jdt_job_lost(void);
const char *jdt_job_lost_why(void);

/* Progress of a long operation (prepare, checkpoint save and load, compilation): on a terminal a
 * live line "what: done/total unit (pct), rate, elapsed, ETA" rewritten in place; otherwise a log
 * line every 10 s. Nothing is printed for operations shorter than 2 s or above log level info.
 * JDT_PROGRESS_INTERVAL=S (seconds) sets the period of the plain lines and shortens the silent
 * start to min(S, 2) s (an invalid value is warned about once per process and ignored).
 * total <= 0: unknown (elapsed time only). Not thread-safe: one reporter per operation. */
typedef struct {
    char what[96];
    const char *unit;
    double total, t0, last;
    double interval_s,
        quiet_s;       /* plain-line period; silence at the start (JDT_PROGRESS_INTERVAL) */
    double estimate_s; /* expected duration when total is unknown (0: none) */
    bool tty, live;
} jdt_progress;
void jdt_progress_begin(jdt_progress *p, const char *what, double total, const char *unit);
void jdt_progress_update(jdt_progress *p, double done);
/* For an operation without measurable progress (total <= 0): an estimate of its duration in
 * seconds (e.g. from the last run's rate), shown as "about Ns left"; <= 0: none. */
void jdt_progress_set_estimate(jdt_progress *p, double estimate_s);
/* Clears the live line (call before the operation's closing log line). */
void jdt_progress_end(jdt_progress *p);

#endif /* JDT_CORE_H */
