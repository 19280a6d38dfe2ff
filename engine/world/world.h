/*
 * world.h — the process model: who am I in the job (rank, world size, local rank), where is the
 * coordinator and which token admits me. Resolves these from the config's dist.* keys (which
 * include JDT_DIST_* environment variables and dist.key=value overrides), else from SLURM's
 * task environment, else a single process; then joins the job through jdt_dist_init().
 *
 * The local launcher (`jdt-train --nproc N`, cmd/launch.c) sets JDT_DIST_RANK,
 * JDT_DIST_WORLD_SIZE, JDT_DIST_LOCAL_RANK, JDT_DIST_COORDINATOR, JDT_DIST_TOKEN for each child
 * and hands rank 0 a pre-bound coordinator socket in JDT_COORD_LISTEN_FD. Under srun every task
 * resolves the same coordinator (first host of the step's node list, a port derived from the
 * job and step id), which the task running there hosts, and a token derived from the job id.
 * See docs/launch.md.
 */
#ifndef JDT_WORLD_H
#define JDT_WORLD_H

#include "config/config.h"
#include "core/core.h"
#include "comm/comm.h"

/* The environment variable through which a launcher passes the hosting process (rank 0 under
 * jdt-train --nproc) its coordinator socket. */
#define JDT_WORLD_LISTEN_FD_ENV "JDT_COORD_LISTEN_FD"

/* Most hosts a node list may expand to (a guard against "n[0-99999999]"). */
#define JDT_WORLD_MAX_HOSTS 65536

typedef struct {
    int rank, world_size;             /* 0 <= rank < world_size */
    int local_rank, local_world_size; /* on this host; local_world_size 1 when unknown */
    char coordinator[256];            /* host:port ("" for a single process) */
    char token[256];                  /* job token ("" for a single process) */
    int coord_listen_fd;              /* inherited by the hosting process, else -1 */
    const char *source; /* "config" | "torchrun" | "torch-env" | "mpi" | "slurm" | "single" */
    bool host_coordinator;            /* this process runs the job's coordinator (world > 1) */
    int coordinator_rank;             /* the rank that runs it; -1 where only that one knows */
} jdt_world;

/*
 * Resolves this process's place in the job. Order: the config's dist.rank (or dist.coordinator
 * outside SLURM; source "config"; the launcher's JDT_DIST_* variables arrive this way), else
 * torchrun's (TORCHELASTIC_RUN_ID; source "torchrun") or another env:// launcher's (RANK,
 * WORLD_SIZE and MASTER_ADDR set; "torch-env") variables, else in an srun step SLURM_PROCID and
 * SLURM_NTASKS (SLURM_NPROCS, SLURM_STEP_NUM_TASKS) in envp (source "slurm"), else an MPI
 * launcher's (OMPI_COMM_WORLD_*, or PMI_RANK / PMI_SIZE; "mpi"; docs/launch.md has where each
 * finds the coordinator), else SLURM outside srun, else one process (source "single"). Single
 * fields fall back the same way: dist.coordinator / dist.port / dist.token override what SLURM
 * (or the other launcher) would give. The token is dist.token, else the first line of
 * dist.token_file, else under SLURM "slurm-<cluster>-<job id>", under another launcher
 * "<source>-<run or job id>-<coordinator>" (keeps other jobs out; not a secret), else none
 * (world size 1). Under SLURM the task count must equal the
 * config's mesh size, and a task's values must agree with each other (SLURM_NTASKS with
 * SLURM_STEP_NUM_TASKS and the sum of SLURM_STEP_TASKS_PER_NODE, SLURM_NODEID with the step's
 * nodes, SLURM_LOCALID with its node's tasks and with SLURM_PROCID; docs/launch.md).
 *
 * Which process hosts the coordinator (host_coordinator, coordinator_rank): rank 0, except under
 * SLURM without dist.coordinator, where the others look for it on the first host of the step's
 * node list: there the task on that host (SLURMD_NODENAME; in a homogeneous step without it,
 * SLURM_NODEID 0) with SLURM_LOCALID 0 hosts it, whatever its rank (an arbitrary distribution,
 * a topology plugin's node order or a heterogeneous step's name-sorted node list may start
 * rank 0 elsewhere); only that task knows its rank, the others get coordinator_rank -1. Where
 * the environment cannot tell (no SLURM_STEP_NODELIST or SLURM_LOCALID, a heterogeneous step
 * without SLURMD_NODENAME) rank 0 hosts, and warns when it runs elsewhere than that host.
 *
 * envp is a NULL-terminated "NAME=value" array like environ (may be NULL). Also sets the log
 * rank prefix (jdt_log_set_rank) and marks an inherited coordinator socket close-on-exec.
 * Returns JDT_OK and fills *w, or JDT_ERR_CONFIG with one line naming the key or variable and
 * what to do (rank out of range, bad host:port, malformed SLURM node list, SLURM values that
 * disagree (naming both), several SLURM tasks outside srun, missing token, unreadable token
 * file, world size vs mesh), or JDT_ERR_NOMEM. Not a collective.
 */
jdt_status jdt_world_resolve(const jdt_config *cfg, char *const *envp, jdt_world *w, jdt_err *e);

/*
 * Joins the job described by w: fills jdt_dist_opts (coordinator, token, timeouts from
 * dist.connect_timeout_s, dist.heartbeat_s, dist.peer_timeout_s) and calls jdt_dist_init.
 * The process with w->host_coordinator hosts the coordinator, on w->coord_listen_fd when >= 0
 * (ownership passes to the context), else on a socket it binds on every interface at the
 * coordinator's port (loopback only for a loopback coordinator address); its jdt_dist_free
 * then waits for the other ranks to leave before stopping the coordinator. Every rank
 * of the job must call it once, at start-up. For world_size 1 no rendezvous is needed: returns
 * JDT_OK with *out = NULL. Otherwise JDT_OK with a context the caller frees with
 * jdt_dist_free, or jdt_dist_init's errors (ERR_NET, ERR_AUTH, ERR_TIMEOUT, ...; their
 * messages name the rank and the coordinator) prefixed with "joining the job (<source>)", or
 * jdt_world_agree's (a rank whose config differs from rank 0's: ERR_CONFIG; the job is then
 * aborted with that message and *out stays NULL).
 */
jdt_status jdt_world_connect(const jdt_world *w, const jdt_config *cfg, jdt_dist **out,
                             jdt_err *e);

/* OMP_NUM_THREADS as a thread count (its first level where it is a list), or 0 when it is
 * unset or not a count from 1 to 65536. */
int jdt_world_threads_env(void);

/*
 * CPU threads for this process: `requested` (runtime.threads) when > 0; else OMP_NUM_THREADS
 * when it is set (jdt_world_threads_env: the count OpenMP programs, PyTorch and llm.c among
 * them, take from the environment); else, when the process
 * is already bound to fewer CPUs than the machine has (the launcher's or SLURM's binding), all
 * of those (jdt_cpus_allowed: OpenMP's places count, not the one its binding gave the main
 * thread); else the machine's CPUs divided among the w->local_world_size processes of this
 * host. Always >= 1.
 */
int jdt_world_threads(const jdt_world *w, int requested);

/*
 * Expands a SLURM host list ("node[01-03,07]", "a,b[1-2]-x,c", "r[1-2]n[1-2]": several
 * bracket groups give every combination, left to right) into hosts in order. Zero padding
 * follows the range's first number ("[08-10]" -> 08 09 10). Returns JDT_OK with *hosts
 * (jdt_malloc'd array of n jdt_malloc'd strings; free with jdt_world_hostlist_free) or
 * JDT_ERR_CONFIG naming the problem and position (unbalanced or nested brackets, empty item or
 * range, reversed range, more than max_hosts hosts), or JDT_ERR_NOMEM.
 */
jdt_status jdt_world_hostlist_expand(const char *list, int max_hosts, char ***hosts, int *n,
                                     jdt_err *e);
/* Frees what jdt_world_hostlist_expand returned; NULL is a no-op. */
void jdt_world_hostlist_free(char **hosts, int n);

/*
 * Tasks on node node_index from a SLURM tasks-per-node list ("2(x3),1" = 2,2,2,1; "4" applies
 * to every node). Returns JDT_OK with *n_tasks, or JDT_ERR_CONFIG for a malformed list.
 */
jdt_status jdt_world_tasks_per_node(const char *spec, int node_index, int *n_tasks, jdt_err *e);

/* The coordinator port a SLURM job step uses when dist.port is 0: 12000 + 8 * (job_id % 2000) +
 * step_id % 8, so it lies below the Linux ephemeral range, consecutive jobs differ, and up to 8
 * concurrent steps of one job differ. */
int jdt_world_slurm_port(long job_id, long step_id);

/*
 * Checks that every rank runs the same job (agree.c): rank 0 publishes its resolved config in
 * the coordinator's KV store; every other rank compares it with its own, key by key, skipping
 * the per-process keys (jdt_config_key_per_process). Every rank calls it once after joining
 * (jdt_world_connect does); d NULL (one process) is a no-op. Returns JDT_OK, or on a rank that
 * differs JDT_ERR_CONFIG naming the first differing key and both values (another build: both
 * versions); the caller aborts the job with that message. Waits up to dist.connect_timeout_s
 * for rank 0's config (ERR_TIMEOUT, ERR_PEER_LOST from the KV store otherwise).
 */
jdt_status jdt_world_agree(jdt_dist *d, const jdt_config *cfg, jdt_err *e);

#endif /* JDT_WORLD_H */
