/*
 * check_world.c — unit tests for engine/world/world.c: SLURM host-list expansion (ranges, zero
 * padding, lists, suffixes, several bracket groups, malformed lists), tasks-per-node lists,
 * world resolution precedence (config > SLURM > single) with environments built in the test,
 * token rules, bad values, the launcher's inherited socket, and a real 2-rank join through
 * jdt_world_connect with forked processes.
 */
#include "tests/unit/testutil.h"
#include "world/world.h"

#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TINY "configs/tiny.yaml"

/* Loads configs/tiny.yaml with the given environment and NULL-terminated overrides. */
static jdt_status load(char *const *envp, const char *const *ovr, jdt_config *c, jdt_err *e)
{
    int n = 0;
    while (ovr && ovr[n]) n++;
    return jdt_config_load(TINY, n, (char *const *)ovr, envp, c, e);
}

/* Expands list and joins the hosts with spaces into buf. */
static jdt_status expand_joined(const char *list, char *buf, size_t cap, jdt_err *e)
{
    char **h = NULL;
    int n = 0;
    jdt_status st = jdt_world_hostlist_expand(list, 1000, &h, &n, e);
    buf[0] = 0;
    if (st) return st;
    size_t o = 0;
    for (int i = 0; i < n; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? " " : "", h[i]);
    jdt_world_hostlist_free(h, n);
    return JDT_OK;
}

START_TEST(test_hostlist_valid)
{
    static const char *const cases[][2] = {
        {"node1", "node1"},
        {"node[01-03,07]", "node01 node02 node03 node07"},
        {"a,b[1-2]-x,c", "a b1-x b2-x c"},
        {"n[8-10]", "n8 n9 n10"},
        {"n[08-10]", "n08 n09 n10"},
        {"n[007]", "n007"},
        {"r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2"},
        {"gpu-[1,3]-ib,login", "gpu-1-ib gpu-3-ib login"},
        {"host1,host2", "host1 host2"},
        {"[1-2]", "1 2"},
        {"x[0-0]", "x0"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        char buf[512];
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(expand_joined(cases[i][0], buf, sizeof buf, &e) == JDT_OK, "%s: %s",
                      cases[i][0], e.msg);
        ck_assert_str_eq(buf, cases[i][1]);
    }
}
END_TEST

START_TEST(test_hostlist_malformed)
{
    static const char *const cases[][2] = {
        {"node[1-3", "unclosed"},      {"node1-3]", "without"},   {"node[[1]]", "nested"},
        {"a,,b", "empty host"},        {"a,", "empty host"},      {"", "empty host list"},
        {"n[]", "empty brackets"},     {"n[3-1]", "reversed"},    {"n[a-b]", "bad range"},
        {"n[1-]", "bad range"},        {"n[-2]", "bad range"},    {"n[1,,2]", "bad range"},
        {"n[1-2000]", "more than"},    {"a b", "white space"},    {"n[1234567890]", "bad range"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        char buf[512];
        jdt_err e;
        jdt_err_clear(&e);
        jdt_status st = expand_joined(cases[i][0], buf, sizeof buf, &e);
        ck_assert_msg(st == JDT_ERR_CONFIG, "'%s' accepted", cases[i][0]);
        ck_assert_msg(strstr(e.msg, cases[i][1]) && strstr(e.msg, "host list"),
                      "'%s': message '%s' lacks '%s'", cases[i][0], e.msg, cases[i][1]);
    }
    char **h = (char **)1;
    int n = 7;
    ck_assert_int_eq(jdt_world_hostlist_expand(NULL, 10, &h, &n, NULL), JDT_ERR_CONFIG);
    ck_assert_ptr_null(h);
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(test_tasks_per_node)
{
    int n = 0;
    jdt_err e;
    ck_assert_int_eq(jdt_world_tasks_per_node("2(x3),1", 0, &n, &e), JDT_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(jdt_world_tasks_per_node("2(x3),1", 2, &n, &e), JDT_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(jdt_world_tasks_per_node("2(x3),1", 3, &n, &e), JDT_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(jdt_world_tasks_per_node("4", 5, &n, &e), JDT_OK);
    ck_assert_int_eq(n, 4);
    ck_assert_int_eq(jdt_world_tasks_per_node("3,5", 1, &n, &e), JDT_OK);
    ck_assert_int_eq(n, 5);
    ck_assert_int_eq(jdt_world_tasks_per_node("2(x3),1", 4, &n, &e), JDT_ERR_CONFIG);
    ck_assert(strstr(e.msg, "node 4"));
    static const char *const bad[] = {"", "x", "2(3)", "2(x)", "2(x3", "2,", "-1", "0", "2;3"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(bad); i++)
        ck_assert_msg(jdt_world_tasks_per_node(bad[i], 0, &n, &e) == JDT_ERR_CONFIG, "'%s'",
                      bad[i]);
}
END_TEST

START_TEST(test_slurm_port)
{
    int p = jdt_world_slurm_port(123456, 0);
    ck_assert(p >= 12000 && p < 28000);
    ck_assert_int_ne(p, jdt_world_slurm_port(123457, 0));
    ck_assert_int_ne(p, jdt_world_slurm_port(123456, 1));
    ck_assert_int_eq(p, jdt_world_slurm_port(123456, 0));
    for (long j = 0; j < 5000; j += 7) {
        int q = jdt_world_slurm_port(j, j % 11);
        ck_assert(q >= 12000 && q < 28000);
    }
}
END_TEST

/* a 3-task SLURM step on two nodes (2 + 1 tasks): this task is rank 2, the only one on n08 */
static char *SLURM_ENV[] = {
    "SLURM_PROCID=2",      "SLURM_NTASKS=3",
    "SLURM_LOCALID=0",     "SLURM_NODEID=1",
    "SLURM_JOB_ID=4242",   "SLURM_STEP_ID=0",
    "SLURM_STEP_NODELIST=n[07-08]", "SLURM_JOB_NODELIST=other[1-9]",
    "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_CLUSTER_NAME=jdt",
    "PATH=/usr/bin",       NULL};

START_TEST(test_resolve_single)
{
    jdt_config c;
    jdt_err e;
    jdt_world w;
    char *env[] = {"HOME=/tmp", NULL};
    ck_assert_int_eq(load(env, NULL, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, env, &w, &e), JDT_OK);
    ck_assert_str_eq(w.source, "single");
    ck_assert_int_eq(w.rank, 0);
    ck_assert_int_eq(w.world_size, 1);
    ck_assert_int_eq(w.local_world_size, 1);
    ck_assert_str_eq(w.token, "");
    ck_assert_int_eq(w.coord_listen_fd, -1);
    jdt_dist *d = (jdt_dist *)&w;
    ck_assert_int_eq(jdt_world_connect(&w, &c, &d, &e), JDT_OK);
    ck_assert_ptr_null(d);
    jdt_config_free(&c);

    /* a mesh of 2 in one process resolves to a world of 1 (the train loop says what to do) */
    const char *ovr[] = {"mesh.data=2", NULL};
    ck_assert_int_eq(load(env, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, env, &w, &e), JDT_OK);
    ck_assert_int_eq(w.world_size, 1);
    jdt_config_free(&c);
}
END_TEST

/* torchrun's worker environment (torch's local_elastic_agent: rank 3 of 4, 2 per node) */
static char *TORCHRUN_ENV[] = {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
                               "GROUP_RANK=1", "MASTER_ADDR=node0", "MASTER_PORT=29500",
                               "TORCHELASTIC_RUN_ID=job7", "TORCHELASTIC_USE_AGENT_STORE=False",
                               NULL};

START_TEST(test_resolve_launchers)
{
    jdt_config c;
    jdt_err e;
    jdt_world w;
    const char *ovr[] = {"mesh.data=4", "data.batch_size=8", "data.micro_batch_size=8", NULL};
    ck_assert_int_eq(load(TORCHRUN_ENV, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, TORCHRUN_ENV, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "torchrun");
    ck_assert_int_eq(w.rank, 3);
    ck_assert_int_eq(w.world_size, 4);
    ck_assert_int_eq(w.local_rank, 1);
    ck_assert_int_eq(w.local_world_size, 2);
    ck_assert_str_eq(w.coordinator, "node0:29500"); /* c10d: the port was found free for us */
    ck_assert_str_eq(w.token, "torchrun-job7-node0:29500");
    ck_assert(!w.host_coordinator);

    /* the static rendezvous's agent holds MASTER_PORT: the next port; dist.port wins */
    char *agent[] = {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2",
                     "MASTER_ADDR=node0", "MASTER_PORT=29500", "TORCHELASTIC_RUN_ID=none",
                     "TORCHELASTIC_USE_AGENT_STORE=True", NULL};
    ck_assert_msg(jdt_world_resolve(&c, agent, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.coordinator, "node0:29501");
    ck_assert(w.host_coordinator);
    jdt_config_free(&c);
    const char *ovr_port[] = {"mesh.data=4", "data.batch_size=8", "data.micro_batch_size=8",
                              "dist.port=40000", NULL};
    ck_assert_int_eq(load(agent, ovr_port, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, agent, &w, &e), JDT_OK);
    ck_assert_str_eq(w.coordinator, "node0:40000");
    jdt_config_free(&c);

    /* a plain env:// launcher (one process per pod): no LOCAL_* means local rank 0 of 1 */
    char *pod[] = {"RANK=2", "WORLD_SIZE=4", "MASTER_ADDR=10.0.0.5", "MASTER_PORT=23456", NULL};
    ck_assert_int_eq(load(pod, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, pod, &w, &e), JDT_OK);
    ck_assert_str_eq(w.source, "torch-env");
    ck_assert_int_eq(w.local_rank, 0);
    ck_assert_int_eq(w.local_world_size, 1);
    ck_assert_str_eq(w.coordinator, "10.0.0.5:23456");
    jdt_config_free(&c);

    /* RANK and WORLD_SIZE without MASTER_ADDR are a stray shell's, not a job */
    char *stray[] = {"RANK=1", "WORLD_SIZE=2", NULL};
    ck_assert_int_eq(load(stray, NULL, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, stray, &w, &e), JDT_OK);
    ck_assert_str_eq(w.source, "single");
    jdt_config_free(&c);

    /* Open MPI's mpirun: ranks from OMPI_COMM_WORLD_*, the coordinator from dist.coordinator */
    char *ompi[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4",
                    "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL};
    ck_assert_int_eq(load(ompi, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, ompi, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "mpi started 4 processes (OMPI_COMM_WORLD_SIZE) but MASTER_ADDR "
                                "is not set: set dist.coordinator=HOST:PORT") != NULL,
                  "%s", e.msg);
    jdt_config_free(&c);
    const char *ovr_coord[] = {"mesh.data=4", "data.batch_size=8", "data.micro_batch_size=8",
                               "dist.coordinator=head:7000", NULL};
    ck_assert_int_eq(load(ompi, ovr_coord, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, ompi, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "mpi");
    ck_assert_int_eq(w.rank, 1);
    ck_assert_int_eq(w.local_world_size, 2);
    ck_assert_str_eq(w.coordinator, "head:7000");
    ck_assert_str_eq(w.token, "mpi--head:7000");
    jdt_config_free(&c);

    /* mpirun on one host (local size = world size) with its job id: loopback, a derived port */
    char *ompi1[] = {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=4",
                     "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
                     "OMPI_MCA_ess_base_jobid=208404481", NULL};
    ck_assert_int_eq(load(ompi1, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, ompi1, &w, &e) == JDT_OK, "%s", e.msg);
    char want1[64];
    snprintf(want1, sizeof want1, "127.0.0.1:%d", jdt_world_slurm_port(208404481, 0));
    ck_assert_str_eq(w.coordinator, want1);
    ck_assert(w.host_coordinator);
    jdt_config_free(&c);

    /* MPICH / Intel MPI (hydra), with MASTER_ADDR and MASTER_PORT exported by the user */
    char *hydra[] = {"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=4",
                     "MASTER_ADDR=127.0.0.1", "MASTER_PORT=7100", NULL};
    ck_assert_int_eq(load(hydra, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, hydra, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "mpi");
    ck_assert_int_eq(w.local_world_size, 4);
    ck_assert_str_eq(w.coordinator, "127.0.0.1:7100");
    jdt_config_free(&c);

    /* a world size the config disagrees with, and ranks past the world, are named */
    const char *ovr_ws[] = {"mesh.data=2", "dist.world_size=2", NULL};
    ck_assert_int_eq(load(pod, ovr_ws, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, pod, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "dist.world_size is 2 but torch-env started 4 (WORLD_SIZE)"),
                  "%s", e.msg);
    jdt_config_free(&c);
    char *bad[] = {"RANK=4", "WORLD_SIZE=4", "MASTER_ADDR=h", "MASTER_PORT=1", NULL};
    ck_assert_int_eq(load(bad, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, bad, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "RANK") != NULL, "%s", e.msg);
    jdt_config_free(&c);

    /* under srun, MPI's variables are SLURM's own tasks: SLURM resolves; torchrun is nearer */
    char *srun_mpi[] = {"SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_NODEID=1",
                        "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=n[07-08]",
                        "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_CLUSTER_NAME=jdt",
                        "PMI_RANK=2", "PMI_SIZE=3", NULL};
    const char *ovr3[] = {"mesh.data=3", "data.batch_size=12", "data.micro_batch_size=12", NULL};
    ck_assert_int_eq(load(srun_mpi, ovr3, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, srun_mpi, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "slurm");
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_resolve_slurm)
{
    jdt_config c;
    jdt_err e;
    jdt_world w;
    const char *ovr[] = {"mesh.data=3", "data.batch_size=12", "data.micro_batch_size=12", NULL};
    ck_assert_int_eq(load(SLURM_ENV, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, SLURM_ENV, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "slurm");
    ck_assert_int_eq(w.rank, 2);
    ck_assert_int_eq(w.world_size, 3);
    ck_assert_int_eq(w.local_rank, 0);
    ck_assert_int_eq(w.local_world_size, 1);
    char want[64];
    snprintf(want, sizeof want, "n07:%d", jdt_world_slurm_port(4242, 0));
    ck_assert_str_eq(w.coordinator, want);
    ck_assert_str_eq(w.token, "slurm-jdt-4242");
    jdt_config_free(&c);

    /* dist.port and dist.token override what SLURM would give; rank stays SLURM's */
    const char *ovr2[] = {"mesh.data=3", "data.batch_size=12", "data.micro_batch_size=12", "dist.port=23456", "dist.token=abc", NULL};
    ck_assert_int_eq(load(SLURM_ENV, ovr2, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, SLURM_ENV, &w, &e), JDT_OK);
    ck_assert_str_eq(w.coordinator, "n07:23456");
    ck_assert_str_eq(w.token, "abc");
    ck_assert_str_eq(w.source, "slurm");
    jdt_config_free(&c);

    /* dist.coordinator alone moves the coordinator but keeps SLURM's ranks */
    const char *ovr3[] = {"mesh.data=3", "data.batch_size=12", "data.micro_batch_size=12",
                          "dist.coordinator=login:2222", NULL};
    ck_assert_int_eq(load(SLURM_ENV, ovr3, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, SLURM_ENV, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "slurm");
    ck_assert_int_eq(w.rank, 2);
    ck_assert_str_eq(w.coordinator, "login:2222");
    ck_assert_str_eq(w.token, "slurm-jdt-4242");
    jdt_config_free(&c);

    /* SLURM's task count must match the mesh */
    ck_assert_int_eq(load(SLURM_ENV, NULL, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, SLURM_ENV, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "slurm: 3 tasks") && strstr(e.msg, "needs 1"), "%s", e.msg);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_resolve_slurm_fallbacks)
{
    jdt_config c;
    jdt_err e;
    jdt_world w;
    /* job node list when there is no step node list; SLURM_NTASKS_PER_NODE for local size */
    char *env[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1", "SLURM_JOBID=77",
                   "SLURM_STEPID=3", "SLURM_JOB_NODELIST=login,c[1-4]",
                   "SLURM_NTASKS_PER_NODE=2", NULL};
    const char *ovr[] = {"mesh.data=2", NULL};
    ck_assert_int_eq(load(env, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, env, &w, &e) == JDT_OK, "%s", e.msg);
    char want[64];
    snprintf(want, sizeof want, "login:%d", jdt_world_slurm_port(77, 3));
    ck_assert_str_eq(w.coordinator, want);
    ck_assert_int_eq(w.local_rank, 1);
    ck_assert_int_eq(w.local_world_size, 2);
    ck_assert_str_eq(w.token, "slurm-cluster-77");
    jdt_config_free(&c);

    /* the batch script itself (no step id) with several tasks: srun is missing */
    char *batch[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                     "SLURM_JOB_NODELIST=a[1-2]", NULL};
    ck_assert_int_eq(load(batch, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, batch, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "srun"), "%s", e.msg);
    jdt_config_free(&c);

    /* malformed SLURM values name the variable */
    static char *bad_nl[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                             "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=a[1-", NULL};
    static char *bad_rank[] = {"SLURM_PROCID=2", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                               "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=a", NULL};
    static char *bad_num[] = {"SLURM_PROCID=x", "SLURM_NTASKS=2", "SLURM_JOB_ID=5", NULL};
    static char *no_job[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_STEP_ID=0", NULL};
    static char *bad_tpn[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=5",
                              "SLURM_STEP_ID=0", "SLURM_STEP_NODELIST=a",
                              "SLURM_STEP_TASKS_PER_NODE=2(x", NULL};
    struct {
        char **env;
        const char *want;
    } cases[] = {{bad_nl, "SLURM_STEP_NODELIST"},
                 {bad_rank, "not below SLURM_NTASKS"},
                 {bad_num, "SLURM_PROCID"},
                 {no_job, "SLURM_JOB_ID"},
                 {bad_tpn, "SLURM_STEP_TASKS_PER_NODE"}};
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        ck_assert_int_eq(load(cases[i].env, ovr, &c, &e), JDT_OK);
        ck_assert_int_eq(jdt_world_resolve(&c, cases[i].env, &w, &e), JDT_ERR_CONFIG);
        ck_assert_msg(strstr(e.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, e.msg,
                      cases[i].want);
        jdt_config_free(&c);
    }
}
END_TEST

/* Loads tiny.yaml with a mesh of `world` data-parallel ranks (batch sizes that divide) and one
 * more override `extra` (NULL: none) and resolves env; returns resolve's status (the load must
 * succeed). */
static jdt_status resolve_env_with(char *const *env, int world, const char *extra, jdt_world *w,
                                   jdt_err *e)
{
    char mesh[32], batch[48], micro[48];
    snprintf(mesh, sizeof mesh, "mesh.data=%d", world);
    snprintf(batch, sizeof batch, "data.batch_size=%d", 4 * world);
    snprintf(micro, sizeof micro, "data.micro_batch_size=%d", 4 * world);
    const char *ovr[] = {mesh, batch, micro, extra, NULL};
    jdt_config c;
    ck_assert_msg(load(env, ovr, &c, e) == JDT_OK, "%s", e->msg);
    jdt_status st = jdt_world_resolve(&c, env, w, e);
    jdt_config_free(&c);
    return st;
}

static jdt_status resolve_env(char *const *env, int world, jdt_world *w, jdt_err *e)
{
    return resolve_env_with(env, world, NULL, w, e);
}

/* SLURM task environments whose values are each well-formed but disagree: one line naming both
 * variables and their values, JDT_ERR_CONFIG (exit 2 in cmd/) */
START_TEST(test_resolve_slurm_inconsistent)
{
    /* SLURM_LOCALID past its node's tasks (the step's list) */
    static char *localid[] = {"SLURM_PROCID=7", "SLURM_NTASKS=8", "SLURM_LOCALID=7",
                              "SLURM_NODEID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                              "SLURM_STEP_NODELIST=n[1-4]", "SLURM_STEP_TASKS_PER_NODE=2(x4)",
                              NULL};
    static char *localid2[] = {"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=2",
                               "SLURM_NODEID=1", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                               "SLURM_STEP_NODELIST=n[1-2]", "SLURM_STEP_TASKS_PER_NODE=3,1",
                               NULL};
    /* SLURM_NODEID past the step's nodes: by the node list, or by the tasks-per-node list */
    static char *nodeid[] = {"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1",
                             "SLURM_NODEID=2", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                             "SLURM_STEP_NODELIST=n[1-2]", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                             NULL};
    static char *nodeid_tpn[] = {"SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                                 "SLURM_NODEID=3", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                                 "SLURM_JOB_NODELIST=n[1-4]", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                                 NULL};
    /* the step's tasks per node add up to another count than SLURM_NTASKS (SLURM_NPROCS) */
    static char *sum[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                          "SLURM_NODEID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                          "SLURM_STEP_NODELIST=n[1-2]", "SLURM_STEP_TASKS_PER_NODE=2,1", NULL};
    static char *sum_nprocs[] = {"SLURM_PROCID=0", "SLURM_NPROCS=4", "SLURM_LOCALID=0",
                                 "SLURM_NODEID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                                 "SLURM_STEP_NODELIST=n1", "SLURM_STEP_TASKS_PER_NODE=2", NULL};
    /* srun -E -n1 in a 4-task allocation (as SLURM 22.05 sets it): the job's SLURM_NTASKS */
    static char *preserve[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NPROCS=4",
                               "SLURM_STEP_NUM_TASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                               "SLURM_JOB_ID=3", "SLURM_STEP_ID=3", "SLURM_STEPID=3",
                               "SLURM_STEP_NODELIST=node1", "SLURM_JOB_NODELIST=node[1-2]",
                               "SLURM_STEP_TASKS_PER_NODE=1", "SLURM_TASKS_PER_NODE=2(x2)",
                               "SLURM_NTASKS_PER_NODE=2", NULL};
    /* a node list and a tasks-per-node list of different lengths */
    static char *nodes[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0",
                            "SLURM_NODEID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                            "SLURM_STEP_NODELIST=n[1-3]", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                            NULL};
    /* a local id above the rank: no distribution puts a task after more tasks than rank it */
    static char *above[] = {"SLURM_PROCID=1", "SLURM_NTASKS=8", "SLURM_LOCALID=3",
                            "SLURM_NODEID=0", "SLURM_JOB_ID=5", "SLURM_STEP_ID=0",
                            "SLURM_STEP_NODELIST=n[1-2]", "SLURM_STEP_TASKS_PER_NODE=4(x2)",
                            NULL};
    /* salloc's interactive step (srun --interactive --preserve-env, SLURM 22.05) and SLURM's
     * special steps printed signed: several tasks there are the batch-script trap */
    static char *interactive[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=1",
                                  "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_JOB_ID=6",
                                  "SLURM_STEP_ID=4294967290", "SLURM_STEP_NODELIST=node1",
                                  "SLURM_STEP_TASKS_PER_NODE=1", "SLURM_TASKS_PER_NODE=3,1",
                                  NULL};
    static char *signed_batch[] = {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_JOB_ID=6",
                                   "SLURM_STEP_ID=-5", "SLURM_JOB_NODELIST=node[1-2]", NULL};
    struct {
        char **env;
        int mesh; /* the task count each claims, so that the mesh alone would accept it */
        const char *want;
    } cases[] = {
        {localid, 8, "SLURM_LOCALID=7 but SLURM_STEP_TASKS_PER_NODE=2(x4) gives node 0 "
                  "(SLURM_NODEID) only 2 tasks"},
        {localid2, 4, "SLURM_LOCALID=2 but SLURM_STEP_TASKS_PER_NODE=3,1 gives node 1 "
                   "(SLURM_NODEID) only 1 task"},
        {nodeid, 4, "SLURM_NODEID=2 but SLURM_STEP_NODELIST=n[1-2] has 2 nodes"},
        {nodeid_tpn, 4, "SLURM_NODEID=3 but SLURM_STEP_TASKS_PER_NODE=2(x2) lists 2 nodes"},
        {sum, 4, "SLURM_NTASKS=4 but SLURM_STEP_TASKS_PER_NODE=2,1 gives the step 3 tasks"},
        {sum_nprocs, 4, "SLURM_NPROCS=4 but SLURM_STEP_TASKS_PER_NODE=2 gives the step 2 tasks"},
        {preserve, 4, "SLURM_NTASKS=4 but SLURM_STEP_NUM_TASKS=1 (srun -E"},
        {nodes, 4, "SLURM_STEP_NODELIST=n[1-3] has 3 nodes but SLURM_STEP_TASKS_PER_NODE=2(x2) "
                "gives tasks to 2"},
        {above, 8, "SLURM_LOCALID=3 but SLURM_PROCID=1"},
        {interactive, 4, "running in SLURM's interactive step (salloc's shell) with "
                      "SLURM_NTASKS=4 but outside srun"},
        {signed_batch, 2, "running in a SLURM batch script with SLURM_NTASKS=2 but outside srun"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        jdt_world w;
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(resolve_env(cases[i].env, cases[i].mesh, &w, &e) == JDT_ERR_CONFIG, "case %zu accepted",
                      i);
        ck_assert_msg(strstr(e.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, e.msg,
                      cases[i].want);
        ck_assert_msg(!strchr(e.msg, '\n'), "case %zu: not one line: '%s'", i, e.msg);
    }
}
END_TEST

/* Environments real SLURM steps have (captured from SLURM 22.05 on tests/infra/slurm-up.sh's
 * cluster, nodes node1 and node2) that look odd but must resolve, with the exact result. */
START_TEST(test_resolve_slurm_odd_but_valid)
{
    /* cyclic: rank 2 is node 0's second task */
    static char *cyclic[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_NPROCS=4",
                             "SLURM_STEP_NUM_TASKS=4", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                             "SLURM_JOB_ID=1", "SLURM_STEP_ID=1", "SLURM_DISTRIBUTION=cyclic",
                             "SLURM_STEP_NODELIST=node[1-2]", "SLURM_JOB_NODELIST=node[1-2]",
                             "SLURM_STEP_TASKS_PER_NODE=2(x2)", "SLURM_TASKS_PER_NODE=2(x2)",
                             "SLURM_NTASKS_PER_NODE=2", "SLURMD_NODENAME=node1", NULL};
    /* arbitrary (SLURM_HOSTFILE node2,node1,node1,node2): rank 0 is on the second node and
     * rank 1 is first on the first, outside any block of ranks */
    static char *arb0[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=4",
                           "SLURM_LOCALID=0", "SLURM_NODEID=1", "SLURM_JOB_ID=1",
                           "SLURM_STEP_ID=7", "SLURM_DISTRIBUTION=arbitrary",
                           "SLURM_STEP_NODELIST=node[1-2]", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                           "SLURMD_NODENAME=node2", NULL};
    static char *arb1[] = {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=4",
                           "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_JOB_ID=1",
                           "SLURM_STEP_ID=7", "SLURM_DISTRIBUTION=arbitrary",
                           "SLURM_STEP_NODELIST=node[1-2]", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                           "SLURMD_NODENAME=node1", NULL};
    /* srun -n1 inside -N2 --ntasks-per-node=2: the job's SLURM_NTASKS_PER_NODE is stale */
    static char *n1[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_NPROCS=1",
                         "SLURM_STEP_NUM_TASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                         "SLURM_JOB_ID=1", "SLURM_STEP_ID=2", "SLURM_STEP_NODELIST=node1",
                         "SLURM_JOB_NODELIST=node[1-2]", "SLURM_STEP_TASKS_PER_NODE=1",
                         "SLURM_TASKS_PER_NODE=1", "SLURM_NTASKS_PER_NODE=2", NULL};
    /* srun -n3 in the same job: 2,1 against the job's 2 per node */
    static char *n3[] = {"SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_STEP_NUM_TASKS=3",
                         "SLURM_LOCALID=0", "SLURM_NODEID=1", "SLURM_JOB_ID=1",
                         "SLURM_STEP_ID=4", "SLURM_STEP_NODELIST=node[1-2]",
                         "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_NTASKS_PER_NODE=2", NULL};
    /* a step on the job's second node only: SLURM_NODEID counts the step's nodes */
    static char *second[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_NUM_TASKS=2",
                             "SLURM_LOCALID=1", "SLURM_NODEID=0", "SLURM_JOB_ID=5",
                             "SLURM_STEP_ID=1", "SLURM_STEP_NODELIST=node2",
                             "SLURM_JOB_NODELIST=node[1-2]", "SLURM_STEP_TASKS_PER_NODE=2",
                             "SLURM_ARRAY_JOB_ID=4", "SLURM_ARRAY_TASK_ID=1", NULL};
    /* srun --overlap -N2 -n2 beside another step */
    static char *overlap[] = {"SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_STEP_NUM_TASKS=2",
                              "SLURM_LOCALID=0", "SLURM_NODEID=1", "SLURM_JOB_ID=1",
                              "SLURM_STEP_ID=5", "SLURM_STEP_NODELIST=node[1-2]",
                              "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_NTASKS_PER_NODE=2",
                              NULL};
    /* srun -E -n2 where the allocation set no task count: the step's own count */
    static char *preserve[] = {"SLURM_PROCID=1", "SLURM_STEP_NUM_TASKS=2", "SLURM_LOCALID=0",
                               "SLURM_NODEID=1", "SLURM_JOB_ID=8", "SLURM_STEP_ID=0",
                               "SLURM_STEP_NODELIST=node[1-2]",
                               "SLURM_STEP_TASKS_PER_NODE=1(x2)", NULL};
    /* a heterogeneous step (srun --het-group=0,1; component 0: 2 tasks on node2, component 1:
     * 1 task on node1): the step's lists are sorted by name (node1 first) while SLURM_NODEID
     * counts within the component; tasks per host come from SLURMD_NODENAME */
#define HET_COMMON                                                                             \
    "SLURM_NTASKS=3", "SLURM_NPROCS=3", "SLURM_STEP_NUM_TASKS=3", "SLURM_JOB_ID=2",            \
        "SLURM_STEP_ID=0", "SLURM_HET_SIZE=2", "SLURM_PACK_SIZE=2",                            \
        "SLURM_STEP_NODELIST=node[1-2]", "SLURM_JOB_NODELIST=node[1-2]",                       \
        "SLURM_STEP_TASKS_PER_NODE=1,2", "SLURM_TASKS_PER_NODE=1,2"
    static char *het0[] = {"SLURM_PROCID=0", "SLURM_LOCALID=0", "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node2", HET_COMMON, NULL};
    static char *het1[] = {"SLURM_PROCID=1", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node2", HET_COMMON, NULL};
    static char *het2[] = {"SLURM_PROCID=2", "SLURM_LOCALID=0", "SLURM_NODEID=1",
                           "SLURMD_NODENAME=node1", HET_COMMON, NULL};
    /* without SLURMD_NODENAME: accepted, the local world as large as the local id needs */
    static char *het1_noname[] = {"SLURM_PROCID=1", "SLURM_LOCALID=1", "SLURM_NODEID=0",
                                  HET_COMMON, NULL};
#undef HET_COMMON
    /* a batch script submitted from inside a step inherits that step's SLURM_STEP_*; alone
     * (one task) it is a single process whatever they say */
    static char *batch[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=9",
                            "SLURM_JOB_NODELIST=node1", "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                            "SLURM_STEP_NUM_TASKS=4", "SLURM_NODEID=3", NULL};
    /* salloc -N2 (no task count) and its interactive step; a special step printed signed */
    static char *interactive[] = {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=1", "SLURM_LOCALID=0",
                                  "SLURM_NODEID=0", "SLURM_JOB_ID=6",
                                  "SLURM_STEP_ID=4294967290", "SLURM_STEP_NODELIST=node1",
                                  "SLURM_STEP_TASKS_PER_NODE=1", "SLURM_TASKS_PER_NODE=3,1",
                                  NULL};
    static char *signed_step[] = {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=6",
                                  "SLURM_STEP_ID=-6", "SLURM_JOB_NODELIST=node[1-2]", NULL};
    struct {
        char **env;
        int rank, world, local, local_world;
        const char *coord_host; /* NULL for a world of 1 */
    } cases[] = {
        {cyclic, 2, 4, 1, 2, "node1"},  {arb0, 0, 4, 0, 2, "node1"},
        {arb1, 1, 4, 0, 2, "node1"},    {n1, 0, 1, 0, 1, NULL},
        {n3, 2, 3, 0, 1, "node1"},      {second, 1, 2, 1, 2, "node2"},
        {overlap, 1, 2, 0, 1, "node1"}, {preserve, 1, 2, 0, 1, "node1"},
        {het0, 0, 3, 0, 2, "node1"},    {het1, 1, 3, 1, 2, "node1"},
        {het2, 2, 3, 0, 1, "node1"},    {het1_noname, 1, 3, 1, 2, "node1"},
        {batch, 0, 1, 0, 1, NULL},      {interactive, 0, 1, 0, 1, NULL},
        {signed_step, 0, 1, 0, 1, NULL},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        jdt_world w;
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(resolve_env(cases[i].env, cases[i].world, &w, &e) == JDT_OK,
                      "case %zu: %s", i, e.msg);
        ck_assert_str_eq(w.source, "slurm");
        ck_assert_msg(w.rank == cases[i].rank && w.world_size == cases[i].world &&
                          w.local_rank == cases[i].local &&
                          w.local_world_size == cases[i].local_world,
                      "case %zu: rank %d of %d, local %d of %d", i, w.rank, w.world_size,
                      w.local_rank, w.local_world_size);
        if (cases[i].coord_host) {
            char want[64];
            snprintf(want, sizeof want, "%s:", cases[i].coord_host);
            ck_assert_msg(strncmp(w.coordinator, want, strlen(want)) == 0, "case %zu: '%s'", i,
                          w.coordinator);
        } else {
            ck_assert_str_eq(w.coordinator, "");
        }
    }
}
END_TEST

/* Which process hosts the coordinator: under SLURM (no dist.coordinator) the task on the first
 * host of the step's node list with SLURM_LOCALID 0, whatever its rank, as every task looks
 * for the coordinator there; rank 0 everywhere else. Exactly one task of each step hosts. */
START_TEST(test_coordinator_host)
{
#define STEP4                                                                                      \
    "SLURM_NTASKS=4", "SLURM_STEP_NUM_TASKS=4", "SLURM_JOB_ID=1", "SLURM_STEP_ID=7",               \
        "SLURM_STEP_NODELIST=node[1-2]", "SLURM_STEP_TASKS_PER_NODE=2(x2)"
    /* --distribution=arbitrary, SLURM_HOSTFILE node2,node1,node1,node2 (as SLURM 22.05 sets
     * it): rank 0 is on node2, rank 1 is the first task of node1 */
    static char *arb0[] = {"SLURM_PROCID=0",
                           "SLURM_LOCALID=0",
                           "SLURM_NODEID=1",
                           "SLURMD_NODENAME=node2",
                           STEP4,
                           NULL};
    static char *arb1[] = {"SLURM_PROCID=1",
                           "SLURM_LOCALID=0",
                           "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node1",
                           STEP4,
                           NULL};
    static char *arb2[] = {"SLURM_PROCID=2",
                           "SLURM_LOCALID=1",
                           "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node1",
                           STEP4,
                           NULL};
    static char *arb3[] = {"SLURM_PROCID=3",
                           "SLURM_LOCALID=1",
                           "SLURM_NODEID=1",
                           "SLURMD_NODENAME=node2",
                           STEP4,
                           NULL};
    /* the same without SLURMD_NODENAME: SLURM_NODEID indexes the step's node list */
    static char *arb0_noname[] = {"SLURM_PROCID=0", "SLURM_LOCALID=0", "SLURM_NODEID=1", STEP4,
                                  NULL};
    static char *arb1_noname[] = {"SLURM_PROCID=1", "SLURM_LOCALID=0", "SLURM_NODEID=0", STEP4,
                                  NULL};
    /* block distribution, nodes in the list's order: rank 0 hosts, rank 2 (node2) does not */
    static char *block0[] = {"SLURM_PROCID=0",
                             "SLURM_LOCALID=0",
                             "SLURM_NODEID=0",
                             "SLURMD_NODENAME=node1",
                             STEP4,
                             NULL};
    static char *block2[] = {"SLURM_PROCID=2",
                             "SLURM_LOCALID=0",
                             "SLURM_NODEID=1",
                             "SLURMD_NODENAME=node2",
                             STEP4,
                             NULL};
    /* block under a topology plugin that puts node2 first: ranks 2, 3 on node1 */
    static char *topo2[] = {"SLURM_PROCID=2",
                            "SLURM_LOCALID=0",
                            "SLURM_NODEID=0",
                            "SLURMD_NODENAME=node1",
                            "SLURM_DISTRIBUTION=block",
                            STEP4,
                            NULL};
    /* without SLURM_LOCALID (not a task srun started): rank 0, as before */
    static char *no_local0[] = {"SLURM_PROCID=0", "SLURM_NODEID=1", "SLURMD_NODENAME=node2", STEP4,
                                NULL};
#undef STEP4
    /* the heterogeneous step of test_resolve_slurm_odd_but_valid: component 0 (ranks 0, 1) on
     * node2, component 1 (rank 2) on node1, the first of the name-sorted list */
#define HET_COMMON                                                                                 \
    "SLURM_NTASKS=3", "SLURM_NPROCS=3", "SLURM_STEP_NUM_TASKS=3", "SLURM_JOB_ID=2",                \
        "SLURM_STEP_ID=0", "SLURM_HET_SIZE=2", "SLURM_PACK_SIZE=2",                                \
        "SLURM_STEP_NODELIST=node[1-2]", "SLURM_JOB_NODELIST=node[1-2]",                           \
        "SLURM_STEP_TASKS_PER_NODE=1,2", "SLURM_TASKS_PER_NODE=1,2"
    static char *het0[] = {"SLURM_PROCID=0",        "SLURM_LOCALID=0", "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node2", HET_COMMON,        NULL};
    static char *het1[] = {"SLURM_PROCID=1",        "SLURM_LOCALID=1", "SLURM_NODEID=0",
                           "SLURMD_NODENAME=node2", HET_COMMON,        NULL};
    static char *het2[] = {"SLURM_PROCID=2",        "SLURM_LOCALID=0", "SLURM_NODEID=1",
                           "SLURMD_NODENAME=node1", HET_COMMON,        NULL};
    /* without SLURMD_NODENAME a heterogeneous step cannot tell (SLURM_NODEID 0 is rank 0's,
     * on node2): rank 0 hosts, as before */
    static char *het0_noname[] = {"SLURM_PROCID=0", "SLURM_LOCALID=0", "SLURM_NODEID=0", HET_COMMON,
                                  NULL};
    static char *het2_noname[] = {"SLURM_PROCID=2", "SLURM_LOCALID=0", "SLURM_NODEID=1", HET_COMMON,
                                  NULL};
#undef HET_COMMON
    /* only the job's node list (the step's first node is unknown): rank 0 */
    static char *job_list0[] = {
        "SLURM_PROCID=0",  "SLURM_NTASKS=2",     "SLURM_LOCALID=0",           "SLURM_JOB_ID=3",
        "SLURM_STEP_ID=0", "SLURMD_NODENAME=c2", "SLURM_JOB_NODELIST=c[1-2]", NULL};
    static char *job_list1[] = {
        "SLURM_PROCID=1",  "SLURM_NTASKS=2",     "SLURM_LOCALID=0",           "SLURM_JOB_ID=3",
        "SLURM_STEP_ID=0", "SLURMD_NODENAME=c1", "SLURM_JOB_NODELIST=c[1-2]", NULL};
    /* one task: nothing to host */
    static char *one[] = {"SLURM_PROCID=0",
                          "SLURM_NTASKS=1",
                          "SLURM_LOCALID=0",
                          "SLURM_NODEID=0",
                          "SLURM_JOB_ID=1",
                          "SLURM_STEP_ID=2",
                          "SLURM_STEP_NODELIST=node1",
                          "SLURMD_NODENAME=node1",
                          NULL};
    /* the launcher's variables (and explicit dist.* keys): rank 0 */
    static char *cfg0[] = {"JDT_DIST_RANK=0", "JDT_DIST_WORLD_SIZE=2",
                           "JDT_DIST_COORDINATOR=127.0.0.1:4000", "JDT_DIST_TOKEN=t", NULL};
    static char *cfg1[] = {"JDT_DIST_RANK=1", "JDT_DIST_WORLD_SIZE=2",
                           "JDT_DIST_COORDINATOR=127.0.0.1:4000", "JDT_DIST_TOKEN=t", NULL};
    const char *coord = "dist.coordinator=login:2222";
    struct {
        char **env;
        int world;
        const char *extra; /* one more override, or NULL */
        bool host;
        int coordinator_rank;
        const char *coord_host; /* where every task looks for it */
    } cases[] = {
        {arb0, 4, NULL, false, -1, "node1:"},
        {arb1, 4, NULL, true, 1, "node1:"},
        {arb2, 4, NULL, false, -1, "node1:"},
        {arb3, 4, NULL, false, -1, "node1:"},
        {arb0_noname, 4, NULL, false, -1, "node1:"},
        {arb1_noname, 4, NULL, true, 1, "node1:"},
        {block0, 4, NULL, true, 0, "node1:"},
        {block2, 4, NULL, false, -1, "node1:"},
        {topo2, 4, NULL, true, 2, "node1:"},
        {no_local0, 4, NULL, true, 0, "node1:"},
        {het0, 3, NULL, false, -1, "node1:"},
        {het1, 3, NULL, false, -1, "node1:"},
        {het2, 3, NULL, true, 2, "node1:"},
        {het0_noname, 3, NULL, true, 0, "node1:"},
        {het2_noname, 3, NULL, false, 0, "node1:"},
        {job_list0, 2, NULL, true, 0, "c1:"},
        {job_list1, 2, NULL, false, 0, "c1:"},
        {one, 1, NULL, false, 0, ""},
        /* dist.coordinator under SLURM says where it is: rank 0 hosts it there, as before */
        {arb0, 4, coord, true, 0, "login:2222"},
        {arb1, 4, coord, false, 0, "login:2222"},
        {het2, 3, coord, false, 0, "login:2222"},
        {cfg0, 2, NULL, true, 0, "127.0.0.1:4000"},
        {cfg1, 2, NULL, false, 0, "127.0.0.1:4000"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        jdt_world w;
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(resolve_env_with(cases[i].env, cases[i].world, cases[i].extra, &w, &e) ==
                          JDT_OK,
                      "case %zu: %s", i, e.msg);
        ck_assert_msg(
            w.host_coordinator == cases[i].host && w.coordinator_rank == cases[i].coordinator_rank,
            "case %zu (rank %d): host %d, coordinator rank %d; expected %d, %d", i, w.rank,
            w.host_coordinator, w.coordinator_rank, cases[i].host, cases[i].coordinator_rank);
        const char *want = cases[i].coord_host;
        ck_assert_msg(strncmp(w.coordinator, want, strlen(want)) == 0 &&
                          (want[0] || !w.coordinator[0]),
                      "case %zu: coordinator '%s', expected '%s...'", i, w.coordinator, want);
    }
}
END_TEST

START_TEST(test_resolve_config_wins)
{
    jdt_config c;
    jdt_err e;
    jdt_world w;
    /* JDT_DIST_* variables (the launcher's) beat SLURM's even inside a SLURM step */
    char *env[32];
    int n = 0;
    for (char **p = SLURM_ENV; *p; p++) env[n++] = *p;
    env[n++] = "JDT_DIST_RANK=1";
    env[n++] = "JDT_DIST_WORLD_SIZE=3";
    env[n++] = "JDT_DIST_COORDINATOR=127.0.0.1:4000";
    env[n++] = "JDT_DIST_TOKEN=tok";
    env[n] = NULL;
    const char *ovr[] = {"mesh.data=3", "data.batch_size=12", "data.micro_batch_size=12", NULL};
    ck_assert_msg(load(env, ovr, &c, &e) == JDT_OK, "%s", e.msg);
    ck_assert_msg(jdt_world_resolve(&c, env, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.source, "config");
    ck_assert_int_eq(w.rank, 1);
    ck_assert_int_eq(w.world_size, 3);
    ck_assert_int_eq(w.local_rank, 1);
    ck_assert_int_eq(w.local_world_size, 3); /* loopback coordinator: one host */
    ck_assert_str_eq(w.coordinator, "127.0.0.1:4000");
    ck_assert_str_eq(w.token, "tok");
    jdt_config_free(&c);

    /* overrides; world size from the mesh; a remote coordinator leaves the local size unknown */
    char *none[] = {NULL};
    const char *ovr2[] = {"mesh.data=2", "dist.rank=0", "dist.coordinator=n1:29500",
                          "dist.token=t", "dist.local_rank=0", NULL};
    ck_assert_int_eq(load(none, ovr2, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, none, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(w.world_size, 2);
    ck_assert_int_eq(w.local_world_size, 1);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_resolve_bad_values)
{
    jdt_err e;
    jdt_world w;
    jdt_config c;
    char *none[] = {NULL};
    struct {
        const char *ovr[6];
        const char *want;
    } cases[] = {
        {{"mesh.data=2", "dist.rank=1", "dist.token=t", NULL}, "dist.coordinator=HOST:PORT"},
        {{"mesh.data=2", "dist.coordinator=h:1", "dist.token=t", NULL}, "dist.rank: not set"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=h", "dist.token=t", NULL},
         "expected host:port"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=h:0", "dist.token=t", NULL},
         "port in 1..65535"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=h:99999", "dist.token=t", NULL},
         "port in 1..65535"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=:80", "dist.token=t", NULL},
         "expected host:port"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=a b:80", "dist.token=t", NULL},
         "not a host name"},
        /* no token for 2 processes: tells how to set one */
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=h:80", NULL}, "JDT_DIST_TOKEN"},
        {{"mesh.data=2", "dist.rank=1", "dist.coordinator=h:80",
          "dist.token_file=/nonexistent/tok", NULL},
         "cannot read '/nonexistent/tok'"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        ck_assert_msg(load(none, cases[i].ovr, &c, &e) == JDT_OK, "case %zu: %s", i, e.msg);
        ck_assert_int_eq(jdt_world_resolve(&c, none, &w, &e), JDT_ERR_CONFIG);
        ck_assert_msg(strstr(e.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, e.msg,
                      cases[i].want);
        jdt_config_free(&c);
    }
    /* a rank beyond the world size is caught (by the config loader or by resolve) */
    const char *ovr[] = {"mesh.data=2", "dist.rank=2", "dist.coordinator=h:80", "dist.token=t",
                         NULL};
    jdt_status st = load(none, ovr, &c, &e);
    if (st == JDT_OK) {
        st = jdt_world_resolve(&c, none, &w, &e);
        jdt_config_free(&c);
    }
    ck_assert_int_eq(st, JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "dist.rank"), "%s", e.msg);
}
END_TEST

START_TEST(test_token_file)
{
    jdt_err e;
    jdt_world w;
    jdt_config c;
    char path[] = "/tmp/jdt-world-tok-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "s3cret \n second line\n", 21), 21);
    close(fd);
    char file_ovr[128];
    snprintf(file_ovr, sizeof file_ovr, "dist.token_file=%s", path);
    char *none[] = {NULL};
    const char *ovr[] = {"mesh.data=2", "dist.rank=1", "dist.coordinator=h:80", file_ovr, NULL};
    ck_assert_int_eq(load(none, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, none, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(w.token, "s3cret");
    jdt_config_free(&c);
    /* empty file */
    FILE *f = fopen(path, "w");
    fclose(f);
    ck_assert_int_eq(load(none, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, none, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "empty"), "%s", e.msg);
    jdt_config_free(&c);
    unlink(path);
}
END_TEST

START_TEST(test_listen_fd)
{
    jdt_err e;
    jdt_world w;
    jdt_config c;
    /* not a socket: a clear error */
    char *env_bad[] = {"JDT_COORD_LISTEN_FD=0", NULL};
    const char *ovr[] = {"mesh.data=2", "dist.rank=0", "dist.coordinator=127.0.0.1:80",
                         "dist.token=t", NULL};
    ck_assert_int_eq(load(env_bad, ovr, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_world_resolve(&c, env_bad, &w, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "JDT_COORD_LISTEN_FD"), "%s", e.msg);
    jdt_config_free(&c);
    /* a listening socket is taken and marked close-on-exec */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = 0};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    char var[64];
    snprintf(var, sizeof var, "JDT_COORD_LISTEN_FD=%d", fd);
    char *env[] = {var, NULL};
    ck_assert_int_eq(load(env, ovr, &c, &e), JDT_OK);
    ck_assert_msg(jdt_world_resolve(&c, env, &w, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(w.coord_listen_fd, fd);
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    jdt_config_free(&c);
    close(fd);
}
END_TEST

START_TEST(test_threads)
{
    jdt_world w;
    memset(&w, 0, sizeof w);
    w.local_world_size = 1;
    const char *omp_env = getenv("OMP_NUM_THREADS");
    char *saved = omp_env ? strdup(omp_env) : NULL;
    /* OMP_NUM_THREADS, when it is a count (a list's first level), decides an auto count; an
     * explicit runtime.threads overrides it; anything else is ignored */
    setenv("OMP_NUM_THREADS", "5", 1);
    ck_assert_int_eq(jdt_world_threads(&w, 0), 5);
    ck_assert_int_eq(jdt_world_threads(&w, 3), 3);
    setenv("OMP_NUM_THREADS", "6,2", 1);
    ck_assert_int_eq(jdt_world_threads(&w, 0), 6);
    static const char *const bad[] = {"", "0", "-2", "x", "4x", "99999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("OMP_NUM_THREADS", bad[i], 1);
        ck_assert_msg(jdt_world_threads_env() == 0, "OMP_NUM_THREADS='%s' taken", bad[i]);
    }
    unsetenv("OMP_NUM_THREADS");
    ck_assert_int_eq(jdt_world_threads(&w, 3), 3);
    cpu_set_t all, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int n_all = CPU_COUNT(&all);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_all == online) {
        ck_assert_int_eq(jdt_world_threads(&w, 0), n_all);
        w.local_world_size = 2;
        ck_assert_int_eq(jdt_world_threads(&w, 0), n_all / 2 > 0 ? n_all / 2 : 1);
        w.local_world_size = 1000;
        ck_assert_int_eq(jdt_world_threads(&w, 0), 1);
    }
    /* bound to one CPU: that is the share, whatever the local world */
    CPU_ZERO(&one);
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &all)) {
            CPU_SET(i, &one);
            break;
        }
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
    w.local_world_size = 2;
    ck_assert_int_eq(jdt_world_threads(&w, 0), 1);
    sched_setaffinity(0, sizeof all, &all);
    if (saved) setenv("OMP_NUM_THREADS", saved, 1);
    free(saved);
}
END_TEST

/* Two forked ranks join through jdt_world_connect: rank 0 on the inherited socket. */
typedef struct {
    int fd, port;
} two_ranks;

static int connect_rank(int r, void *p)
{
    const two_ranks *j = p;
    char rank[32], coord[64], lfd[64];
    snprintf(rank, sizeof rank, "JDT_DIST_RANK=%d", r);
    snprintf(coord, sizeof coord, "JDT_DIST_COORDINATOR=127.0.0.1:%d", j->port);
    snprintf(lfd, sizeof lfd, "JDT_COORD_LISTEN_FD=%d", j->fd);
    char *env[] = {rank, coord, "JDT_DIST_WORLD_SIZE=2", "JDT_DIST_TOKEN=tt",
                   "JDT_DIST_CONNECT_TIMEOUT_S=20", r == 0 ? lfd : NULL, NULL};
    if (r != 0) close(j->fd);
    const char *ovr[] = {"mesh.data=2", NULL};
    jdt_config c;
    jdt_err e;
    jdt_world w;
    jdt_dist *d = NULL;
    if (load(env, ovr, &c, &e) || jdt_world_resolve(&c, env, &w, &e) ||
        jdt_world_connect(&w, &c, &d, &e)) {
        fprintf(stderr, "rank %d: %s\n", r, e.msg);
        return 1;
    }
    double x = r + 1.0;
    jdt_status st = jdt_comm_allreduce(jdt_dist_world(d), &x, 1, JDT_DTYPE_F64, JDT_REDUCE_SUM, &e);
    if (!st) st = jdt_dist_barrier(d, 20, &e);
    jdt_dist_free(d);
    jdt_config_free(&c);
    return st == JDT_OK && x == 3.0 ? 0 : 2;
}

START_TEST(test_connect_two_ranks)
{
    two_ranks j;
    j.fd = tu_free_listener(&j.port);
    int codes[2];
    tu_run_procs(2, connect_rank, &j, j.fd, 120, codes);
    for (int r = 0; r < 2; r++) ck_assert_msg(codes[r] == 0, "rank %d failed (%d)", r, codes[r]);
}
END_TEST

/* A SLURM step of two tasks whose rank 0 is not on the first node of the node list
 * (--distribution=arbitrary): rank 1, the task there, hosts the coordinator (on the socket
 * the test bound, so ports cannot collide) and leaves first; rank 0 still uses the
 * coordinator (KV store, health) longer than dist.connect_timeout_s after that, so the host
 * must keep it up until rank 0 has left. Both "nodes" are 127.0.0.x. */
static int connect_slurm_task(int r, void *p)
{
    const two_ranks *j = p;
    char port[48], lfd[64];
    snprintf(port, sizeof port, "JDT_DIST_PORT=%d", j->port);
    snprintf(lfd, sizeof lfd, "JDT_COORD_LISTEN_FD=%d", j->fd);
    char *env[] = {r == 0 ? "SLURM_PROCID=0" : "SLURM_PROCID=1",
                   r == 0 ? "SLURM_NODEID=1" : "SLURM_NODEID=0",
                   r == 0 ? "SLURMD_NODENAME=127.0.0.2" : "SLURMD_NODENAME=127.0.0.1",
                   "SLURM_LOCALID=0",
                   "SLURM_NTASKS=2",
                   "SLURM_STEP_NUM_TASKS=2",
                   "SLURM_JOB_ID=31",
                   "SLURM_STEP_ID=0",
                   "SLURM_STEP_NODELIST=127.0.0.[1-2]",
                   "SLURM_STEP_TASKS_PER_NODE=1(x2)",
                   "SLURM_DISTRIBUTION=arbitrary",
                   port,
                   "JDT_DIST_CONNECT_TIMEOUT_S=3",
                   r == 1 ? lfd : NULL,
                   NULL};
    if (r != 1) close(j->fd);
    const char *ovr[] = {"mesh.data=2", NULL};
    jdt_config c;
    jdt_err e;
    jdt_world w;
    jdt_dist *d = NULL;
    if (load(env, ovr, &c, &e) || jdt_world_resolve(&c, env, &w, &e)) {
        fprintf(stderr, "task %d: %s\n", r, e.msg);
        return 1;
    }
    if (w.rank != r || w.host_coordinator != (r == 1) ||
        w.coord_listen_fd != (r == 1 ? j->fd : -1)) {
        fprintf(stderr, "task %d: rank %d, host %d, fd %d\n", r, w.rank, w.host_coordinator,
                w.coord_listen_fd);
        return 3;
    }
    if (jdt_world_connect(&w, &c, &d, &e)) {
        fprintf(stderr, "task %d: %s\n", r, e.msg);
        return 1;
    }
    double x = r + 1.0;
    jdt_status st = jdt_comm_allreduce(jdt_dist_world(d), &x, 1, JDT_DTYPE_F64, JDT_REDUCE_SUM, &e);
    if (!st && r == 0) {
        /* the host has left by now; its coordinator must still serve this rank */
        struct timespec ts = {4, 500 * 1000 * 1000}; /* > dist.connect_timeout_s */
        nanosleep(&ts, NULL);
        void *v = NULL;
        size_t n = 0;
        if (!(st = jdt_dist_check(d, &e)) && !(st = jdt_dist_kv_set(d, "late", "x", 1, &e)))
            st = jdt_dist_kv_get(d, "late", 5, &v, &n, &e);
        jdt_free(v);
    }
    if (st) fprintf(stderr, "task %d: %s\n", r, e.msg);
    jdt_dist_free(d);
    jdt_config_free(&c);
    return st == JDT_OK && x == 3.0 ? 0 : 2;
}

START_TEST(test_connect_host_not_rank0)
{
    two_ranks j;
    j.fd = tu_free_listener(&j.port);
    int codes[2];
    tu_run_procs(2, connect_slurm_task, &j, j.fd, 60, codes);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(codes[r] == 0, "task %d failed (%d)", r, codes[r]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("world");
    TCase *tc = tcase_create("world");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hostlist_valid);
    tcase_add_test(tc, test_hostlist_malformed);
    tcase_add_test(tc, test_tasks_per_node);
    tcase_add_test(tc, test_slurm_port);
    tcase_add_test(tc, test_resolve_single);
    tcase_add_test(tc, test_resolve_slurm);
    tcase_add_test(tc, test_resolve_slurm_fallbacks);
    tcase_add_test(tc, test_resolve_slurm_inconsistent);
    tcase_add_test(tc, test_resolve_slurm_odd_but_valid);
    tcase_add_test(tc, test_coordinator_host);
    tcase_add_test(tc, test_resolve_config_wins);
    tcase_add_test(tc, test_resolve_bad_values);
    tcase_add_test(tc, test_resolve_launchers);
    tcase_add_test(tc, test_token_file);
    tcase_add_test(tc, test_listen_fd);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_connect_two_ranks);
    tcase_add_test(tc, test_connect_host_not_rank0);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
