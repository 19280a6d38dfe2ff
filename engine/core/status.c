/*
 * status.c — status strings and the error context (see core.h).
 */
#include "core/core.h"

#include <stdio.h>
#include <string.h>

static const char *const STATUS_STR[JDT_STATUS_COUNT] = {
#define X_(name, str) str,
    JDT_STATUS_LIST(X_)
#undef X_
};

static const char *const STATUS_NAME[JDT_STATUS_COUNT] = {
#define X_(name, str) #name,
    JDT_STATUS_LIST(X_)
#undef X_
};

_Static_assert(JDT_ARRAY_LEN(STATUS_STR) == JDT_STATUS_COUNT, "status table incomplete");

const char *jdt_status_str(jdt_status s)
{
    if ((int)s < 0 || s >= JDT_STATUS_COUNT) return "unknown status";
    return STATUS_STR[s];
}

const char *jdt_status_name(jdt_status s)
{
    if ((int)s < 0 || s >= JDT_STATUS_COUNT) return "UNKNOWN";
    return STATUS_NAME[s];
}

jdt_status jdt_err_vset(jdt_err *e, jdt_status code, const char *fmt, va_list ap)
{
    if (!e) return code;
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    return code;
}

jdt_status jdt_err_set(jdt_err *e, jdt_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    jdt_err_vset(e, code, fmt, ap);
    va_end(ap);
    return code;
}

jdt_status jdt_err_prefix(jdt_err *e, const char *fmt, ...)
{
    if (!e) return JDT_ERR_INTERNAL;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[sizeof e->msg];
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof e->msg - 3) n = sizeof e->msg - 3;
    memcpy(e->msg, prefix, n);
    e->msg[n] = ':';
    e->msg[n + 1] = ' ';
    size_t m = strlen(old);
    if (m > sizeof e->msg - n - 3) m = sizeof e->msg - n - 3;
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = '\0';
    return e->code;
}

void jdt_err_clear(jdt_err *e)
{
    if (!e) return;
    e->code = JDT_OK;
    e->msg[0] = '\0';
}
