/*
 * safetensors.c — the safetensors reader and writer of safetensors.h. The header is parsed by
 * io/json.h; tensor data is read with pread at its offset.
 */
#include "io/safetensors.h"
#include "io/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_HEADER = 100 << 20 };

typedef struct {
    char *name;
    int ndim;
    int64_t shape[JDT_ST_MAX_DIMS];
    int dtype_bytes; /* 4 F32, 2 F16/BF16 */
    bool bf16;
    uint64_t begin, end;
} st_entry;

struct jdt_st_file {
    char *path;
    int fd;
    uint64_t data_start;
    st_entry *ent;
    int n;
};

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const jdt_st_tensor *)a)->name, ((const jdt_st_tensor *)b)->name);
}

jdt_status jdt_st_write(const char *path, const jdt_st_tensor *tin, int n, const char *const *meta,
                        int n_meta, jdt_err *e)
{
    jdt_st_tensor *t = jdt_malloc((size_t)(n ? n : 1) * sizeof *t);
    char *tmp = jdt_malloc(strlen(path) + 8);
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *f = NULL, *hf = NULL;
    jdt_status st = JDT_OK;
    if (!t || !tmp) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    memcpy(t, tin, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_tensor);
    for (int i = 0; i < n; i++) {
        if (i && strcmp(t[i].name, t[i - 1].name) == 0) {
            st = jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s' given twice", path, t[i].name);
            goto out;
        }
        if (t[i].ndim < 0 || t[i].ndim > JDT_ST_MAX_DIMS) {
            st = jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s' has %d dims", path, t[i].name, t[i].ndim);
            goto out;
        }
    }
    if (!(hf = open_memstream(&hdr, &hlen))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto out;
    }
    fputc('{', hf);
    if (n_meta > 0) {
        fputs("\"__metadata__\":{", hf);
        for (int i = 0; i < n_meta; i++) {
            if (i) fputc(',', hf);
            jdt_json_write_string(hf, meta[2 * i], strlen(meta[2 * i]));
            fputc(':', hf);
            jdt_json_write_string(hf, meta[2 * i + 1], strlen(meta[2 * i + 1]));
        }
        fputs(n ? "}," : "}", hf);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t nb = (uint64_t)numel_of(t[i].ndim, t[i].shape) * 4;
        if (i) fputc(',', hf);
        jdt_json_write_string(hf, t[i].name, strlen(t[i].name));
        fputs(":{\"dtype\":\"F32\",\"shape\":[", hf);
        for (int d = 0; d < t[i].ndim; d++) fprintf(hf, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        fprintf(hf, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + nb));
        off += nb;
    }
    fputc('}', hf);
    while ((ftell(hf) % 8) != 0) fputc(' ', hf);
    fclose(hf);
    hf = NULL;
    sprintf(tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char len8[8];
    for (int b = 0; b < 8; b++) len8[b] = (unsigned char)((uint64_t)hlen >> (8 * b));
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, hlen, f);
    for (int i = 0; i < n; i++) /* x86-64 and aarch64 are little-endian, as the format is */
        fwrite(t[i].data, 4, (size_t)numel_of(t[i].ndim, t[i].shape), f);
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == JDT_OK) st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
    f = NULL;
    if (st == JDT_OK && rename(tmp, path) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st) remove(tmp);
out:
    if (hf) fclose(hf);
    free(hdr); /* open_memstream's buffer comes from malloc */
    jdt_free(tmp);
    jdt_free(t);
    return st;
}

void jdt_st_close(jdt_st_file *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) jdt_free(f->ent[i].name);
    jdt_free(f->ent);
    jdt_free(f->path);
    jdt_free(f);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

jdt_status jdt_st_open(const char *path, jdt_st_file **out, jdt_err *e)
{
    *out = NULL;
    jdt_st_file *f = jdt_calloc(1, sizeof *f);
    char *hdr = NULL;
    jdt_json_doc *doc = NULL;
    jdt_status st = JDT_OK;
    if (!f || !(f->path = jdt_strdup(path))) {
        jdt_free(f);
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        st = jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    unsigned char len8[8];
    if (fstat(f->fd, &sb) != 0 || pread(f->fd, len8, 8, 0) != 8) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: shorter than a safetensors header", path);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int b = 0; b < 8; b++) hlen |= (uint64_t)len8[b] << (8 * b);
    if (hlen < 2 || hlen > MAX_HEADER || hlen > (uint64_t)sb.st_size - 8) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: header length %llu does not fit the file (%lld bytes); not a safetensors file?",
                         path, (unsigned long long)hlen, (long long)sb.st_size);
        goto fail;
    }
    if (!(hdr = jdt_malloc(hlen))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (pread(f->fd, hdr, hlen, 8) != (ssize_t)hlen) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: short read of the header", path);
        goto fail;
    }
    size_t used = hlen;
    while (used && hdr[used - 1] == ' ') used--; /* padding */
    if ((st = jdt_json_parse(hdr, used, path, &doc, e))) goto fail;
    const jdt_json *root = jdt_json_root(doc);
    if (root->type != JDT_JSON_OBJECT) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }
    f->data_start = 8 + hlen;
    uint64_t data_len = (uint64_t)sb.st_size - f->data_start;
    if (!(f->ent = jdt_calloc(root->len ? root->len : 1, sizeof *f->ent))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    for (const jdt_json *c = root->child; c; c = c->next) {
        if (strcmp(c->key, "__metadata__") == 0) continue;
        st_entry *t = &f->ent[f->n];
        const char *dt = jdt_json_str(jdt_json_get(c, "dtype"));
        const jdt_json *shape = jdt_json_get(c, "shape"), *offs = jdt_json_get(c, "data_offsets");
        int64_t b, en;
        if (!dt || !shape || shape->type != JDT_JSON_ARRAY || shape->len > JDT_ST_MAX_DIMS || !offs ||
            offs->type != JDT_JSON_ARRAY || offs->len != 2 || !jdt_json_int(offs->child, 0, INT64_MAX / 2, &b) ||
            !jdt_json_int(offs->child->next, 0, INT64_MAX / 2, &en) || en < b) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' lacks a valid dtype, shape or data_offsets", path, c->key);
            goto fail;
        }
        if (strcmp(dt, "F32") == 0) t->dtype_bytes = 4;
        else if (strcmp(dt, "F16") == 0) t->dtype_bytes = 2;
        else if (strcmp(dt, "BF16") == 0) t->dtype_bytes = 2, t->bf16 = true;
        else {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, F16 and BF16 are read)", path, c->key, dt);
            goto fail;
        }
        t->ndim = (int)shape->len;
        int d = 0;
        for (const jdt_json *s = shape->child; s; s = s->next, d++)
            if (!jdt_json_int(s, 0, INT64_MAX / 16, &t->shape[d])) {
                st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' has a bad shape", path, c->key);
                goto fail;
            }
        t->begin = (uint64_t)b;
        t->end = (uint64_t)en;
        if ((uint64_t)numel_of(t->ndim, t->shape) * (uint64_t)t->dtype_bytes != t->end - t->begin) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s': data_offsets span %llu bytes, shape x dtype needs %llu",
                             path, c->key, (unsigned long long)(t->end - t->begin),
                             (unsigned long long)numel_of(t->ndim, t->shape) * (unsigned long long)t->dtype_bytes);
            goto fail;
        }
        if (!(t->name = jdt_strdup(c->key))) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
            goto fail;
        }
        f->n++;
    }
    /* the data must be tiled exactly: no gaps, no overlaps, nothing past the end */
    st_entry *sorted = jdt_malloc((size_t)(f->n ? f->n : 1) * sizeof *sorted);
    if (!sorted) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(sorted, f->ent, (size_t)f->n * sizeof *sorted);
    qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n && st == JDT_OK; i++) {
        if (sorted[i].begin != at)
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' starts at %llu, expected %llu (gap or overlap)",
                             path, sorted[i].name, (unsigned long long)sorted[i].begin, (unsigned long long)at);
        at = sorted[i].end;
    }
    jdt_free(sorted);
    if (st) goto fail;
    if (at != data_len) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensors cover %llu data bytes but the file has %llu (truncated?)",
                         path, (unsigned long long)at, (unsigned long long)data_len);
        goto fail;
    }
    jdt_json_doc_free(doc);
    jdt_free(hdr);
    *out = f;
    return JDT_OK;
fail:
    jdt_json_doc_free(doc);
    jdt_free(hdr);
    jdt_st_close(f);
    return st;
}

int jdt_st_count(const jdt_st_file *f) { return f->n; }

jdt_st_tensor jdt_st_info(const jdt_st_file *f, int i)
{
    jdt_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = f->ent[i].name;
    t.ndim = f->ent[i].ndim;
    memcpy(t.shape, f->ent[i].shape, sizeof t.shape);
    return t;
}

int jdt_st_find(const jdt_st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->ent[i].name, name) == 0) return i;
    return -1;
}

static float half_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1F, m = h & 0x3FF, bits;
    if (ex == 0) {
        if (m == 0) {
            bits = s;
        } else { /* subnormal */
            ex = 127 - 15 + 1;
            while (!(m & 0x400)) {
                m <<= 1;
                ex--;
            }
            bits = s | (ex << 23) | ((m & 0x3FF) << 13);
        }
    } else if (ex == 31) {
        bits = s | 0x7F800000u | (m << 13);
    } else {
        bits = s | ((ex + 127 - 15) << 23) | (m << 13);
    }
    float r;
    memcpy(&r, &bits, 4);
    return r;
}

jdt_status jdt_st_read(jdt_st_file *f, int i, float *dst, jdt_err *e)
{
    const st_entry *t = &f->ent[i];
    uint64_t nb = t->end - t->begin, n = nb / (uint64_t)t->dtype_bytes;
    void *buf = t->dtype_bytes == 4 ? (void *)dst : jdt_malloc(nb ? nb : 1);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", f->path);
    for (uint64_t got = 0; got < nb;) {
        ssize_t r = pread(f->fd, (char *)buf + got, nb - got, (off_t)(f->data_start + t->begin + got));
        if (r <= 0) {
            if (buf != dst) jdt_free(buf);
            return jdt_err_set(e, JDT_ERR_IO, "%s: reading tensor '%s': %s", f->path, t->name,
                               r < 0 ? strerror(errno) : "unexpected end of file");
        }
        got += (uint64_t)r;
    }
    if (t->dtype_bytes == 2) {
        const uint16_t *h = buf;
        for (uint64_t k = 0; k < n; k++) {
            if (t->bf16) {
                uint32_t bits = (uint32_t)h[k] << 16;
                memcpy(&dst[k], &bits, 4);
            } else {
                dst[k] = half_to_f32(h[k]);
            }
        }
        jdt_free(buf);
    }
    return JDT_OK;
}
