/*
 * world.c — resolving a process's place in the job (config dist.* keys > SLURM > single) and
 * joining it through jdt_dist_init. Also SLURM's host-list and tasks-per-node syntax.
 *
 * Everything is read from the envp and config handed in, never from globals, so tests can
 * feed any environment.
 */
#include "world/world.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_MAX 256

/* ---- small helpers --------------------------------------------------------------------------- */

/* Value of NAME in envp, or NULL. */
static const char *env_get(char *const *envp, const char *name)
{
    if (!envp) return NULL;
    size_t n = strlen(name);
    for (char *const *p = envp; *p; p++)
        if (strncmp(*p, name, n) == 0 && (*p)[n] == '=') return *p + n + 1;
    return NULL;
}

/* Parses a whole decimal integer in [lo, hi]; false when s is not one. */
static bool parse_long(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s) return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* Reads env var `name` as an integer in [lo, hi]. Returns JDT_OK with *out (left as is when
 * the variable is absent and *found false), or ERR_CONFIG for a malformed value. */
static jdt_status env_long(char *const *envp, const char *name, long lo, long hi, long *out,
                           bool *found, jdt_err *e)
{
    const char *s = env_get(envp, name);
    if (found) *found = s != NULL;
    if (!s) return JDT_OK;
    if (!parse_long(s, lo, hi, out))
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "environment variable %s: expected an integer in [%ld, %ld], got '%s'",
                           name, lo, hi, s);
    return JDT_OK;
}

static bool is_loopback_host(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 ||
           strcmp(host, "::1") == 0;
}

/* Checks "host:port" (port 1..65535, host non-empty, no spaces); `what` names the source. */
static jdt_status check_addr(const char *addr, const char *what, jdt_err *e)
{
    const char *colon = strrchr(addr, ':');
    long port;
    if (!colon || colon == addr || !parse_long(colon + 1, 1, 65535, &port))
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "%s: expected host:port with a port in 1..65535, got '%s'", what, addr);
    for (const char *p = addr; p < colon; p++)
        if (*p == ' ' || *p == '\t' || *p == '/' || *p == ',')
            return jdt_err_set(e, JDT_ERR_CONFIG, "%s: '%s' is not a host name or address", what,
                               addr);
    return JDT_OK;
}

/* ---- SLURM host lists ------------------------------------------------------------------------ */

typedef struct {
    char **v; /* (n) owned strings */
    int n, cap, max;
} strlist;

static jdt_status strlist_push(strlist *l, const char *s, jdt_err *e)
{
    if (l->n >= l->max)
        return jdt_err_set(e, JDT_ERR_CONFIG, "expands to more than %d hosts", l->max);
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **v = jdt_realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) return jdt_err_set(e, JDT_ERR_NOMEM, "host list: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = jdt_strdup(s);
    if (!l->v[l->n]) return jdt_err_set(e, JDT_ERR_NOMEM, "host list: out of memory");
    l->n++;
    return JDT_OK;
}

/* Parses one range element "a" or "a-b" of len bytes into [*lo, *hi] with zero-pad width. */
static jdt_status parse_range(const char *s, size_t len, long *lo, long *hi, int *width,
                              jdt_err *e)
{
    char a[16], b[16];
    const char *dash = memchr(s, '-', len);
    size_t la = dash ? (size_t)(dash - s) : len;
    size_t lb = dash ? len - la - 1 : 0;
    if (la == 0 || la >= sizeof a || (dash && (lb == 0 || lb >= sizeof b)))
        return jdt_err_set(e, JDT_ERR_CONFIG, "bad range '%.*s' (want N or N-M, up to 9 digits)",
                           (int)len, s);
    memcpy(a, s, la);
    a[la] = 0;
    if (dash) memcpy(b, dash + 1, lb);
    b[lb] = 0;
    for (size_t i = 0; i < la; i++)
        if (a[i] < '0' || a[i] > '9') goto bad;
    for (size_t i = 0; i < lb; i++)
        if (b[i] < '0' || b[i] > '9') goto bad;
    if (!parse_long(a, 0, 999999999, lo) || (dash && !parse_long(b, 0, 999999999, hi))) goto bad;
    if (!dash) *hi = *lo;
    if (*hi < *lo)
        return jdt_err_set(e, JDT_ERR_CONFIG, "reversed range '%.*s'", (int)len, s);
    *width = (int)la;
    return JDT_OK;
bad:
    return jdt_err_set(e, JDT_ERR_CONFIG, "bad range '%.*s' (want N or N-M, up to 9 digits)",
                       (int)len, s);
}

/* Expands item[0..len) (no top-level commas) after `prefix` into out. */
static jdt_status expand_item(const char *item, size_t len, const char *prefix, strlist *out,
                              jdt_err *e)
{
    char buf[HOST_MAX];
    const char *lb = memchr(item, '[', len);
    if (!lb) {
        int n = snprintf(buf, sizeof buf, "%s%.*s", prefix, (int)len, item);
        if (n < 0 || (size_t)n >= sizeof buf)
            return jdt_err_set(e, JDT_ERR_CONFIG, "host name longer than %d bytes", HOST_MAX - 1);
        return strlist_push(out, buf, e);
    }
    const char *rb = memchr(lb, ']', len - (size_t)(lb - item));
    if (!rb) return jdt_err_set(e, JDT_ERR_CONFIG, "unclosed '['");
    const char *inner = lb + 1;
    size_t inner_len = (size_t)(rb - inner);
    if (inner_len == 0) return jdt_err_set(e, JDT_ERR_CONFIG, "empty brackets '[]'");
    if (memchr(inner, '[', inner_len)) return jdt_err_set(e, JDT_ERR_CONFIG, "nested '['");
    const char *tail = rb + 1;
    size_t tail_len = len - (size_t)(tail - item);
    size_t pos = 0;
    while (pos <= inner_len) {
        const char *el = inner + pos;
        const char *comma = memchr(el, ',', inner_len - pos);
        size_t el_len = comma ? (size_t)(comma - el) : inner_len - pos;
        long lo = 0, hi = -1;
        int width = 0;
        jdt_status st = parse_range(el, el_len, &lo, &hi, &width, e);
        if (st) return st;
        for (long v = lo; v <= hi; v++) {
            int n = snprintf(buf, sizeof buf, "%s%.*s%0*ld", prefix, (int)(lb - item), item, width,
                             v);
            if (n < 0 || (size_t)n >= sizeof buf)
                return jdt_err_set(e, JDT_ERR_CONFIG, "host name longer than %d bytes",
                                   HOST_MAX - 1);
            st = expand_item(tail, tail_len, buf, out, e);
            if (st) return st;
        }
        pos += el_len + 1;
    }
    return JDT_OK;
}

jdt_status jdt_world_hostlist_expand(const char *list, int max_hosts, char ***hosts, int *n,
                                     jdt_err *e)
{
    strlist out = {NULL, 0, 0, max_hosts > 0 ? max_hosts : JDT_WORLD_MAX_HOSTS};
    jdt_status st = JDT_OK;
    *hosts = NULL;
    *n = 0;
    if (!list || !*list) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "empty host list");
        goto out_fail;
    }
    size_t len = strlen(list), start = 0;
    int depth = 0;
    for (size_t i = 0; i <= len; i++) {
        char c = list[i];
        if (c == '[') {
            if (depth++ > 0) {
                st = jdt_err_set(e, JDT_ERR_CONFIG, "nested '[' at position %zu", i + 1);
                goto out_fail;
            }
        } else if (c == ']') {
            if (--depth < 0) {
                st = jdt_err_set(e, JDT_ERR_CONFIG, "']' without '[' at position %zu", i + 1);
                goto out_fail;
            }
        } else if (c == ' ' || c == '\t' || c == '\n') {
            st = jdt_err_set(e, JDT_ERR_CONFIG, "white space at position %zu", i + 1);
            goto out_fail;
        } else if ((c == ',' && depth == 0) || c == '\0') {
            if (c == '\0' && depth > 0) {
                st = jdt_err_set(e, JDT_ERR_CONFIG, "unclosed '['");
                goto out_fail;
            }
            if (i == start) {
                st = jdt_err_set(e, JDT_ERR_CONFIG, "empty host name at position %zu", i + 1);
                goto out_fail;
            }
            st = expand_item(list + start, i - start, "", &out, e);
            if (st) goto out_fail;
            start = i + 1;
        }
    }
    *hosts = out.v;
    *n = out.n;
    return JDT_OK;
out_fail:
    jdt_world_hostlist_free(out.v, out.n);
    if (e && st != JDT_ERR_NOMEM) jdt_err_prefix(e, "host list '%s'", list ? list : "");
    return st;
}

void jdt_world_hostlist_free(char **hosts, int n)
{
    if (!hosts) return;
    for (int i = 0; i < n; i++) jdt_free(hosts[i]);
    jdt_free(hosts);
}

/* Parses a tasks-per-node list ("2(x3),1"). Returns false when it is malformed; else true with
 * *n_on_node the count of node node_index (-1 when the list has no entry for it), and, when not
 * NULL, *n_nodes and *n_tasks the nodes it lists and their tasks in all. */
static bool parse_tpn(const char *spec, long node_index, long *n_on_node, long *n_nodes,
                      long *n_tasks)
{
    const char *p = spec;
    long node = 0, found = -1, total = 0;
    if (!spec || !*spec) return false;
    while (*p) {
        char *end = NULL;
        if (*p < '0' || *p > '9') return false;
        errno = 0;
        long count = strtol(p, &end, 10), reps = 1;
        if (errno || end == p || count < 1 || count > 1000000) return false;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x' || p[2] < '0' || p[2] > '9') return false;
            errno = 0;
            reps = strtol(p + 2, &end, 10);
            if (errno || reps < 1 || reps > 1000000 || *end != ')') return false;
            p = end + 1;
        }
        if (node_index >= node && node_index < node + reps) found = count;
        node += reps;
        total += count * reps;
        if (node > (1L << 30) || total > (1L << 40)) return false;
        if (*p == ',') {
            if (!*++p) return false;
        } else if (*p) {
            return false;
        }
    }
    *n_on_node = found;
    if (n_nodes) *n_nodes = node;
    if (n_tasks) *n_tasks = total;
    return true;
}

jdt_status jdt_world_tasks_per_node(const char *spec, int node_index, int *n_tasks, jdt_err *e)
{
    long found = -1, n_nodes = 0;
    if (!parse_tpn(spec, node_index, &found, &n_nodes, NULL))
        return jdt_err_set(e, JDT_ERR_CONFIG, "tasks per node '%s': expected counts like '2(x3),1'",
                           spec ? spec : "");
    /* a single count ("4", as in SLURM_NTASKS_PER_NODE) applies to every node */
    if (found < 0 && n_nodes == 1 && !strchr(spec, '(')) found = strtol(spec, NULL, 10);
    if (found < 0)
        return jdt_err_set(e, JDT_ERR_CONFIG, "tasks per node '%s': no entry for node %d", spec,
                           node_index);
    *n_tasks = (int)found;
    return JDT_OK;
}

int jdt_world_slurm_port(long job_id, long step_id)
{
    if (job_id < 0) job_id = -job_id;
    if (step_id < 0) step_id = 0;
    return 12000 + 8 * (int)(job_id % 2000) + (int)(step_id % 8);
}

/* ---- resolution ------------------------------------------------------------------------------ */

/* Reads the first line of path into out (trailing white space trimmed). */
static jdt_status read_token_file(const char *path, char *out, size_t cap, jdt_err *e)
{
    jdt_status st = JDT_OK;
    FILE *f = fopen(path, "r");
    if (!f)
        return jdt_err_set(e, JDT_ERR_CONFIG, "dist.token_file: cannot read '%s': %s", path,
                           strerror(errno));
    char line[1024];
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' ||
                     line[n - 1] == '\t'))
        line[--n] = 0;
    if (n == 0)
        st = jdt_err_set(e, JDT_ERR_CONFIG, "dist.token_file: '%s' is empty (want one line)",
                         path);
    else if (n >= cap)
        st = jdt_err_set(e, JDT_ERR_CONFIG, "dist.token_file: '%s': token longer than %zu bytes",
                         path, cap - 1);
    else
        memcpy(out, line, n + 1);
    fclose(f);
    return st;
}

/* The SLURM part of the environment: what resolution uses, and what check_slurm_step holds it
 * against. */
typedef struct {
    bool present;
    long rank, world_size, local_rank, local_world_size, job_id, step_id;
    const char *world_var; /* the variable world_size came from */
    char outside_srun[96]; /* "" in a task srun started, else where this process runs */
    /* a heterogeneous job: SLURM_HET_SIZE (SLURM_PACK_SIZE before 20.02) is set */
    bool het;
    bool has_local_id, has_node_id;
    long node_id;
    long step_num_tasks; /* SLURM_STEP_NUM_TASKS, -1 when not set */
    /* SLURM_STEP_TASKS_PER_NODE (NULL when not set), its nodes, its tasks in all and the tasks
     * of node node_id (-1 when it has no entry for it) */
    const char *step_tpn;
    long step_tpn_nodes, step_tpn_tasks, step_tpn_here;
    /* SLURM_STEP_NODELIST (NULL when not set) and the hosts it expands to */
    const char *step_nodelist;
    long step_hosts;
    char first_host[HOST_MAX]; /* of the step's node list, else of the job's */
    const char *node_name;     /* SLURMD_NODENAME: this node's SLURM name, NULL when not set */
    char cluster[64];
} slurm_env;

/* The environment another launcher gives its processes: torchrun's (and any env:// launcher's:
 * RANK, WORLD_SIZE, MASTER_ADDR, with LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_PORT; torchrun adds
 * TORCHELASTIC_RUN_ID), or an MPI launcher's (Open MPI's OMPI_COMM_WORLD_RANK, _SIZE,
 * _LOCAL_RANK, _LOCAL_SIZE; MPICH's and Intel MPI's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
 * MPI_LOCALNRANKS). */
typedef struct {
    const char *source; /* "torchrun", "torch-env", "mpi"; NULL when neither is there */
    long rank, world_size, local_rank, local_world_size;
    const char *world_var;   /* the variable world_size came from */
    const char *master_addr; /* MASTER_ADDR, or NULL */
    long master_port;        /* MASTER_PORT, or -1 */
    bool agent_store;        /* torchrun's agent holds MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE) */
    const char *run_id;      /* TORCHELASTIC_RUN_ID, or NULL */
    long job_id;             /* mpi: Open MPI's job id (OMPI_MCA_ess_base_jobid), or -1 */
} launcher_env;

static jdt_status read_launcher(char *const *envp, launcher_env *l, jdt_err *e)
{
    memset(l, 0, sizeof *l);
    l->master_port = -1;
    static const struct {
        const char *source, *rank, *size, *local_rank, *local_size;
    } kinds[] = {
        {"torch-env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    };
    jdt_status st;
    for (size_t k = 0; k < JDT_ARRAY_LEN(kinds); k++) {
        /* env:// needs its rendezvous address too: RANK and WORLD_SIZE alone are too common a
         * pair of names to take a stray shell's for a job */
        if (!env_get(envp, kinds[k].rank) || !env_get(envp, kinds[k].size) ||
            (k == 0 && !env_get(envp, "MASTER_ADDR")))
            continue;
        bool found = false;
        l->local_rank = 0;
        l->local_world_size = -1;
        if ((st = env_long(envp, kinds[k].size, 1, 1 << 20, &l->world_size, NULL, e)) ||
            (st = env_long(envp, kinds[k].rank, 0, l->world_size - 1, &l->rank, NULL, e)) ||
            (st = env_long(envp, kinds[k].local_rank, 0, 1 << 20, &l->local_rank, NULL, e)) ||
            (st = env_long(envp, kinds[k].local_size, 1, 1 << 20, &l->local_world_size, &found,
                           e)))
            return st;
        if (!found) l->local_world_size = l->local_rank + 1; /* unknown: at least this many */
        if (l->local_rank >= l->local_world_size)
            return jdt_err_set(e, JDT_ERR_CONFIG, "environment variable %s=%ld is not below %s=%ld",
                               kinds[k].local_rank, l->local_rank, kinds[k].local_size,
                               l->local_world_size);
        l->source = kinds[k].source;
        l->world_var = kinds[k].size;
        break;
    }
    if (!l->source) return JDT_OK;
    l->master_addr = env_get(envp, "MASTER_ADDR");
    if (l->master_addr && !l->master_addr[0]) l->master_addr = NULL;
    if ((st = env_long(envp, "MASTER_PORT", 1, 65535, &l->master_port, NULL, e))) return st;
    l->run_id = env_get(envp, "TORCHELASTIC_RUN_ID");
    l->job_id = -1;
    if (strcmp(l->source, "mpi") == 0 &&
        (st = env_long(envp, "OMPI_MCA_ess_base_jobid", 0, LONG_MAX, &l->job_id, NULL, e)))
        return st;
    if (strcmp(l->source, "torch-env") == 0 && l->run_id) l->source = "torchrun";
    const char *agent = env_get(envp, "TORCHELASTIC_USE_AGENT_STORE");
    l->agent_store = agent && (strcmp(agent, "True") == 0 || strcmp(agent, "true") == 0 ||
                               strcmp(agent, "1") == 0);
    return JDT_OK;
}

static const char *plural(long n)
{
    return n == 1 ? "" : "s";
}

/* Classifies SLURM_STEP_ID (or SLURM_STEPID) into s: a step srun started has a small id; the
 * batch script has none (or "batch"), and SLURM's special steps have ids near 2^32 (slurm.h:
 * NO_VAL 0xfffffffe, batch 0xfffffffb, interactive 0xfffffffa, ...), which newer versions
 * print as signed numbers (-2, -5, -6, ...). None of those are srun's tasks. */
static jdt_status read_slurm_step(const char *step, slurm_env *s, jdt_err *e)
{
    long id = 0;
    if (!step || strcmp(step, "batch") == 0) {
        snprintf(s->outside_srun, sizeof s->outside_srun, "a SLURM batch script");
        return JDT_OK;
    }
    if (!parse_long(step, -16, 1L << 40, &id))
        return jdt_err_set(e, JDT_ERR_CONFIG, "SLURM_STEP_ID: expected an integer, got '%s'", step);
    if (id == 0xfffffffaL || id == -6)
        snprintf(s->outside_srun, sizeof s->outside_srun,
                 "SLURM's interactive step (salloc's shell)");
    else if (id == 0xfffffffbL || id == -5 || id == 0xfffffffeL || id == -2)
        snprintf(s->outside_srun, sizeof s->outside_srun, "a SLURM batch script");
    else if (id < 0 || id >= 0xfffffff0L)
        snprintf(s->outside_srun, sizeof s->outside_srun, "SLURM step %s, which srun did not start",
                 step);
    else
        s->step_id = id;
    return JDT_OK;
}

/* Tasks on this host in a heterogeneous step, or 0 when unknown: srun sorts the step's node list
 * by name and its tasks-per-node list with it, while SLURM_NODEID counts the nodes of the task's
 * own component, so the host is found by its name (SLURMD_NODENAME), every entry of it summed. */
static long het_local_tasks(char *const *envp, char **hosts, int n_hosts, const char *tpn)
{
    const char *name = env_get(envp, "SLURMD_NODENAME");
    long sum = 0, here = -1;
    if (!name || !tpn) return 0;
    for (int i = 0; i < n_hosts; i++)
        if (strcmp(hosts[i], name) == 0 && parse_tpn(tpn, i, &here, NULL, NULL) && here > 0)
            sum += here;
    return sum;
}

static jdt_status read_slurm(char *const *envp, slurm_env *s, jdt_err *e)
{
    memset(s, 0, sizeof *s);
    s->step_num_tasks = -1;
    s->step_tpn_here = -1;
    const char *procid = env_get(envp, "SLURM_PROCID");
    if (!procid) return JDT_OK;
    s->present = true;
    jdt_status st;
    bool found = false;
    if ((st = env_long(envp, "SLURM_PROCID", 0, 1 << 20, &s->rank, NULL, e))) return st;
    if ((st = env_long(envp, "SLURM_STEP_NUM_TASKS", 1, 1 << 20, &s->step_num_tasks, NULL, e)))
        return st;
    /* SLURM_NPROCS is the old name; srun --preserve-env passes neither on when the allocation
     * had none, and then the step's own count is all there is */
    const char *world_vars[] = {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"};
    s->world_size = 1;
    s->world_var = world_vars[0];
    for (size_t i = 0; i < JDT_ARRAY_LEN(world_vars) && !found; i++) {
        if ((st = env_long(envp, world_vars[i], 1, 1 << 20, &s->world_size, &found, e))) return st;
        if (found) s->world_var = world_vars[i];
    }
    if (s->rank >= s->world_size)
        return jdt_err_set(e, JDT_ERR_CONFIG, "SLURM_PROCID=%ld is not below %s=%ld", s->rank,
                           s->world_var, s->world_size);
    s->local_rank = s->rank;
    if ((st = env_long(envp, "SLURM_LOCALID", 0, 1 << 20, &s->local_rank, &s->has_local_id, e)))
        return st;
    if ((st = env_long(envp, "SLURM_NODEID", 0, 1 << 20, &s->node_id, &s->has_node_id, e)))
        return st;
    s->het = env_get(envp, "SLURM_HET_SIZE") || env_get(envp, "SLURM_PACK_SIZE");
    s->node_name = env_get(envp, "SLURMD_NODENAME");

    /* the batch script itself runs with SLURM_PROCID=0 and the job's SLURM_NTASKS, but it is
     * one process: its tasks start only under srun (so does salloc's interactive step) */
    const char *step = env_get(envp, "SLURM_STEP_ID");
    if (!step) step = env_get(envp, "SLURM_STEPID");
    if ((st = read_slurm_step(step, s, e))) return st;

    const char *job = env_get(envp, "SLURM_JOB_ID");
    const char *job_var = "SLURM_JOB_ID";
    if (!job) {
        job = env_get(envp, "SLURM_JOBID");
        job_var = "SLURM_JOBID";
    }
    if (!job)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_PROCID is set but SLURM_JOB_ID is not: not a SLURM task "
                           "environment (unset SLURM_PROCID, or set dist.rank)");
    if (!parse_long(job, 0, 1L << 50, &s->job_id))
        return jdt_err_set(e, JDT_ERR_CONFIG, "%s: expected an integer, got '%s'", job_var, job);

    const char *step_tpn = env_get(envp, "SLURM_STEP_TASKS_PER_NODE");
    long het_local = 0;
    const char *nl_vars[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    const char *nl = NULL, *nl_var = NULL;
    for (size_t i = 0; i < JDT_ARRAY_LEN(nl_vars) && !nl; i++) {
        nl = env_get(envp, nl_vars[i]);
        nl_var = nl_vars[i];
    }
    if (nl) {
        char **hosts = NULL;
        int n = 0;
        st = jdt_world_hostlist_expand(nl, JDT_WORLD_MAX_HOSTS, &hosts, &n, e);
        if (st) return jdt_err_prefix(e, "environment variable %s", nl_var);
        snprintf(s->first_host, sizeof s->first_host, "%s", hosts[0]);
        if (strcmp(nl_var, "SLURM_STEP_NODELIST") == 0) {
            s->step_nodelist = nl;
            s->step_hosts = n;
            if (s->het) het_local = het_local_tasks(envp, hosts, n, step_tpn);
        }
        jdt_world_hostlist_free(hosts, n);
    }

    /* tasks on this node: the step's list, else the job's (stale inside an allocation: a
     * `srun -n1` inherits the job's SLURM_NTASKS_PER_NODE) */
    const char *tpn_vars[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                              "SLURM_TASKS_PER_NODE"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(tpn_vars) && !s->local_world_size; i++) {
        const char *v = env_get(envp, tpn_vars[i]);
        if (!v) continue;
        if (i == 0) {
            if (!parse_tpn(v, s->node_id, &s->step_tpn_here, &s->step_tpn_nodes,
                           &s->step_tpn_tasks))
                return jdt_err_set(e, JDT_ERR_CONFIG,
                                   "environment variable %s: tasks per node '%s': expected "
                                   "counts like '2(x3),1'",
                                   tpn_vars[i], v);
            s->step_tpn = v;
            if (het_local > 0) {
                s->local_world_size = het_local;
                break;
            }
            if (s->step_tpn_here < 0) break; /* no entry for SLURM_NODEID: check_slurm_step */
        }
        int n = 0;
        st = jdt_world_tasks_per_node(v, (int)s->node_id, &n, e);
        if (st) return jdt_err_prefix(e, "environment variable %s", tpn_vars[i]);
        s->local_world_size = n;
    }
    if (!s->local_world_size) s->local_world_size = 1;
    if (s->local_rank >= s->local_world_size) s->local_world_size = s->local_rank + 1;

    const char *cl = env_get(envp, "SLURM_CLUSTER_NAME");
    snprintf(s->cluster, sizeof s->cluster, "%s", cl && *cl ? cl : "cluster");
    return JDT_OK;
}

/*
 * Holds a task's SLURM values against each other; each check is true of every task srun starts
 * (block, cyclic, plane or arbitrary distribution, topology-ordered nodes, --overlap, a step
 * smaller than its allocation, job arrays). Not checked: that SLURM_PROCID lies in its node's
 * block of ranks, which holds for a block distribution only, and not even for that where a
 * topology plugin orders the nodes. In a heterogeneous step SLURM_NODEID counts the nodes of
 * the task's own component while the step's lists are sorted by host name, so the checks per
 * node are left out there. Returns JDT_OK, or JDT_ERR_CONFIG with one line naming both values.
 */
static jdt_status check_slurm_step(const slurm_env *s, jdt_err *e)
{
    if (s->step_num_tasks > 0 && s->step_num_tasks != s->world_size)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "%s=%ld but SLURM_STEP_NUM_TASKS=%ld (srun -E keeps the "
                           "allocation's %s; a batch script submitted from a step inherits its "
                           "SLURM_STEP_*): start the tasks with `srun jdt-train ...` without -E",
                           s->world_var, s->world_size, s->step_num_tasks, s->world_var);
    if (s->step_tpn && s->step_tpn_tasks != s->world_size)
        return jdt_err_set(
            e, JDT_ERR_CONFIG, "%s=%ld but SLURM_STEP_TASKS_PER_NODE=%s gives the step %ld task%s",
            s->world_var, s->world_size, s->step_tpn, s->step_tpn_tasks, plural(s->step_tpn_tasks));
    if (s->step_tpn && s->step_nodelist && s->step_hosts != s->step_tpn_nodes)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_STEP_NODELIST=%s has %ld node%s but "
                           "SLURM_STEP_TASKS_PER_NODE=%s gives tasks to %ld",
                           s->step_nodelist, s->step_hosts, plural(s->step_hosts), s->step_tpn,
                           s->step_tpn_nodes);
    /* a node's tasks have distinct ranks and SLURM_LOCALID orders them, so none exceeds its rank */
    if (s->has_local_id && s->local_rank > s->rank)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_LOCALID=%ld but SLURM_PROCID=%ld: a task's local id counts "
                           "the tasks of lower rank on its node, so it cannot exceed the rank",
                           s->local_rank, s->rank);
    if (s->het || !s->has_node_id) return JDT_OK;
    if (s->step_nodelist && s->node_id >= s->step_hosts)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_NODEID=%ld but SLURM_STEP_NODELIST=%s has %ld node%s", s->node_id,
                           s->step_nodelist, s->step_hosts, plural(s->step_hosts));
    if (s->step_tpn && s->node_id >= s->step_tpn_nodes)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_NODEID=%ld but SLURM_STEP_TASKS_PER_NODE=%s lists %ld node%s",
                           s->node_id, s->step_tpn, s->step_tpn_nodes, plural(s->step_tpn_nodes));
    if (s->has_local_id && s->step_tpn && s->local_rank >= s->step_tpn_here)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "SLURM_LOCALID=%ld but SLURM_STEP_TASKS_PER_NODE=%s gives node %ld "
                           "(SLURM_NODEID) only %ld task%s",
                           s->local_rank, s->step_tpn, s->node_id, s->step_tpn_here,
                           plural(s->step_tpn_here));
    return JDT_OK;
}

/*
 * Whether this task hosts the coordinator under SLURM when dist.coordinator is not set. Every
 * task looks for it on the first host of the step's node list, so the task running there with
 * SLURM_LOCALID 0 hosts it, whatever its rank: SLURM starts rank 0 elsewhere under an arbitrary
 * distribution, a topology plugin's node order or in a heterogeneous step (its node list is
 * sorted by name). The host is recognised by its SLURM name (SLURMD_NODENAME, spelt as the node
 * list spells it); without that name, in a homogeneous step, by SLURM_NODEID 0 (the index into
 * the step's node list there; a heterogeneous step counts the nodes of the task's own
 * component). Returns 1 (this task), 0 (another task), or -1 where the environment cannot tell
 * (no step node list or local id, a heterogeneous step without the name): rank 0 hosts then.
 * SLURM gives the components of a heterogeneous job separate nodes (two asked onto one node
 * pend for resources, Debian's SLURM 22.05), so one task of the step has SLURM_LOCALID 0 on
 * the first host there too (tests/e2e/slurm_train.sh case 3).
 */
static int slurm_hosts_coordinator(const slurm_env *s)
{
    if (!s->step_nodelist || !s->has_local_id) return -1;
    if (s->node_name) return strcmp(s->node_name, s->first_host) == 0 && s->local_rank == 0;
    if (!s->het && s->has_node_id) return s->node_id == 0 && s->local_rank == 0;
    return -1;
}

jdt_status jdt_world_resolve(const jdt_config *cfg, char *const *envp, jdt_world *w, jdt_err *e)
{
    memset(w, 0, sizeof *w);
    w->coord_listen_fd = -1;
    w->local_world_size = 1;
    const int mesh_size = jdt_config_mesh_size(cfg);
    slurm_env sl;
    jdt_status st = read_slurm(envp, &sl, e);
    if (st) return st;
    launcher_env le;
    if ((st = read_launcher(envp, &le, e))) return st;
    /* torchrun inside an srun step is the nearer launcher; MPI under srun is SLURM's own tasks */
    const bool srun_step = sl.present && !sl.outside_srun[0];
    const bool other = le.source && (strcmp(le.source, "mpi") != 0 || !srun_step);
    int first_node = -1; /* slurm_hosts_coordinator where the coordinator is SLURM's first node */

    /* dist.coordinator alone under SLURM (or another launcher) only moves the coordinator; ranks
     * stay the launcher's */
    const bool cfg_mode =
        cfg->dist.rank >= 0 || (cfg->dist.coordinator[0] && !sl.present && !other);
    if (cfg_mode) {
        w->source = "config";
        w->world_size = cfg->dist.world_size > 0 ? cfg->dist.world_size : mesh_size;
        if (w->world_size < 1)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "dist.world_size: not set, and the mesh has a -1 axis to fill in "
                               "from it: set dist.world_size=N (or JDT_DIST_WORLD_SIZE)");
        if (cfg->dist.rank < 0)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "dist.rank: not set, but dist.coordinator is '%s': give each "
                               "process dist.rank=R (or JDT_DIST_RANK), or use jdt-train --nproc",
                               cfg->dist.coordinator);
        w->rank = cfg->dist.rank;
        if (w->rank >= w->world_size)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "dist.rank: %d is not below the world size %d (dist.world_size, "
                               "else the mesh size)",
                               w->rank, w->world_size);
        if (cfg->dist.coordinator[0]) {
            snprintf(w->coordinator, sizeof w->coordinator, "%s", cfg->dist.coordinator);
        } else if (w->world_size > 1) {
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "dist.coordinator: not set, but dist.rank is %d of %d: set "
                               "dist.coordinator=HOST:PORT (rank 0's host) on every process",
                               w->rank, w->world_size);
        }
        if (w->coordinator[0] && (st = check_addr(w->coordinator, "dist.coordinator", e)))
            return st;
        w->local_rank = cfg->dist.local_rank >= 0 ? cfg->dist.local_rank : w->rank;
        /* everyone on one host when the coordinator is on loopback; unknown otherwise */
        char host[HOST_MAX];
        const char *colon = strrchr(w->coordinator, ':');
        snprintf(host, sizeof host, "%.*s", colon ? (int)(colon - w->coordinator) : 0,
                 w->coordinator);
        w->local_world_size = is_loopback_host(host) ? w->world_size : 1;
        if (w->local_rank >= w->local_world_size) w->local_world_size = w->local_rank + 1;
    } else if (other) {
        w->source = le.source;
        w->rank = (int)le.rank;
        w->world_size = (int)le.world_size;
        w->local_rank = (int)le.local_rank;
        w->local_world_size = (int)le.local_world_size;
        if (cfg->dist.world_size > 0 && cfg->dist.world_size != w->world_size)
            return jdt_err_set(e, JDT_ERR_CONFIG, "dist.world_size is %d but %s started %d (%s)",
                               cfg->dist.world_size, le.source, w->world_size, le.world_var);
        if (w->world_size > 1 && cfg->dist.coordinator[0]) {
            snprintf(w->coordinator, sizeof w->coordinator, "%s", cfg->dist.coordinator);
        } else if (w->world_size > 1) {
            /* rank 0's host; torchrun's c10d rendezvous found MASTER_PORT free there for the
             * workers, its static one (TORCHELASTIC_USE_AGENT_STORE) holds it in the agent */
            long port = cfg->dist.port > 0          ? cfg->dist.port
                        : le.master_port < 0        ? -1
                        : le.agent_store            ? le.master_port % 65535 + 1
                                                    : le.master_port;
            /* mpirun on one host: every process can derive the same loopback address */
            const bool one_host = le.local_world_size == le.world_size && le.job_id >= 0;
            if (!le.master_addr && one_host) {
                le.master_addr = "127.0.0.1";
                if (port < 0) port = jdt_world_slurm_port(le.job_id, 0);
            }
            if (!le.master_addr || port < 0)
                return jdt_err_set(e, JDT_ERR_CONFIG,
                                   "%s started %d processes (%s) but %s: set "
                                   "dist.coordinator=HOST:PORT (rank 0's host and a free port) "
                                   "on every process, or MASTER_ADDR and MASTER_PORT",
                                   le.source, w->world_size, le.world_var,
                                   !le.master_addr ? "MASTER_ADDR is not set"
                                                   : "MASTER_PORT is not set (nor dist.port)");
            int n = snprintf(w->coordinator, sizeof w->coordinator, "%s:%ld", le.master_addr, port);
            if (n < 0 || (size_t)n >= sizeof w->coordinator)
                return jdt_err_set(e, JDT_ERR_CONFIG, "MASTER_ADDR: host name too long");
        }
        if (w->coordinator[0] && (st = check_addr(w->coordinator, cfg->dist.coordinator[0]
                                                                      ? "dist.coordinator"
                                                                      : "MASTER_ADDR:MASTER_PORT",
                                                  e)))
            return st;
    } else if (sl.present && sl.outside_srun[0] && sl.world_size > 1) {
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "running in %s with %s=%ld but outside srun: start the tasks with "
                           "`srun jdt-train ...`",
                           sl.outside_srun, sl.world_var, sl.world_size);
    } else if (sl.present) {
        if (!sl.outside_srun[0] && (st = check_slurm_step(&sl, e))) return st;
        w->source = "slurm";
        w->rank = (int)sl.rank;
        w->world_size = (int)sl.world_size;
        w->local_rank = (int)sl.local_rank;
        w->local_world_size = (int)sl.local_world_size;
        if (cfg->dist.world_size > 0 && cfg->dist.world_size != w->world_size)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "dist.world_size is %d but SLURM started %d tasks (%s)",
                               cfg->dist.world_size, w->world_size, sl.world_var);
        if (w->world_size > 1 && cfg->dist.coordinator[0]) {
            snprintf(w->coordinator, sizeof w->coordinator, "%s", cfg->dist.coordinator);
            if ((st = check_addr(w->coordinator, "dist.coordinator", e))) return st;
        } else if (w->world_size > 1) {
            if (!sl.first_host[0])
                return jdt_err_set(e, JDT_ERR_CONFIG,
                                   "SLURM: no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to find "
                                   "the coordinator host; set dist.coordinator=HOST:PORT");
            int port = cfg->dist.port > 0 ? cfg->dist.port
                                          : jdt_world_slurm_port(sl.job_id, sl.step_id);
            int n = snprintf(w->coordinator, sizeof w->coordinator, "%s:%d", sl.first_host, port);
            if (n < 0 || (size_t)n >= sizeof w->coordinator)
                return jdt_err_set(e, JDT_ERR_CONFIG, "SLURM: coordinator host name too long");
            first_node = slurm_hosts_coordinator(&sl);
        }
    } else {
        w->source = "single";
        w->world_size = 1;
        w->rank = w->local_rank = 0;
    }

    /* SLURM's task count must fit the mesh (the train loop checks the other sources) */
    if (strcmp(w->source, "slurm") == 0 && mesh_size > 0 && w->world_size != mesh_size)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "slurm: %d tasks (%s), but the mesh (data=%d fsdp=%d tensor=%d) "
                           "needs %d: make mesh.data * mesh.fsdp * mesh.tensor match",
                           w->world_size, sl.world_var, cfg->mesh.data, cfg->mesh.fsdp,
                           cfg->mesh.tensor, mesh_size);

    /* token */
    if (cfg->dist.token[0]) {
        if (strlen(cfg->dist.token) >= sizeof w->token)
            return jdt_err_set(e, JDT_ERR_CONFIG, "dist.token: longer than %zu bytes",
                               sizeof w->token - 1);
        snprintf(w->token, sizeof w->token, "%s", cfg->dist.token);
    } else if (cfg->dist.token_file[0]) {
        if ((st = read_token_file(cfg->dist.token_file, w->token, sizeof w->token, e))) return st;
    } else if (strcmp(w->source, "slurm") == 0) {
        snprintf(w->token, sizeof w->token, "slurm-%s-%ld", sl.cluster, sl.job_id);
    } else if (other && w->world_size > 1) { /* what every process of the job was given */
        char id[32] = "";
        if (le.job_id >= 0) snprintf(id, sizeof id, "%ld", le.job_id);
        snprintf(w->token, sizeof w->token, "%s-%.64s-%.160s", le.source, le.run_id ? le.run_id : id,
                 w->coordinator);
    } else if (w->world_size > 1) {
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "dist.token: %d processes need a job token so strangers cannot join: "
                           "set the same dist.token=SECRET (or JDT_DIST_TOKEN, or "
                           "dist.token_file=PATH) on every process (jdt-train --nproc and srun "
                           "set one for you)",
                           w->world_size);
    }

    /* rank 0 hosts the coordinator, except where SLURM's first node tells another task to */
    w->host_coordinator = w->world_size > 1 && (first_node >= 0 ? first_node == 1 : w->rank == 0);
    w->coordinator_rank = first_node == 1 ? w->rank : first_node == 0 ? -1 : 0;

    /* the launcher's pre-bound coordinator socket, for the process that hosts (rank 0 there) */
    const char *fd_s = env_get(envp, JDT_WORLD_LISTEN_FD_ENV);
    if (fd_s && (w->rank == 0 || w->host_coordinator)) {
        long fd;
        struct stat sb;
        int listening = 0;
        socklen_t sl_len = sizeof listening;
        if (!parse_long(fd_s, 3, 1 << 20, &fd) || fstat((int)fd, &sb) != 0 ||
            !S_ISSOCK(sb.st_mode) ||
            getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &sl_len) != 0 ||
            !listening)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "environment variable %s=%s: not an inherited listening socket "
                               "(it is set by jdt-train --nproc; unset it)",
                               JDT_WORLD_LISTEN_FD_ENV, fd_s);
        fcntl((int)fd, F_SETFD, FD_CLOEXEC); /* not for the compiler processes we start */
        if (w->host_coordinator) w->coord_listen_fd = (int)fd; /* else nobody will connect */
    }
    jdt_log_set_rank(w->rank, w->world_size);

    /* where the environment could not tell which task runs on the first node (no step node
     * list: the job's first node may not even be in the step), rank 0 hosts: it says so when it
     * knows it runs elsewhere than where the others look */
    if (strcmp(w->source, "slurm") == 0 && w->world_size > 1 && !cfg->dist.coordinator[0] &&
        first_node < 0 && w->rank == 0 && sl.node_name && strcmp(sl.node_name, sl.first_host) != 0)
        JDT_WARN("SLURM started rank 0 on %s (SLURMD_NODENAME), not on %s, the first node of "
                 "%s, where the other tasks look for the coordinator (%s): if they cannot "
                 "connect, set dist.coordinator=%s:PORT",
                 sl.node_name, sl.first_host,
                 sl.step_nodelist ? "the step's node list" : "the job's node list", w->coordinator,
                 sl.node_name);
    return JDT_OK;
}

int jdt_world_threads_env(void)
{
    const char *v = getenv("OMP_NUM_THREADS");
    if (!v || !*v) return 0;
    char *end = NULL;
    errno = 0;
    const long n = strtol(v, &end, 10); /* "4" or a nesting list "4,2": its first level */
    if (errno != 0 || end == v || (*end != '\0' && *end != ',') || n < 1 || n > 65536) return 0;
    return (int)n;
}

int jdt_world_threads(const jdt_world *w, int requested)
{
    if (requested > 0) return requested;
    const int from_env = jdt_world_threads_env();
    if (from_env > 0) return from_env;
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int allowed = jdt_cpus_allowed(&set);
    if (allowed < 1) allowed = (int)online;
    if (online < 1) online = 1;
    if (allowed < 1) allowed = 1;
    if (allowed < online) return allowed; /* bound by a launcher or the scheduler already */
    int n = w && w->local_world_size > 1 ? allowed / w->local_world_size : allowed;
    return n > 0 ? n : 1;
}

/* ---- joining ------------------------------------------------------------------------------- */

/* Binds the hosting process's coordinator socket: on loopback when the coordinator address is a
 * loopback one (a single-host job: nobody else needs to reach it), else on 0.0.0.0:port, so ranks
 * on other hosts reach it whatever address its host name resolves to. */
static jdt_status bind_any(int port, bool loopback, int *fd_out, jdt_err *e)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_NET, "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(loopback ? INADDR_LOOPBACK : INADDR_ANY);
    sa.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0) {
        int err = errno;
        close(fd);
        return jdt_err_set(e, JDT_ERR_NET,
                           "cannot listen on port %d for the coordinator: %s%s", port,
                           strerror(err),
                           err == EADDRINUSE ? " (another job on this host? set dist.port)" : "");
    }
    *fd_out = fd;
    return JDT_OK;
}

jdt_status jdt_world_connect(const jdt_world *w, const jdt_config *cfg, jdt_dist **out,
                             jdt_err *e)
{
    *out = NULL;
    if (w->world_size <= 1) return JDT_OK;
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.rank = w->rank;
    o.world_size = w->world_size;
    o.coordinator = w->coordinator;
    o.token = w->token;
    o.host_coordinator = true;
    o.coordinator_rank = w->host_coordinator ? w->rank : w->coordinator_rank;
    o.coord_listen_fd = w->coord_listen_fd;
    o.connect_timeout_s = cfg->dist.connect_timeout_s;
    o.heartbeat_s = cfg->dist.heartbeat_s;
    o.peer_timeout_s = cfg->dist.peer_timeout_s;
    jdt_status st = JDT_OK;
    int own_fd = -1;
    if (w->host_coordinator && o.coord_listen_fd < 0) {
        const char *colon = strrchr(w->coordinator, ':');
        long port = 0;
        if (!colon || !parse_long(colon + 1, 1, 65535, &port))
            return jdt_err_set(e, JDT_ERR_CONFIG, "coordinator '%s': bad port", w->coordinator);
        size_t hl = (size_t)(colon - w->coordinator);
        bool loopback = (hl == 9 && strncmp(w->coordinator, "localhost", 9) == 0) ||
                        (hl >= 4 && strncmp(w->coordinator, "127.", 4) == 0);
        if ((st = bind_any((int)port, loopback, &own_fd, e))) goto out_fail;
        o.coord_listen_fd = own_fd;
    }
    st = jdt_dist_init(&o, out, e);
    if (st) goto out_fail;
    if ((st = jdt_world_agree(*out, cfg, e))) {
        jdt_dist_abort(*out, e->msg); /* every rank leaves with this rank's reason */
        jdt_dist_free(*out);
        *out = NULL;
        return st;
    }
    JDT_DEBUG("joined the job: rank %d of %d (local %d of %d) via %s, source %s", w->rank,
              w->world_size, w->local_rank, w->local_world_size, w->coordinator, w->source);
    return JDT_OK;
out_fail:
    jdt_err_prefix(e, "joining the job (%s)", w->source);
    return st;
}
