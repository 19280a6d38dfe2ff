/*
 * check_core.c — unit tests for engine/core: statuses, error context, allocation hook, dtypes,
 * hashing, the counter-based RNG and the stop signals.
 */
#include "tests/unit/testutil.h"
#include "core/core.h"

#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

START_TEST(test_status_strings)
{
    ck_assert_str_eq(jdt_status_str(JDT_OK), "ok");
    ck_assert_str_eq(jdt_status_name(JDT_ERR_CONFIG), "ERR_CONFIG");
    ck_assert_str_eq(jdt_status_str((jdt_status)9999), "unknown status");
    for (int s = 0; s < JDT_STATUS_COUNT; s++)
        ck_assert(strlen(jdt_status_str((jdt_status)s)) > 0);
}
END_TEST

START_TEST(test_err_set_prefix)
{
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_err_set(&e, JDT_ERR_IO, "open %s", "x.h5"), JDT_ERR_IO);
    jdt_err_prefix(&e, "dataset %d", 3);
    ck_assert_str_eq(e.msg, "dataset 3: open x.h5");
    ck_assert_int_eq(e.code, JDT_ERR_IO);
    ck_assert_int_eq(jdt_err_set(NULL, JDT_ERR_NET, "ignored"), JDT_ERR_NET);
}
END_TEST

/* Every error message is one printable line, whatever text it echoes. */
START_TEST(test_err_one_line)
{
    jdt_err e;
    jdt_err_set(&e, JDT_ERR_CONFIG, "key '%s': bad", "a\nb\rc\td\x1b[2Je\x7f\xc2\x9b");
    ck_assert_str_eq(e.msg, "key 'a\\nb\\rc\\td\\x1b[2Je\\x7f\\u009b': bad");
    jdt_err_set(&e, JDT_ERR_IO, "writing tensor '%s': %s", "x", "");
    ck_assert_str_eq(e.msg, "writing tensor 'x'");
    jdt_err_set(&e, JDT_ERR_IO, "x\xe0\x86\x8b\xff"); /* overlong form, stray byte */
    ck_assert_str_eq(e.msg, "x\\xe0\\x86\\x8b\\xff");
    jdt_err_set(&e, JDT_ERR_IO, "caf\xc3\xa9 \xe2\x82\xac"); /* UTF-8 text stays */
    ck_assert_str_eq(e.msg, "caf\xc3\xa9 \xe2\x82\xac");
    jdt_err_prefix(&e, "in\n%s", "x");
    ck_assert_str_eq(e.msg, "in\\nx: caf\xc3\xa9 \xe2\x82\xac");
    for (size_t i = 0; e.msg[i]; i++)
        ck_assert((unsigned char)e.msg[i] >= 0x20 && e.msg[i] != 0x7f);
}
END_TEST

START_TEST(test_alloc_fail_hook)
{
    jdt_alloc_fail_after(2);
    void *a = jdt_malloc(16);
    void *b = jdt_malloc(16);
    void *c = jdt_malloc(16);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(jdt_alloc_fail_after(0), 3);
    jdt_free(a);
    jdt_free(c);
    jdt_free(NULL);
}
END_TEST

/* Whether the mapping holding p carries the huge-page advice (smaps' VmFlags "hg"); -1 when
 * smaps cannot be read. */
static int vma_advised_huge(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    bool in = false;
    int r = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            r = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return r;
}

START_TEST(test_aligned_huge_pages)
{
    const size_t mib = (size_t)1 << 20;
    float *small = jdt_malloc_aligned(1000);
    ck_assert_ptr_nonnull(small);
    ck_assert_uint_eq((uintptr_t)small % 64, 0);
    jdt_free_aligned(small);
    /* 2 MiB and up: on a 2 MiB boundary, writable to the last byte */
    for (int off = 0; off < 2; off++) {
        size_t n = 5 * mib + (size_t)off * 4096 + 40;
        unsigned char *p = jdt_malloc_aligned(n);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % (2 * mib), 0);
        memset(p, 7, n);
        ck_assert_int_eq(p[n - 1], 7);
        jdt_free_aligned(p);
    }
    /* the advice, where the kernel has transparent huge pages; JDT_HUGEPAGES=0 withholds it */
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) != 0) return;
    setenv("JDT_HUGEPAGES", "0", 1);
    void *plain = jdt_malloc_aligned(6 * mib);
    unsetenv("JDT_HUGEPAGES");
    void *huge = jdt_malloc_aligned(6 * mib);
    ck_assert_ptr_nonnull(plain);
    ck_assert_ptr_nonnull(huge);
    int hp = vma_advised_huge(huge), pp = vma_advised_huge(plain);
    if (hp >= 0) {
        ck_assert_int_eq(hp, 1);
        ck_assert_int_eq(pp, 0);
    }
    jdt_free_aligned(plain);
    jdt_free_aligned(huge);
}
END_TEST

START_TEST(test_dtypes)
{
    jdt_dtype d;
    ck_assert(jdt_dtype_parse("u16", &d));
    ck_assert_int_eq(d, JDT_DTYPE_U16);
    ck_assert_uint_eq(jdt_dtype_size(JDT_DTYPE_BF16), 2);
    ck_assert(!jdt_dtype_parse("f33", &d));
}
END_TEST

START_TEST(test_philox_known_answer)
{
    /* Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors):
     * counter 0, key 0 -> 6627e8d5 e169c58d bc57ac4c 9b00dbd8. */
    jdt_philox_ctr r = jdt_philox(0, 0, 0);
    ck_assert_uint_eq(r.v[0], 0x6627e8d5u);
    ck_assert_uint_eq(r.v[1], 0xe169c58du);
    ck_assert_uint_eq(r.v[2], 0xbc57ac4cu);
    ck_assert_uint_eq(r.v[3], 0x9b00dbd8u);
}
END_TEST

START_TEST(test_rng_index_stable)
{
    float whole[64], part[16];
    uint64_t key = jdt_rng_key(42, "blocks.0.attn.wq");
    jdt_rng_normal(key, 0, 64, whole);
    jdt_rng_normal(key, 30, 16, part);
    for (int i = 0; i < 16; i++)
        ck_assert_float_eq(whole[30 + i], part[i]);
    double mean = 0, var = 0;
    enum { N = 20000 };
    static float big[N];
    jdt_rng_normal(key, 0, N, big);
    for (int i = 0; i < N; i++)
        mean += big[i];
    mean /= N;
    for (int i = 0; i < N; i++)
        var += (big[i] - mean) * (big[i] - mean);
    var /= N;
    ck_assert(fabs(mean) < 0.03);
    ck_assert(fabs(var - 1.0) < 0.05);
    ck_assert(jdt_rng_key(42, "a") != jdt_rng_key(42, "b"));
    ck_assert(jdt_rng_key(42, "a") != jdt_rng_key(43, "a"));
}
END_TEST

/* Runs fn with stderr redirected to a temp file; returns what it printed (caller frees). */
static char *capture_stderr(void (*fn)(void))
{
    char path[] = "/tmp/jdt-core-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *buf = calloc(1, 8192);
    ck_assert_int_ge(pread(fd, buf, 8191, 0), 0);
    close(fd);
    unlink(path);
    return buf;
}

static void progress_ops(void)
{
    jdt_progress p;
    jdt_progress_begin(&p, "saving", 100, "MB");
    jdt_progress_update(&p, 25);
    jdt_progress_update(&p, 100);
    jdt_progress_end(&p);
    jdt_progress_begin(&p, "compiling", 0, "");
    jdt_progress_set_estimate(&p, 1e6);
    jdt_progress_update(&p, 0);
    jdt_progress_end(&p);
}

START_TEST(test_progress_plain_lines)
{
    /* not a terminal, JDT_PROGRESS_INTERVAL=0: one plain line per update, no control chars */
    setenv("JDT_PROGRESS_INTERVAL", "0", 1);
    char *out = capture_stderr(progress_ops);
    ck_assert_msg(strstr(out, "saving: 25.0/100.0 MB (25%)") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "saving: 100.0/100.0 MB (100%)") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "compiling: 0s elapsed, about ") != NULL, "%s", out);
    ck_assert_msg(strstr(out, "s left (from the last run's rate)") != NULL, "%s", out);
    ck_assert_ptr_null(strchr(out, '\r'));
    ck_assert_ptr_null(strchr(out, '\033'));
    free(out);
    /* default period (10 s): nothing for operations this short */
    unsetenv("JDT_PROGRESS_INTERVAL");
    out = capture_stderr(progress_ops);
    ck_assert_str_eq(out, "");
    free(out);
    /* a bad value: one warning for the process, then the default */
    setenv("JDT_PROGRESS_INTERVAL", "fast", 1);
    out = capture_stderr(progress_ops);
    ck_assert_msg(strstr(out, "JDT_PROGRESS_INTERVAL='fast' is not a number") != NULL, "%s", out);
    ck_assert_ptr_null(strstr(strstr(out, "'fast'") + 1, "'fast'"));
    ck_assert_ptr_null(strstr(out, "saving:"));
    free(out);
    unsetenv("JDT_PROGRESS_INTERVAL");
}
END_TEST

START_TEST(test_hash)
{
    ck_assert(jdt_hash_str(JDT_HASH_INIT, "abc") != jdt_hash_str(JDT_HASH_INIT, "abd"));
    ck_assert(jdt_hash_str(JDT_HASH_INIT, "abc") == jdt_hash_str(JDT_HASH_INIT, "abc"));
}
END_TEST

static void *record_mask(void *mask)
{
    pthread_sigmask(SIG_SETMASK, NULL, mask);
    return NULL;
}

/* Waits up to 5 s for the stop request to read sig. */
static bool stop_reads(int sig)
{
    for (int i = 0; i < 5000 && jdt_signals_stop_requested() != sig; i++)
        usleep(1000);
    return jdt_signals_stop_requested() == sig;
}

/* The life of a jdt-train process, in a child (the signal state is process-wide): returns the
 * number of the check that failed, or is ended by the last SIGTERM as it should be. */
static int signals_life(void)
{
    signal(SIGINT, SIG_IGN);  /* as a shell starts a background job */
    signal(SIGTERM, SIG_DFL); /* not Check's handler, which ends the whole test */
    jdt_err e;
    jdt_err_clear(&e);
    if (jdt_signals_init(&e) != JDT_OK) return 1;
    /* a thread made afterwards, as OpenMP makes its workers, inherits the block */
    sigset_t m;
    pthread_t t;
    if (pthread_create(&t, NULL, record_mask, &m) != 0) return 2;
    pthread_join(t, NULL);
    if (!sigismember(&m, SIGINT) || !sigismember(&m, SIGTERM)) return 3;
    /* a forked child (the C compiler) gets the mask the process started with */
    pid_t kid = fork();
    if (kid == 0) {
        jdt_signals_reset_child();
        sigset_t c;
        sigprocmask(SIG_SETMASK, NULL, &c);
        _exit(sigismember(&c, SIGINT) || sigismember(&c, SIGTERM));
    }
    int ws;
    if (kid < 0 || waitpid(kid, &ws, 0) != kid || !WIFEXITED(ws) || WEXITSTATUS(ws)) return 4;
    kill(getpid(), SIGINT); /* ignored, as it was */
    usleep(50 * 1000);
    /* a stop: the signal thread records the signals, a second one too, the ignored one included
     * (the trainer's handler always overrode the ignore) */
    jdt_signals_stop_begin();
    if (jdt_signals_stop_requested() != 0) return 5;
    kill(getpid(), SIGTERM);
    if (!stop_reads(SIGTERM)) return 6;
    kill(getpid(), SIGINT);
    if (!stop_reads(SIGINT)) return 7;
    jdt_signals_stop_end();
    kill(getpid(), SIGINT); /* ignored again */
    usleep(50 * 1000);
    kill(getpid(), SIGTERM); /* no stop now: the default action ends the process */
    usleep(5 * 1000 * 1000);
    return 8;
}

START_TEST(test_signals)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) _exit(signals_life());
    int ws;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM, "the child %s %d",
                  WIFEXITED(ws) ? "failed check" : "was killed by signal",
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_status_strings);
    tcase_add_test(tc, test_err_set_prefix);
    tcase_add_test(tc, test_err_one_line);
    tcase_add_test(tc, test_alloc_fail_hook);
    tcase_add_test(tc, test_aligned_huge_pages);
    tcase_add_test(tc, test_dtypes);
    tcase_add_test(tc, test_philox_known_answer);
    tcase_add_test(tc, test_rng_index_stable);
    tcase_add_test(tc, test_hash);
    tcase_add_test(tc, test_progress_plain_lines);
    tcase_add_test(tc, test_signals);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
