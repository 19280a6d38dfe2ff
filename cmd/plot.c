/*
 * plot.c — the `plot` subcommand: parses its own arguments (several run directories, -o,
 * --metric, --x, --log), reads each run's metrics.jsonl and renders them with jdt_plot_render.
 */
#include "cmd/plot.h"

#include "obs/obs.h"

#include <stdio.h>
#include <string.h>

const char JDT_PLOT_USAGE[] =
    "usage: jdt-train plot RUN_DIR... [-o FILE.png|FILE.svg] [--metric NAME]... [--x step|tokens|time]\n"
    "                     [--log] [--title TEXT]\n"
    "\n"
    "Draws the curves in each RUN_DIR/metrics.jsonl into one picture, runs overlaid in one\n"
    "colour each with a legend: by default a loss panel (train solid, val dashed), the learning\n"
    "rate and the throughput. Writes FILE (default RUN_DIR/loss.png for one run, plot.png for\n"
    "several) and prints its path.\n"
    "\n"
    "options:\n"
    "  -o FILE          output, .png or .svg\n"
    "  --metric NAME    one panel per --metric instead of the defaults: loss, val_loss, lr,\n"
    "                   grad_norm, tokens_per_s, mfu, step_ms, peak_rss_mb\n"
    "  --x AXIS         step (default), tokens (tokens seen) or time (wall seconds)\n"
    "  --log            log scale on the loss axis\n"
    "  --title TEXT     the picture's title (default: the run names)\n"
    "  -h, --help       show this help\n";

enum { EXIT_OK_ = 0, EXIT_RUNTIME_ = 1, EXIT_USAGE_ = 2, MAX_RUNS = 32 };

static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "jdt-train: plot: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see 'jdt-train plot --help')\n");
    return EXIT_USAGE_;
}

int jdt_cmd_plot(int argc, char **argv)
{
    const char *dirs[MAX_RUNS];
    int n_dirs = 0;
    jdt_plot_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            fputs(JDT_PLOT_USAGE, stdout);
            return EXIT_OK_;
        } else if (strcmp(s, "-o") == 0 || strcmp(s, "--metric") == 0 || strcmp(s, "--x") == 0 ||
                   strcmp(s, "--title") == 0) {
            if (i + 1 >= argc) return usage("%s needs a value", s);
            const char *v = argv[++i];
            if (strcmp(s, "-o") == 0) {
                o.out_path = v;
            } else if (strcmp(s, "--title") == 0) {
                o.title = v;
            } else if (strcmp(s, "--x") == 0) {
                if (strcmp(v, "step") == 0) o.x = JDT_PLOT_X_STEP;
                else if (strcmp(v, "tokens") == 0) o.x = JDT_PLOT_X_TOKENS;
                else if (strcmp(v, "time") == 0) o.x = JDT_PLOT_X_TIME;
                else return usage("--x: expected step, tokens or time, got '%s'", v);
            } else {
                jdt_metric m;
                if (!jdt_metric_parse(v, &m))
                    return usage("--metric: unknown metric '%s' (loss, val_loss, lr, grad_norm, "
                                 "tokens_per_s, mfu, step_ms, peak_rss_mb)", v);
                if (o.n_metrics < JDT_METRIC_COUNT) o.metrics[o.n_metrics++] = m;
            }
        } else if (strcmp(s, "--log") == 0) {
            o.log_y = true;
        } else if (s[0] == '-' && s[1]) {
            return usage("unknown option '%s'", s);
        } else {
            if (n_dirs == MAX_RUNS) return usage("too many runs (at most 32), at '%s'", s);
            dirs[n_dirs++] = s;
        }
    }
    if (n_dirs == 0) return usage("%s", "give at least one RUN_DIR (e.g. runs/llm)");
    char def_out[1100];
    if (!o.out_path) {
        if (n_dirs == 1) snprintf(def_out, sizeof def_out, "%s/loss.png", dirs[0]);
        else snprintf(def_out, sizeof def_out, "plot.png");
        o.out_path = def_out;
    }
    const char *ext = strrchr(o.out_path, '.');
    if (!ext || (strcmp(ext, ".png") != 0 && strcmp(ext, ".svg") != 0))
        return usage("-o: the output must end in .png or .svg, got '%s'", o.out_path);
    jdt_run_metrics runs[MAX_RUNS];
    memset(runs, 0, sizeof runs);
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = JDT_OK;
    for (int r = 0; r < n_dirs && st == JDT_OK; r++) st = jdt_run_metrics_read(dirs[r], &runs[r], &e);
    if (st == JDT_OK) st = jdt_plot_render(runs, n_dirs, &o, &e);
    for (int r = 0; r < n_dirs; r++) jdt_run_metrics_free(&runs[r]);
    if (st != JDT_OK) {
        fprintf(stderr, "jdt-train: plot: %s\n", e.msg);
        return EXIT_RUNTIME_;
    }
    printf("%s\n", o.out_path);
    return EXIT_OK_;
}
