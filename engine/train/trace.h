/*
 * trace.h — Chrome trace-event JSON writer (the format chrome://tracing and Perfetto open):
 * one complete ("X") event per span, microsecond timestamps relative to the trace start,
 * pid = rank, tid = a lane (0 host loop, 1 compiled kernels). Used by `train --profile`.
 */
#ifndef JDT_TRAIN_TRACE_H
#define JDT_TRAIN_TRACE_H

#include "core/core.h"

typedef struct jdt_trace jdt_trace;

/* Creates path (truncating) and writes the header. Returns ERR_IO naming the path. */
jdt_status jdt_trace_open(const char *path, int rank, jdt_trace **out, jdt_err *e);

/* Appends a span [t0_s, t1_s] (jdt_now_s() clock) named `name` in category `cat` on lane
 * `tid`. Names are JSON-escaped. A NULL trace is a no-op. */
void jdt_trace_span(jdt_trace *t, const char *name, const char *cat, int tid, double t0_s,
                    double t1_s);

/* Writes the footer and closes the file; returns ERR_IO if any write failed. NULL is a no-op
 * returning JDT_OK. */
jdt_status jdt_trace_close(jdt_trace *t, jdt_err *e);

#endif /* JDT_TRAIN_TRACE_H */
