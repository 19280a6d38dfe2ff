/*
 * check_safetensors.c — unit tests for engine/io/safetensors.h: write -> read identity, the
 * on-disk layout (header length, 8-byte padding, sorted packed data), F16/BF16 reading, and
 * one clear error for every kind of broken file (short, header length past the end, bad JSON,
 * gaps/overlaps, offsets disagreeing with the shape, truncated data, unknown dtype).
 */
#include "core/core.h"
#include "io/safetensors.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char g_dir[256];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/jdt-check-st.XXXXXX");
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

START_TEST(test_roundtrip_layout)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1.5f, 0, 1e30f};
    jdt_st_tensor t[2] = {{.name = "z.w", .ndim = 2, .shape = {2, 3}, .data = a},
                          {.name = "a.b", .ndim = 1, .shape = {3}, .data = b}};
    const char *meta[] = {"format", "pt"};
    jdt_err e;
    ck_assert_int_eq(jdt_st_write(path_in("m.safetensors"), t, 2, meta, 1, &e), JDT_OK);
    FILE *f = fopen(path_in("m.safetensors"), "rb");
    unsigned char len8[8];
    ck_assert_int_eq((int)fread(len8, 1, 8, f), 8);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)len8[i] << (8 * i);
    ck_assert_uint_eq(hl % 8, 0);
    char hdr[512];
    ck_assert(hl < sizeof hdr);
    ck_assert_uint_eq(fread(hdr, 1, hl, f), hl);
    hdr[hl] = 0;
    /* sorted by name: a.b first at offset 0 */
    ck_assert_ptr_nonnull(strstr(hdr, "\"a.b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}"));
    ck_assert_ptr_nonnull(strstr(hdr, "\"z.w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[12,36]}"));
    ck_assert_ptr_nonnull(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}"));
    fclose(f);
    jdt_st_file *sf = NULL;
    ck_assert_int_eq(jdt_st_open(path_in("m.safetensors"), &sf, &e), JDT_OK);
    ck_assert_int_eq(jdt_st_count(sf), 2);
    int i = jdt_st_find(sf, "z.w");
    ck_assert_int_ge(i, 0);
    jdt_st_tensor info = jdt_st_info(sf, i);
    ck_assert_int_eq(info.ndim, 2);
    ck_assert_int_eq((int)info.shape[1], 3);
    float got[6];
    ck_assert_int_eq(jdt_st_read(sf, i, got, &e), JDT_OK);
    ck_assert(memcmp(got, a, sizeof a) == 0);
    ck_assert_int_eq(jdt_st_read(sf, jdt_st_find(sf, "a.b"), got, &e), JDT_OK);
    ck_assert(memcmp(got, b, sizeof b) == 0);
    ck_assert_int_eq(jdt_st_find(sf, "nope"), -1);
    jdt_st_close(sf);
    /* duplicate names are refused */
    t[1].name = "z.w";
    ck_assert_int_eq(jdt_st_write(path_in("d.safetensors"), t, 2, NULL, 0, &e), JDT_ERR_INVALID);
}
END_TEST

/* Writes a file with the given header text and n_data bytes of data. */
static void write_raw(const char *name, const char *hdr, const void *data, size_t n_data, long hl_override)
{
    FILE *f = fopen(path_in(name), "wb");
    uint64_t hl = hl_override >= 0 ? (uint64_t)hl_override : strlen(hdr);
    for (int i = 0; i < 8; i++) fputc((int)((hl >> (8 * i)) & 0xFF), f);
    fputs(hdr, f);
    if (n_data) fwrite(data, 1, n_data, f);
    fclose(f);
}

START_TEST(test_half_types)
{
    /* F16: 1.0 = 0x3C00, -2.0 = 0xC000, 0.5 = 0x3800, 2^-24 = 0x0001 (subnormal);
     * BF16: 1.0 = 0x3F80, -3.0 = 0xC040 */
    uint16_t d[6] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x3F80, 0xC040};
    write_raw("h.safetensors",
              "{\"h\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
              d, sizeof d, -1);
    jdt_st_file *sf = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_st_open(path_in("h.safetensors"), &sf, &e), JDT_OK);
    float out[4];
    ck_assert_int_eq(jdt_st_read(sf, jdt_st_find(sf, "h"), out, &e), JDT_OK);
    ck_assert(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f && out[3] == 0x1p-24f);
    ck_assert_int_eq(jdt_st_read(sf, jdt_st_find(sf, "b"), out, &e), JDT_OK);
    ck_assert(out[0] == 1.0f && out[1] == -3.0f);
    jdt_st_close(sf);
}
END_TEST

START_TEST(test_bad_files)
{
    float d[4] = {0};
    static const struct {
        const char *hdr;
        size_t n_data;
        long hl;
        const char *msg;
    } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, 4096, "does not fit the file"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, -1, "unexpected end of input"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, -1, "gap or overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, -1, "shape x dtype needs 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, -1, "truncated"},
        {"{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, -1, "dtype I64"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, -1, "data_offsets"},
        {"[1, 2]", 0, -1, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_raw("bad.safetensors", bad[i].hdr, d, bad[i].n_data, bad[i].hl);
        jdt_st_file *sf = NULL;
        jdt_err e;
        ck_assert_msg(jdt_st_open(path_in("bad.safetensors"), &sf, &e) != JDT_OK, "case %zu accepted", i);
        ck_assert_ptr_null(sf);
        ck_assert_msg(strstr(e.msg, bad[i].msg) && strstr(e.msg, "bad.safetensors"), "case %zu: '%s' lacks '%s'",
                      i, e.msg, bad[i].msg);
    }
    FILE *f = fopen(path_in("short.safetensors"), "wb");
    fputs("abc", f);
    fclose(f);
    jdt_st_file *sf = NULL;
    jdt_err e;
    ck_assert_int_eq(jdt_st_open(path_in("short.safetensors"), &sf, &e), JDT_ERR_FORMAT);
    ck_assert_int_eq(jdt_st_open(path_in("missing.safetensors"), &sf, &e), JDT_ERR_NOT_FOUND);
}
END_TEST

START_TEST(test_alloc_failures)
{
    float a[6] = {1, 2, 3, 4, 5, 6};
    jdt_st_tensor t[1] = {{.name = "w", .ndim = 2, .shape = {2, 3}, .data = a}};
    jdt_err e;
    ck_assert_int_eq(jdt_st_write(path_in("m.safetensors"), t, 1, NULL, 0, &e), JDT_OK);
    for (long k = 1; k < 20; k++) {
        jdt_st_file *sf = NULL;
        jdt_alloc_fail_after(k);
        jdt_status st = jdt_st_open(path_in("m.safetensors"), &sf, &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
        if (st) ck_assert_ptr_null(sf);
        jdt_st_close(sf);
        jdt_alloc_fail_after(k);
        st = jdt_st_write(path_in("w.safetensors"), t, 1, NULL, 0, &e);
        jdt_alloc_fail_after(0);
        ck_assert(st == JDT_OK || st == JDT_ERR_NOMEM);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("safetensors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_roundtrip_layout);
    tcase_add_test(tc, test_half_types);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_alloc_failures);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
