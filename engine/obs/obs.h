/*
 * obs.h — seeing a run: TensorBoard event files written natively (TFRecord framing with masked
 * CRC-32C around hand-encoded Event/Summary protobufs), the MFU reference peak (measured once
 * per machine and thread count, cached beside the compile cache, overridable), peak memory,
 * the metrics.jsonl reader and the loss-curve plotter behind `jdt-train plot`.
 *
 * Depends on engine/core only (and cairo for the plotter, OpenBLAS for the peak measurement),
 * so the training loop and cmd/ can both use it.
 */
#ifndef JDT_OBS_H
#define JDT_OBS_H

#include "core/core.h"

#include <stdint.h>
#include <stdio.h>

/* ---- CRC-32C and TFRecord framing ------------------------------------------------------------ */

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF) of the
 * n bytes at data. jdt_crc32c("123456789", 9) == 0xE3069283. */
uint32_t jdt_crc32c(const void *data, size_t n);

/* The TFRecord "masked" CRC: ((crc >> 15) | (crc << 17)) + 0xA282EAD8 (mod 2^32). */
uint32_t jdt_crc32c_mask(uint32_t crc);

/* Bytes a TFRecord of an n-byte payload takes: 8 (length) + 4 + n + 4. */
#define JDT_TFRECORD_OVERHEAD 16

/* Writes one TFRecord into out (n + JDT_TFRECORD_OVERHEAD bytes, caller-owned): uint64 LE
 * length, uint32 LE masked CRC-32C of those 8 bytes, the payload, uint32 LE masked CRC-32C of
 * the payload. Returns the number of bytes written. */
size_t jdt_tfrecord_frame(const void *payload, size_t n, uint8_t *out);

/* ---- TensorBoard event files ---------------------------------------------------------------- */

typedef struct jdt_tboard jdt_tboard;

/* Creates dir/events.out.tfevents.<unix time>.<host>.<pid>.jdt (dir must exist) and writes the
 * leading file_version "brain.Event:2" event. `tensorboard --logdir <parent of dir>` lists dir as
 * one run. Errors: ERR_IO naming the file. *out is owned by the caller (jdt_tboard_close). */
jdt_status jdt_tboard_open(const char *dir, jdt_tboard **out, jdt_err *e);

/* Appends a scalar summary (Summary.Value.simple_value, float) under tag at step; wall time is
 * now. Buffered: visible after jdt_tboard_flush or close. Errors: ERR_IO. */
jdt_status jdt_tboard_scalar(jdt_tboard *tb, const char *tag, int64_t step, double value,
                             jdt_err *e);

/* Appends a text summary for TensorBoard's Text dashboard (a DT_STRING scalar tensor with
 * plugin "text"; the dashboard renders it as Markdown). Errors: ERR_IO, ERR_NOMEM. */
jdt_status jdt_tboard_text(jdt_tboard *tb, const char *tag, int64_t step, const char *markdown,
                           jdt_err *e);

/* Appends Event{session_log{status: START}} at step: a run resumed from the checkpoint of step
 * - 1 trains `step` and what follows again, and TensorBoard's reader (purge_orphaned_data, on
 * by default; PyTorch's SummaryWriter(purge_step=) writes the same event) drops the earlier
 * files' events at and after it, so the curves show each step once. Errors: ERR_IO. */
jdt_status jdt_tboard_restart(jdt_tboard *tb, int64_t step, jdt_err *e);

/* Flushes buffered events to the file. Errors: ERR_IO. */
jdt_status jdt_tboard_flush(jdt_tboard *tb, jdt_err *e);

/* The event file's path (owned by tb). */
const char *jdt_tboard_path(const jdt_tboard *tb);

/* Flushes and closes; NULL is a no-op. */
void jdt_tboard_close(jdt_tboard *tb);

/* Encodes one Event {wall_time, step, summary {value {tag, simple_value}}} protobuf into buf
 * (cap bytes). Returns the encoded size, or 0 if it does not fit. Exposed for tests. */
size_t jdt_tboard_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                                const char *tag, float value);

/* ---- the MFU reference peak ----------------------------------------------------------------- */

typedef struct {
    double flops;          /* reference FLOP/s of one process (0: unknown) */
    const char *source;    /* "runtime.peak_gflops", "cached", "measured", "measured (busy
                              machine: not cached)", "device datasheet" */
    bool provisional;      /* measured on a busy machine: MFU may be overstated */
    bool guessed;          /* a GPU not in the datasheet table: the H100 SXM figure assumed */
    double cores_held;     /* measured here: cores its threads held (CPU s / wall s) */
    double cores_wanted;   /* ... of these: its threads (0: not measured here) */
    char cache_path[1024]; /* the cache file ("" when not used) */
    char blas_core[32];    /* CPU: OpenBLAS's kernels ("SkylakeX", ...) the SGEMM ran on */
    char gemm[48];         /* CPU: what was measured instead of the SGEMM ("" = the SGEMM) */
} jdt_peak_ref;

/* What a CPU reference measures when it is not OpenBLAS's SGEMM: the GEMM the run's compute goes
 * through (oneDNN's bf16 matmul under precision.compute: bf16 where bf16 products outrun f32
 * FMAs). name: the cache file's suffix ("bf16"); what: the reference line's words ("oneDNN bf16
 * GEMMs"); measure: best-of-n_rep FLOP/s of 1024^3 products on nt threads, the first a warm-up
 * not counted, 0 on failure. */
typedef struct {
    const char *name, *what;
    double (*measure)(int n_rep, int nt, double *cores); /* *cores: as jdt_peak_measure_sgemm */
} jdt_peak_gemm;

/* A measured reference is cached only when its threads held at least this share of the cores
 * they asked for while it was measured: less means another process ran on them. */
#define JDT_PEAK_QUIET_SHARE 0.9

/* The MFU denominator for a CPU process with `threads` threads (0 = OpenMP's default):
 * override_gflops > 0 wins; else the value cached in cache_dir/peak/<host>-t<threads>-<OpenBLAS
 * core>[-<gemm name>].txt (kernels chosen otherwise, e.g. by OPENBLAS_CORETYPE, are measured
 * again); else the best of 7 (or more, for 0.2 s) 1024^3 products of `gemm` (NULL: OpenBLAS's
 * SGEMM) on `threads` threads, cached only when the machine was quiet (the threads held at
 * least JDT_PEAK_QUIET_SHARE of `threads` cores: cores_held, cores_wanted) so a busy
 * measurement is never kept. Leaves OpenBLAS's thread count at `threads`.
 * Errors: none fatal (a failed cache write is reported through JDT_WARN); returns JDT_OK with
 * flops > 0, or ERR_NOMEM (or, with gemm, ERR_INTERNAL when its measurement fails). */
jdt_status jdt_peak_reference(const char *cache_dir, int threads, double override_gflops,
                              const jdt_peak_gemm *gemm, jdt_peak_ref *out, jdt_err *e);

/* Best-of-n SGEMM throughput (FLOP/s) of 1024^3 products on OpenBLAS's current threads: n_rep
 * of them, or more until 0.2 s have passed, after a warm-up that is not counted. *cores (may be
 * NULL): the process's CPU seconds per wall second over the counted products, i.e. the cores
 * its threads held. 0 on allocation failure. */
double jdt_peak_measure_sgemm(int n_rep, double *cores);

/* The dense tensor-core peak FLOP/s of a GPU from its marketing name (cudaDeviceProp.name, e.g.
 * "NVIDIA H200", "NVIDIA A100-SXM4-80GB"): bf16 for bf16 math, else TF32 (what f32 matmuls run
 * on). Datasheet numbers without sparsity; the more specific variant wins (H100 PCIe, H100 NVL).
 * Returns 0 for an unknown name (the caller asks for runtime.peak_gflops). */
double jdt_peak_gpu_datasheet(const char *name, bool bf16);

/* The MFU denominator for one GPU process: override_gflops > 0 wins (source
 * "runtime.peak_gflops"); else the datasheet peak of device_name (jdt_device_describe's text)
 * for bf16 math when bf16, else TF32 (f32 GEMMs run on TF32 tensor cores), source "device
 * datasheet (dense bf16|TF32)"; an unknown name gets the H100 SXM figure with guessed = true
 * (the caller warns and asks for runtime.peak_gflops). Never fails. */
void jdt_peak_reference_gpu(const char *device_name, bool bf16, double override_gflops,
                            jdt_peak_ref *out);

/* ---- memory -----------------------------------------------------------------------------------
 */

/* Peak resident set size of this process image so far, in bytes (/proc/self/status VmHWM,
 * which starts afresh at exec; getrusage's ru_maxrss, which does not, where /proc is missing). */
int64_t jdt_obs_peak_rss_bytes(void);

/* ---- metrics.jsonl reader and plots ------------------------------------------------------------
 */

/* One run's series as read from RUN_DIR/metrics.jsonl (see docs/observability.md). Arrays are
 * parallel per series; x values are steps; tokens and seconds are derived per point. */
typedef struct {
    int64_t n;      /* points */
    double *step;   /* (n) */
    double *tokens; /* (n) tokens (or samples) seen at that step; NAN when unknown */
    double *time_s; /* (n) wall seconds since the run started (interpolated); NAN unknown */
    double *value;  /* (n) */
} jdt_series;

typedef enum {
    JDT_METRIC_LOSS = 0,
    JDT_METRIC_VAL_LOSS,
    JDT_METRIC_LR,
    JDT_METRIC_GRAD_NORM,
    JDT_METRIC_TOKENS_PER_S,
    JDT_METRIC_MFU,
    JDT_METRIC_STEP_MS,
    JDT_METRIC_PEAK_RSS_MB,
    JDT_METRIC_COUNT
} jdt_metric;

/* The metrics.jsonl key of m ("loss", "val_loss", "lr", ...). */
const char *jdt_metric_key(jdt_metric m);
/* Looks a metrics.jsonl key up; false when it is not one of the plottable metrics. */
bool jdt_metric_parse(const char *key, jdt_metric *out);

typedef struct {
    char name[256]; /* the run's label: its directory's last component */
    jdt_series s[JDT_METRIC_COUNT];
} jdt_run_metrics;

/* Reads dir/metrics.jsonl. Errors: ERR_NOT_FOUND (no metrics.jsonl: not a run directory),
 * ERR_FORMAT naming file:line for a line that is not one JSON object of numbers. Owned by the
 * caller: jdt_run_metrics_free. */
jdt_status jdt_run_metrics_read(const char *dir, jdt_run_metrics *out, jdt_err *e);
void jdt_run_metrics_free(jdt_run_metrics *r);

/* Drops the lines of the metrics file at path whose "step" is above `step` (a run resumed from
 * the checkpoint of `step` trains those steps again) and any line that is not one JSON object
 * of numbers (the torn last line of a killed run), rewriting the file through a temporary and
 * rename(2) only when something goes; *dropped (may be NULL): the lines dropped. A missing file
 * drops nothing. Errors: ERR_IO naming the file (the file is then unchanged). */
jdt_status jdt_metrics_truncate(const char *path, int64_t step, int64_t *dropped, jdt_err *e);

typedef enum { JDT_PLOT_X_STEP = 0, JDT_PLOT_X_TOKENS, JDT_PLOT_X_TIME } jdt_plot_x;

typedef struct {
    const char *out_path; /* .png or .svg (by extension) */
    jdt_plot_x x;
    bool log_y;    /* log scale on the loss panel */
    int n_metrics; /* 0: the default panels (loss + val loss, lr, tokens/s) */
    jdt_metric metrics[JDT_METRIC_COUNT]; /* one panel each (loss also draws val loss) */
    const char *title;                    /* NULL: "jdt-train: RUN[, RUN...]" */
} jdt_plot_opts;

/* Draws the runs' curves (several runs overlaid, one colour per run, a legend) into one
 * picture with one panel per metric, and writes it to o->out_path. Errors: ERR_INVALID (bad
 * extension, nothing to plot: every series empty), ERR_IO naming the file. */
jdt_status jdt_plot_render(const jdt_run_metrics *runs, int n_runs, const jdt_plot_opts *o,
                           jdt_err *e);

#endif /* JDT_OBS_H */
