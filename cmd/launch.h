/*
 * launch.h — the local launcher (`jdt-train --nproc N ...`) and the hidden `dist-check`
 * debug subcommand, called from main.c before the subcommand table.
 */
#ifndef JDT_CMD_LAUNCH_H
#define JDT_CMD_LAUNCH_H

#include <stdbool.h>

/* True when argv (before a "--") holds --nproc N / --nproc=N. */
bool jdt_launch_requested(int argc, char **argv);

/* Runs N copies of this binary with argv minus --nproc as ranks 0..N-1 of one job on this
 * host (see docs/launch.md) and returns the process exit code: 0 when every rank exited 0,
 * 2 for a usage error, else the first failing rank's exit code (1 when it was killed). */
int jdt_launch_main(int argc, char **argv);

/* `jdt-train dist-check CONFIG [overrides]`: resolves the world, joins the job, all-reduces
 * the ranks and prints one line per rank. args are argv after "dist-check". Exit code as
 * main's. */
int jdt_launch_dist_check(int argc, char **argv);

#endif /* JDT_CMD_LAUNCH_H */
