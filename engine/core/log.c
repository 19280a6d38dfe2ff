/*
 * log.c — leveled logging to stderr with a "[rank r/w]" prefix once the job has several ranks.
 */
#include "core/core.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Process-wide by design (see core.h): written at start-up, read by every layer. */
static jdt_log_level g_level = JDT_LOG_INFO;
static int g_rank = 0;
static int g_world_size = 1;

void jdt_log_set_level(jdt_log_level level) { g_level = level; }
jdt_log_level jdt_log_get_level(void) { return g_level; }

void jdt_log_set_rank(int rank, int world_size)
{
    g_rank = rank;
    g_world_size = world_size;
}

bool jdt_log_parse_level(const char *name, jdt_log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "quiet"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(names); i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (jdt_log_level)i;
            return true;
        }
    }
    return false;
}

void jdt_log(jdt_log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"debug", "info", "warn", "error", ""};
    if (level < g_level || level >= JDT_LOG_QUIET) return;
    char line[4096];
    int n = 0;
    if (g_world_size > 1)
        n = snprintf(line, sizeof line, "[rank %d/%d] ", g_rank, g_world_size);
    if (level != JDT_LOG_INFO) n += snprintf(line + n, sizeof line - (size_t)n, "%s: ", tags[level]);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len > sizeof line - 2) len = sizeof line - 2;
    if (len == 0 || line[len - 1] != '\n') line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
