/*
 * agree.c — every rank of a job must run the same job: the same jdt-train version and the same
 * value of every key that shapes the computation, the data order or the checkpoints. A rank
 * started with another learning rate, batch size or mesh would otherwise train silently on a
 * different program (or hang in a collective the others never call).
 *
 * Rank 0 publishes its resolved config (the YAML every run directory keeps) in the
 * coordinator's KV store; every other rank reads it, parses it with its own schema and compares
 * it with its own resolved config, key by key, skipping the keys each process may set for
 * itself (jdt_config_key_per_process: input paths, caches, threads, the compiler, logging,
 * dist.*). A rank that differs fails with one line naming the first differing key and both
 * values; the caller then aborts the job with that line, so every rank reports it.
 */
#include "world/world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_CHUNK 60000 /* under the KV store's 64 KiB value limit */

/* Rank 0's resolved YAML, published in chunks: "config.n" holds the chunk count as text. */
static jdt_status publish(jdt_dist *d, const char *yaml, jdt_err *e)
{
    size_t len = strlen(yaml), n = (len + KV_CHUNK - 1) / KV_CHUNK;
    char key[32], count[32];
    for (size_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "config.%zu", i);
        size_t m = len - i * KV_CHUNK < KV_CHUNK ? len - i * KV_CHUNK : KV_CHUNK;
        jdt_status st = jdt_dist_kv_set(d, key, yaml + i * KV_CHUNK, m, e);
        if (st) return st;
    }
    snprintf(count, sizeof count, "%zu", n);
    return jdt_dist_kv_set(d, "config.n", count, strlen(count), e); /* last: readers wait on it */
}

/* Reads rank 0's YAML back (jdt_malloc'd, NUL-terminated, into *out). */
static jdt_status fetch(jdt_dist *d, double timeout_s, char **out, jdt_err *e)
{
    *out = NULL;
    void *v = NULL;
    size_t vn = 0;
    jdt_status st = jdt_dist_kv_get(d, "config.n", timeout_s, &v, &vn, e);
    if (st) return st;
    char count[32];
    snprintf(count, sizeof count, "%.*s", (int)(vn < 31 ? vn : 31), (const char *)v);
    jdt_free(v);
    char *end;
    unsigned long n = strtoul(count, &end, 10);
    if (*end || n == 0 || n > 1024)
        return jdt_err_set(e, JDT_ERR_PROTOCOL, "rank 0's config: malformed chunk count '%s'",
                           count);
    char *text = jdt_malloc(n * KV_CHUNK + 1);
    if (!text) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory reading rank 0's config");
    size_t len = 0;
    for (unsigned long i = 0; i < n && st == JDT_OK; i++) {
        char key[32];
        snprintf(key, sizeof key, "config.%lu", i);
        if ((st = jdt_dist_kv_get(d, key, 0, &v, &vn, e))) break;
        if (vn > KV_CHUNK || memchr(v, '\0', vn))
            st = jdt_err_set(e, JDT_ERR_PROTOCOL, "rank 0's config: malformed chunk %lu", i);
        else
            memcpy(text + len, v, vn);
        len += vn;
        jdt_free(v);
    }
    if (st) {
        jdt_free(text);
        return st;
    }
    text[len] = '\0';
    *out = text;
    return JDT_OK;
}

/* The first line of a resolved YAML: "# resolved by jdt-train <version>". */
static void version_line(const char *yaml, char *buf, size_t n)
{
    size_t l = strcspn(yaml, "\n");
    snprintf(buf, n, "%.*s", (int)(l < n - 1 ? l : n - 1), yaml);
}

jdt_status jdt_world_agree(jdt_dist *d, const jdt_config *cfg, jdt_err *e)
{
    if (!d) return JDT_OK;
    int rank = jdt_dist_rank(d);
    if (!cfg->resolved_yaml)
        return jdt_err_set(e, JDT_ERR_INVALID, "rank %d: the config has no resolved text", rank);
    if (rank == 0) {
        jdt_status st = publish(d, cfg->resolved_yaml, e);
        return st ? jdt_err_prefix(e, "rank 0: publishing the config") : JDT_OK;
    }
    char *theirs = NULL;
    jdt_status st = fetch(d, cfg->dist.connect_timeout_s, &theirs, e);
    if (st) return jdt_err_prefix(e, "rank %d: reading rank 0's config", rank);
    char v0[128], v1[128];
    version_line(theirs, v0, sizeof v0);
    version_line(cfg->resolved_yaml, v1, sizeof v1);
    if (strcmp(v0, v1) != 0) {
        st = jdt_err_set(e, JDT_ERR_CONFIG,
                         "rank %d runs another jdt-train than rank 0 ('%s' here, '%s' on rank 0): "
                         "every rank must run the same build",
                         rank, v1 + (v1[0] == '#' ? 2 : 0), v0 + (v0[0] == '#' ? 2 : 0));
        jdt_free(theirs);
        return st;
    }
    jdt_config c0;
    jdt_err e2;
    jdt_err_clear(&e2);
    st = jdt_config_load_string(theirs, "rank 0's config", 0, NULL, NULL, &c0, &e2);
    jdt_free(theirs);
    if (st)
        return jdt_err_set(e, st == JDT_ERR_NOMEM ? st : JDT_ERR_CONFIG,
                           "rank %d cannot read rank 0's resolved config (%s)", rank, e2.msg);
    /* against this rank's own config: what the run resolved since loading it (runtime.threads,
     * dist.local_rank, run.profile from --profile) is per-process, skipped */
    const jdt_config_key *k = jdt_config_first_difference(cfg, &c0, true);
    if (k) {
        char here[96], there[96];
        jdt_config_value_text(k, cfg, here, sizeof here);
        jdt_config_value_text(k, &c0, there, sizeof there);
        st = jdt_err_set(e, JDT_ERR_CONFIG,
                         "rank %d's config differs from rank 0's: %s is %s here, %s on rank 0 "
                         "(every rank must run the same job; only input paths, caches, threads, "
                         "the compiler, logging and dist.* may differ)",
                         rank, k->path, here, there);
    }
    jdt_config_free(&c0);
    return st;
}
