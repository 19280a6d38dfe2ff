/*
 * tboard.c — TensorBoard event files without TensorFlow: CRC-32C, TFRecord framing and a tiny
 * protobuf writer for the few Event/Summary fields a scalar or text summary needs.
 *
 * An event file is a sequence of TFRecords, each carrying one serialized tensorflow.Event:
 *   Event        1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary,
 *                7 session_log (SessionLog: 1 status, START = 1)
 *   Summary      1 value (repeated Value)
 *   Value        1 tag (string), 2 simple_value (float), 8 tensor (TensorProto),
 *                9 metadata (SummaryMetadata)
 *   SummaryMetadata 1 plugin_data {1 plugin_name (string)}
 *   TensorProto  1 dtype (enum, DT_STRING = 7), 2 tensor_shape (empty: a scalar),
 *                8 string_val (repeated bytes)
 * Field keys are (number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
 */
#include "obs/obs.h"

#include <errno.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- CRC-32C (table-driven, reflected) ---------------------------------------------------------- */

static uint32_t crc_table_entry(uint32_t i)
{
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    return c;
}

uint32_t jdt_crc32c(const void *data, size_t n)
{
    static uint32_t table[256];
    static volatile int ready = 0; /* idempotent fill: a racing second fill writes equal values */
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) table[i] = crc_table_entry(i);
        ready = 1;
    }
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t jdt_crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t jdt_tfrecord_frame(const void *payload, size_t n, uint8_t *out)
{
    put_le64(out, (uint64_t)n);
    put_le32(out + 8, jdt_crc32c_mask(jdt_crc32c(out, 8)));
    memcpy(out + 12, payload, n);
    put_le32(out + 12 + n, jdt_crc32c_mask(jdt_crc32c(payload, n)));
    return n + JDT_TFRECORD_OVERHEAD;
}

/* ---- a minimal protobuf writer into a caller buffer ------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t cap, len;
    bool overflow;
} pb;

static void pb_bytes(pb *w, const void *p, size_t n)
{
    if (w->overflow || w->len + n > w->cap) {
        w->overflow = true;
        return;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void pb_varint(pb *w, uint64_t v)
{
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (v) tmp[n] |= 0x80;
        n++;
    } while (v);
    pb_bytes(w, tmp, n);
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

static void pb_key(pb *w, unsigned field, unsigned wire) { pb_varint(w, (uint64_t)field << 3 | wire); }

static void pb_double(pb *w, unsigned field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t b[8];
    put_le64(b, bits);
    pb_key(w, field, WT_FIXED64);
    pb_bytes(w, b, 8);
}

static void pb_float(pb *w, unsigned field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint8_t b[4];
    put_le32(b, bits);
    pb_key(w, field, WT_FIXED32);
    pb_bytes(w, b, 4);
}

static void pb_len_bytes(pb *w, unsigned field, const void *p, size_t n)
{
    pb_key(w, field, WT_LEN);
    pb_varint(w, n);
    pb_bytes(w, p, n);
}

/* Starts a nested message whose encoded size is known: key + length prefix. */
static void pb_begin(pb *w, unsigned field, size_t n)
{
    pb_key(w, field, WT_LEN);
    pb_varint(w, n);
}

static size_t len_field(unsigned field, size_t n) { return varint_len((uint64_t)field << 3) + varint_len(n) + n; }

static void event_header(pb *w, double wall_time, int64_t step)
{
    pb_double(w, 1, wall_time);
    if (step != 0) {
        pb_key(w, 2, WT_VARINT);
        pb_varint(w, (uint64_t)step);
    }
}

size_t jdt_tboard_encode_scalar(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                                const char *tag, float value)
{
    pb w = {buf, cap, 0, false};
    size_t tag_n = strlen(tag);
    size_t value_n = len_field(1, tag_n) + 1 + 4;  /* tag, simple_value */
    size_t summary_n = len_field(1, value_n);
    event_header(&w, wall_time, step);
    pb_begin(&w, 5, summary_n);
    pb_begin(&w, 1, value_n);
    pb_len_bytes(&w, 1, tag, tag_n);
    pb_float(&w, 2, value);
    return w.overflow ? 0 : w.len;
}

/* Event{wall_time, step, summary{value{tag, metadata{plugin_data{"text"}}, tensor{DT_STRING,
 * shape {}, string_val}}}} */
static size_t encode_text(uint8_t *buf, size_t cap, double wall_time, int64_t step, const char *tag,
                          const char *text)
{
    pb w = {buf, cap, 0, false};
    size_t tag_n = strlen(tag), text_n = strlen(text);
    size_t plugin_n = len_field(1, 4);            /* plugin_name "text" */
    size_t meta_n = len_field(1, plugin_n);       /* plugin_data */
    size_t tensor_n = 2 + len_field(2, 0) + len_field(8, text_n); /* dtype, shape, string_val */
    size_t value_n = len_field(1, tag_n) + len_field(9, meta_n) + len_field(8, tensor_n);
    size_t summary_n = len_field(1, value_n);
    event_header(&w, wall_time, step);
    pb_begin(&w, 5, summary_n);
    pb_begin(&w, 1, value_n);
    pb_len_bytes(&w, 1, tag, tag_n);
    pb_begin(&w, 9, meta_n);
    pb_begin(&w, 1, plugin_n);
    pb_len_bytes(&w, 1, "text", 4);
    pb_begin(&w, 8, tensor_n);
    pb_key(&w, 1, WT_VARINT);
    pb_varint(&w, 7); /* DT_STRING */
    pb_begin(&w, 2, 0);
    pb_len_bytes(&w, 8, text, text_n);
    return w.overflow ? 0 : w.len;
}

/* ---- the writer ---------------------------------------------------------------------------------- */

struct jdt_tboard {
    FILE *f;
    char path[1100];
};

static double wall_now(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static jdt_status write_record(jdt_tboard *tb, const uint8_t *payload, size_t n, jdt_err *e)
{
    uint8_t head[12], tail[4];
    put_le64(head, (uint64_t)n);
    put_le32(head + 8, jdt_crc32c_mask(jdt_crc32c(head, 8)));
    put_le32(tail, jdt_crc32c_mask(jdt_crc32c(payload, n)));
    if (fwrite(head, 1, 12, tb->f) != 12 || fwrite(payload, 1, n, tb->f) != n ||
        fwrite(tail, 1, 4, tb->f) != 4)
        return jdt_err_set(e, JDT_ERR_IO, "%s: write: %s", tb->path, strerror(errno));
    return JDT_OK;
}

jdt_status jdt_tboard_open(const char *dir, jdt_tboard **out, jdt_err *e)
{
    *out = NULL;
    jdt_tboard *tb = jdt_calloc(1, sizeof *tb);
    if (!tb) return jdt_err_set(e, JDT_ERR_NOMEM, "tensorboard writer: out of memory");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%ld.jdt", dir,
             (long long)time(NULL), host, (long)getpid());
    tb->f = fopen(tb->path, "wb");
    if (!tb->f) {
        jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tb->path, strerror(errno));
        jdt_free(tb);
        return st;
    }
    uint8_t buf[64];
    pb w = {buf, sizeof buf, 0, false};
    event_header(&w, wall_now(), 0);
    pb_len_bytes(&w, 3, "brain.Event:2", 13);
    jdt_status st = write_record(tb, buf, w.len, e);
    if (st == JDT_OK) st = jdt_tboard_flush(tb, e);
    if (st != JDT_OK) {
        jdt_tboard_close(tb);
        return st;
    }
    *out = tb;
    return JDT_OK;
}

jdt_status jdt_tboard_scalar(jdt_tboard *tb, const char *tag, int64_t step, double value, jdt_err *e)
{
    uint8_t buf[512];
    size_t n = jdt_tboard_encode_scalar(buf, sizeof buf, wall_now(), step, tag, (float)value);
    if (n == 0) return jdt_err_set(e, JDT_ERR_INVALID, "tensorboard: tag too long: %.40s...", tag);
    return write_record(tb, buf, n, e);
}

jdt_status jdt_tboard_text(jdt_tboard *tb, const char *tag, int64_t step, const char *markdown,
                           jdt_err *e)
{
    size_t cap = strlen(tag) + strlen(markdown) + 128;
    uint8_t *buf = jdt_malloc(cap);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "tensorboard: out of memory");
    size_t n = encode_text(buf, cap, wall_now(), step, tag, markdown);
    jdt_status st = n ? write_record(tb, buf, n, e)
                      : jdt_err_set(e, JDT_ERR_INTERNAL, "tensorboard: text event size miscounted");
    jdt_free(buf);
    return st;
}

jdt_status jdt_tboard_restart(jdt_tboard *tb, int64_t step, jdt_err *e)
{
    uint8_t buf[64];
    pb w = {buf, sizeof buf, 0, false};
    event_header(&w, wall_now(), step);
    pb_begin(&w, 7, 2); /* session_log */
    pb_key(&w, 1, WT_VARINT);
    pb_varint(&w, 1); /* status START */
    return write_record(tb, buf, w.len, e);
}

jdt_status jdt_tboard_flush(jdt_tboard *tb, jdt_err *e)
{
    if (fflush(tb->f) != 0) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", tb->path, strerror(errno));
    /* a write that failed earlier (a full disk) leaves the stream's error flag */
    if (ferror(tb->f)) return jdt_err_set(e, JDT_ERR_IO, "%s: a write failed", tb->path);
    return JDT_OK;
}

const char *jdt_tboard_path(const jdt_tboard *tb) { return tb->path; }

void jdt_tboard_close(jdt_tboard *tb)
{
    if (!tb) return;
    if (tb->f) fclose(tb->f);
    jdt_free(tb);
}
