/*
 * testutil.h — helpers every Check suite shares (tests/unit/testutil.c, linked into each suite
 * by the Makefile): a per-test temp directory, a loopback listener on a free port, a harness
 * that forks N processes (ranks) and collects their exit codes with a deadline, and the suite
 * main. Tests run in Check's fork mode, so the temp dir's state is per test process.
 */
#ifndef JDT_TESTUTIL_H
#define JDT_TESTUTIL_H

#include <check.h>
#include <stdbool.h>

/* Creates a fresh directory /tmp/jdt-<tag>.XXXXXX (fails the test if it cannot). */
void tu_tmpdir_make(const char *tag);
/* Removes the directory made by tu_tmpdir_make and everything in it (fails the test if rm
 * fails). No-op when none was made. */
void tu_tmpdir_remove(void);
/* The directory made by tu_tmpdir_make ("" before). */
const char *tu_tmpdir(void);
/* "<tmpdir>/<name>" in one of 32 rotating static buffers (valid until 32 more calls). */
char *tu_path(const char *name);

/* Binds and listens on 127.0.0.1 with port 0, so ports never collide between tests; returns the
 * fd and sets *port. Fails the test on error. */
int tu_free_listener(int *port);

/* Body of one forked process: returns its exit code (0..255). */
typedef int (*tu_proc_fn)(int i, void *arg);

/* Forks n processes (n <= 16), process i running _exit(fn(i, arg)); the parent then closes
 * parent_fd (unless -1: e.g. a listener only process 0 serves, so a dead process 0 means
 * refused connections) and waits for all of them, up to timeout_s, then SIGKILLs the ones
 * left. codes[i] = exit code, 100 + signal number when a signal ended it, or 99 when it was
 * killed at the deadline. */
void tu_run_procs(int n, tu_proc_fn fn, void *arg, int parent_fd, double timeout_s, int *codes);

/* The suite main: runs every test of s in Check's fork mode (one process per test, whatever
 * CK_FORK says: the temp dir and the fork harness rely on it) and returns
 * the process exit code: 0 when all passed, 1 otherwise. */
int tu_run_suite(Suite *s);

/* max(acc, err) for a running worst error, with a NaN err giving +inf: fmax(acc, NaN) and
 * `if (err > acc)` both keep acc, so a kernel that returns NaN would pass an error bound. */
static inline double tu_worse(double acc, double err)
{
    return err <= acc ? acc : (err != err ? __builtin_inf() : err);
}

#endif /* JDT_TESTUTIL_H */
