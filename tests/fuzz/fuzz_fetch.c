/*
 * fuzz_fetch.c — libFuzzer target: the parsers behind remote data (engine/io/fetch.h), fed
 * through jdt_fetch_parse as the body a server returned for http://127.0.0.1:8080/d/x/.
 * Input: one byte choosing the name filter (none, or *.h5), then the body (HTML listing or jdt
 * manifest). Checks, besides ASan/UBSan: an error is one printable line naming the URL; every
 * item that comes back has a safe relative name (no empty, "." or ".." part, no leading '/'),
 * a URL under the base folder, a cache path under the list's folder, and a size, digest and
 * length that are unknown or well-formed.
 */
#include "io/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BASE "http://127.0.0.1:8080/d/x/"

static bool keep_h5(const char *name, void *ctx)
{
    size_t n = strlen(name);
    return n > 3 && strcmp(name + n - 3, ".h5") == 0;
}

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "%s: %s\n", what, detail);
    abort();
}

static void check_name(const char *s)
{
    if (!*s || *s == '/') fail("empty or absolute name", s);
    for (const char *seg = s;;) {
        const char *end = strchr(seg, '/');
        size_t n = end ? (size_t)(end - seg) : strlen(seg);
        if (n == 0 || (n == 1 && seg[0] == '.') || (n == 2 && seg[0] == '.' && seg[1] == '.'))
            fail("unsafe name", s);
        if (!end) break;
        seg = end + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536) return 0;
    char *body = malloc(size);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    body[size - 1] = '\0';
    jdt_fetch_opts o;
    jdt_fetch_opts_default(&o);
    o.cache_dir = "/nonexistent/cache";
    jdt_fetch_list *l = NULL;
    jdt_err e;
    jdt_status st = jdt_fetch_parse(&o, BASE, body, data[0] & 1 ? keep_h5 : NULL, NULL, &l, &e);
    if (st != JDT_OK) {
        for (const char *c = e.msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) fail("control character in error", e.msg);
        if (!strstr(e.msg, BASE)) fail("error does not name the URL", e.msg);
    } else {
        size_t dl = strlen(l->local_dir);
        for (int64_t i = 0; i < l->n_items; i++) {
            const jdt_fetch_item *it = &l->items[i];
            check_name(it->name);
            if (strncmp(it->url, BASE, strlen(BASE)) != 0) fail("URL outside the base", it->url);
            if (strncmp(it->local, l->local_dir, dl) != 0 || it->local[dl] != '/')
                fail("cache path outside the list's folder", it->local);
            if (it->n_bytes < -1 || it->n_units < -1) fail("negative size", it->name);
            size_t hl = strlen(it->sha256);
            if (hl != 0 && hl != 64) fail("bad digest", it->sha256);
            for (size_t k = 0; k < hl; k++)
                if (!strchr("0123456789abcdef", it->sha256[k])) fail("bad digest", it->sha256);
        }
        jdt_fetch_list_free(l);
    }
    free(body);
    return 0;
}
