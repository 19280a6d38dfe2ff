/*
 * plot.c — loss curves as a picture (PNG or SVG) with cairo: one panel per metric stacked
 * vertically, every run in its own colour (val loss dashed in the run's colour), ticks at
 * 1-2-5 steps (decades and their 2x/5x on a log axis), axis labels, a legend and a title.
 * Used by `jdt-train plot` (cmd/main.c) and at the end of `make run`.
 */
#include "obs/obs.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <math.h>
#include <string.h>

enum { FIG_W = 1000, PANEL_H = 300, TITLE_H = 46, MARGIN_L = 90, MARGIN_R = 30, PANEL_GAP = 58 };

/* tab10: distinguishable, colour-blind-friendlier than pure primaries */
static const double PALETTE[][3] = {
    {0.122, 0.467, 0.706}, {1.000, 0.498, 0.055}, {0.173, 0.627, 0.173}, {0.839, 0.153, 0.157},
    {0.580, 0.404, 0.741}, {0.549, 0.337, 0.294}, {0.890, 0.467, 0.761}, {0.498, 0.498, 0.498},
    {0.737, 0.741, 0.133}, {0.090, 0.745, 0.812},
};

static const char *metric_title(jdt_metric m)
{
    switch (m) {
    case JDT_METRIC_LOSS: return "loss (solid: train, dashed: val)";
    case JDT_METRIC_VAL_LOSS: return "val loss";
    case JDT_METRIC_LR: return "learning rate";
    case JDT_METRIC_GRAD_NORM: return "gradient norm (before clipping)";
    case JDT_METRIC_TOKENS_PER_S: return "throughput (tokens/s or samples/s)";
    case JDT_METRIC_MFU: return "MFU (%)";
    case JDT_METRIC_STEP_MS: return "step time (ms)";
    case JDT_METRIC_PEAK_RSS_MB: return "peak resident memory (MB)";
    case JDT_METRIC_COUNT: break;
    }
    return "?";
}

static double xval(const jdt_series *s, int64_t i, jdt_plot_x x)
{
    return x == JDT_PLOT_X_TOKENS ? s->tokens[i] : x == JDT_PLOT_X_TIME ? s->time_s[i] : s->step[i];
}

/* A 1-2-5 tick step giving about `want` intervals over span. */
static double nice_step(double span, int want)
{
    double raw = span / want, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static void fmt_num(char *buf, size_t n, double v, double step)
{
    double a = fabs(v);
    if (v == 0) snprintf(buf, n, "0");
    else if (a >= 1e6 || a < 1e-3) snprintf(buf, n, "%.3g", v);
    else if (step >= 1) snprintf(buf, n, "%.0f", v);
    else {
        int dec = (int)ceil(-log10(step) - 1e-9);
        snprintf(buf, n, "%.*f", dec > 6 ? 6 : dec, v);
    }
}

typedef struct {
    double x0, x1, y0, y1; /* data range */
    double px, py, pw, ph; /* pixel box */
    bool log_y;
} axes;

static double to_px(const axes *a, double x) { return a->px + (x - a->x0) / (a->x1 - a->x0) * a->pw; }
static double to_py(const axes *a, double y)
{
    if (a->log_y) y = log10(y);
    double lo = a->log_y ? log10(a->y0) : a->y0, hi = a->log_y ? log10(a->y1) : a->y1;
    return a->py + a->ph - (y - lo) / (hi - lo) * a->ph;
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double ax, double ay)
{
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    cairo_move_to(cr, x - te.width * ax - te.x_bearing, y - te.height * ay - te.y_bearing);
    cairo_show_text(cr, s);
}

static void draw_axes(cairo_t *cr, const axes *a, const char *title, const char *xlabel)
{
    char buf[64];
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_rectangle(cr, a->px, a->py, a->pw, a->ph);
    cairo_fill(cr);
    cairo_set_font_size(cr, 12);
    cairo_set_line_width(cr, 1);
    /* x ticks and grid */
    double xs = nice_step(a->x1 - a->x0, 8);
    for (double v = ceil(a->x0 / xs) * xs; v <= a->x1 + 1e-9 * xs; v += xs) {
        double p = to_px(a, v);
        cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
        cairo_move_to(cr, p, a->py);
        cairo_line_to(cr, p, a->py + a->ph);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
        fmt_num(buf, sizeof buf, v, xs);
        text_at(cr, p, a->py + a->ph + 6, buf, 0.5, 0);
    }
    /* y ticks and grid */
    cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
    if (a->log_y) {
        /* a span under 4x (a loss curve's tail) every half multiple, so the last values can be
         * read; within one or two decades every integer multiple; up to four 1-2-5; decades */
        static const double half[] = {1,   1.5, 2,   2.5, 3,   3.5, 4,   4.5, 5,
                                      5.5, 6,   6.5, 7,   7.5, 8,   8.5, 9,   9.5},
                            all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, few[] = {1, 2, 5};
        int d0 = (int)floor(log10(a->y0)), d1 = (int)ceil(log10(a->y1));
        int n_dec = d1 - d0;
        bool narrow = a->y1 < 4 * a->y0;
        const double *mult = narrow ? half : n_dec <= 2 ? all : few;
        int n_mult = narrow ? 18 : n_dec <= 2 ? 9 : n_dec <= 4 ? 3 : 1;
        for (int d = d0; d <= d1; d++)
            for (int k = 0; k < n_mult; k++) {
                double v = mult[k] * pow(10, d);
                if (v < a->y0 * (1 - 1e-9) || v > a->y1 * (1 + 1e-9)) continue;
                double p = to_py(a, v);
                cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
                cairo_move_to(cr, a->px, p);
                cairo_line_to(cr, a->px + a->pw, p);
                cairo_stroke(cr);
                cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
                snprintf(buf, sizeof buf, "%g", v);
                text_at(cr, a->px - 6, p, buf, 1, 0.5);
            }
    } else {
        double ys = nice_step(a->y1 - a->y0, 6);
        for (double v = ceil(a->y0 / ys) * ys; v <= a->y1 + 1e-9 * ys; v += ys) {
            double p = to_py(a, v);
            cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
            cairo_move_to(cr, a->px, p);
            cairo_line_to(cr, a->px + a->pw, p);
            cairo_stroke(cr);
            cairo_set_source_rgb(cr, 0.15, 0.15, 0.15);
            fmt_num(buf, sizeof buf, fabs(v) < 1e-12 * ys ? 0 : v, ys);
            text_at(cr, a->px - 6, p, buf, 1, 0.5);
        }
    }
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, a->px, a->py, a->pw, a->ph);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 14);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    text_at(cr, a->px, a->py - 8, title, 0, 1);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, 12);
    text_at(cr, a->px + a->pw / 2, a->py + a->ph + 24, xlabel, 0.5, 0);
}

static bool usable(const jdt_series *s, int64_t i, jdt_plot_x x, bool log_y)
{
    double xv = xval(s, i, x), y = s->value[i];
    return isfinite(xv) && isfinite(y) && (!log_y || y > 0);
}

static void draw_series(cairo_t *cr, const axes *a, const jdt_series *s, jdt_plot_x x,
                        const double rgb[3], bool dashed)
{
    cairo_save(cr);
    cairo_rectangle(cr, a->px, a->py, a->pw, a->ph);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
    cairo_set_line_width(cr, dashed ? 2.2 : 1.6);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    if (dashed) {
        double d[] = {7, 4};
        cairo_set_dash(cr, d, 2, 0);
    }
    bool pen = false;
    int64_t n_ok = 0;
    for (int64_t i = 0; i < s->n; i++) {
        if (!usable(s, i, x, a->log_y)) {
            pen = false;
            continue;
        }
        double px = to_px(a, xval(s, i, x)), py = to_py(a, s->value[i]);
        if (pen) cairo_line_to(cr, px, py);
        else cairo_move_to(cr, px, py);
        pen = true;
        n_ok++;
    }
    cairo_stroke(cr);
    if (n_ok <= 40 || dashed) { /* sparse series (val loss, progress prints): mark the points */
        cairo_set_dash(cr, NULL, 0, 0);
        for (int64_t i = 0; i < s->n; i++) {
            if (!usable(s, i, x, a->log_y)) continue;
            cairo_arc(cr, to_px(a, xval(s, i, x)), to_py(a, s->value[i]), 2.8, 0, 2 * M_PI);
            cairo_fill(cr);
        }
    }
    cairo_restore(cr);
}

/* Data range of the series of one panel; false when nothing is plottable. */
static bool panel_range(const jdt_run_metrics *runs, int n_runs, const jdt_metric *ms, int n_ms,
                        jdt_plot_x x, bool log_y, axes *a)
{
    a->x0 = a->y0 = INFINITY;
    a->x1 = a->y1 = -INFINITY;
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < n_ms; k++) {
            const jdt_series *s = &runs[r].s[ms[k]];
            for (int64_t i = 0; i < s->n; i++) {
                if (!usable(s, i, x, log_y)) continue;
                double xv = xval(s, i, x), y = s->value[i];
                a->x0 = fmin(a->x0, xv);
                a->x1 = fmax(a->x1, xv);
                a->y0 = fmin(a->y0, y);
                a->y1 = fmax(a->y1, y);
            }
        }
    if (!isfinite(a->x0)) return false;
    if (x == JDT_PLOT_X_STEP || a->x0 > 0) a->x0 = fmin(a->x0, 0);
    if (a->x1 <= a->x0) a->x1 = a->x0 + 1;
    if (log_y) {
        a->y0 /= 1.1;
        a->y1 *= 1.1;
    } else {
        double pad = (a->y1 - a->y0) * 0.05;
        if (pad <= 0) pad = fabs(a->y1) * 0.05 + 1e-12;
        a->y0 -= pad;
        a->y1 += pad;
        if (a->y0 < 0 && a->y0 + pad >= 0) a->y0 = 0; /* non-negative metrics start at 0 */
    }
    return true;
}

static void draw_legend(cairo_t *cr, const axes *a, const jdt_run_metrics *runs, int n_runs,
                        bool with_val)
{
    cairo_set_font_size(cr, 12);
    double w = 0;
    char label[320];
    for (int r = 0; r < n_runs; r++) {
        cairo_text_extents_t te;
        cairo_text_extents(cr, runs[r].name, &te);
        w = fmax(w, te.x_advance);
    }
    double row = 18, bw = w + 48, bh = row * n_runs + 10;
    double bx = a->px + a->pw - bw - 10, by = a->py + 10;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.88);
    cairo_rectangle(cr, bx, by, bw, bh);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    for (int r = 0; r < n_runs; r++) {
        const double *c = PALETTE[r % JDT_ARRAY_LEN(PALETTE)];
        double y = by + 5 + row * r + row / 2;
        cairo_set_source_rgb(cr, c[0], c[1], c[2]);
        cairo_set_line_width(cr, 3);
        cairo_move_to(cr, bx + 8, y);
        cairo_line_to(cr, bx + 34, y);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        snprintf(label, sizeof label, "%s", runs[r].name);
        text_at(cr, bx + 40, y, label, 0, 0.5);
    }
    (void)with_val;
}

jdt_status jdt_plot_render(const jdt_run_metrics *runs, int n_runs, const jdt_plot_opts *o,
                           jdt_err *e)
{
    const char *ext = strrchr(o->out_path, '.');
    bool svg = ext && strcmp(ext, ".svg") == 0;
    if (!ext || (!svg && strcmp(ext, ".png") != 0))
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: the output must end in .png or .svg", o->out_path);
    jdt_metric panels[JDT_METRIC_COUNT];
    int n_panels = 0;
    if (o->n_metrics == 0) {
        panels[n_panels++] = JDT_METRIC_LOSS;
        panels[n_panels++] = JDT_METRIC_LR;
        panels[n_panels++] = JDT_METRIC_TOKENS_PER_S;
    } else {
        for (int i = 0; i < o->n_metrics; i++) panels[n_panels++] = o->metrics[i];
    }
    /* keep the panels that have data */
    axes ax[JDT_METRIC_COUNT];
    int n_keep = 0;
    for (int p = 0; p < n_panels; p++) {
        jdt_metric ms[2] = {panels[p], JDT_METRIC_VAL_LOSS};
        int n_ms = panels[p] == JDT_METRIC_LOSS ? 2 : 1;
        bool log_y = o->log_y && (panels[p] == JDT_METRIC_LOSS || panels[p] == JDT_METRIC_VAL_LOSS);
        if (!panel_range(runs, n_runs, ms, n_ms, o->x, log_y, &ax[n_keep])) continue;
        ax[n_keep].log_y = log_y;
        panels[n_keep++] = panels[p];
    }
    if (n_keep == 0)
        return jdt_err_set(e, JDT_ERR_INVALID, "nothing to plot: the runs have no %s%s",
                           o->n_metrics ? "values of the requested metric" : "loss values",
                           o->x == JDT_PLOT_X_TOKENS ? " with a tokens count"
                           : o->x == JDT_PLOT_X_TIME ? " with elapsed times" : "");
    int H = TITLE_H + n_keep * (PANEL_H + PANEL_GAP) + 10;
    cairo_surface_t *surf = svg ? cairo_svg_surface_create(o->out_path, FIG_W, H)
                                : cairo_image_surface_create(CAIRO_FORMAT_RGB24, FIG_W, H);
    if (cairo_surface_status(surf) != CAIRO_STATUS_SUCCESS) {
        jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", o->out_path,
                                    cairo_status_to_string(cairo_surface_status(surf)));
        cairo_surface_destroy(surf);
        return st;
    }
    cairo_t *cr = cairo_create(surf);
    cairo_set_source_rgb(cr, 0.97, 0.97, 0.97);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 18);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    char title[512];
    if (o->title) {
        snprintf(title, sizeof title, "%s", o->title);
    } else {
        int n = snprintf(title, sizeof title, "jdt-train: ");
        for (int r = 0; r < n_runs && n < (int)sizeof title - 1; r++)
            n += snprintf(title + n, sizeof title - (size_t)n, "%s%s", r ? " vs " : "", runs[r].name);
    }
    text_at(cr, FIG_W / 2.0, 14, title, 0.5, 0);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    const char *xlabel = o->x == JDT_PLOT_X_TOKENS ? "tokens (samples for mlp)"
                         : o->x == JDT_PLOT_X_TIME ? "wall time (s)" : "step";
    for (int p = 0; p < n_keep; p++) {
        axes *a = &ax[p];
        a->px = MARGIN_L;
        a->pw = FIG_W - MARGIN_L - MARGIN_R;
        a->py = TITLE_H + p * (PANEL_H + PANEL_GAP) + 22;
        a->ph = PANEL_H - 22;
        char ptitle[128];
        snprintf(ptitle, sizeof ptitle, "%s%s", metric_title(panels[p]), a->log_y ? ", log scale" : "");
        draw_axes(cr, a, ptitle, xlabel);
        for (int r = 0; r < n_runs; r++) {
            const double *c = PALETTE[r % JDT_ARRAY_LEN(PALETTE)];
            draw_series(cr, a, &runs[r].s[panels[p]], o->x, c, panels[p] == JDT_METRIC_VAL_LOSS);
            if (panels[p] == JDT_METRIC_LOSS)
                draw_series(cr, a, &runs[r].s[JDT_METRIC_VAL_LOSS], o->x, c, true);
        }
        draw_legend(cr, a, runs, n_runs, panels[p] == JDT_METRIC_LOSS);
    }
    cairo_destroy(cr);
    cairo_status_t cs = CAIRO_STATUS_SUCCESS;
    if (!svg) cs = cairo_surface_write_to_png(surf, o->out_path);
    cairo_surface_finish(surf);
    if (cs == CAIRO_STATUS_SUCCESS) cs = cairo_surface_status(surf);
    cairo_surface_destroy(surf);
    if (cs != CAIRO_STATUS_SUCCESS)
        return jdt_err_set(e, JDT_ERR_IO, "%s: %s", o->out_path, cairo_status_to_string(cs));
    return JDT_OK;
}
