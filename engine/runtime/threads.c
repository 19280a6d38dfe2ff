/*
 * threads.c — the adaptive thread count of the CPU backend (see runtime.h, jdt_rt_tuner). The
 * backend (engine/backend/cpu/cpu.c) times every run of a program and feeds the times here;
 * the tuner compares the thread budget n against 1 thread now and then and keeps the faster.
 * Why: with one core kept busy by another process, n threads split every parallel loop and
 * GEMM evenly while one of them gets about half a core, so every region waits for it and n
 * threads ran at 0.82-0.94x of 1 thread (docs/perf.md, Busy machines). Only whole runs are
 * compared, so the decision sees everything that threads change: generated kernels, the
 * runtime kernels and OpenBLAS.
 */
#include "runtime/runtime.h"

#include <math.h>
#include <string.h>

enum { MAX_S = JDT_RT_TUNER_MAX_SAMPLES };

void jdt_rt_tuner_init(jdt_rt_tuner *t, int max_threads, int probe_every)
{
    memset(t, 0, sizeof *t);
    t->max_threads = max_threads > 1 ? max_threads : 1;
    t->chosen = t->max_threads;
    t->probe_every = probe_every > 0 ? probe_every : 50;
    t->interval = t->probe_every;
    t->until_probe = 0; /* the first comparison as soon as there are enough samples */
}

static int other(const jdt_rt_tuner *t)
{
    return t->chosen == 1 ? t->max_threads : 1;
}

int jdt_rt_tuner_threads(const jdt_rt_tuner *t)
{
    return t->probing && t->alt_next ? other(t) : t->chosen;
}

static double median(const double *x, int n)
{
    double s[MAX_S];
    if (n <= 0) return 0.0; /* no samples: no time */
    memcpy(s, x, (size_t)n * sizeof *s);
    for (int i = 1; i < n; i++) { /* insertion sort: n <= MAX_S */
        double v = s[i];
        int j = i;
        for (; j > 0 && s[j - 1] > v; j--)
            s[j] = s[j - 1];
        s[j] = v;
    }
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* the median of the newest k samples of the base ring (k <= samples held) */
static double base_median(const jdt_rt_tuner *t, int k)
{
    double x[MAX_S];
    for (int i = 0; i < k; i++)
        x[i] = t->base[(t->n_base - 1 - i) % MAX_S];
    return median(x, k);
}

/* samples per side: enough runs for JDT_RT_TUNER_PROBE_S seconds, within 2..MAX_S */
static int samples_for(double run_s)
{
    if (!(run_s > 0.0)) return MAX_S;
    double k = ceil(JDT_RT_TUNER_PROBE_S / run_s);
    return k < 2.0 ? 2 : k > (double)MAX_S ? MAX_S : (int)k;
}

static void end_probe(jdt_rt_tuner *t, bool changed)
{
    t->probing = false;
    if (changed)
        t->interval = t->probe_every;
    else if (t->interval < 16 * t->probe_every)
        t->interval *= 2;
    t->until_probe = t->interval;
}

bool jdt_rt_tuner_record(jdt_rt_tuner *t, double run_s)
{
    t->n_runs++;
    if (t->max_threads <= 1 || t->n_runs <= JDT_RT_TUNER_WARMUP || !(run_s >= 0.0) ||
        !isfinite(run_s))
        return false;
    if (!t->probing || !t->alt_next) { /* a run of the current choice */
        t->base[t->n_base % MAX_S] = run_s;
        t->n_base++;
        if (t->n_base >= 2 * MAX_S) t->n_base -= MAX_S; /* same ring slot, no overflow */
    }
    if (!t->probing) {
        if (t->until_probe > 0) t->until_probe--;
        int have = t->n_base < MAX_S ? t->n_base : MAX_S;
        if (t->until_probe == 0) {
            int k = samples_for(base_median(t, have));
            if (have >= (t->n_probes == 0 ? JDT_RT_TUNER_FIRST_RUNS : k)) {
                t->probing = true;
                t->alt_next = true;
                t->k = k;
                t->n_probe = t->n_pbase = 0;
                t->n_probes++;
            }
        }
        return false;
    }
    /* probing: runs alternate other, current, other ... so that a change of load during the
     * probe hits both sides alike */
    if (!t->alt_next) {
        t->pbase[t->n_pbase++] = run_s;
    } else {
        t->probe[t->n_probe++] = run_s;
        /* the runs before the probe: k of them, or the JDT_RT_TUNER_FIRST_RUNS before the first */
        double before = base_median(t, t->n_base < t->k ? t->n_base : t->k);
        if (t->n_probe == 1 && run_s > JDT_RT_TUNER_ABORT * before) { /* clearly slower */
            t->last_base_s = before;
            t->last_probe_s = run_s;
            end_probe(t, false);
            return false;
        }
    }
    t->alt_next = !t->alt_next;
    double mb = median(t->pbase, t->n_pbase), mp = median(t->probe, t->n_probe);
    bool full = t->n_probe >= t->k && t->n_pbase >= t->k;
    bool clear = t->n_probe >= JDT_RT_TUNER_EARLY_RUNS && t->n_pbase >= JDT_RT_TUNER_EARLY_RUNS &&
                 (mp > (1.0 + JDT_RT_TUNER_EARLY_LOSS) * mb ||
                  mp < (1.0 - JDT_RT_TUNER_EARLY_WIN) * mb); /* decided early, either way */
    if (!full && !clear) return false;
    t->last_base_s = mb;
    t->last_probe_s = mp;
    double hyst = other(t) == 1 ? JDT_RT_TUNER_HYST_DOWN : JDT_RT_TUNER_HYST_UP;
    bool win = mp < (1.0 - hyst) * mb;
    if (win) { /* the probe's runs become the new choice's samples */
        t->chosen = other(t);
        for (int i = 0; i < t->n_probe; i++)
            t->base[i] = t->probe[i];
        t->n_base = t->n_probe;
    }
    end_probe(t, win);
    return win;
}
