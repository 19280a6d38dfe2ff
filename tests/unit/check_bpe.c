/*
 * check_bpe.c — unit tests for the strict JSON reader (engine/io/json.h) and the byte-level
 * BPE (datasets/bpe.h): JSON values and every strictness error; merge order (rank, then
 * leftmost), added tokens, ignore_merges, save -> load identity, round trips on arbitrary
 * bytes, and allocation failures. Equality with Hugging Face `tokenizers` on a real corpus is
 * tests/e2e/tokenizer_bpe.sh.
 */
#include "core/core.h"
#include "datasets/bpe.h"
#include "io/json.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/jdt-check-bpe.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *path_in(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    return p;
}

START_TEST(test_json_values)
{
    const char *txt = "{\"a\": [1, -2.5e1, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\\\"\","
                      " \"o\": {}, \"e\": []}";
    jdt_json_doc *d = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_json_parse(txt, strlen(txt), "t", &d, &e), JDT_OK);
    const jdt_json *r = jdt_json_root(d);
    const jdt_json *a = jdt_json_get(r, "a");
    ck_assert_int_eq(a->type, JDT_JSON_ARRAY);
    ck_assert_int_eq((int)a->len, 5);
    int64_t v;
    ck_assert(jdt_json_int(a->child, 0, 10, &v) && v == 1);
    ck_assert(a->child->next->num == -25.0);
    ck_assert(jdt_json_int(a->child->next, -100, 100, &v) && v == -25);
    ck_assert(!jdt_json_int(a->child->next, 0, 100, &v)); /* out of range */
    ck_assert_int_eq(a->child->next->next->type, JDT_JSON_TRUE);
    ck_assert_int_eq(a->child->next->next->next->next->type, JDT_JSON_NULL);
    const jdt_json *s = jdt_json_get(r, "s");
    ck_assert_str_eq(jdt_json_str(s), "x\xc3\xa9\xf0\x9f\x98\x80\n\"");
    ck_assert_int_eq((int)s->len, 9);
    ck_assert_int_eq((int)jdt_json_get(r, "o")->len, 0);
    ck_assert_ptr_null(jdt_json_get(r, "missing"));
    jdt_json_doc_free(d);
}
END_TEST

START_TEST(test_json_strict_errors)
{
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"[1, 2,]", "trailing comma"},
        {"{\"a\": 1,}", "trailing comma"},
        {"[01]", "leading zero"},
        {"[1.]", "digit after '.'"},
        {"// c\n[1]", "unexpected character"},
        {"[\"\\ud800\"]", "high surrogate"},
        {"[\"\\udc00\"]", "lone low surrogate"},
        {"[\"a\tb\"]", "control character"},
        {"[\"\xff\"]", "invalid UTF-8"},
        {"[\"\xc0\xaf\"]", "invalid UTF-8"},
        {"[1] x", "text after"},
        {"\xEF\xBB\xBF[1]", "byte-order mark"},
        {"{\"a\": \"b", "unterminated string"},
        {"{\"a\": 1", "unexpected end of input"},
        {"{\"a\" 1}", "expected ':'"},
        {"[tru]", "unexpected word"},
        {"[\"\\x\"]", "bad escape"},
        {"", "unexpected end of input"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        jdt_json_doc *d = NULL;
        jdt_err e;
        jdt_status st = jdt_json_parse(bad[i].text, strlen(bad[i].text), "f.json", &d, &e);
        ck_assert_msg(st == JDT_ERR_FORMAT, "case %zu accepted", i);
        ck_assert_ptr_null(d);
        ck_assert_msg(strstr(e.msg, bad[i].msg) && strncmp(e.msg, "f.json:", 7) == 0,
                      "case %zu: '%s' lacks '%s'", i, e.msg, bad[i].msg);
    }
    /* nesting depth is bounded (no stack overflow on hostile input) */
    char deep[2000];
    memset(deep, '[', sizeof deep);
    jdt_json_doc *d = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_json_parse(deep, sizeof deep, "deep", &d, &e), JDT_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "nesting"));
}
END_TEST

/* GPT-2's byte -> character map, written independently of bpe.c */
static void put_byte_char(FILE *f, unsigned b)
{
    static unsigned map[256];
    unsigned n = 0;
    for (unsigned i = 0; i < 256; i++) {
        bool pr = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || i >= 174;
        map[i] = pr ? i : 256 + n++;
    }
    unsigned cp = map[b];
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", cp);
    else if (cp < 0x80) fputc((int)cp, f);
    else fprintf(f, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
}

/* A tokenizer.json: ids 0..255 = bytes, then the given merges ("a b" in plain ASCII, no
 * spaces in the parts; the merged tokens get ids 256..), added tokens <s> and <|x|>. */
static const char *write_small(const char *const *merges, int n_merges, bool ignore_merges)
{
    const char *p = path_in("small.json");
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"added_tokens\": [{\"id\": %d, \"content\": \"<s>\", \"special\": true},"
               "{\"id\": %d, \"content\": \"<|x|>\", \"special\": true}],"
               "\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
               "\"add_prefix_space\": false, \"use_regex\": true},"
               "\"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {",
            256 + n_merges, 257 + n_merges, ignore_merges ? "true" : "false");
    for (unsigned b = 0; b < 256; b++) {
        fputs(b ? ",\"" : "\"", f);
        put_byte_char(f, b);
        fprintf(f, "\": %u", b);
    }
    for (int m = 0; m < n_merges; m++) {
        char a[32], c[32];
        ck_assert_int_eq(sscanf(merges[m], "%31s %31s", a, c), 2);
        fprintf(f, ",\"%s%s\": %d", a, c, 256 + m);
    }
    fprintf(f, ",\"<s>\": %d, \"<|x|>\": %d}, \"merges\": [", 256 + n_merges, 257 + n_merges);
    for (int m = 0; m < n_merges; m++) fprintf(f, "%s\"%s\"", m ? "," : "", merges[m]);
    fputs("]}}", f);
    fclose(f);
    return p;
}

static size_t enc(jdt_bpe *t, const char *s, uint32_t *out, size_t max)
{
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_encode(t, s, strlen(s), &ids, &n, &cap, &e), JDT_OK);
    ck_assert(n <= max);
    memcpy(out, ids, n * sizeof *ids);
    jdt_free(ids);
    return n;
}

START_TEST(test_merge_order)
{
    /* ranks: "b c" before "a b", so "abc" -> a + bc, not ab + c; "a a" is leftmost on ties */
    static const char *const merges[] = {"b c", "a b", "a a", "aa a"};
    jdt_bpe *t = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_load(write_small(merges, 4, false), &t, &e), JDT_OK);
    ck_assert_int_eq(jdt_bpe_vocab_size(t), 262);
    uint32_t ids[64];
    size_t n = enc(t, "abc", ids, 64);
    ck_assert_int_eq((int)n, 2);
    ck_assert_uint_eq(ids[0], 'a');
    ck_assert_uint_eq(ids[1], 256); /* bc */
    n = enc(t, "ab", ids, 64);
    ck_assert_int_eq((int)n, 1);
    ck_assert_uint_eq(ids[0], 257);
    n = enc(t, "aaaa", ids, 64); /* aa + aa (left first), then "aa aa" is no merge */
    ck_assert_int_eq((int)n, 2);
    ck_assert_uint_eq(ids[0], 258);
    ck_assert_uint_eq(ids[1], 258);
    n = enc(t, "aaa", ids, 64); /* aa + a -> aaa */
    ck_assert_int_eq((int)n, 1);
    ck_assert_uint_eq(ids[0], 259);
    /* pieces: " ab" is one GPT-2 piece (space + letters), so the space stays a byte */
    n = enc(t, "ab ab", ids, 64);
    ck_assert_int_eq((int)n, 3);
    ck_assert_uint_eq(ids[1], ' ');
    /* added tokens are cut out first, longest match wins, special ids */
    n = enc(t, "ab<s>x<|x|><s", ids, 64);
    ck_assert_int_eq((int)n, 6); /* ab <s> x <|x|> < s */
    ck_assert_uint_eq(ids[0], 257);
    ck_assert_uint_eq(ids[1], 260);
    ck_assert_uint_eq(ids[2], 'x');
    ck_assert_uint_eq(ids[3], 261);
    ck_assert_uint_eq(ids[4], '<');
    ck_assert_uint_eq(ids[5], 's');
    ck_assert_int_eq(jdt_bpe_special_id(t, "<|x|>"), 261);
    ck_assert_int_eq(jdt_bpe_special_id(t, "nope"), -1);
    char out[64];
    size_t m = jdt_bpe_decode(t, ids, n, out, sizeof out);
    ck_assert_int_eq((int)m, 13);
    ck_assert(memcmp(out, "ab<s>x<|x|><s", 13) == 0);
    jdt_bpe_free(t);
}
END_TEST

START_TEST(test_ignore_merges)
{
    /* with ignore_merges a piece that is a whole vocab entry is emitted as it is, even when the
     * merges would not build it ("aaa" is in the vocab through "aa a", but "abc" is not built
     * by rank order: b c first) */
    static const char *const merges[] = {"b c", "a b", "ab c"};
    jdt_bpe *t = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_load(write_small(merges, 3, true), &t, &e), JDT_OK);
    uint32_t ids[8];
    ck_assert_int_eq((int)enc(t, "abc", ids, 8), 1);
    ck_assert_uint_eq(ids[0], 258);
    jdt_bpe_free(t);
    ck_assert_int_eq(jdt_bpe_load(write_small(merges, 3, false), &t, &e), JDT_OK);
    ck_assert_int_eq((int)enc(t, "abc", ids, 8), 2);
    jdt_bpe_free(t);
}
END_TEST

static char *sample_text(size_t *n)
{
    const char *base = "The quick brown fox jumps over the lazy dog. It's 2024, we'll see!\n"
                       "Grüße aus München — naïve café, 東京 123456.  \t \n<|endoftext|>";
    size_t bl = strlen(base);
    char *s = jdt_malloc(bl * 50 + 1);
    for (int i = 0; i < 50; i++) memcpy(s + bl * (size_t)i, base, bl);
    s[bl * 50] = 0;
    *n = bl * 50;
    return s;
}

START_TEST(test_train_save_load)
{
    size_t n;
    char *text = sample_text(&n);
    jdt_bpe *t = NULL, *u = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_train(text, n, 400, false, &t, &e), JDT_OK);
    int V = jdt_bpe_vocab_size(t);
    ck_assert(V > 257 && V <= 400);
    ck_assert_int_eq(jdt_bpe_special_id(t, "<|endoftext|>"), V - 1);
    ck_assert_int_eq(jdt_bpe_save(t, path_in("tok.json"), &e), JDT_OK);
    ck_assert_int_eq(jdt_bpe_load(path_in("tok.json"), &u, &e), JDT_OK);
    ck_assert_int_eq(jdt_bpe_vocab_size(u), V);
    uint32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0, ca = 0, cb = 0;
    ck_assert_int_eq(jdt_bpe_encode(t, text, n, &a, &na, &ca, &e), JDT_OK);
    ck_assert_int_eq(jdt_bpe_encode(u, text, n, &b, &nb, &cb, &e), JDT_OK);
    ck_assert_uint_eq(na, nb);
    ck_assert(memcmp(a, b, na * sizeof *a) == 0);
    ck_assert(na < n / 3); /* the merges compress the repeated text */
    char *back = jdt_malloc(n);
    ck_assert_uint_eq(jdt_bpe_decode(u, b, nb, back, n), n);
    ck_assert(memcmp(back, text, n) == 0);
    /* vocab too small / too large */
    jdt_bpe *x = NULL;
    ck_assert_int_eq(jdt_bpe_train(text, n, 256, false, &x, &e), JDT_ERR_INVALID);
    ck_assert_ptr_null(x);
    jdt_free(back);
    jdt_free(a);
    jdt_free(b);
    jdt_bpe_free(t);
    jdt_bpe_free(u);
    jdt_free(text);
}
END_TEST

START_TEST(test_roundtrip_bytes)
{
    size_t n;
    char *text = sample_text(&n);
    jdt_bpe *t = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_train(text, n, 350, false, &t, &e), JDT_OK);
    char buf[600], back[600];
    uint32_t *ids = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < 3000; i++) {
        jdt_philox_ctr r = jdt_philox(9, i, 0);
        size_t len = r.v[0] % 512;
        for (size_t k = 0; k < len; k++) {
            jdt_philox_ctr q = jdt_philox(9, i, k + 1);
            /* mostly text bytes, some high bytes that make invalid UTF-8 */
            buf[k] = (q.v[1] & 3) ? text[q.v[0] % n] : (char)(q.v[2] & 0xFF);
        }
        size_t m = 0;
        ck_assert_int_eq(jdt_bpe_encode(t, buf, len, &ids, &m, &cap, &e), JDT_OK);
        for (size_t k = 0; k < m; k++) ck_assert(ids[k] < (uint32_t)jdt_bpe_vocab_size(t));
        ck_assert_uint_eq(jdt_bpe_decode(t, ids, m, back, sizeof back), len);
        ck_assert(memcmp(buf, back, len) == 0);
    }
    jdt_free(ids);
    jdt_bpe_free(t);
    jdt_free(text);
}
END_TEST

START_TEST(test_bad_files)
{
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"model\": {\"type\": \"Unigram\"}}", "model type 'Unigram'"},
        {"{\"pre_tokenizer\": {\"type\": \"Whitespace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
         "pre-tokenizer 'Whitespace'"},
        {"{\"pre_tokenizer\": null, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
         "pre_tokenizer must be ByteLevel"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}",
         "no valid id"},
        {"{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "no token for byte 0x00"},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\", \"use_regex\": false}]}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}",
         "does not compile"},
        {"{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": \"a\"}, \"behavior\": \"Removed\"}]}, \"model\": {\"type\": \"BPE\"}}",
         "behavior 'Removed'"},
        {"{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1}}", "dropout"},
        {"{\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"type\": \"BPE\"}}", "normalizer 'NFKC'"},
        {"[1, 2]", "no \"model\" object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path_in("bad.json"), "w");
        fputs(bad[i].text, f);
        fclose(f);
        jdt_bpe *t = NULL;
        jdt_err e;
        ck_assert_msg(jdt_bpe_load(path_in("bad.json"), &t, &e) != JDT_OK, "case %zu accepted", i);
        ck_assert_ptr_null(t);
        ck_assert_msg(strstr(e.msg, bad[i].msg) && strstr(e.msg, "bad.json"), "case %zu: '%s' lacks '%s'", i,
                      e.msg, bad[i].msg);
        ck_assert_ptr_null(strchr(e.msg, '\n'));
    }
    jdt_bpe *t = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_bpe_load(path_in("missing.json"), &t, &e), JDT_ERR_NOT_FOUND);
    ck_assert_int_eq(jdt_bpe_load(g_dir, &t, &e), JDT_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(e.msg, "vocab.bpe"));
}
END_TEST

START_TEST(test_alloc_failures)
{
    size_t n;
    char *text = sample_text(&n);
    jdt_err e;
    jdt_bpe *t = NULL;
    ck_assert_int_eq(jdt_bpe_train(text, n, 300, false, &t, &e), JDT_OK);
    ck_assert_int_eq(jdt_bpe_save(t, path_in("tok.json"), &e), JDT_OK);
    jdt_bpe_free(t);
    int n_nomem = 0;
    for (long k = 1; k < 80; k++) {
        jdt_bpe *u = NULL;
        jdt_alloc_fail_after(k);
        jdt_status st = jdt_bpe_load(path_in("tok.json"), &u, &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
        if (st == JDT_OK) {
            uint32_t *ids = NULL;
            size_t m = 0, cap = 0;
            jdt_alloc_fail_after(k % 3 + 1);
            st = jdt_bpe_encode(u, text, n, &ids, &m, &cap, &e);
            jdt_alloc_fail_after(0);
            ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
            jdt_free(ids);
        } else {
            ck_assert_ptr_null(u);
            n_nomem++;
        }
        jdt_bpe_free(u);
        jdt_bpe *v = NULL;
        jdt_alloc_fail_after(k);
        st = jdt_bpe_train(text, n, 300, false, &v, &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
        jdt_bpe_free(v);
    }
    ck_assert(n_nomem > 5);
    jdt_free(text);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bpe");
    TCase *tc = tcase_create("bpe");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_json_values);
    tcase_add_test(tc, test_json_strict_errors);
    tcase_add_test(tc, test_merge_order);
    tcase_add_test(tc, test_ignore_merges);
    tcase_add_test(tc, test_train_save_load);
    tcase_add_test(tc, test_roundtrip_bytes);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
