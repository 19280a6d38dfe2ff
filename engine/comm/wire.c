/*
 * wire.c — the rendezvous protocol's framing: a versioned, length-prefixed binary frame with a
 * bounded payload, a growable writer and a bounds-checked reader (a short or malformed
 * payload marks the reader bad instead of reading past the end).
 */
#include "comm/comm-impl.h"

#include <string.h>

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void jdt_wbuf_init(jdt_wbuf *b) { memset(b, 0, sizeof *b); }

void jdt_wbuf_free(jdt_wbuf *b)
{
    jdt_free(b->data);
    memset(b, 0, sizeof *b);
}

static void wb_append(jdt_wbuf *b, const void *p, size_t n)
{
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = jdt_realloc(b->data, cap);
        if (!d) {
            b->oom = true;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

void jdt_wbuf_begin(jdt_wbuf *b, jdt_msg_type type)
{
    b->len = 0;
    b->oom = false;
    uint8_t h[JDT_WIRE_HDR] = {0};
    put32(h, JDT_WIRE_MAGIC);
    h[4] = JDT_WIRE_VERSION & 0xff;
    h[5] = (JDT_WIRE_VERSION >> 8) & 0xff;
    h[6] = (uint8_t)(type & 0xff);
    h[7] = (uint8_t)((type >> 8) & 0xff);
    wb_append(b, h, sizeof h);
}

void jdt_wbuf_u32(jdt_wbuf *b, uint32_t v)
{
    uint8_t p[4];
    put32(p, v);
    wb_append(b, p, 4);
}

void jdt_wbuf_u64(jdt_wbuf *b, uint64_t v)
{
    jdt_wbuf_u32(b, (uint32_t)v);
    jdt_wbuf_u32(b, (uint32_t)(v >> 32));
}

void jdt_wbuf_bytes(jdt_wbuf *b, const void *p, size_t n)
{
    jdt_wbuf_u32(b, (uint32_t)n);
    wb_append(b, p, n);
}

void jdt_wbuf_str(jdt_wbuf *b, const char *s) { jdt_wbuf_bytes(b, s, s ? strlen(s) : 0); }

jdt_status jdt_wbuf_finish(jdt_wbuf *b, jdt_err *e)
{
    if (b->oom) return jdt_err_set(e, JDT_ERR_NOMEM, "building a rendezvous message");
    size_t payload = b->len - JDT_WIRE_HDR;
    if (payload > JDT_WIRE_MAX_PAYLOAD)
        return jdt_err_set(e, JDT_ERR_INVALID, "rendezvous message of %zu bytes exceeds %u",
                           payload, JDT_WIRE_MAX_PAYLOAD);
    put32(b->data + 8, (uint32_t)payload);
    return JDT_OK;
}

jdt_status jdt_wire_parse_hdr(const uint8_t hdr[JDT_WIRE_HDR], jdt_msg_type *type, uint32_t *len,
                              jdt_err *e)
{
    uint32_t magic = get32(hdr);
    if (magic != JDT_WIRE_MAGIC)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "bad magic 0x%08x (not a jdt-train peer)", magic);
    unsigned ver = (unsigned)hdr[4] | (unsigned)hdr[5] << 8;
    if (ver != JDT_WIRE_VERSION)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "protocol version %u, expected %u", ver,
                           JDT_WIRE_VERSION);
    unsigned t = (unsigned)hdr[6] | (unsigned)hdr[7] << 8;
    if (t == 0 || t >= JDT_MSG_COUNT)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "unknown message type %u", t);
    uint32_t l = get32(hdr + 8);
    if (l > JDT_WIRE_MAX_PAYLOAD)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "message of %u bytes exceeds the %u-byte bound", l,
                           JDT_WIRE_MAX_PAYLOAD);
    *type = (jdt_msg_type)t;
    *len = l;
    return JDT_OK;
}

uint32_t jdt_rbuf_u32(jdt_rbuf *r)
{
    if (r->bad || r->len - r->off < 4) {
        r->bad = true;
        return 0;
    }
    uint32_t v = get32(r->p + r->off);
    r->off += 4;
    return v;
}

uint64_t jdt_rbuf_u64(jdt_rbuf *r)
{
    uint64_t lo = jdt_rbuf_u32(r);
    uint64_t hi = jdt_rbuf_u32(r);
    return lo | hi << 32;
}

size_t jdt_rbuf_bytes(jdt_rbuf *r, const uint8_t **p, size_t max)
{
    uint32_t n = jdt_rbuf_u32(r);
    if (r->bad || n > max || r->len - r->off < n) {
        r->bad = true;
        *p = NULL;
        return 0;
    }
    *p = r->p + r->off;
    r->off += n;
    return n;
}

void jdt_rbuf_str(jdt_rbuf *r, char *out, size_t cap)
{
    const uint8_t *p;
    size_t n = jdt_rbuf_bytes(r, &p, cap - 1);
    out[0] = 0;
    if (r->bad) return;
    if (memchr(p, 0, n)) {
        r->bad = true;
        return;
    }
    memcpy(out, p, n);
    out[n] = 0;
}

jdt_status jdt_wire_send(int fd, jdt_wbuf *b, double deadline, atomic_int *abort_flag,
                         const char *what, jdt_err *e)
{
    jdt_status st = jdt_wbuf_finish(b, e);
    if (st) return st;
    return jdt_net_send_all(fd, b->data, b->len, deadline, abort_flag, what, e);
}

jdt_status jdt_wire_recv(int fd, jdt_msg_type *type, uint8_t **payload, uint32_t *len,
                         double deadline, atomic_int *abort_flag, const char *what, jdt_err *e)
{
    uint8_t hdr[JDT_WIRE_HDR];
    *payload = NULL;
    jdt_status st = jdt_net_recv_all(fd, hdr, sizeof hdr, deadline, abort_flag, what, e);
    if (st) return st;
    st = jdt_wire_parse_hdr(hdr, type, len, e);
    if (st) return jdt_err_prefix(e, "from %s", what);
    uint8_t *p = jdt_malloc(*len ? *len : 1);
    if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "receiving %u bytes from %s", *len, what);
    st = jdt_net_recv_all(fd, p, *len, deadline, abort_flag, what, e);
    if (st) {
        jdt_free(p);
        return st;
    }
    *payload = p;
    return JDT_OK;
}
