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

/* Length of the well-formed UTF-8 sequence at p (2..4), or 0 if it is not one. */
static int utf8_len(const unsigned char *p)
{
    unsigned c = p[0];
    int n = (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0) return 0;
    uint32_t cp = n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i <= n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n + 1;
}

/* Makes s (a NUL-terminated string in a buffer of cap bytes) one printable line: control
 * characters become escapes (\n, \r, \t, \xNN; C1 controls U+0080..U+009F as \u00NN) and bytes
 * that are not UTF-8 become \xNN, so
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
        } else if (c >= 0x80) {
            int n = utf8_len(p);
            if (n == 0) { /* not UTF-8: shown as a byte, never sent raw to the terminal */
                k += (size_t)snprintf(out + k, lim - k, "\\x%02x", c);
            } else {
                for (int i = 0; i < n && k + 1 < lim; i++) out[k++] = (char)p[i];
                p += n - 1;
            }
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
