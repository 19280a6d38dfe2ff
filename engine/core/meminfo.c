/*
 * meminfo.c — how much memory this process may still allocate, so a plan that cannot fit is
 * refused with a figure before anything big is allocated (see core.h jdt_mem_available):
 * /proc/meminfo's MemAvailable, lowered by the cgroup memory limit (v1 or v2) and by the
 * address-space limit (ulimit -v) where one is set.
 */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Reads one integer (or "max") from a file; false if absent or unlimited. */
static bool read_limit(const char *path, int64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char buf[64] = "";
    bool ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || strncmp(buf, "max", 3) == 0) return false;
    char *end = NULL;
    long long v = strtoll(buf, &end, 10);
    if (end == buf || v <= 0 || v >= (1LL << 60)) return false; /* v1 "unlimited" is ~2^63 */
    *out = v;
    return true;
}

/* The cgroup's remaining memory (limit - usage) and which file said so. */
static bool cgroup_room(int64_t *room, const char **source)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return false;
    char line[1024], v1[1024] = "", v2[1024] = "";
    bool have_v1 = false, have_v2 = false;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!b) continue;
        *b = '\0';
        const char *ctrls = a + 1, *path = b + 1;
        if (ctrls[0] == '\0' && strncmp(line, "0", 1) == 0) {
            snprintf(v2, sizeof v2, "%s", path);
            have_v2 = true;
        } else if (strstr(ctrls, "memory")) {
            snprintf(v1, sizeof v1, "%s", path);
            have_v1 = true;
        }
    }
    fclose(f);
    char p_lim[1200], p_use[1200];
    int64_t lim, use;
    /* the process's own cgroup directory, or the mount root when the mount is namespaced */
    for (int k = 0; k < 2; k++) {
        if (have_v1) {
            const char *dir = k == 0 ? v1 : "";
            snprintf(p_lim, sizeof p_lim, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", dir);
            snprintf(p_use, sizeof p_use, "/sys/fs/cgroup/memory%s/memory.usage_in_bytes", dir);
            if (read_limit(p_lim, &lim)) {
                *room = read_limit(p_use, &use) ? lim - use : lim;
                *source = "cgroup memory.limit_in_bytes";
                return true;
            }
        }
        if (have_v2) {
            const char *dir = k == 0 ? v2 : "";
            snprintf(p_lim, sizeof p_lim, "/sys/fs/cgroup%s/memory.max", dir);
            snprintf(p_use, sizeof p_use, "/sys/fs/cgroup%s/memory.current", dir);
            if (read_limit(p_lim, &lim)) {
                *room = read_limit(p_use, &use) ? lim - use : lim;
                *source = "cgroup memory.max";
                return true;
            }
        }
    }
    return false;
}

int64_t jdt_mem_available(const char **source)
{
    const char *src = "unknown";
    int64_t avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
                avail = (int64_t)kb * 1024;
                src = "MemAvailable";
                break;
            }
        fclose(f);
    }
    int64_t room;
    const char *csrc;
    if (cgroup_room(&room, &csrc) && (avail < 0 || room < avail)) {
        avail = room > 0 ? room : 0;
        src = csrc;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        /* address space already mapped: /proc/self/statm's first field, in pages */
        long long pages = 0;
        FILE *sf = fopen("/proc/self/statm", "r");
        if (sf) {
            if (fscanf(sf, "%lld", &pages) != 1) pages = 0;
            fclose(sf);
        }
        int64_t left = (int64_t)rl.rlim_cur - (int64_t)pages * sysconf(_SC_PAGESIZE);
        if (left < 0) left = 0;
        if (avail < 0 || left < avail) {
            avail = left;
            src = "address-space limit, ulimit -v";
        }
    }
    if (source) *source = src;
    return avail;
}
