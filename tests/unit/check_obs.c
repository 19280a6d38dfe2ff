/*
 * check_obs.c — unit tests for engine/obs: CRC-32C against the RFC 3720 vectors, the TFRecord
 * mask and framing, the hand-encoded Event protobuf byte for byte, the metrics.jsonl reader
 * (tokens and time axes, resume) and a rendered plot (size, not blank, SVG too).
 * The read-back by TensorBoard's own reader is tests/e2e/obs_tensorboard.sh.
 */
#include "obs/obs.h"

#include <cairo.h>
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

START_TEST(test_crc32c_vectors)
{
    uint8_t b[32];
    ck_assert_uint_eq(jdt_crc32c("123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(jdt_crc32c("", 0), 0u);
    memset(b, 0, sizeof b);
    ck_assert_uint_eq(jdt_crc32c(b, 32), 0x8A9136AAu);
    memset(b, 0xFF, sizeof b);
    ck_assert_uint_eq(jdt_crc32c(b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)i;
    ck_assert_uint_eq(jdt_crc32c(b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++)
        b[i] = (uint8_t)(31 - i);
    ck_assert_uint_eq(jdt_crc32c(b, 32), 0x113FDB5Cu);
}
END_TEST

START_TEST(test_crc_mask)
{
    ck_assert_uint_eq(jdt_crc32c_mask(0), 0xA282EAD8u);
    ck_assert_uint_eq(jdt_crc32c_mask(0xE3069283u), 0xC78AB0E5u);
}
END_TEST

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

START_TEST(test_tfrecord_frame)
{
    uint8_t out[64];
    const char *payload = "123456789";
    size_t n = jdt_tfrecord_frame(payload, 9, out);
    ck_assert_uint_eq(n, 9 + JDT_TFRECORD_OVERHEAD);
    /* uint64 little-endian length */
    ck_assert_uint_eq(out[0], 9);
    for (int i = 1; i < 8; i++)
        ck_assert_uint_eq(out[i], 0);
    ck_assert_uint_eq(le32(out + 8), jdt_crc32c_mask(jdt_crc32c(out, 8)));
    ck_assert_mem_eq(out + 12, payload, 9);
    ck_assert_uint_eq(le32(out + 21), 0xC78AB0E5u); /* masked CRC of "123456789" */
    /* an empty record: the payload CRC is mask(0) */
    n = jdt_tfrecord_frame("", 0, out);
    ck_assert_uint_eq(n, 16);
    ck_assert_uint_eq(le32(out + 12), 0xA282EAD8u);
}
END_TEST

START_TEST(test_event_encoding)
{
    uint8_t buf[64];
    size_t n = jdt_tboard_encode_scalar(buf, sizeof buf, 1.5, 3, "a", 2.0f);
    static const uint8_t want[] = {
        0x09, 0,    0,   0, 0,    0, 0, 0xF8, 0x3F, /* wall_time 1.5 (fixed64) */
        0x10, 0x03,                                 /* step 3 */
        0x2A, 0x0A,                                 /* summary, 10 bytes */
        0x0A, 0x08,                                 /* value, 8 bytes */
        0x0A, 0x01, 'a',                            /* tag */
        0x15, 0,    0,   0, 0x40,                   /* simple_value 2.0f (fixed32) */
    };
    ck_assert_uint_eq(n, sizeof want);
    ck_assert_mem_eq(buf, want, sizeof want);
    /* a big step needs a multi-byte varint; a buffer too small is refused */
    n = jdt_tboard_encode_scalar(buf, sizeof buf, 0, 300, "a", 1.0f);
    ck_assert_uint_eq(buf[9], 0x10);
    ck_assert_uint_eq(buf[10], 0xAC);
    ck_assert_uint_eq(buf[11], 0x02);
    ck_assert_uint_eq(jdt_tboard_encode_scalar(buf, 10, 0, 1, "loss/train", 1.0f), 0);
}
END_TEST

START_TEST(test_tboard_file)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    jdt_err e;
    jdt_tboard *tb = NULL;
    ck_assert_int_eq(jdt_tboard_open(dir, &tb, &e), JDT_OK);
    ck_assert_int_eq(jdt_tboard_scalar(tb, "loss/train", 1, 2.5, &e), JDT_OK);
    ck_assert_int_eq(jdt_tboard_text(tb, "config", 0, "```\nmodel: {}\n```", &e), JDT_OK);
    char path[1200];
    snprintf(path, sizeof path, "%s", jdt_tboard_path(tb));
    ck_assert_ptr_nonnull(strstr(path, "events.out.tfevents."));
    jdt_tboard_close(tb);
    /* walk the records: every length and payload CRC must check */
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    int n_rec = 0;
    uint8_t head[12];
    while (fread(head, 1, 12, f) == 12) {
        ck_assert_uint_eq(le32(head + 8), jdt_crc32c_mask(jdt_crc32c(head, 8)));
        uint64_t len = le32(head) | (uint64_t)le32(head + 4) << 32;
        ck_assert_uint_lt(len, 4096);
        uint8_t data[4096], tail[4];
        ck_assert_uint_eq(fread(data, 1, len, f), len);
        ck_assert_uint_eq(fread(tail, 1, 4, f), 4);
        ck_assert_uint_eq(le32(tail), jdt_crc32c_mask(jdt_crc32c(data, len)));
        if (n_rec == 0) ck_assert_ptr_nonnull(memmem(data, len, "brain.Event:2", 13));
        n_rec++;
    }
    fclose(f);
    ck_assert_int_eq(n_rec, 3);
    unlink(path);
    rmdir(dir);
    /* a directory that does not exist: one clear error */
    ck_assert_int_eq(jdt_tboard_open("/nonexistent/dir", &tb, &e), JDT_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "/nonexistent/dir"));
}
END_TEST

static void write_metrics(const char *dir, bool resumed)
{
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int s = 1; s <= 40; s++) {
        fprintf(
            f, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": 1.0, \"tokens\": %d}\n",
            s, 5.0 * exp(-s / 15.0) + 1.0, 1e-3 * (s < 10 ? s / 10.0 : 1.0), s * 512);
        if (s % 10 == 0) {
            fprintf(f, "{\"step\": %d, \"val_loss\": %.6f}\n", s, 5.0 * exp(-s / 15.0) + 1.2);
            /* elapsed_s restarts at 0 after a resume at step 20 */
            double el = resumed && s > 20 ? (s - 20) * 0.5 : s * 0.5;
            fprintf(f,
                    "{\"step\": %d, \"tokens_per_s\": 1024, \"mfu\": 12.5, \"step_ms\": 500, "
                    "\"data_ms\": 1, \"peak_rss_mb\": 100, \"elapsed_s\": %.3f}\n",
                    s, el);
        }
    }
    fclose(f);
}

START_TEST(test_metrics_read)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_metrics(dir, true);
    jdt_run_metrics r;
    jdt_err e;
    ck_assert_int_eq(jdt_run_metrics_read(dir, &r, &e), JDT_OK);
    ck_assert_str_eq(r.name, strrchr(dir, '/') + 1);
    ck_assert_int_eq(r.s[JDT_METRIC_LOSS].n, 40);
    ck_assert_int_eq(r.s[JDT_METRIC_VAL_LOSS].n, 4);
    ck_assert_int_eq(r.s[JDT_METRIC_MFU].n, 4);
    ck_assert_double_eq_tol(r.s[JDT_METRIC_LOSS].tokens[9], 5120, 1e-9);
    /* interpolated and continued across the resume: step 40 is 20 s in, step 5 is 2.5 s */
    ck_assert_double_eq_tol(r.s[JDT_METRIC_LOSS].time_s[39], 20.0, 1e-9);
    ck_assert_double_eq_tol(r.s[JDT_METRIC_LOSS].time_s[4], 2.5, 1e-9);
    ck_assert_double_eq_tol(r.s[JDT_METRIC_LOSS].time_s[29], 15.0, 1e-9);
    jdt_run_metrics_free(&r);
    /* a corrupt line is named by file:line */
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "a");
    fputs("{\"step\": 41, \"loss\": oops}\n", f);
    fclose(f);
    ck_assert_int_eq(jdt_run_metrics_read(dir, &r, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "metrics.jsonl:49"));
    unlink(path);
    ck_assert_int_eq(jdt_run_metrics_read(dir, &r, &e), JDT_ERR_NOT_FOUND);
    rmdir(dir);
    jdt_metric m;
    ck_assert(jdt_metric_parse("val_loss", &m) && m == JDT_METRIC_VAL_LOSS);
    ck_assert(!jdt_metric_parse("accuracy", &m));
}
END_TEST

/* A resume drops the lines of the steps it trains again and a torn last line, rewriting the
 * file whole; nothing to drop leaves it as it was, no temporary behind; no file is fine. */
START_TEST(test_metrics_truncate)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[512], tmp[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    jdt_err e;
    int64_t dropped = -1;
    ck_assert_int_eq(jdt_metrics_truncate(path, 3, &dropped, &e), JDT_OK); /* no file */
    ck_assert_int_eq(dropped, 0);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 6; s++) {
        fprintf(f, "{\"step\": %d, \"loss\": %d.5}\n", s, 10 - s);
        if (s % 2 == 0) fprintf(f, "{\"step\": %d, \"val_loss\": 7}\n", s);
    }
    fputs("{\"step\": 7, \"lo", f); /* killed mid-line */
    fclose(f);
    ck_assert_int_eq(jdt_metrics_truncate(path, 6, &dropped, &e), JDT_OK);
    ck_assert_int_eq(dropped, 1); /* the torn line only */
    ck_assert_int_eq(jdt_metrics_truncate(path, 3, &dropped, &e), JDT_OK);
    ck_assert_int_eq(dropped, 5); /* steps 4, 5, 6 and two evals */
    ck_assert_int_eq(access(tmp, F_OK), -1);
    jdt_run_metrics r;
    ck_assert_int_eq(jdt_run_metrics_read(dir, &r, &e), JDT_OK);
    ck_assert_int_eq(r.s[JDT_METRIC_LOSS].n, 3);
    ck_assert_int_eq(r.s[JDT_METRIC_VAL_LOSS].n, 1);
    jdt_run_metrics_free(&r);
    struct stat a, b;
    ck_assert_int_eq(stat(path, &a), 0);
    ck_assert_int_eq(jdt_metrics_truncate(path, 3, &dropped, &e), JDT_OK);
    ck_assert_int_eq(dropped, 0);
    ck_assert_int_eq(stat(path, &b), 0);
    ck_assert(a.st_ino == b.st_ino); /* not rewritten */
    ck_assert_int_eq(access(tmp, F_OK), -1);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(test_plot_png_svg)
{
    char a[] = "/tmp/jdt-obs-XXXXXX", b[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(a));
    ck_assert_ptr_nonnull(mkdtemp(b));
    write_metrics(a, false);
    write_metrics(b, true);
    jdt_run_metrics runs[2];
    jdt_err e;
    ck_assert_int_eq(jdt_run_metrics_read(a, &runs[0], &e), JDT_OK);
    ck_assert_int_eq(jdt_run_metrics_read(b, &runs[1], &e), JDT_OK);
    char png[600], svg[600];
    snprintf(png, sizeof png, "%s/cmp.png", a);
    snprintf(svg, sizeof svg, "%s/cmp.svg", a);
    jdt_plot_opts o = {.out_path = png, .x = JDT_PLOT_X_STEP, .log_y = true};
    ck_assert_int_eq(jdt_plot_render(runs, 2, &o, &e), JDT_OK);
    struct stat sb;
    ck_assert_int_eq(stat(png, &sb), 0);
    ck_assert_int_gt(sb.st_size, 20000); /* three panels with text: tens of KB */
    cairo_surface_t *img = cairo_image_surface_create_from_png(png);
    ck_assert_int_eq(cairo_surface_status(img), CAIRO_STATUS_SUCCESS);
    int w = cairo_image_surface_get_width(img), h = cairo_image_surface_get_height(img);
    ck_assert_int_eq(w, 1000);
    ck_assert_int_gt(h, 900);
    /* not blank: many pixels of the first run's blue and the second run's orange */
    const uint8_t *px = cairo_image_surface_get_data(img);
    int stride = cairo_image_surface_get_stride(img);
    long blue = 0, orange = 0;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            uint32_t p = *(const uint32_t *)(px + (size_t)y * (size_t)stride + (size_t)x * 4);
            int r = (p >> 16) & 0xFF, g = (p >> 8) & 0xFF, bl = p & 0xFF;
            if (bl > 150 && r < 80 && g > 90 && g < 150) blue++;
            if (r > 220 && g > 100 && g < 160 && bl < 60) orange++;
        }
    cairo_surface_destroy(img);
    ck_assert_int_gt(blue, 100);
    ck_assert_int_gt(orange, 100);
    o.out_path = svg;
    o.x = JDT_PLOT_X_TOKENS;
    ck_assert_int_eq(jdt_plot_render(runs, 2, &o, &e), JDT_OK);
    ck_assert_int_eq(stat(svg, &sb), 0);
    ck_assert_int_gt(sb.st_size, 5000);
    o.out_path = "x.jpg";
    ck_assert_int_eq(jdt_plot_render(runs, 2, &o, &e), JDT_ERR_INVALID);
    jdt_run_metrics_free(&runs[0]);
    jdt_run_metrics_free(&runs[1]);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", a, b);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_peak_override_and_rss)
{
    jdt_peak_ref p;
    jdt_err e;
    ck_assert_int_eq(jdt_peak_reference("/tmp", 1, 123.0, NULL, &p, &e), JDT_OK);
    ck_assert_double_eq_tol(p.flops, 123e9, 1);
    ck_assert_str_eq(p.source, "runtime.peak_gflops");
    ck_assert_int_gt(jdt_obs_peak_rss_bytes(), 1 << 20);
}
END_TEST

START_TEST(test_peak_gpu_datasheet)
{
    /* dense bf16 and TF32 peaks by name; specific variants are not shadowed by shorter keys */
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA H200", true), 989.4e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA H200", false), 494.7e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA H100 PCIe", true), 756.5e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA H100 80GB HBM3", true), 989.4e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA A100-SXM4-80GB", false), 156e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA A10", true), 125e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA L40S", true), 362.05e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA L40", true), 181.05e12, 1e9);
    ck_assert_double_eq_tol(jdt_peak_gpu_datasheet("NVIDIA L4", true), 121e12, 1e9);
    ck_assert(jdt_peak_gpu_datasheet("Tesla K80", true) == 0);
    ck_assert(jdt_peak_gpu_datasheet(NULL, true) == 0);
    /* the reference of a GPU process: f32 math is measured against TF32, the override wins,
     * an unknown part is flagged */
    jdt_peak_ref p;
    jdt_peak_reference_gpu("cuda:0 NVIDIA H200 (sm_90)", false, 0, &p);
    ck_assert_double_eq_tol(p.flops, 494.7e12, 1e9);
    ck_assert_str_eq(p.source, "device datasheet (dense TF32)");
    ck_assert(!p.guessed && !p.provisional);
    jdt_peak_reference_gpu("cuda:0 NVIDIA H200 (sm_90)", true, 0, &p);
    ck_assert_double_eq_tol(p.flops, 989.4e12, 1e9);
    jdt_peak_reference_gpu("cuda:0 NVIDIA H200 (sm_90)", false, 100000, &p);
    ck_assert_double_eq_tol(p.flops, 100e12, 1e6);
    ck_assert_str_eq(p.source, "runtime.peak_gflops");
    jdt_peak_reference_gpu("cuda:0 Tesla K80 (sm_37)", false, 0, &p);
    ck_assert(p.guessed && p.flops > 0);
}
END_TEST

START_TEST(test_peak_cache)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    jdt_peak_ref p;
    jdt_err e;
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, NULL, &p, &e), JDT_OK);
    ck_assert(p.flops > 0);
    if (!p.provisional) { /* quiet machine: the value was cached and is read back as is */
        double first = p.flops;
        ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, NULL, &p, &e), JDT_OK);
        ck_assert_str_eq(p.source, "cached");
        ck_assert_double_eq_tol(p.flops, first, first * 1e-4);
    } else { /* busy machine: nothing may be cached */
        struct stat sb;
        ck_assert_int_ne(stat(p.cache_path, &sb), 0);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A GEMM other than the SGEMM (bf16 compute through oneDNN) is measured by the caller's function
 * and cached under its own name, beside the SGEMM's; a failed measurement is an error. The fake
 * says its best run held g_fake_share of its threads' cores. */
static double g_fake_share = 1.0;

static double fake_gemm_rate(int n_rep, int nt, double *cores)
{
    *cores = g_fake_share * nt;
    return n_rep == 7 && nt == 1 ? 42e9 : -1;
}

static double failing_gemm_rate(int n_rep, int nt, double *cores)
{
    (void)n_rep, (void)nt;
    *cores = 0;
    return 0;
}

START_TEST(test_peak_other_gemm)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const jdt_peak_gemm fake = {"fake", "fake GEMMs", fake_gemm_rate};
    jdt_peak_ref p, q;
    jdt_err e;
    g_fake_share = 1.0;
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, &fake, &p, &e), JDT_OK);
    ck_assert_double_eq_tol(p.flops, 42e9, 1);
    ck_assert_str_eq(p.gemm, "fake GEMMs");
    ck_assert(!p.provisional);
    ck_assert_str_eq(p.source, "measured");
    ck_assert_double_eq_tol(p.cores_held, 1.0, 1e-12);
    ck_assert_double_eq_tol(p.cores_wanted, 1.0, 1e-12);
    const size_t n = strlen(p.cache_path);
    ck_assert(n > 9 && !strcmp(p.cache_path + n - 9, "-fake.txt"));
    /* read back from its own file, whatever the measurement would say now */
    g_fake_share = 0.1;
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, &fake, &p, &e), JDT_OK);
    ck_assert_str_eq(p.source, "cached");
    ck_assert_double_eq_tol(p.flops, 42e9, 1);
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, NULL, &q, &e), JDT_OK);
    ck_assert_str_ne(q.cache_path, p.cache_path);
    ck_assert_str_eq(q.gemm, "");
    const jdt_peak_gemm bad = {"bad", "bad GEMMs", failing_gemm_rate};
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, &bad, &p, &e), JDT_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "bad GEMMs"));
    /* an override wins over any GEMM */
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 7.0, &fake, &p, &e), JDT_OK);
    ck_assert_double_eq_tol(p.flops, 7e9, 1);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A measurement whose best run's threads did not hold their cores (another process ran on them)
 * is used for the run, marked provisional and never cached; at the threshold it is kept. */
START_TEST(test_peak_busy_not_cached)
{
    char dir[] = "/tmp/jdt-obs-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const jdt_peak_gemm fake = {"fake", "fake GEMMs", fake_gemm_rate};
    jdt_peak_ref p;
    jdt_err e;
    struct stat sb;
    g_fake_share = JDT_PEAK_QUIET_SHARE - 0.01;
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, &fake, &p, &e), JDT_OK);
    ck_assert_double_eq_tol(p.flops, 42e9, 1);
    ck_assert(p.provisional);
    ck_assert_str_eq(p.source, "measured (busy machine: not cached)");
    ck_assert_double_eq_tol(p.cores_held, JDT_PEAK_QUIET_SHARE - 0.01, 1e-12);
    ck_assert_double_eq_tol(p.cores_wanted, 1.0, 1e-12);
    ck_assert_int_ne(stat(p.cache_path, &sb), 0);
    /* measured again next time, and kept once quiet */
    g_fake_share = JDT_PEAK_QUIET_SHARE;
    ck_assert_int_eq(jdt_peak_reference(dir, 1, 0, &fake, &p, &e), JDT_OK);
    ck_assert(!p.provisional);
    ck_assert_str_eq(p.source, "measured");
    ck_assert_int_eq(stat(p.cache_path, &sb), 0);
    g_fake_share = 1.0;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("obs");
    TCase *tc = tcase_create("obs");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_crc32c_vectors);
    tcase_add_test(tc, test_crc_mask);
    tcase_add_test(tc, test_tfrecord_frame);
    tcase_add_test(tc, test_event_encoding);
    tcase_add_test(tc, test_tboard_file);
    tcase_add_test(tc, test_metrics_read);
    tcase_add_test(tc, test_metrics_truncate);
    tcase_add_test(tc, test_plot_png_svg);
    tcase_add_test(tc, test_peak_override_and_rss);
    tcase_add_test(tc, test_peak_cache);
    tcase_add_test(tc, test_peak_other_gemm);
    tcase_add_test(tc, test_peak_busy_not_cached);
    tcase_add_test(tc, test_peak_gpu_datasheet);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
