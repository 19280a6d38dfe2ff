/*
 * testutil.c — the helpers shared by the Check suites (see testutil.h).
 */
#include "tests/unit/testutil.h"

#include "core/core.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_tmpdir[256];

void tu_tmpdir_make(const char *tag)
{
    snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/jdt-%s.XXXXXX", tag);
    ck_assert_msg(mkdtemp(g_tmpdir) != NULL, "mkdtemp %s failed", g_tmpdir);
}

void tu_tmpdir_remove(void)
{
    if (!g_tmpdir[0]) return;
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    g_tmpdir[0] = '\0';
}

const char *tu_tmpdir(void)
{
    return g_tmpdir;
}

char *tu_path(const char *name)
{
    static char buf[32][512];
    static int i;
    i = (i + 1) % 32;
    snprintf(buf[i], sizeof buf[i], "%s/%s", g_tmpdir, name);
    return buf[i];
}

int tu_free_listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 128), 0);
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

void tu_run_procs(int n, tu_proc_fn fn, void *arg, int parent_fd, double timeout_s, int *codes)
{
    enum { MAX_PROCS = 16 };
    ck_assert_int_le(n, MAX_PROCS);
    pid_t pids[MAX_PROCS];
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) _exit(fn(i, arg));
    }
    if (parent_fd >= 0) close(parent_fd);
    double until = jdt_now_s() + timeout_s;
    int left = n;
    for (int i = 0; i < n; i++)
        codes[i] = -1;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, WNOHANG);
        if (p > 0) {
            for (int i = 0; i < n; i++) {
                if (pids[i] != p) continue;
                codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
                left--;
            }
            continue;
        }
        if (jdt_now_s() > until) {
            for (int i = 0; i < n; i++)
                if (codes[i] < 0) kill(pids[i], SIGKILL);
            for (int i = 0; i < n; i++)
                if (codes[i] < 0) {
                    waitpid(pids[i], NULL, 0);
                    codes[i] = 99;
                }
            break;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_FORK); /* per-test state (temp dir, forks) assumes it */
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
