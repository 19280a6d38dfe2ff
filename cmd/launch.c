/*
 * launch.c — the local launcher: `jdt-train --nproc N [COMMAND] CONFIG [overrides] [flags]`
 * runs N copies of this binary as ranks 0..N-1 of one job on this host, like torchrun's
 * standalone mode. It pre-binds the coordinator socket (127.0.0.1, port 0) and hands it to
 * rank 0, makes a random job token, gives each rank a disjoint share of the CPUs, prefixes
 * every output line with "[rank r] ", forwards SIGINT/SIGTERM, and when one rank fails stops
 * the others (SIGTERM, then SIGKILL after a grace period) and exits with that rank's code.
 *
 * Also the hidden `dist-check` subcommand: resolve the world, join, all-reduce, report; used by
 * the launcher and SLURM end-to-end tests and for debugging a cluster's set-up.
 *
 * Command-line code: it prints its own messages and returns exit codes (0 ok, 1 run-time
 * failure, 2 usage or config error).
 */
#include "cmd/launch.h"

#include "config/config.h"
#include "core/core.h"
#include "comm/comm.h"
#include "train/train.h"
#include "world/world.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

#define MAX_NPROC 1024
#define GRACE_S 10.0   /* SIGTERM -> SIGKILL */
#define DRAIN_S 2.0    /* output still open after every rank exited (a lingering grandchild) */
#define LINE_CAP 65536 /* a longer line is split */

/* the dist.* keys the launcher sets per rank: the user must not set them too */
static const char *const OWNED_KEYS[] = {"rank", "world_size", "local_rank", "coordinator"};

static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "jdt-train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see docs/launch.md)\n");
    return EXIT_USAGE;
}

bool jdt_launch_requested(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0) return false;
        if (strcmp(argv[i], "--nproc") == 0 || strncmp(argv[i], "--nproc=", 8) == 0) return true;
    }
    return false;
}

/* ---- output relay ------------------------------------------------------------------------------
 */

typedef struct {
    int fd;     /* read end of the child's pipe, -1 once closed */
    int out_fd; /* where its lines go: 1 or 2 */
    int rank;
    size_t len;
    char *buf; /* (LINE_CAP) */
} stream;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* our own output is gone (EPIPE): keep draining the children */
        p += w;
        n -= (size_t)w;
    }
}

static void emit_line(const stream *s, const char *p, size_t n)
{
    /* the logger's own "[rank r/w] " is replaced by ours, not doubled */
    char own[32];
    int ol = snprintf(own, sizeof own, "[rank %d/", s->rank);
    if (n > (size_t)ol && memcmp(p, own, (size_t)ol) == 0) {
        const char *close = memchr(p + ol, ']', n - (size_t)ol);
        if (close && close + 1 < p + n && close[1] == ' ') {
            n -= (size_t)(close + 2 - p);
            p = close + 2;
        }
    }
    char out[LINE_CAP + 64];
    int k = snprintf(out, sizeof out, "[rank %d] ", s->rank);
    memcpy(out + k, p, n);
    size_t len = (size_t)k + n;
    if (n == 0 || p[n - 1] != '\n') out[len++] = '\n';
    write_all(s->out_fd, out, len);
}

/* Reads what is there; emits complete lines (all of it at EOF). Returns false at EOF. */
static bool stream_pump(stream *s)
{
    ssize_t r;
    do {
        r = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
    } while (r < 0 && errno == EINTR);
    if (r < 0 && errno == EAGAIN) return true;
    bool eof = r <= 0;
    if (r > 0) s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(s, s->buf + start, i + 1 - start);
            start = i + 1;
        }
    }
    if (start == 0 && s->len == LINE_CAP) start = s->len, emit_line(s, s->buf, s->len);
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    if (eof) {
        if (s->len) emit_line(s, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
    }
    return !eof;
}

/* ---- argument inspection -----------------------------------------------------------------------
 */

typedef struct {
    char **child_argv; /* argv without --nproc N, NULL-terminated (owned array) */
    int nproc;
    const char *config; /* NULL if none */
    bool from_ckpt;     /* `eval CKPT`: config names a checkpoint, whose stored config is used */
    int n_overrides;
    char **overrides; /* (n_overrides) point into argv (owned array) */
} launch_args;

static int parse_launch_args(int argc, char **argv, launch_args *a)
{
    memset(a, 0, sizeof *a);
    a->child_argv = jdt_calloc((size_t)argc + 1, sizeof *a->child_argv);
    a->overrides = jdt_calloc((size_t)argc + 1, sizeof *a->overrides);
    if (!a->child_argv || !a->overrides) return usage("out of %s", "memory");
    int n = 0;
    const char *nproc_s = NULL;
    bool dashdash = false;
    a->child_argv[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (!dashdash && strcmp(argv[i], "--") == 0) dashdash = true;
        if (!dashdash && strcmp(argv[i], "--nproc") == 0) {
            if (i + 1 >= argc) return usage("--nproc needs a number of processes%s", "");
            nproc_s = argv[++i];
        } else if (!dashdash && strncmp(argv[i], "--nproc=", 8) == 0) {
            nproc_s = argv[i] + 8;
        } else {
            a->child_argv[n++] = argv[i];
        }
    }
    if (!nproc_s) return usage("--nproc: missing%s", ""); /* jdt_launch_requested saw one */
    char *end = NULL;
    errno = 0;
    long np = strtol(nproc_s, &end, 10);
    if (errno || end == nproc_s || *end || np < 1 || np > MAX_NPROC)
        return usage("--nproc: expected a number of processes in 1..1024, got '%s'", nproc_s);
    a->nproc = (int)np;

    /* which command, and its CONFIG and overrides (the flags taking a value are skipped) */
    int i = 1;
    static const char *const ok_cmds[] = {"train", "inspect", "eval", "dist-check"};
    static const char *const no_cmds[] = {"sample", "prepare", "export", "plot", "version", "help"};
    if (n > 1) {
        for (size_t k = 0; k < JDT_ARRAY_LEN(no_cmds); k++)
            if (strcmp(a->child_argv[1], no_cmds[k]) == 0)
                return usage("--nproc runs a job of several processes: use it with train, eval, "
                             "inspect or dist-check, not '%s'",
                             no_cmds[k]);
        for (size_t k = 0; k < JDT_ARRAY_LEN(ok_cmds); k++)
            if (strcmp(a->child_argv[1], ok_cmds[k]) == 0) i = 2;
    }
    const bool eval = i == 2 && strcmp(a->child_argv[1], "eval") == 0;
    for (; i < n; i++) {
        const char *s = a->child_argv[i];
        if (strcmp(s, "--") == 0) continue;
        if (s[0] == '-') {
            if ((strcmp(s, "--log-level") == 0 || strcmp(s, "--ckpt") == 0) && i + 1 < n) i++;
            continue;
        }
        if (!a->config) {
            a->config = s;
            a->from_ckpt = eval && jdt_train_is_ckpt_path(s);
        } else if (strchr(s, '='))
            a->overrides[a->n_overrides++] = a->child_argv[i];
    }
    return EXIT_OK;
}

static void free_launch_args(launch_args *a)
{
    jdt_free(a->child_argv);
    jdt_free(a->overrides);
}

/* The job's config as a rank will load it under envp: the YAML file, or for `eval CKPT` the
 * checkpoint's stored config (jdt_train_load_stored_config), with the overrides. */
static jdt_status load_job_config(const launch_args *a, char *const *envp, jdt_config *c,
                                  jdt_err *e)
{
    if (!a->from_ckpt) return jdt_config_load(a->config, a->n_overrides, a->overrides, envp, c, e);
    char *resolved = NULL;
    jdt_status st = jdt_train_load_stored_config(a->config, a->n_overrides, a->overrides, envp, c,
                                                 &resolved, e);
    jdt_free(resolved);
    return st;
}

/* Refuses dist.* keys the launcher owns, set in overrides, the environment or the file. */
static int check_owned_keys(const launch_args *a, const jdt_config *c)
{
    for (size_t k = 0; k < JDT_ARRAY_LEN(OWNED_KEYS); k++) {
        char key[64], var[64];
        snprintf(key, sizeof key, "dist.%s=", OWNED_KEYS[k]);
        snprintf(var, sizeof var, "JDT_DIST_%s", OWNED_KEYS[k]);
        for (char *p = var; *p; p++)
            if (*p >= 'a' && *p <= 'z') *p = (char)(*p - 'a' + 'A');
        for (int i = 0; i < a->n_overrides; i++)
            if (strncmp(a->overrides[i], key, strlen(key)) == 0)
                return usage("--nproc sets dist.rank, dist.world_size, dist.local_rank and "
                             "dist.coordinator for each process: drop '%s' or drop --nproc",
                             a->overrides[i]);
        if (getenv(var))
            return usage("--nproc sets JDT_DIST_RANK, JDT_DIST_WORLD_SIZE, JDT_DIST_LOCAL_RANK "
                         "and JDT_DIST_COORDINATOR for each process: unset %s or drop --nproc",
                         var);
    }
    if (c && (c->dist.rank >= 0 || c->dist.local_rank >= 0 || c->dist.coordinator[0]))
        return usage("%s sets dist.rank, dist.local_rank or dist.coordinator, which --nproc "
                     "sets for each process: remove them from the config or drop --nproc",
                     a->config);
    return EXIT_OK;
}

/* ---- environment --------------------------------------------------------------------------------
 */

typedef struct {
    char **v; /* NULL-terminated; strings from environ are borrowed, ours are in own[] */
    int n;
    char own[12][320];
    int n_own;
} envlist;

static bool env_init(envlist *l)
{
    int n = 0;
    while (environ[n])
        n++;
    l->v = jdt_calloc((size_t)n + 16, sizeof *l->v);
    if (!l->v) return false;
    for (int i = 0; i < n; i++)
        l->v[i] = environ[i];
    l->n = n;
    l->n_own = 0;
    return true;
}

/* Adds NAME=value, replacing an existing NAME. */
static void env_set(envlist *l, const char *name, const char *value)
{
    if (l->n_own >= (int)JDT_ARRAY_LEN(l->own)) abort(); /* a programming error: grow own[] */
    char *s = l->own[l->n_own++];
    snprintf(s, sizeof l->own[0], "%s=%s", name, value);
    size_t nl = strlen(name);
    for (int i = 0; i < l->n; i++) {
        if (strncmp(l->v[i], name, nl) == 0 && l->v[i][nl] == '=') {
            l->v[i] = s;
            return;
        }
    }
    l->v[l->n++] = s;
    l->v[l->n] = NULL;
}

static void env_unset(envlist *l, const char *name)
{
    size_t nl = strlen(name);
    for (int i = 0; i < l->n; i++) {
        if (strncmp(l->v[i], name, nl) == 0 && l->v[i][nl] == '=') {
            l->v[i] = l->v[--l->n];
            l->v[l->n] = NULL;
            return;
        }
    }
}

/* ---- the launcher -------------------------------------------------------------------------------
 */

typedef struct {
    pid_t pid; /* 0 once reaped */
    int status;
    bool exited;
} child;

static void make_token(char *out, size_t cap)
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    if (got < sizeof raw) { /* no entropy source: time and pid still keep other jobs out */
        uint64_t h = jdt_hash_u64(jdt_hash_u64(JDT_HASH_INIT, (uint64_t)getpid()),
                                  (uint64_t)(jdt_now_s() * 1e9));
        memcpy(raw, &h, sizeof h);
        memcpy(raw + 8, &h, sizeof h);
    }
    for (size_t i = 0; i < sizeof raw && 2 * i + 2 < cap; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static void describe_status(int status, char *buf, size_t cap)
{
    if (WIFEXITED(status))
        snprintf(buf, cap, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, cap, "was killed by signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(buf, cap, "ended with status %d", status);
}

/* Whether process pid is stopped (SIGSTOP, SIGTSTP, a debugger): state T or t in its stat. */
static bool is_stopped(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return p && p[1] == ' ' && (p[2] == 'T' || p[2] == 't');
}

/* Sends sig to every live rank's process group. A stopped rank would take a SIGTERM or SIGINT
 * only once continued, so it was killed after the grace period instead of stopping on its own:
 * it is named and continued (as a shell's kill does for a stopped job). */
static void signal_all(child *ch, int n, int sig)
{
    for (int r = 0; r < n; r++) {
        if (ch[r].pid <= 0) continue;
        const bool cont = (sig == SIGTERM || sig == SIGINT) && is_stopped(ch[r].pid);
        if (cont)
            fprintf(stderr,
                    "jdt-train: rank %d is stopped (SIGSTOP or a debugger): continuing it "
                    "to deliver %s\n",
                    r, sig == SIGINT ? "SIGINT" : "SIGTERM");
        if (kill(-ch[r].pid, sig) != 0) kill(ch[r].pid, sig);
        if (cont && kill(-ch[r].pid, SIGCONT) != 0) kill(ch[r].pid, SIGCONT);
    }
}

/* In the child between fork and exec: only async-signal-safe calls. */
static void exec_child(const launch_args *a, char **envp, int out_fd, int err_fd, int listen_fd,
                       const cpu_set_t *cpus, bool pin, pid_t parent, const sigset_t *oldmask)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull > 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (listen_fd >= 0) fcntl(listen_fd, F_SETFD, 0);
    if (pin) sched_setaffinity(0, sizeof *cpus, cpus);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, oldmask, NULL);
    execve("/proc/self/exe", a->child_argv, envp);
    static const char msg[] = "jdt-train: cannot exec /proc/self/exe\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(127);
}

/* The launcher's state from set-up to the last rank's exit. */
typedef struct {
    launch_args a;
    int n; /* ranks */
    jdt_config c;
    bool have_config;
    envlist env;
    child *ch;          /* (n) */
    stream *st;         /* (2n): rank r's stdout at 2r, stderr at 2r+1 */
    int listen_fd, sfd; /* the coordinator socket rank 0 inherits; the signalfd */
    sigset_t oldmask;
    bool masked;
    int cpu_ids[CPU_SETSIZE], n_cpus;
    bool pin; /* one contiguous share of the CPUs per rank */
    char coord[64];
    int n_live;
    /* supervision */
    int fail_rank, fail_code, stop_signals;
    double kill_at, drain_until;
    bool killed;
} launcher;

/* Loads the config as the user gave it (printed once here instead of by every rank) and
 * refuses what the ranks would refuse: keys the launcher owns, what this build cannot run.
 * Sets *user_token / *user_threads when the user chose them. Returns 0 or an exit code. */
static int preflight(launcher *L, bool *user_token, bool *user_threads)
{
    jdt_err e;
    jdt_err_clear(&e);
    int rc;
    if ((rc = check_owned_keys(&L->a, NULL))) return rc;
    const launch_args *a = &L->a;
    jdt_status s = load_job_config(a, environ, &L->c, &e);
    if (s) {
        fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
        return s == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
    }
    L->have_config = true;
    if ((rc = check_owned_keys(&L->a, &L->c))) return rc;
    if (jdt_train_check_capabilities(&L->c, &e) != JDT_OK) { /* once, not once per rank */
        fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
        return EXIT_USAGE;
    }
    *user_token = L->c.dist.token[0] || L->c.dist.token_file[0];
    *user_threads = L->c.runtime.threads != 0 || getenv("JDT_RUNTIME_THREADS") ||
                    jdt_world_threads_env() > 0; /* OMP_NUM_THREADS: each rank takes it */
    for (int i = 0; i < L->a.n_overrides; i++)
        if (strncmp(L->a.overrides[i], "runtime.threads=", 16) == 0) *user_threads = true;
    return 0;
}

/* The CPUs this process may use (rank r gets the r-th contiguous share when pinning). */
static void list_cpus(launcher *L)
{
    cpu_set_t all;
    L->n_cpus = 0;
    if (jdt_cpus_allowed(&all) > 0)
        for (int i = 0; i < CPU_SETSIZE; i++)
            if (CPU_ISSET(i, &all)) L->cpu_ids[L->n_cpus++] = i;
    if (L->n_cpus == 0) L->n_cpus = 1, L->cpu_ids[0] = 0;
    L->pin = L->n <= L->n_cpus && L->n > 1;
}

/* Opens the coordinator socket rank 0 inherits: the port is ours before any rank starts. */
static int open_coordinator(launcher *L)
{
    L->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    if (L->listen_fd < 0 || bind(L->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        listen(L->listen_fd, 1024) != 0 ||
        getsockname(L->listen_fd, (struct sockaddr *)&sa, &sl) != 0) {
        fprintf(stderr, "jdt-train: cannot open the coordinator socket on 127.0.0.1: %s\n",
                strerror(errno));
        return EXIT_RUNTIME;
    }
    snprintf(L->coord, sizeof L->coord, "127.0.0.1:%d", ntohs(sa.sin_port));
    return 0;
}

/* The environment every rank shares (world size, coordinator, token, threads), then the config
 * reloaded as rank 0 will see it, so an error it causes is printed once. */
static int make_rank_env(launcher *L, bool user_token, bool user_threads)
{
    char token[64], num[32];
    make_token(token, sizeof token);
    if (!env_init(&L->env)) return usage("out of %s", "memory");
    snprintf(num, sizeof num, "%d", L->n);
    env_set(&L->env, "JDT_DIST_WORLD_SIZE", num);
    env_set(&L->env, "JDT_DIST_COORDINATOR", L->coord);
    if (!user_token) env_set(&L->env, "JDT_DIST_TOKEN", token);
    if (!user_threads) {
        snprintf(num, sizeof num, "%d", L->n_cpus / L->n > 0 ? L->n_cpus / L->n : 1);
        env_set(&L->env, "JDT_RUNTIME_THREADS", num);
    }
    env_set(&L->env, "JDT_DIST_RANK", "0");
    env_set(&L->env, "JDT_DIST_LOCAL_RANK", "0");
    jdt_config_free(&L->c);
    L->have_config = false;
    jdt_err e;
    jdt_err_clear(&e);
    const launch_args *a = &L->a;
    jdt_status s = load_job_config(a, L->env.v, &L->c, &e);
    if (s) {
        fprintf(stderr, "jdt-train: config error (with --nproc %d): %s\n", L->n, e.msg);
        return s == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
    }
    L->have_config = true;
    /* a mesh or rule that cannot work is one message here, not one per rank */
    if ((s = jdt_train_check_mesh(&L->c, L->n, &e)) != JDT_OK) {
        fprintf(stderr, "jdt-train: config error (with --nproc %d): %s\n", L->n, e.msg);
        return s == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
    }
    return 0;
}

/* Signals arrive through a signalfd (children get the old mask back before exec); allocates
 * the per-rank tables. */
static int setup_supervision(launcher *L)
{
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, &L->oldmask);
    L->masked = true;
    signal(SIGPIPE, SIG_IGN);
    L->sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    L->ch = jdt_calloc((size_t)L->n, sizeof *L->ch);
    L->st = jdt_calloc(2 * (size_t)L->n, sizeof *L->st);
    if (L->sfd < 0 || !L->ch || !L->st) {
        fprintf(stderr, "jdt-train: launcher set-up failed: %s\n", strerror(errno));
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < 2 * L->n; i++)
        L->st[i].fd = -1;
    return 0;
}

/* Forks and execs rank r with its pipes, environment and CPU share. Returns 0 or an exit code
 * (the rank did not start). */
static int start_rank(launcher *L, int r, int env_base, pid_t self)
{
    stream *st = L->st;
    L->env.n_own = env_base; /* each rank's three variables reuse the same slots */
    int po[2], pe[2];
    char num[32];
    st[2 * r].buf = jdt_malloc(LINE_CAP);
    st[2 * r + 1].buf = jdt_malloc(LINE_CAP);
    if (!st[2 * r].buf || !st[2 * r + 1].buf || pipe2(po, O_CLOEXEC) != 0) {
        fprintf(stderr, "jdt-train: cannot start rank %d: %s\n", r, strerror(errno));
        return EXIT_RUNTIME;
    }
    if (pipe2(pe, O_CLOEXEC) != 0) {
        close(po[0]);
        close(po[1]);
        fprintf(stderr, "jdt-train: cannot start rank %d: %s\n", r, strerror(errno));
        return EXIT_RUNTIME;
    }
    snprintf(num, sizeof num, "%d", r);
    env_set(&L->env, "JDT_DIST_RANK", num);
    env_set(&L->env, "JDT_DIST_LOCAL_RANK", num);
    char fdv[32];
    snprintf(fdv, sizeof fdv, "%d", L->listen_fd);
    if (r == 0)
        env_set(&L->env, JDT_WORLD_LISTEN_FD_ENV, fdv);
    else
        env_unset(&L->env, JDT_WORLD_LISTEN_FD_ENV);
    cpu_set_t mine;
    CPU_ZERO(&mine);
    for (int k = r * L->n_cpus / L->n; k < (r + 1) * L->n_cpus / L->n; k++)
        CPU_SET(L->cpu_ids[k], &mine);
    pid_t pid = fork();
    if (pid == 0)
        exec_child(&L->a, L->env.v, po[1], pe[1], r == 0 ? L->listen_fd : -1, &mine, L->pin, self,
                   &L->oldmask);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        fprintf(stderr, "jdt-train: cannot start rank %d: %s\n", r, strerror(errno));
        return EXIT_RUNTIME;
    }
    setpgid(pid, pid);
    L->ch[r].pid = pid;
    L->n_live++;
    st[2 * r] = (stream){po[0], 1, r, 0, st[2 * r].buf};
    st[2 * r + 1] = (stream){pe[0], 2, r, 0, st[2 * r + 1].buf};
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    if (r == 0) {
        close(L->listen_fd); /* rank 0 owns it now; a dead rank 0 must refuse connections */
        L->listen_fd = -1;
    }
    return 0;
}

/* Drains the signalfd: the first SIGINT/SIGTERM/SIGHUP is forwarded to every rank (SIGHUP as
 * SIGTERM) with a grace period; a second one kills them all. */
static void handle_signals(launcher *L)
{
    struct signalfd_siginfo si;
    while (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) continue;
        L->stop_signals++;
        int fwd = si.ssi_signo == SIGHUP ? SIGTERM : (int)si.ssi_signo;
        if (L->stop_signals == 1) {
            fprintf(stderr, "jdt-train: %s: stopping all ranks\n", strsignal((int)si.ssi_signo));
            signal_all(L->ch, L->n, fwd);
            L->kill_at = jdt_now_s() + GRACE_S;
        } else {
            fprintf(stderr, "jdt-train: second signal: killing all ranks\n");
            signal_all(L->ch, L->n, SIGKILL);
            L->killed = true;
        }
    }
}

/* Reaps exited ranks. The first failure names the job's cause (in one batch a rank killed by a
 * signal is the cause, exits are consequences); unless a signal is already stopping the job,
 * it is reported and the other ranks get SIGTERM and a grace period. */
static void reap_ranks(launcher *L)
{
    child *ch = L->ch;
    int batch_fail = -1;
    for (;;) {
        int status = 0;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p <= 0) break;
        for (int r = 0; r < L->n; r++) {
            if (ch[r].pid != p) continue;
            ch[r].pid = 0;
            ch[r].status = status;
            ch[r].exited = true;
            L->n_live--;
            bool bad = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            if (bad && L->fail_rank < 0 &&
                (batch_fail < 0 || (WIFSIGNALED(status) && !WIFSIGNALED(ch[batch_fail].status))))
                batch_fail = r;
        }
    }
    if (batch_fail < 0) return;
    char why[128];
    L->fail_rank = batch_fail;
    int status = ch[L->fail_rank].status;
    L->fail_code = WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_RUNTIME;
    if (L->fail_code == 0) L->fail_code = EXIT_RUNTIME;
    if (L->stop_signals == 0) {
        describe_status(status, why, sizeof why);
        fprintf(stderr, "jdt-train: rank %d %s%s\n", L->fail_rank, why,
                L->n_live > 0 ? "; stopping the other ranks" : "");
        if (L->n_live > 0 && L->kill_at == 0) {
            signal_all(ch, L->n, SIGTERM);
            L->kill_at = jdt_now_s() + GRACE_S;
        }
    }
}

/* Relays the ranks' output line by line, forwards signals and reaps ranks until every rank has
 * exited and its output is drained (or DRAIN_S passed). start_rc != 0: a rank could not start,
 * so those that did are stopped. Returns the launcher's exit code: 0, or the failing rank's. */
static int supervise(launcher *L, int start_rc)
{
    const int n = L->n;
    stream *st = L->st;
    L->fail_rank = -1;
    if (start_rc) { /* a rank could not start: stop those that did */
        signal_all(L->ch, n, SIGTERM);
        L->kill_at = jdt_now_s() + GRACE_S;
        L->fail_code = start_rc;
    }
    struct pollfd *pfd = jdt_calloc(2 * (size_t)n + 1, sizeof *pfd);
    if (!pfd) {
        signal_all(L->ch, n, SIGKILL);
        L->kill_at = jdt_now_s();
    }
    for (;;) {
        int n_open = 0;
        for (int i = 0; i < 2 * n; i++)
            n_open += st[i].fd >= 0;
        double now = jdt_now_s();
        if (L->n_live == 0) {
            if (L->drain_until == 0) L->drain_until = now + DRAIN_S;
            if (n_open == 0 || now >= L->drain_until) break;
        }
        if (L->kill_at > 0 && now >= L->kill_at && !L->killed && L->n_live > 0) {
            for (int r = 0; r < n; r++)
                if (L->ch[r].pid > 0)
                    fprintf(stderr, "jdt-train: rank %d did not stop within %.0f s: killing it\n",
                            r, GRACE_S);
            signal_all(L->ch, n, SIGKILL);
            L->killed = true;
        }
        double wait_s = 1.0;
        if (L->kill_at > 0 && !L->killed) wait_s = L->kill_at - now;
        if (L->n_live == 0) wait_s = L->drain_until - now;
        if (wait_s < 0) wait_s = 0;
        if (!pfd) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        } else {
            int np = 0;
            pfd[np++] = (struct pollfd){L->sfd, POLLIN, 0};
            int idx[2 * MAX_NPROC];
            for (int i = 0; i < 2 * n; i++)
                if (st[i].fd >= 0)
                    idx[np - 1] = i, pfd[np++] = (struct pollfd){st[i].fd, POLLIN, 0};
            int pr = poll(pfd, (nfds_t)np, (int)(wait_s * 1000) + 1);
            if (pr > 0) {
                for (int k = 1; k < np; k++)
                    if (pfd[k].revents) stream_pump(&st[idx[k - 1]]);
            }
        }
        handle_signals(L);
        reap_ranks(L);
    }
    for (int i = 0; i < 2 * n; i++) {
        if (st[i].fd >= 0) { /* a grandchild still holds the pipe: flush what we have */
            if (st[i].len) emit_line(&st[i], st[i].buf, st[i].len);
            close(st[i].fd);
        }
    }
    jdt_free(pfd);
    return L->fail_rank >= 0 || L->fail_code ? (L->fail_code ? L->fail_code : EXIT_RUNTIME)
                                             : EXIT_OK;
}

int jdt_launch_main(int argc, char **argv)
{
    launcher L;
    memset(&L, 0, sizeof L);
    L.listen_fd = L.sfd = -1;
    int rc = parse_launch_args(argc, argv, &L.a);
    L.n = L.a.nproc;
    bool user_token = false, user_threads = false;
    if (rc) goto out;
    if (!L.a.config) {
        rc = usage("--nproc: missing CONFIG%s", "");
        goto out;
    }
    if ((rc = preflight(&L, &user_token, &user_threads))) goto out;
    list_cpus(&L);
    if ((rc = open_coordinator(&L))) goto out;
    if ((rc = make_rank_env(&L, user_token, user_threads))) goto out;
    if ((rc = setup_supervision(&L))) goto out;

    const pid_t self = getpid();
    const int env_base = L.env.n_own;
    for (int r = 0; r < L.n && rc == 0; r++)
        rc = start_rank(&L, r, env_base, self);
    JDT_DEBUG("launched %d ranks, coordinator %s", L.n_live, L.coord);
    rc = supervise(&L, rc);
out:
    if (L.st)
        for (int i = 0; i < 2 * L.n; i++)
            jdt_free(L.st[i].buf);
    jdt_free(L.st);
    jdt_free(L.ch);
    jdt_free(L.env.v);
    if (L.sfd >= 0) close(L.sfd);
    if (L.listen_fd >= 0) close(L.listen_fd);
    if (L.masked) sigprocmask(SIG_SETMASK, &L.oldmask, NULL);
    if (L.have_config) jdt_config_free(&L.c);
    free_launch_args(&L.a);
    return rc;
}

/* ---- dist-check -------------------------------------------------------------------------------
 */

static volatile sig_atomic_t g_check_signal = 0; /* the only state a signal handler touches */
static void on_check_signal(int sig)
{
    g_check_signal = sig;
}

int jdt_launch_dist_check(int argc, char **argv)
{
    const char *config = NULL;
    double hold_s = 0;
    long exit_rank = -1, exit_code = 0;
    const char *emit = NULL;
    bool stubborn = false;
    int n_ovr = 0;
    char **ovr = jdt_calloc((size_t)argc + 1, sizeof *ovr);
    if (!ovr) return EXIT_RUNTIME;
    int rc = EXIT_OK;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc) {
            char *end = NULL;
            hold_s = strtod(argv[++i], &end);
            if (*end || !(hold_s >= 0) || hold_s > 3600) {
                rc = usage("dist-check --hold: expected seconds in [0, 3600], got '%s'", argv[i]);
                goto out_args;
            }
        } else if (strcmp(argv[i], "--stubborn") == 0) {
            stubborn = true;
        } else if (strcmp(argv[i], "--emit") == 0 && i + 1 < argc) {
            emit = argv[++i];
        } else if (strcmp(argv[i], "--exit") == 0 && i + 1 < argc) {
            char *end = NULL;
            exit_rank = strtol(argv[++i], &end, 10);
            if (*end == ':') exit_code = strtol(end + 1, &end, 10);
            if (*end || exit_rank < 0 || exit_code < 0 || exit_code > 255) {
                rc = usage("dist-check --exit: expected RANK:CODE, got '%s'", argv[i]);
                goto out_args;
            }
        } else if (argv[i][0] == '-') {
            rc = usage("dist-check: unknown option '%s'", argv[i]);
            goto out_args;
        } else if (!config) {
            config = argv[i];
        } else if (strchr(argv[i], '=')) {
            ovr[n_ovr++] = argv[i];
        } else {
            rc = usage("dist-check: unexpected argument '%s'", argv[i]);
            goto out_args;
        }
    }
    if (!config) {
        rc = usage("usage: jdt-train dist-check CONFIG [key=value ...] [--hold SECONDS] "
                   "[--exit RANK:CODE] [--emit TEXT] [--stubborn]%s",
                   "");
        goto out_args;
    }
    jdt_config c;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_config_load(config, n_ovr, ovr, environ, &c, &e);
    if (s) {
        fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
        rc = s == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
        goto out_args;
    }
    jdt_log_set_level(c.run.log_level);
    jdt_world w;
    jdt_dist *d = NULL;
    s = jdt_world_resolve(&c, environ, &w, &e);
    if (s) {
        fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
        rc = s == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
        goto out_config;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stubborn ? SIG_IGN : on_check_signal; /* --stubborn: a rank that hangs */
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s = jdt_world_connect(&w, &c, &d, &e);
    double sum = w.rank + 1.0;
    if (!s && d)
        s = jdt_comm_allreduce(jdt_dist_world(d), &sum, 1, JDT_DTYPE_F64, JDT_REDUCE_SUM, &e);
    double want = 0.5 * w.world_size * (w.world_size + 1.0);
    if (!s && sum != want)
        s = jdt_err_set(&e, JDT_ERR_INTERNAL, "all-reduce gave %g, expected %g", sum, want);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    if (!s) {
        printf("dist-check: rank %d of %d, local %d of %d, pid %d, host %s, coordinator %s, "
               "source %s, threads %d, all-reduce ok\n",
               w.rank, w.world_size, w.local_rank, w.local_world_size, (int)getpid(), host,
               w.coordinator[0] ? w.coordinator : "-", w.source,
               jdt_world_threads(&w, c.runtime.threads));
        if (w.rank == 0 && d)
            for (int r = 0; r < w.world_size; r++)
                printf("dist-check: peer %d at %s\n", r, jdt_dist_host(d, r));
        if (emit) fputs(emit, stdout); /* --emit: raw text, e.g. a last line with no newline */
        fflush(stdout);
    }
    if (!s && w.rank == exit_rank) { /* --exit: this rank leaves early with a code (tests) */
        jdt_dist_free(d);
        jdt_config_free(&c);
        jdt_free(ovr);
        return (int)exit_code;
    }
    /* --hold: stay in the job, watching it, until the time is up, a signal, or a lost peer */
    double until = jdt_now_s() + hold_s;
    while (!s && jdt_now_s() < until && !g_check_signal) {
        if (d) s = jdt_dist_check(d, &e);
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!s && d && !g_check_signal) s = jdt_dist_barrier(d, c.dist.connect_timeout_s, &e);
    if (g_check_signal) {
        printf("dist-check: rank %d got %s, leaving\n", w.rank, strsignal(g_check_signal));
        fflush(stdout);
        rc = 128 + g_check_signal;
    } else if (s) {
        fprintf(stderr, "jdt-train: error: %s\n", e.msg);
        rc = EXIT_RUNTIME;
    }
    jdt_dist_free(d);
out_config:
    jdt_config_free(&c);
out_args:
    jdt_free(ovr);
    return rc;
}
