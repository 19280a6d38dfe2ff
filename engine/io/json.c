/*
 * json.c — the strict JSON reader and string writer of json.h. A recursive-descent parser
 * over the whole text; nodes and decoded strings are bump-allocated from arena blocks.
 */
#include "io/json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { ARENA_BLOCK = 1 << 20, MAX_DEPTH = 512 };

typedef struct arena_blk {
    struct arena_blk *prev;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_blk;

struct jdt_json_doc {
    arena_blk *top;
    jdt_json *root;
};

typedef struct {
    const char *s, *end, *p;
    const char *what;
    jdt_json_doc *doc;
    jdt_err *e;
    int depth;
} parser;

static void *arena_alloc(jdt_json_doc *d, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!d->top || d->top->cap - d->top->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        arena_blk *b = jdt_malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->prev = d->top;
        b->used = 0;
        b->cap = cap;
        d->top = b;
    }
    void *r = d->top->data + d->top->used;
    d->top->used += n;
    return r;
}

void jdt_json_doc_free(jdt_json_doc *d)
{
    if (!d) return;
    for (arena_blk *b = d->top; b;) {
        arena_blk *p = b->prev;
        jdt_free(b);
        b = p;
    }
    jdt_free(d);
}

const jdt_json *jdt_json_root(const jdt_json_doc *d) { return d->root; }

static jdt_status fail(parser *ps, const char *at, const char *msg)
{
    int line = 1, col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else if (((unsigned char)*q & 0xC0) != 0x80) {
            col++;
        }
    }
    if (at >= ps->end) /* every "expected X" at the end means the text stops early */
        return jdt_err_set(ps->e, JDT_ERR_FORMAT, "%s:%d:%d: unexpected end of input (truncated file?)",
                           ps->what, line, col);
    return jdt_err_set(ps->e, JDT_ERR_FORMAT, "%s:%d:%d: %s", ps->what, line, col, msg);
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid (overlongs, surrogates and
 * code points above U+10FFFF are invalid). */
static int utf8_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    int n;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (end - p < n) return 0;
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

static int put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parses the string at ps->p (on the opening quote); the decoded text is never longer than the
 * literal, so the output is sized by a first scan to the closing quote. */
static jdt_status parse_string(parser *ps, const char **out, size_t *out_len)
{
    const char *start = ps->p++;
    const char *q = ps->p;
    while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) return fail(ps, start, "unterminated string");
    char *o = arena_alloc(ps->doc, (size_t)(q - ps->p) + 1);
    if (!o) return jdt_err_set(ps->e, JDT_ERR_NOMEM, "%s: out of memory", ps->what);
    size_t n = 0;
    while (ps->p < q) {
        unsigned char c = (unsigned char)*ps->p;
        if (c == '\\') {
            char x = ps->p[1];
            const char *esc = ps->p;
            ps->p += 2;
            switch (x) {
            case '"': o[n++] = '"'; break;
            case '\\': o[n++] = '\\'; break;
            case '/': o[n++] = '/'; break;
            case 'b': o[n++] = '\b'; break;
            case 'f': o[n++] = '\f'; break;
            case 'n': o[n++] = '\n'; break;
            case 'r': o[n++] = '\r'; break;
            case 't': o[n++] = '\t'; break;
            case 'u': {
                unsigned cp, lo;
                if (q - ps->p < 4 || hex4(ps->p, &cp)) return fail(ps, esc, "bad \\u escape");
                ps->p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(ps, esc, "lone low surrogate in \\u escape");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (q - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u' || hex4(ps->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return fail(ps, esc, "high surrogate not followed by a low surrogate");
                    ps->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                n += (size_t)put_utf8(o + n, cp);
                break;
            }
            default: return fail(ps, esc, "bad escape in string");
            }
        } else if (c < 0x20) {
            return fail(ps, ps->p, "control character in string (must be escaped)");
        } else if (c < 0x80) {
            o[n++] = (char)c;
            ps->p++;
        } else {
            int l = utf8_len((const unsigned char *)ps->p, (const unsigned char *)q);
            if (!l) return fail(ps, ps->p, "invalid UTF-8 in string");
            memcpy(o + n, ps->p, (size_t)l);
            n += (size_t)l;
            ps->p += l;
        }
    }
    o[n] = 0;
    ps->p = q + 1;
    *out = o;
    *out_len = n;
    return JDT_OK;
}

static jdt_status parse_number(parser *ps, jdt_json *v)
{
    const char *p = ps->p, *start = p;
    if (p < ps->end && *p == '-') p++;
    if (p >= ps->end) return fail(ps, start, "bad number");
    if (*p == '0') {
        p++;
        if (p < ps->end && *p >= '0' && *p <= '9') return fail(ps, start, "leading zero in number");
    } else if (*p >= '1' && *p <= '9') {
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    } else {
        return fail(ps, start, "bad number");
    }
    if (p < ps->end && *p == '.') {
        p++;
        if (p >= ps->end || *p < '0' || *p > '9') return fail(ps, start, "bad number (digit after '.')");
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < ps->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < ps->end && (*p == '+' || *p == '-')) p++;
        if (p >= ps->end || *p < '0' || *p > '9') return fail(ps, start, "bad number (exponent)");
        while (p < ps->end && *p >= '0' && *p <= '9') p++;
    }
    char buf[64];
    size_t n = (size_t)(p - start);
    if (n >= sizeof buf) {
        char *tmp = jdt_malloc(n + 1);
        if (!tmp) return jdt_err_set(ps->e, JDT_ERR_NOMEM, "%s: out of memory", ps->what);
        memcpy(tmp, start, n);
        tmp[n] = 0;
        v->num = strtod(tmp, NULL);
        jdt_free(tmp);
    } else {
        memcpy(buf, start, n);
        buf[n] = 0;
        v->num = strtod(buf, NULL);
    }
    v->type = JDT_JSON_NUMBER;
    ps->p = p;
    return JDT_OK;
}

static jdt_status parse_value(parser *ps, jdt_json *v);

static jdt_status parse_container(parser *ps, jdt_json *v, bool is_obj)
{
    const char *open = ps->p++;
    if (++ps->depth > MAX_DEPTH) return fail(ps, open, "nesting deeper than 512");
    v->type = is_obj ? JDT_JSON_OBJECT : JDT_JSON_ARRAY;
    char close = is_obj ? '}' : ']';
    jdt_json **tail = &v->child;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return JDT_OK;
    }
    for (;;) {
        jdt_json *c = arena_alloc(ps->doc, sizeof *c);
        if (!c) return jdt_err_set(ps->e, JDT_ERR_NOMEM, "%s: out of memory", ps->what);
        memset(c, 0, sizeof *c);
        skip_ws(ps);
        if (is_obj) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, ps->p, "expected a string key");
            jdt_status st = parse_string(ps, &c->key, &c->key_len);
            if (st) return st;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, ps->p, "expected ':' after key");
            ps->p++;
            skip_ws(ps);
        }
        jdt_status st = parse_value(ps, c);
        if (st) return st;
        *tail = c;
        tail = &c->next;
        v->len++;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == close) return fail(ps, ps->p, "trailing comma");
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            ps->depth--;
            return JDT_OK;
        }
        return fail(ps, ps->p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static jdt_status parse_value(parser *ps, jdt_json *v)
{
    if (ps->p >= ps->end) return fail(ps, ps->p, "unexpected end of input");
    switch (*ps->p) {
    case '{': return parse_container(ps, v, true);
    case '[': return parse_container(ps, v, false);
    case '"':
        v->type = JDT_JSON_STRING;
        return parse_string(ps, &v->str, &v->len);
    case 't':
    case 'f':
    case 'n': {
        static const struct {
            const char *word;
            jdt_json_type t;
        } lits[] = {{"true", JDT_JSON_TRUE}, {"false", JDT_JSON_FALSE}, {"null", JDT_JSON_NULL}};
        for (size_t i = 0; i < 3; i++) {
            size_t n = strlen(lits[i].word);
            if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, lits[i].word, n) == 0) {
                v->type = lits[i].t;
                ps->p += n;
                return JDT_OK;
            }
        }
        return fail(ps, ps->p, "unexpected word (expected true, false or null)");
    }
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps, v);
        return fail(ps, ps->p, "unexpected character");
    }
}

jdt_status jdt_json_parse(const char *text, size_t n_bytes, const char *what, jdt_json_doc **out,
                          jdt_err *e)
{
    *out = NULL;
    jdt_json_doc *d = jdt_calloc(1, sizeof *d);
    if (!d) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    parser ps = {.s = text, .end = text + n_bytes, .p = text, .what = what, .doc = d, .e = e};
    jdt_status st = JDT_OK;
    if (!(d->root = arena_alloc(d, sizeof *d->root))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
        goto fail;
    }
    memset(d->root, 0, sizeof *d->root);
    if (n_bytes >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        st = fail(&ps, text, "byte-order mark at the start (JSON text must not have one)");
        goto fail;
    }
    skip_ws(&ps);
    if ((st = parse_value(&ps, d->root))) goto fail;
    skip_ws(&ps);
    if (ps.p != ps.end) {
        st = fail(&ps, ps.p, "text after the JSON value");
        goto fail;
    }
    *out = d;
    return JDT_OK;
fail:
    jdt_json_doc_free(d);
    return st;
}

jdt_status jdt_io_read_all(const char *path, char **buf, size_t *n_bytes, jdt_err *e)
{
    *buf = NULL;
    *n_bytes = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s", path,
                           strerror(errno));
    struct stat sb;
    jdt_status st = JDT_OK;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: not a regular file", path);
        goto out;
    }
    char *b = jdt_malloc((size_t)sb.st_size + 1);
    if (!b) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory (%lld bytes)", path,
                         (long long)sb.st_size);
        goto out;
    }
    size_t got = fread(b, 1, (size_t)sb.st_size, f);
    if (got != (size_t)sb.st_size || ferror(f)) {
        jdt_free(b);
        st = jdt_err_set(e, JDT_ERR_IO, "%s: short read", path);
        goto out;
    }
    b[got] = 0;
    *buf = b;
    *n_bytes = got;
out:
    fclose(f);
    return st;
}

jdt_status jdt_json_parse_file(const char *path, jdt_json_doc **out, jdt_err *e)
{
    char *buf;
    size_t n;
    *out = NULL;
    jdt_status st = jdt_io_read_all(path, &buf, &n, e);
    if (st) return st;
    st = jdt_json_parse(buf, n, path, out, e);
    jdt_free(buf);
    return st;
}

const jdt_json *jdt_json_get(const jdt_json *obj, const char *key)
{
    if (!obj || obj->type != JDT_JSON_OBJECT) return NULL;
    for (const jdt_json *c = obj->child; c; c = c->next)
        if (strcmp(c->key, key) == 0) return c;
    return NULL;
}

const char *jdt_json_str(const jdt_json *v)
{
    return v && v->type == JDT_JSON_STRING ? v->str : NULL;
}

bool jdt_json_int(const jdt_json *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (!v || v->type != JDT_JSON_NUMBER || !isfinite(v->num) || v->num != floor(v->num) ||
        v->num < (double)lo || v->num > (double)hi)
        return false;
    *out = (int64_t)v->num;
    return true;
}

void jdt_json_write_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20) {
            fprintf(f, "\\u%04x", c);
        } else {
            fputc(c, f);
        }
    }
    fputc('"', f);
}
