/*
 * cpus.c — which CPUs this process may use (see core.h jdt_cpus_allowed), seen through
 * OpenMP's binding of the main thread.
 *
 * With OMP_PROC_BIND or OMP_PLACES set (a common line in SLURM scripts: OMP_PROC_BIND=close
 * OMP_PLACES=cores), libgomp binds the initial thread to the first place when it loads, before
 * main. The thread's affinity mask then holds one place (one CPU or core), while the process's
 * threads may use every place, which libgomp built from the mask the process started with.
 * Read alone, the mask made jdt-train size its thread budget at 1 and re-execute itself
 * (cmd/main.c) on that one CPU: two threads on one core, each step at half speed (docs/perf.md,
 * Session 53).
 */
#include "core/core.h"

#include <omp.h>

int jdt_cpus_allowed(cpu_set_t *set)
{
    CPU_ZERO(set);
    if (sched_getaffinity(0, sizeof *set, set) != 0) return 0;
    const int n_places = omp_get_num_places(); /* 0 unless binding was asked for */
    int ids[CPU_SETSIZE];                      /* a place's CPUs (its ids are CPU numbers) */
    for (int p = 0; p < n_places; p++) {
        const int n = omp_get_place_num_procs(p);
        if (n < 1 || n > CPU_SETSIZE) continue;
        omp_get_place_proc_ids(p, ids);
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], set);
    }
    return CPU_COUNT(set);
}
