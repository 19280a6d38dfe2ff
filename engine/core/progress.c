/*
 * progress.c — progress of long operations (prepare, checkpoint loads, compilation): a live
 * line rewritten in place when stderr is a terminal, plain log lines every 10 s otherwise (SLURM
 * logs stay readable). Silent for operations that end within 2 s. JDT_PROGRESS_INTERVAL=S
 * (seconds, >= 0) sets the plain lines' period, and silences only the first min(S, 2) s: tests
 * and impatient users see lines for short operations (S=0: one line per update).
 */
#include "core/core.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one piece of process state here: a bad JDT_PROGRESS_INTERVAL is reported once per
 * process, not once per operation. */
static atomic_bool bad_env_warned;

void jdt_progress_begin(jdt_progress *p, const char *what, double total, const char *unit)
{
    memset(p, 0, sizeof *p);
    snprintf(p->what, sizeof p->what, "%s", what);
    p->total = total;
    p->unit = unit;
    p->t0 = p->last = jdt_now_s();
    p->tty = isatty(STDERR_FILENO) == 1;
    p->interval_s = 10.0;
    p->quiet_s = 2.0;
    const char *env = getenv("JDT_PROGRESS_INTERVAL");
    if (env && *env) {
        char *end = NULL;
        double s = strtod(env, &end);
        if (end && end != env && *end == 0 && s >= 0 && s <= 86400) {
            p->interval_s = s;
            p->quiet_s = s < 2.0 ? s : 2.0;
        } else if (!atomic_exchange(&bad_env_warned, true)) {
            JDT_WARN("JDT_PROGRESS_INTERVAL='%s' is not a number of seconds in [0, 86400]; "
                     "progress lines keep their 10 s period",
                     env);
        }
    }
}

static void line(jdt_progress *p, double done, double now, char *buf, size_t n)
{
    double dt = now - p->t0, rate = dt > 0 ? done / dt : 0;
    if (p->total > 0 && rate > 0)
        snprintf(buf, n, "%s: %.1f/%.1f %s (%.0f%%), %.1f %s/s, %.0fs elapsed, ETA %.0fs", p->what,
                 done, p->total, p->unit, 100.0 * done / p->total, rate, p->unit, dt,
                 (p->total - done) / rate);
    else if (p->estimate_s > 0 && dt < p->estimate_s)
        snprintf(buf, n, "%s: %.0fs elapsed, about %.0fs left (from the last run's rate)", p->what,
                 dt, p->estimate_s - dt);
    else if (p->estimate_s > 0)
        snprintf(buf, n, "%s: %.0fs elapsed, longer than the %.0fs the last run's rate predicted",
                 p->what, dt, p->estimate_s);
    else if (done > 0 && rate > 0) /* total unknown: what is done so far and its rate */
        snprintf(buf, n, "%s: %.1f %s, %.1f %s/s, %.0fs elapsed", p->what, done, p->unit, rate,
                 p->unit, dt);
    else
        snprintf(buf, n, "%s: %.0fs elapsed", p->what, dt);
}

void jdt_progress_set_estimate(jdt_progress *p, double estimate_s)
{
    p->estimate_s = estimate_s > 0 ? estimate_s : 0;
}

void jdt_progress_update(jdt_progress *p, double done)
{
    double now = jdt_now_s();
    if (jdt_log_get_level() > JDT_LOG_INFO || now - p->t0 < p->quiet_s) return;
    if (now - p->last < (p->tty ? 0.2 : p->interval_s)) return;
    p->last = now;
    char buf[512];
    line(p, done, now, buf, sizeof buf);
    if (p->tty) {
        fprintf(stderr, "\r%s\033[K", buf);
        p->live = true;
    } else {
        JDT_INFO("%s", buf);
    }
}

void jdt_progress_end(jdt_progress *p)
{
    if (p->live) fprintf(stderr, "\r\033[K");
    p->live = false;
}
