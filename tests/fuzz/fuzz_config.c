/*
 * fuzz_config.c — libFuzzer target: the YAML config loader and key=value overrides
 * (engine/config). Input: YAML text, then NUL-separated overrides (at most 8). Checks, besides
 * ASan/UBSan: every error message is one printable line (no control characters, only
 * well-formed UTF-8: libyaml must accept it) that does not end in ": "; a config
 * that loads writes resolved YAML that loads again (the round trip docs/config.md promises).
 */
#include "config/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_message(const jdt_err *e)
{
    size_t n = strlen(e->msg);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)e->msg[i];
        if (c < 0x20 || c == 0x7f) {
            fprintf(stderr, "control character 0x%02x in error: %s\n", c, e->msg);
            abort();
        }
    }
    for (size_t i = 0; i < n;) { /* well-formed UTF-8 only */
        unsigned char c = (unsigned char)e->msg[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        for (int k = 1; k < len; k++)
            if (i + (size_t)k >= n || ((unsigned char)e->msg[i + k] & 0xc0) != 0x80) len = 0;
        if (len == 0) {
            fprintf(stderr, "byte 0x%02x that is not UTF-8 in error: %s\n", c, e->msg);
            abort();
        }
        i += (size_t)len;
    }
    if (n >= 1 && e->msg[n - 1] == ':') {
        fprintf(stderr, "error ends with an empty detail: %s\n", e->msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0;
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    /* text up to the first NUL; the rest, NUL-separated, are overrides */
    char *ov[8];
    int n_ov = 0;
    size_t first = strlen(buf);
    for (size_t i = first + 1; i < size && n_ov < 8; i += strlen(buf + i) + 1)
        if (buf[i]) ov[n_ov++] = buf + i;
    char *envp[] = {NULL};
    jdt_config cfg;
    jdt_err e;
    memset(&cfg, 0, sizeof cfg);
    jdt_status st = jdt_config_load_string(buf, "fuzz.yaml", n_ov, ov, envp, &cfg, &e);
    if (st != JDT_OK) {
        check_message(&e);
        jdt_config_free(&cfg);
    } else {
        /* round trip: the resolved YAML loads back */
        jdt_config again;
        memset(&again, 0, sizeof again);
        if (jdt_config_load_string(cfg.resolved_yaml, "resolved.yaml", 0, NULL, envp, &again,
                                   &e) != JDT_OK) {
            fprintf(stderr, "resolved config does not load back: %s\n---\n%s\n", e.msg,
                    cfg.resolved_yaml);
            abort();
        }
        jdt_config_free(&again);
        jdt_config_free(&cfg);
    }
    free(buf);
    return 0;
}
