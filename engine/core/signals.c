/*
 * signals.c — SIGINT and SIGTERM taken on one thread of their own, and the training loop's
 * stop request (see core.h); also the flag saying the job ended under this process
 * (jdt_job_lost), process-wide state of the same kind.
 *
 * The kernel hands a process-directed signal to any thread that does not block it, and a
 * handler then runs on that thread wherever it is: in the middle of a JIT kernel on an OpenMP
 * worker, or in oneDNN's code (a handler frame there once corrupted the heap). Threads we do
 * not make (OpenMP's workers, which run the generated kernels and OpenBLAS; oneDNN's) take the
 * mask of the thread that made them, so the only way to keep every one of them out is to block
 * the signals before the first exists and take them synchronously (sigwaitinfo) on a thread
 * that does nothing else. That thread then acts as the disposition in force says: the stop
 * handler (jdt_signals_stop_begin) records the signal; anything else is delivered to the signal
 * thread itself, so the default action ends the process exactly as if nothing had blocked it.
 *
 * Signal masks and dispositions are process-wide, so this state is too (like logging's rank
 * prefix): the masks are written once by jdt_signals_init before any thread exists; after that
 * only the stop changes it (the main thread's dispositions, and the request, a lock-free atomic
 * that a handler may store to).
 */
#include "core/core.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static bool g_blocked;               /* jdt_signals_init blocked the stop signals */
static sigset_t g_startup_mask;      /* the mask the process started with (children get it) */
static sigset_t g_wait_set;          /* the stop signals the signal thread takes */
static atomic_int g_stop_signal;     /* the signal that asked for a stop; 0: none */
static struct sigaction g_saved_int; /* the dispositions jdt_signals_stop_begin replaced */
static struct sigaction g_saved_term;

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the stop handler stores to a lock-free atomic");

static void on_stop_signal(int sig)
{
    atomic_store(&g_stop_signal, sig);
}

static void *signal_thread(void *arg)
{
    (void)arg;
    for (;;) {
        const int sig = sigwaitinfo(&g_wait_set, NULL);
        if (sig < 0) continue; /* EINTR */
        struct sigaction now;
        sigaction(sig, NULL, &now);
        if (now.sa_handler == on_stop_signal) {
            atomic_store(&g_stop_signal, sig);
            continue;
        }
        /* whatever else is in force, acted on here, on this thread: the default action (the
         * process ends, as without the block), an ignore (the kernel queues a signal that every
         * thread blocks even when it is ignored: it is dropped here), another handler */
        sigset_t one;
        sigemptyset(&one);
        sigaddset(&one, sig);
        pthread_sigmask(SIG_UNBLOCK, &one, NULL);
        raise(sig);
        pthread_sigmask(SIG_BLOCK, &one, NULL);
    }
    return NULL;
}

jdt_status jdt_signals_init(jdt_err *e)
{
    if (g_blocked) return JDT_OK;
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    int rc = pthread_sigmask(SIG_BLOCK, &stop, &g_startup_mask);
    if (rc != 0)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "blocking SIGINT/SIGTERM: %s", strerror(rc));
    g_blocked = true;
    /* a signal the parent blocked stays blocked for good, as it would have without us */
    sigemptyset(&g_wait_set);
    if (!sigismember(&g_startup_mask, SIGINT)) sigaddset(&g_wait_set, SIGINT);
    if (!sigismember(&g_startup_mask, SIGTERM)) sigaddset(&g_wait_set, SIGTERM);
    if (sigisemptyset(&g_wait_set)) return JDT_OK;
    pthread_t t;
    rc = pthread_create(&t, NULL, signal_thread, NULL); /* it inherits the block sigwait needs */
    if (rc != 0) {
        pthread_sigmask(SIG_SETMASK, &g_startup_mask, NULL);
        g_blocked = false;
        return jdt_err_set(e, JDT_ERR_INTERNAL, "starting the signal thread: %s", strerror(rc));
    }
    pthread_setname_np(t, "jdt-signals");
    pthread_detach(t);
    return JDT_OK;
}

void jdt_signals_reset_child(void)
{
    if (g_blocked) sigprocmask(SIG_SETMASK, &g_startup_mask, NULL);
}

/* A handler, not a flag the signal thread reads: it is what tells that thread a stop is on
 * (read with the disposition, so the two never disagree), it overrides an ignore the shell set
 * (a background job's SIGINT stopped the trainer before too), and without jdt_signals_init (the
 * unit tests) it takes the signals itself. */
void jdt_signals_stop_begin(void)
{
    atomic_store(&g_stop_signal, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_saved_int);
    sigaction(SIGTERM, &sa, &g_saved_term);
}

void jdt_signals_stop_end(void)
{
    sigaction(SIGINT, &g_saved_int, NULL);
    sigaction(SIGTERM, &g_saved_term, NULL);
}

int jdt_signals_stop_requested(void)
{
    return atomic_load(&g_stop_signal);
}

static atomic_bool g_job_lost; /* jdt_job_lost_set: the job ended under this process */
static atomic_flag g_job_lost_claim = ATOMIC_FLAG_INIT; /* the first setter writes g_job_lost_why */
static char g_job_lost_why[512];

void jdt_job_lost_set(const char *why)
{
    if (atomic_flag_test_and_set(&g_job_lost_claim)) return;
    snprintf(g_job_lost_why, sizeof g_job_lost_why, "%s", why ? why : "");
    atomic_store(&g_job_lost, true); /* publishes g_job_lost_why */
}

bool jdt_job_lost(void)
{
    return atomic_load(&g_job_lost);
}

const char *jdt_job_lost_why(void)
{
    return atomic_load(&g_job_lost) ? g_job_lost_why : "";
}
