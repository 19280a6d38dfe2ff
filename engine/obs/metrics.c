/*
 * metrics.c — reads a run's metrics.jsonl back into series for `jdt-train plot`, and drops
 * the lines of steps a resumed run trains again (jdt_metrics_truncate).
 *
 * The loop writes three kinds of line (docs/observability.md), each one flat JSON object of
 * numbers: per step {"step", "loss", "lr", "grad_norm", "tokens"}; per eval {"step",
 * "val_loss"}; per progress print {"step", "tokens_per_s", "mfu", "step_ms", "data_ms",
 * "peak_rss_mb", "elapsed_s"}. The x axes in tokens and seconds are derived: tokens from the
 * tokens-per-step ratio, seconds by interpolating the progress lines' elapsed_s between steps
 * (a resumed run restarts elapsed_s; its times are shifted to continue the curve).
 */
#include "obs/obs.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const METRIC_KEYS[JDT_METRIC_COUNT] = {
    [JDT_METRIC_LOSS] = "loss",
    [JDT_METRIC_VAL_LOSS] = "val_loss",
    [JDT_METRIC_LR] = "lr",
    [JDT_METRIC_GRAD_NORM] = "grad_norm",
    [JDT_METRIC_TOKENS_PER_S] = "tokens_per_s",
    [JDT_METRIC_MFU] = "mfu",
    [JDT_METRIC_STEP_MS] = "step_ms",
    [JDT_METRIC_PEAK_RSS_MB] = "peak_rss_mb",
};
_Static_assert(JDT_ARRAY_LEN(METRIC_KEYS) == JDT_METRIC_COUNT, "a key per metric");

const char *jdt_metric_key(jdt_metric m)
{
    return (unsigned)m < JDT_METRIC_COUNT ? METRIC_KEYS[m] : "?";
}

bool jdt_metric_parse(const char *key, jdt_metric *out)
{
    for (int m = 0; m < JDT_METRIC_COUNT; m++)
        if (strcmp(key, METRIC_KEYS[m]) == 0) {
            *out = (jdt_metric)m;
            return true;
        }
    return false;
}

enum { MAX_KEYS = 16 };

typedef struct {
    int n;
    char key[MAX_KEYS][32];
    double val[MAX_KEYS];
} jline;

/* Parses one flat JSON object of "key": number pairs. false on anything else. */
static bool parse_line(const char *s, jline *l)
{
    l->n = 0;
    while (isspace((unsigned char)*s)) s++;
    if (*s++ != '{') return false;
    for (;;) {
        while (isspace((unsigned char)*s)) s++;
        if (*s == '}') break;
        if (*s++ != '"') return false;
        const char *k = s;
        while (*s && *s != '"') s++;
        if (*s != '"' || s - k >= 32) return false;
        size_t kn = (size_t)(s - k);
        s++;
        while (isspace((unsigned char)*s)) s++;
        if (*s++ != ':') return false;
        char *end;
        double v;
        while (isspace((unsigned char)*s)) s++;
        if (strncmp(s, "NaN", 3) == 0 || strncmp(s, "nan", 3) == 0) { /* printf of a NaN loss */
            v = NAN;
            end = (char *)s + 3;
        } else {
            v = strtod(s, &end);
            if (end == s) return false;
        }
        s = end;
        if (l->n < MAX_KEYS) {
            memcpy(l->key[l->n], k, kn);
            l->key[l->n][kn] = '\0';
            l->val[l->n] = v;
            l->n++;
        }
        while (isspace((unsigned char)*s)) s++;
        if (*s == ',') s++;
        else if (*s != '}') return false;
    }
    return true;
}

static bool get(const jline *l, const char *key, double *v)
{
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->key[i], key) == 0) {
            *v = l->val[i];
            return true;
        }
    return false;
}

static jdt_status push(jdt_series *s, int64_t *cap, double step, double value, jdt_err *e)
{
    if (s->n == *cap) {
        int64_t nc = *cap ? *cap * 2 : 256;
        double **arrs[4] = {&s->step, &s->tokens, &s->time_s, &s->value};
        for (int i = 0; i < 4; i++) {
            double *p = jdt_realloc(*arrs[i], (size_t)nc * sizeof(double));
            if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "metrics: out of memory");
            *arrs[i] = p;
        }
        *cap = nc;
    }
    s->step[s->n] = step;
    s->tokens[s->n] = NAN;
    s->time_s[s->n] = NAN;
    s->value[s->n] = value;
    s->n++;
    return JDT_OK;
}

void jdt_run_metrics_free(jdt_run_metrics *r)
{
    if (!r) return;
    for (int m = 0; m < JDT_METRIC_COUNT; m++) {
        jdt_free(r->s[m].step);
        jdt_free(r->s[m].tokens);
        jdt_free(r->s[m].time_s);
        jdt_free(r->s[m].value);
    }
    memset(r, 0, sizeof *r);
}

/* Linear interpolation of time at step x through the points (ts, tt) (sorted by step). */
static double interp_time(const double *ts, const double *tt, int64_t n, double x)
{
    if (n == 0) return NAN;
    if (n == 1) return ts[0] > 0 ? tt[0] * x / ts[0] : NAN;
    int64_t i = 1;
    while (i < n - 1 && ts[i] < x) i++;
    double x0 = ts[i - 1], x1 = ts[i];
    if (x1 == x0) return tt[i];
    return tt[i - 1] + (tt[i] - tt[i - 1]) * (x - x0) / (x1 - x0);
}

jdt_status jdt_run_metrics_read(const char *dir, jdt_run_metrics *out, jdt_err *e)
{
    memset(out, 0, sizeof *out);
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    const char *base = dir;
    for (size_t i = 0; i < dl; i++)
        if (dir[i] == '/' && i + 1 < dl) base = dir + i + 1;
    snprintf(out->name, sizeof out->name, "%.*s", (int)(dl - (size_t)(base - dir)), base);
    char path[1100];
    snprintf(path, sizeof path, "%.*s/metrics.jsonl", (int)dl, dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO,
                           "%s: %s (is %s a run directory?)", path, strerror(errno), dir);
    int64_t caps[JDT_METRIC_COUNT] = {0};
    double tokens_per_step = NAN;
    double *ts = NULL, *tt = NULL; /* time points (step, elapsed) */
    int64_t n_t = 0, cap_t = 0;
    double t_offset = 0, last_raw = -1;
    jdt_status st = JDT_OK;
    char line[4096];
    long lineno = 0;
    while (st == JDT_OK && fgets(line, sizeof line, f)) {
        lineno++;
        jline l;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        double step;
        if (!parse_line(line, &l) || !get(&l, "step", &step)) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s:%ld: not a metrics line (one JSON object of "
                             "numbers with a \"step\")", path, lineno);
            break;
        }
        double v;
        if (isnan(tokens_per_step) && get(&l, "tokens", &v) && step > 0) tokens_per_step = v / step;
        if (get(&l, "elapsed_s", &v)) {
            if (v < last_raw) t_offset = n_t ? tt[n_t - 1] : 0; /* resumed: a new process's clock */
            last_raw = v;
            if (n_t == cap_t) {
                cap_t = cap_t ? cap_t * 2 : 64;
                double *a = jdt_realloc(ts, (size_t)cap_t * sizeof *ts);
                if (a) ts = a;
                double *b = jdt_realloc(tt, (size_t)cap_t * sizeof *tt);
                if (b) tt = b;
                if (!a || !b) {
                    st = jdt_err_set(e, JDT_ERR_NOMEM, "metrics: out of memory");
                    break;
                }
            }
            ts[n_t] = step;
            tt[n_t] = t_offset + v;
            n_t++;
        }
        for (int m = 0; m < JDT_METRIC_COUNT && st == JDT_OK; m++)
            if (get(&l, METRIC_KEYS[m], &v)) st = push(&out->s[m], &caps[m], step, v, e);
    }
    fclose(f);
    if (st == JDT_OK) {
        for (int m = 0; m < JDT_METRIC_COUNT; m++) {
            jdt_series *s = &out->s[m];
            for (int64_t i = 0; i < s->n; i++) {
                s->tokens[i] = s->step[i] * tokens_per_step;
                s->time_s[i] = interp_time(ts, tt, n_t, s->step[i]);
            }
        }
    } else {
        jdt_run_metrics_free(out);
    }
    jdt_free(ts);
    jdt_free(tt);
    return st;
}

jdt_status jdt_metrics_truncate(const char *path, int64_t step, int64_t *dropped, jdt_err *e)
{
    if (dropped) *dropped = 0;
    FILE *f = fopen(path, "r");
    if (!f) {
        if (errno == ENOENT) return JDT_OK;
        return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w"); /* a copy of the lines kept, used only when some go */
    if (!out) {
        jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        fclose(f);
        return st;
    }
    char line[4096];
    int64_t n_drop = 0;
    bool failed = false;
    while (!failed && fgets(line, sizeof line, f)) {
        const size_t len = strlen(line);
        bool whole = line[len - 1] == '\n';
        jline l;
        double s;
        const bool keep = whole && parse_line(line, &l) && get(&l, "step", &s) && s <= (double)step;
        while (!whole && fgets(line, sizeof line, f)) /* the rest of an overlong line */
            whole = line[strlen(line) - 1] == '\n';
        if (!keep) n_drop++;
        else failed = fputs(line, out) < 0;
    }
    failed = failed || ferror(f);
    fclose(f);
    failed = failed || fflush(out) != 0 || ferror(out) || fsync(fileno(out)) != 0;
    failed = (fclose(out) != 0) || failed;
    if (!failed && n_drop > 0) failed = rename(tmp, path) != 0;
    if (failed) {
        jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: rewriting without the steps after %lld: %s",
                                    path, (long long)step, strerror(errno));
        unlink(tmp);
        return st;
    }
    if (n_drop == 0) unlink(tmp);
    if (dropped) *dropped = n_drop;
    return JDT_OK;
}
