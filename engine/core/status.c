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

/* Makes s (a NUL-terminated string in a buffer of cap bytes) one printable line: control
 * characters become escapes (\n, \r, \t, \xNN; C1 controls U+0080..U+009F as \u00NN), so
 * text echoed from a config, an override or a network peer cannot break the line or drive the
 * terminal; a detail left empty after a colon ("writing 'x': ") loses the dangling colon. */
static void one_line(char *s, size_t cap)
{
    char out[sizeof ((jdt_err *)0)->msg];
    size_t k = 0, lim = cap < sizeof out ? cap : sizeof out;
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 7 < lim; p++) {
        unsigned char c = *p;
        if (c == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
            k += (size_t)snprintf(out + k, lim - k, "\\u%04x", p[1]);
            p++;
        } else if (c == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else if (c == '\r') {
            out[k++] = '\\';
            out[k++] = 'r';
        } else if (c == '\t') {
            out[k++] = '\\';
            out[k++] = 't';
        } else if (c < 0x20 || c == 0x7f) {
            k += (size_t)snprintf(out + k, lim - k, "\\x%02x", c);
        } else {
            out[k++] = (char)c;
        }
    }
    while (k > 0 && (out[k - 1] == ' ' || out[k - 1] == ':'))
        k--;
    out[k] = '\0';
    memcpy(s, out, k + 1);
}

jdt_status jdt_err_vset(jdt_err *e, jdt_status code, const char *fmt, va_list ap)
{
    if (!e) return code;
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    one_line(e->msg, sizeof e->msg);
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
    one_line(e->msg, sizeof e->msg);
    return e->code;
}

void jdt_err_clear(jdt_err *e)
{
    if (!e) return;
    e->code = JDT_OK;
    e->msg[0] = '\0';
}
