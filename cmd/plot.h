/*
 * plot.h — `jdt-train plot RUN_DIR... [-o FILE.png|.svg] [--metric NAME] [--x step|tokens|time]
 * [--log]`: loss curves of one or several runs (engine/obs draws them), called from main.c's
 * subcommand table.
 */
#ifndef JDT_CMD_PLOT_H
#define JDT_CMD_PLOT_H

/* The usage text printed by `jdt-train plot --help`. */
extern const char JDT_PLOT_USAGE[];

/* Runs `plot` with args = argv after "plot". Returns the exit code: 0 written (the path is
 * printed on stdout), 2 usage error (bad flag, no run, unknown metric), 1 run-time failure (a
 * missing or corrupt metrics.jsonl, nothing to plot, an unwritable output). */
int jdt_cmd_plot(int argc, char **argv);

#endif /* JDT_CMD_PLOT_H */
