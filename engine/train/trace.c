/*
 * trace.c — Chrome trace-event JSON writer (see trace.h). Events are streamed to the file as
 * they come, so a crashed run still leaves every span written before the crash (the viewer
 * tolerates a missing footer).
 */
#include "train/trace.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct jdt_trace {
    FILE *f;
    char path[1024];
    int rank;
    double t_origin;
    long n_events;
};

jdt_status jdt_trace_open(const char *path, int rank, jdt_trace **out, jdt_err *e)
{
    *out = NULL;
    jdt_trace *t = jdt_calloc(1, sizeof *t);
    if (!t) return jdt_err_set(e, JDT_ERR_NOMEM, "trace: out of memory");
    t->f = fopen(path, "w");
    if (!t->f) {
        jdt_free(t);
        return jdt_err_set(e, JDT_ERR_IO, "trace %s: %s", path, strerror(errno));
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->rank = rank;
    t->t_origin = jdt_now_s();
    fprintf(t->f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(t->f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": "
                  "\"rank %d\"}}", rank, rank);
    *out = t;
    return JDT_OK;
}

static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

void jdt_trace_span(jdt_trace *t, const char *name, const char *cat, int tid, double t0_s,
                    double t1_s)
{
    if (!t) return;
    fprintf(t->f, ",\n{\"name\": \"");
    put_escaped(t->f, name);
    fprintf(t->f, "\", \"cat\": \"");
    put_escaped(t->f, cat);
    fprintf(t->f, "\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d}",
            (t0_s - t->t_origin) * 1e6, (t1_s - t0_s) * 1e6, t->rank, tid);
    t->n_events++;
}

jdt_status jdt_trace_close(jdt_trace *t, jdt_err *e)
{
    if (!t) return JDT_OK;
    fprintf(t->f, "\n]}\n");
    bool bad = ferror(t->f) != 0;
    if (fclose(t->f) != 0) bad = true;
    jdt_status st = bad ? jdt_err_set(e, JDT_ERR_IO, "trace %s: write failed", t->path) : JDT_OK;
    jdt_free(t);
    return st;
}
