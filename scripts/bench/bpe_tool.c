/*
 * bpe_tool.c — drives datasets/bpe.h from the shell, for tests/e2e/tokenizer_bpe.sh and
 * scripts/bench/tokenize.sh:
 *
 *   bpe_tool encode TOKENIZER TEXT OUT      ids of TEXT, one decimal per line, into OUT
 *   bpe_tool decode TOKENIZER IDS OUT       the text of IDS (one decimal per line) into OUT
 *   bpe_tool train TEXT VOCAB_SIZE OUT.json trains on TEXT and writes a tokenizer.json
 *   bpe_tool roundtrip TOKENIZER N SEED     decode(encode(x)) == x for N random strings
 *                                           (valid UTF-8, and arbitrary bytes); exit 1 if not
 *   bpe_tool bench TOKENIZER TEXT REPS      encode MB/s on this thread (best of REPS)
 *
 * Errors print one line and exit 1 (2 for usage).
 */
#include "core/core.h"
#include "datasets/bpe.h"
#include "io/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(const jdt_err *e)
{
    fprintf(stderr, "bpe_tool: %s\n", e->msg);
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Random text: with `utf8` a mix of ASCII words, spaces, newlines, digits and multi-byte code
 * points (2-4 bytes); otherwise arbitrary bytes. */
static size_t random_text(char *buf, size_t cap, uint64_t seed, uint64_t i, bool utf8)
{
    size_t n = 0, want = 1 + jdt_philox(seed, i, 0).v[0] % (cap - 8);
    for (uint64_t k = 1; n < want; k++) {
        jdt_philox_ctr r = jdt_philox(seed, i, k);
        if (!utf8) {
            buf[n++] = (char)(r.v[0] & 0xFF);
            continue;
        }
        unsigned kind = r.v[0] % 10, cp;
        if (kind < 5) cp = "aeiou tnsrlhdc\n'.,0123456789A"[r.v[1] % 30];
        else if (kind < 7) cp = 0x80 + r.v[1] % (0x800 - 0x80);
        else if (kind < 9) {
            cp = 0x800 + r.v[1] % (0x10000 - 0x800);
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E2D;
        } else cp = 0x10000 + r.v[1] % (0x110000 - 0x10000);
        if (cp < 0x80) {
            buf[n++] = (char)cp;
        } else if (cp < 0x800) {
            buf[n++] = (char)(0xC0 | (cp >> 6));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[n++] = (char)(0xE0 | (cp >> 12));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)(0xF0 | (cp >> 18));
            buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_bpe *t = NULL;
    if (argc == 5 && strcmp(argv[1], "encode") == 0) {
        char *text;
        size_t n, n_ids = 0, cap = 0;
        uint32_t *ids = NULL;
        if (jdt_bpe_load(argv[2], &t, &e) || jdt_io_read_all(argv[3], &text, &n, &e)) return fail(&e);
        if (jdt_bpe_encode(t, text, n, &ids, &n_ids, &cap, &e)) return fail(&e);
        FILE *f = fopen(argv[4], "w");
        if (!f) return perror(argv[4]), 1;
        for (size_t i = 0; i < n_ids; i++) fprintf(f, "%u\n", ids[i]);
        fclose(f);
        printf("%zu bytes -> %zu tokens\n", n, n_ids);
        jdt_free(ids);
        jdt_free(text);
    } else if (argc == 5 && strcmp(argv[1], "decode") == 0) {
        if (jdt_bpe_load(argv[2], &t, &e)) return fail(&e);
        FILE *in = fopen(argv[3], "r"), *out = fopen(argv[4], "wb");
        if (!in || !out) return perror(in ? argv[4] : argv[3]), 1;
        unsigned id;
        size_t n_ids = 0, n_bytes = 0;
        while (fscanf(in, "%u", &id) == 1) {
            size_t l;
            const char *b = jdt_bpe_token_bytes(t, id, &l);
            fwrite(b, 1, l, out);
            n_ids++;
            n_bytes += l;
        }
        fclose(in);
        if (fclose(out) != 0) return perror(argv[4]), 1;
        printf("%zu tokens -> %zu bytes\n", n_ids, n_bytes);
    } else if (argc == 5 && strcmp(argv[1], "train") == 0) {
        char *text;
        size_t n;
        if (jdt_io_read_all(argv[2], &text, &n, &e)) return fail(&e);
        double t0 = now_s();
        if (jdt_bpe_train(text, n, atoi(argv[3]), false, &t, &e) || jdt_bpe_save(t, argv[4], &e)) return fail(&e);
        printf("trained vocab %d on %zu bytes in %.2f s\n", jdt_bpe_vocab_size(t), n, now_s() - t0);
        jdt_free(text);
    } else if (argc == 5 && strcmp(argv[1], "roundtrip") == 0) {
        if (jdt_bpe_load(argv[2], &t, &e)) return fail(&e);
        long reps = atol(argv[3]);
        uint64_t seed = strtoull(argv[4], NULL, 10);
        char buf[4096], back[4096 * 2];
        uint32_t *ids = NULL;
        size_t cap = 0;
        for (long i = 0; i < reps; i++) {
            for (int utf8 = 0; utf8 < 2; utf8++) {
                size_t n = random_text(buf, 4000, seed, (uint64_t)i * 2 + (uint64_t)utf8, utf8);
                size_t n_ids = 0;
                if (jdt_bpe_encode(t, buf, n, &ids, &n_ids, &cap, &e)) return fail(&e);
                size_t m = jdt_bpe_decode(t, ids, n_ids, back, sizeof back);
                if (m != n || memcmp(buf, back, n) != 0) {
                    fprintf(stderr, "bpe_tool: round trip failed on string %ld (%s, %zu bytes -> %zu)\n",
                            i, utf8 ? "utf-8" : "bytes", n, m);
                    return 1;
                }
            }
        }
        printf("round trip ok: %ld random UTF-8 strings and %ld random byte strings\n", reps, reps);
        jdt_free(ids);
    } else if (argc == 5 && strcmp(argv[1], "bench") == 0) {
        char *text;
        size_t n;
        if (jdt_bpe_load(argv[2], &t, &e) || jdt_io_read_all(argv[3], &text, &n, &e)) return fail(&e);
        int reps = atoi(argv[4]);
        double best = 1e30;
        size_t n_ids = 0, cap = 0;
        uint32_t *ids = NULL;
        for (int r = 0; r < reps; r++) {
            /* a fresh tokenizer each rep: the piece cache starts cold, as tiktoken's and
             * tokenizers' do in a new process */
            jdt_bpe_free(t);
            if (jdt_bpe_load(argv[2], &t, &e)) return fail(&e);
            n_ids = 0;
            double t0 = now_s();
            if (jdt_bpe_encode(t, text, n, &ids, &n_ids, &cap, &e)) return fail(&e);
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        printf("jdt %.2f MB/s (%zu bytes -> %zu tokens, best of %d)\n", (double)n / best / 1e6, n, n_ids, reps);
        jdt_free(ids);
        jdt_free(text);
    } else {
        fprintf(stderr, "usage: bpe_tool encode TOKENIZER TEXT OUT | decode TOKENIZER IDS OUT | train TEXT VOCAB OUT.json | "
                        "roundtrip TOKENIZER N SEED | bench TOKENIZER TEXT REPS\n");
        return 2;
    }
    jdt_bpe_free(t);
    return 0;
}
