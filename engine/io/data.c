/*
 * data.c — streaming batches from token and array datasets (see data.h, docs/data.md).
 *
 * A dataset is a list of shards (one file, or a directory's *.h5 files in name order) that
 * together form one logical array of "units": tokens, or rows. A batch is computed from its
 * global index alone: global sequence g = k*B + j maps to a sample (window or row) through a
 * per-epoch keyed Feistel permutation (or the identity in sequential mode), and each sample's
 * unit range is read as one hyperslab per shard it touches; runs of consecutive samples are
 * merged into one read. Open shards are kept in a small LRU cache so a directory of thousands
 * of files does not exhaust file descriptors; the cache holds every shard when the descriptor
 * limit allows (a quarter of RLIMIT_NOFILE, 16..256), because reopening an HDF5 file per
 * shuffled window made the loader 10-60x slower over 32 shards (docs/perf.md).
 *
 * Prefetch: one worker thread fills a ring of depth+1 slots with batches want..want+depth-1
 * while the caller holds the slot of batch want-1. Asking for a batch out of order bumps a
 * generation counter, which discards in-flight work and restarts the worker at that batch.
 */
#include "io/data.h"
#include "io/fetch.h"
#include "io/io-impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zlib.h>

enum { MIN_OPEN_SHARDS = 16, MAX_OPEN_SHARDS = 256, MAX_PREFETCH = 64 };
/* Chunk cache of compressed datasets: 8 MiB each, at most this much over all open shards. */
#define CHUNK_CACHE_MAX (8u << 20)
#define CHUNK_CACHE_TOTAL (256u << 20)

typedef struct {
    char *path;
    int64_t n_units; /* tokens or rows in this shard */
    int64_t start;   /* index of its first unit in the logical stream */
    hid_t file;      /* open handles, or H5I_INVALID_HID when evicted from the cache */
    hid_t dx;        /* /tokens or /x */
    hid_t dy;        /* /y (arrays) */
    uint64_t last_use;
    bool pending; /* remote shard laid out from its manifest, not yet fetched and validated */
} shard;

typedef struct {
    int64_t k; /* batch held, -1 if none */
    uint64_t gen;
    jdt_status st;
    jdt_err err;
    void *x;    /* (rows, x_cols) */
    int32_t *y; /* (rows, y_cols) */
} slot;

struct jdt_data {
    char *path;
    jdt_data_opts o; /* path and split point to our copies */
    jdt_data_info info;
    int64_t rows; /* row_end - row_begin */
    uint64_t perm_key;
    jdt_remote *remote; /* path is a URL: the shards are downloaded into the cache (fetch.h) */

    /* I/O state, guarded by io_lock (the prefetcher and read_rows callers share it). */
    pthread_mutex_t io_lock;
    shard *shards; /* (n_shards) */
    int64_t n_shards;
    int n_open;
    int max_open;             /* shard files kept open at once (LRU beyond) */
    size_t chunk_cache_bytes; /* per compressed dataset */
    uint64_t tick;
    int64_t scratch_rows; /* rows the sample/scratch/raw buffers hold */
    int32_t *scratch;     /* token runs: (rows*T + 1) */
    void *raw;            /* the same run in the on-disk integer type (u16 or u32) */
    int64_t *sample;      /* (rows) sample index per row */

    /* synchronous mode buffers */
    void *sx;
    int32_t *sy;

    /* prefetch */
    bool threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    slot *slots; /* (depth + 1) */
    int n_slots;
    int64_t want;      /* next batch the caller will ask for */
    int64_t fill_next; /* next batch the worker fills */
    uint64_t gen;
    bool stop;
};

/* ---- permutation ------------------------------------------------------------------------ */

/* One balanced Feistel network on [0, 2^(2*half)) keyed by key; cycle-walking restricts it to
 * a bijection on [0, n). The domain is < 4n, so the expected number of walks is < 4. */
static uint64_t feistel_perm(uint64_t key, uint64_t n, uint64_t i)
{
    if (n <= 1) return 0;
    int bits = 0;
    while (bits < 64 && (1ULL << bits) < n)
        bits++;
    if (bits & 1) bits++;
    int half = bits / 2;
    uint64_t mask = (1ULL << half) - 1;
    uint64_t x = i;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 6; round++) {
            jdt_philox_ctr f = jdt_philox(key, round, r);
            uint64_t fr = (((uint64_t)f.v[1] << 32) | f.v[0]) & mask;
            uint64_t nl = r;
            r = l ^ fr;
            l = nl;
        }
        x = (l << half) | r;
    } while (x >= n);
    return x;
}

int64_t jdt_data_sample_index(const jdt_data *d, int64_t k, int64_t j)
{
    uint64_t n = (uint64_t)d->info.n_samples;
    uint64_t g = (uint64_t)k * (uint64_t)d->o.global_batch + (uint64_t)j;
    uint64_t epoch = g / n, pos = g % n;
    if (!d->o.shuffle) return (int64_t)pos;
    jdt_philox_ctr ek = jdt_philox(d->perm_key, 0x45504f43ULL /* "EPOC" */, epoch);
    uint64_t key = ((uint64_t)ek.v[1] << 32) | ek.v[0];
    return (int64_t)feistel_perm(key, n, pos);
}

/* ---- shards ------------------------------------------------------------------------------ */

static void shard_close(jdt_data *d, shard *s)
{
    if (s->file < 0) return;
    if (s->dy >= 0) H5Dclose(s->dy);
    if (s->dx >= 0) H5Dclose(s->dx);
    H5Fclose(s->file);
    s->file = s->dx = s->dy = H5I_INVALID_HID;
    d->n_open--;
}

/* Opens a dataset with a clear error if it is missing. */
static hid_t open_dset(hid_t f, const char *name, size_t cache_bytes, const char *path, jdt_err *e)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: missing dataset /%s", path, name);
        return H5I_INVALID_HID;
    }
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) {
        char dd[256];
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot open dataset /%s: %s", path, name,
                    jdt_h5_detail(dd, sizeof dd));
        return ds;
    }
    /* Uncompressed chunks: no chunk cache, so a window read copies just its bytes instead of
     * pulling whole chunks through the cache (6x faster for shuffled windows). Compressed
     * chunks keep a larger cache: decompressing a chunk is the expensive part. */
    hid_t dcpl = H5Dget_create_plist(ds);
    int n_filters = dcpl >= 0 ? H5Pget_nfilters(dcpl) : 0;
    if (dcpl >= 0) H5Pclose(dcpl);
    /* a dataset opened twice shares its first opening's cache: close before reopening */
    H5Dclose(ds);
    hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (dapl < 0 || H5Pset_chunk_cache(dapl, 521, n_filters > 0 ? cache_bytes : 0, 0.75) < 0) {
        if (dapl >= 0) H5Pclose(dapl);
        dapl = H5P_DEFAULT;
    }
    ds = H5Dopen2(f, name, dapl);
    if (ds < 0) {
        char dd[256];
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot open dataset /%s: %s", path, name,
                    jdt_h5_detail(dd, sizeof dd));
    }
    if (dapl != H5P_DEFAULT) H5Pclose(dapl);
    return ds;
}

/* Checks a dataset's rank and element type; fills dims (up to 2). */
static jdt_status check_dset(hid_t ds, const char *name, int want_rank, jdt_dtype want_dt,
                             hsize_t *dims, const char *path, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t sp = H5Dget_space(ds), t = H5Dget_type(ds);
    jdt_dtype dt;
    if (sp < 0 || t < 0) {
        char dd[256];
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: dataset /%s unreadable: %s", path, name,
                         jdt_h5_detail(dd, sizeof dd));
        goto out;
    }
    int rank = H5Sget_simple_extent_ndims(sp);
    if (rank != want_rank) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: dataset /%s has %d dimensions, expected %d", path,
                         name, rank, want_rank);
        goto out;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    if (!jdt_h5_classify(t, &dt) || dt != want_dt) {
        bool known = jdt_h5_classify(t, &dt);
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: dataset /%s has element type %s, expected %s",
                         path, name, known ? jdt_dtype_name(dt) : "(unsupported)",
                         jdt_dtype_name(want_dt));
        goto out;
    }
out:
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

/* Reads dataset ds (rank 1 or 2, n_rows rows of row_elems elements of dt) in blocks and
 * continues the CRC-32 *crc over its little-endian bytes. */
static jdt_status crc_dataset(hid_t ds, jdt_dtype dt, int rank, int64_t n_rows, int64_t row_elems,
                              uLong *crc, const char *path, const char *name, jdt_err *e)
{
    size_t esz = jdt_dtype_size(dt);
    int64_t rows_per = (int64_t)((4u << 20) / (esz * (size_t)row_elems));
    if (rows_per < 1) rows_per = 1;
    void *buf = jdt_malloc((size_t)rows_per * (size_t)row_elems * esz);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: checksum: out of memory", path);
    jdt_status st = JDT_OK;
    for (int64_t r = 0; r < n_rows && st == JDT_OK; r += rows_per) {
        int64_t nr = n_rows - r < rows_per ? n_rows - r : rows_per;
        hsize_t start[2] = {(hsize_t)r, 0}, count[2] = {(hsize_t)nr, (hsize_t)row_elems};
        hid_t fs = H5Dget_space(ds), ms = H5Screate_simple(rank, count, NULL);
        if (fs < 0 || ms < 0 ||
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
            H5Dread(ds, jdt_h5_mem_type(dt), ms, fs, H5P_DEFAULT, buf) < 0) {
            char dd[256];
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: reading /%s: %s", path, name,
                             jdt_h5_detail(dd, sizeof dd));
        } else {
            *crc = crc32_z(*crc, buf, (size_t)nr * (size_t)row_elems * esz);
        }
        if (ms >= 0) H5Sclose(ms);
        if (fs >= 0) H5Sclose(fs);
    }
    jdt_free(buf);
    return st;
}

/* Checks the shard's recorded CRC-32 (if it has one) against its data: every byte is read
 * once, when the dataset is opened. Files written before checksums existed pass unchecked. */
static jdt_status verify_crc(const shard *s, jdt_data_kind kind, jdt_dtype token_dt,
                             const hsize_t *dims, jdt_err *e)
{
    if (!jdt_h5_has_attr(s->file, JDT_DATA_CRC_ATTR)) return JDT_OK;
    int64_t want;
    jdt_status st = jdt_h5_attr_read_i64(s->file, JDT_DATA_CRC_ATTR, &want, s->path, e);
    if (st != JDT_OK) return st;
    uLong crc = crc32(0L, Z_NULL, 0);
    if (kind == JDT_DATA_KIND_TOKENS) {
        st = crc_dataset(s->dx, token_dt, 1, (int64_t)dims[0], 1, &crc, s->path, "tokens", e);
    } else {
        st = crc_dataset(s->dx, JDT_DTYPE_F32, 2, (int64_t)dims[0], (int64_t)dims[1], &crc, s->path,
                         "x", e);
        if (st == JDT_OK)
            st = crc_dataset(s->dy, JDT_DTYPE_I32, 1, (int64_t)dims[0], 1, &crc, s->path, "y", e);
    }
    if (st != JDT_OK) return st;
    if ((int64_t)(uint32_t)crc != want)
        return jdt_err_set(e, JDT_ERR_FORMAT,
                           "%s: the data fails its checksum (crc32 %08lx, recorded %08llx): "
                           "the file is damaged; re-run prepare or restore it",
                           s->path, (unsigned long)crc, (unsigned long long)want);
    return JDT_OK;
}

/* Labels of array data lie in [0, label_bound): the model's class count when the caller gave
 * one, else the files' n_classes attribute (0: unchecked). */
static int64_t label_bound(const jdt_data *d)
{
    return d->o.n_classes > 0 ? d->o.n_classes : d->info.n_classes;
}

/* Checks that every label of the shard's /y (n_rows) lies in [0, n_classes), reading it in
 * blocks: a bad label is an error naming the file at open, not a failure at whatever step
 * first draws its row. n_classes 0: unchecked. */
static jdt_status check_labels(const shard *s, int64_t n_rows, int64_t n_classes, jdt_err *e)
{
    if (n_classes <= 0) return JDT_OK;
    const int64_t rows_per = n_rows < (1 << 20) ? n_rows : (1 << 20);
    int32_t *buf = jdt_malloc((size_t)rows_per * sizeof *buf);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: checking labels: out of memory", s->path);
    jdt_status st = JDT_OK;
    for (int64_t r = 0; r < n_rows && st == JDT_OK; r += rows_per) {
        int64_t nr = n_rows - r < rows_per ? n_rows - r : rows_per;
        hsize_t start[1] = {(hsize_t)r}, count[1] = {(hsize_t)nr};
        hid_t fs = H5Dget_space(s->dy), ms = H5Screate_simple(1, count, NULL);
        if (fs < 0 || ms < 0 ||
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
            H5Dread(s->dy, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, buf) < 0) {
            char dd[256];
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: reading /y: %s", s->path,
                             jdt_h5_detail(dd, sizeof dd));
        }
        for (int64_t i = 0; i < nr && st == JDT_OK; i++) {
            if (buf[i] < 0 || buf[i] >= n_classes)
                st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: /y[%lld] = %d is outside [0, %lld)",
                                 s->path, (long long)(r + i), buf[i], (long long)n_classes);
        }
        if (ms >= 0) H5Sclose(ms);
        if (fs >= 0) H5Sclose(fs);
    }
    jdt_free(buf);
    return st;
}

/* An optional count attribute of file p (n_rows, dim) against the datasets' count: absent is
 * fine, another value is ERR_FORMAT naming it ("attribute dim is 100 but /x has 784 columns"). */
static jdt_status check_count_attr(hid_t f, const char *name, hsize_t count, const char *holder,
                                   const char *unit, const char *p, jdt_err *e)
{
    if (!jdt_h5_has_attr(f, name)) return JDT_OK;
    int64_t v;
    jdt_status st = jdt_h5_attr_read_i64(f, name, &v, p, e);
    if (st != JDT_OK) return st;
    if (v == (int64_t)count) return JDT_OK;
    return jdt_err_set(e, JDT_ERR_FORMAT, "%s: attribute %s is %lld but %s %llu %s", p, name,
                       (long long)v, holder, (unsigned long long)count, unit);
}

/* Opens shard s (if needed) and validates it against the dataset so far. `first`: s is the
 * first shard, so it sets info's kind, vocab, tokenizer, dim. */
static jdt_status shard_open(jdt_data *d, shard *s, bool validate, bool first, jdt_err *e)
{
    if (s->file >= 0) {
        s->last_use = ++d->tick;
        return JDT_OK;
    }
    if (d->n_open >= d->max_open) {
        shard *lru = NULL;
        for (int64_t i = 0; i < d->n_shards; i++) {
            shard *c = &d->shards[i];
            if (c->file >= 0 && (!lru || c->last_use < lru->last_use)) lru = c;
        }
        if (lru) shard_close(d, lru);
    }
    jdt_status st = JDT_OK;
    char *format = NULL, *tokenizer = NULL;
    const char *p = s->path;
    /* small sieve: a shuffled window read fetches its own bytes, not 64 KiB around them */
    hid_t f = jdt_h5_open_ro(p, 4096, e);
    size_t np = strlen(p);
    if (f < 0 && e && e->code == JDT_ERR_FORMAT && np > 4 && !strcmp(p + np - 4, ".bin"))
        return jdt_err_set(e, JDT_ERR_FORMAT,
                           "%s: not an HDF5 file; llm.c's and nanoGPT's .bin token files are "
                           "imported first: `jdt-train prepare` with data.source naming them "
                           "(docs/data.md)",
                           p);
    if (f < 0) return e ? e->code : JDT_ERR_FORMAT;
    s->file = f;
    d->n_open++;
    s->last_use = ++d->tick;
    if (!validate) {
        /* re-open of a validated shard: just the handles */
        bool tokens = d->info.kind == JDT_DATA_KIND_TOKENS;
        s->dx = open_dset(f, tokens ? "tokens" : "x", d->chunk_cache_bytes, p, e);
        if (s->dx < 0) goto fail;
        if (!tokens && (s->dy = open_dset(f, "y", d->chunk_cache_bytes, p, e)) < 0) goto fail;
        /* the file may have been replaced since it was validated (a re-run of prepare) */
        hsize_t now[2] = {0, 0};
        hid_t sp = H5Dget_space(s->dx);
        int rank = sp >= 0 ? H5Sget_simple_extent_dims(sp, now, NULL) : -1;
        if (sp >= 0) H5Sclose(sp);
        if (rank < 1 || (int64_t)now[0] != s->n_units) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: /%s changed since the dataset was opened "
                             "(%lld -> %llu); was it re-prepared during the run?",
                             p, tokens ? "tokens" : "x", (long long)s->n_units,
                             (unsigned long long)now[0]);
            goto fail;
        }
        return JDT_OK;
    }
    if (!jdt_h5_has_attr(f, "format")) { /* an HDF5 file of someone else's: say what ours holds */
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: not a jdt dataset (no 'format' attribute): a token file holds 1-D "
                         "/tokens with the attributes format 'jdt-tokens', version, vocab_size, "
                         "tokenizer, n_tokens (docs/data.md); `jdt-train prepare` writes them",
                         p);
        goto fail;
    }
    if ((st = jdt_h5_attr_read_str(f, "format", &format, p, e))) goto fail;
    jdt_data_kind kind;
    if (strcmp(format, JDT_DATA_FORMAT_TOKENS) == 0)
        kind = JDT_DATA_KIND_TOKENS;
    else if (strcmp(format, JDT_DATA_FORMAT_ARRAYS) == 0)
        kind = JDT_DATA_KIND_ARRAYS;
    else {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: format '%s' is not '%s' or '%s'", p, format,
                         JDT_DATA_FORMAT_TOKENS, JDT_DATA_FORMAT_ARRAYS);
        goto fail;
    }
    jdt_data_kind want = first ? d->o.kind : d->info.kind;
    if (want != JDT_DATA_KIND_AUTO && want != kind) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: format is '%s' but a %s dataset was expected", p,
                         format, want == JDT_DATA_KIND_TOKENS ? "token" : "array");
        goto fail;
    }
    if (first) d->info.kind = kind;
    int64_t version;
    if ((st = jdt_h5_attr_read_i64(f, "version", &version, p, e))) goto fail;
    if (version != JDT_DATA_VERSION) {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: format version %lld is not supported (this "
                         "build reads version %d); re-run prepare",
                         p, (long long)version, JDT_DATA_VERSION);
        goto fail;
    }
    hsize_t dims[2] = {0, 0};
    if (kind == JDT_DATA_KIND_TOKENS) {
        int64_t vocab, n_tokens;
        if ((st = jdt_h5_attr_read_i64(f, "vocab_size", &vocab, p, e)) ||
            (st = jdt_h5_attr_read_i64(f, "n_tokens", &n_tokens, p, e)) ||
            (st = jdt_h5_attr_read_str(f, "tokenizer", &tokenizer, p, e)))
            goto fail;
        if (vocab < 1 || vocab > (1LL << 31)) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: vocab_size %lld out of range", p,
                             (long long)vocab);
            goto fail;
        }
        jdt_dtype dt = vocab <= 65536 ? JDT_DTYPE_U16 : JDT_DTYPE_U32;
        if (first) {
            d->info.vocab_size = vocab;
            d->info.token_dtype = dt;
            snprintf(d->info.tokenizer, sizeof d->info.tokenizer, "%s", tokenizer);
        } else if (vocab != d->info.vocab_size || strcmp(tokenizer, d->info.tokenizer) != 0) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: vocab_size %lld / tokenizer '%s' differ from "
                             "the first shard's (%lld / '%s')",
                             p, (long long)vocab, tokenizer, (long long)d->info.vocab_size,
                             d->info.tokenizer);
            goto fail;
        }
        if ((s->dx = open_dset(f, "tokens", d->chunk_cache_bytes, p, e)) < 0) goto fail;
        if ((st = check_dset(s->dx, "tokens", 1, dt, dims, p, e))) goto fail;
        if ((int64_t)dims[0] != n_tokens) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: /tokens holds %llu tokens but attribute "
                             "n_tokens says %lld",
                             p, (unsigned long long)dims[0], (long long)n_tokens);
            goto fail;
        }
    } else {
        hsize_t ydims[2] = {0, 0};
        if ((s->dx = open_dset(f, "x", d->chunk_cache_bytes, p, e)) < 0) goto fail;
        if ((st = check_dset(s->dx, "x", 2, JDT_DTYPE_F32, dims, p, e))) goto fail;
        if ((s->dy = open_dset(f, "y", d->chunk_cache_bytes, p, e)) < 0) goto fail;
        if ((st = check_dset(s->dy, "y", 1, JDT_DTYPE_I32, ydims, p, e))) goto fail;
        if (ydims[0] != dims[0]) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: /x has %llu rows but /y has %llu", p,
                             (unsigned long long)dims[0], (unsigned long long)ydims[0]);
            goto fail;
        }
        /* The shape attributes must describe the datasets, and n_classes the labels and the
         * model: a file that disagrees is refused here, naming the attribute, instead of
         * training on it or failing at some later step without the file's name. An absent
         * n_rows or dim is not required (/x and /y say it). */
        int64_t n_classes = 0;
        if ((st = check_count_attr(f, "n_rows", dims[0], "/x and /y hold", "rows", p, e)) ||
            (st = check_count_attr(f, "dim", dims[1], "/x has", "columns", p, e)))
            goto fail;
        if (jdt_h5_has_attr(f, "n_classes") &&
            (st = jdt_h5_attr_read_i64(f, "n_classes", &n_classes, p, e)))
            goto fail;
        if (n_classes < 0 || n_classes > (1LL << 31)) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: attribute n_classes is %lld; expected 1 to 2^31 classes "
                             "(or 0: labels unchecked)",
                             p, (long long)n_classes);
            goto fail;
        }
        if (d->o.n_classes > 0 && n_classes > 0 && n_classes != d->o.n_classes) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: attribute n_classes is %lld but the model has %lld classes", p,
                             (long long)n_classes, (long long)d->o.n_classes);
            goto fail;
        }
        if (first) {
            d->info.dim = (int64_t)dims[1];
            d->info.n_classes = n_classes;
        } else if ((int64_t)dims[1] != d->info.dim || n_classes != d->info.n_classes) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: /x is (%llu, %llu) with n_classes %lld; the "
                             "first shard has dim %lld, n_classes %lld",
                             p, (unsigned long long)dims[0], (unsigned long long)dims[1],
                             (long long)n_classes, (long long)d->info.dim,
                             (long long)d->info.n_classes);
            goto fail;
        }
        if (dims[1] == 0) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: dataset /x has zero columns", p);
            goto fail;
        }
    }
    if (dims[0] == 0) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: dataset /%s is empty", p,
                         kind == JDT_DATA_KIND_TOKENS ? "tokens" : "x");
        goto fail;
    }
    if ((st = verify_crc(s, kind, d->info.token_dtype, dims, e))) goto fail;
    if (kind == JDT_DATA_KIND_ARRAYS && (st = check_labels(s, (int64_t)dims[0], label_bound(d), e)))
        goto fail;
    s->n_units = (int64_t)dims[0];
    jdt_free(format);
    jdt_free(tokenizer);
    return JDT_OK;
fail:
    if (st == JDT_OK) st = e ? e->code : JDT_ERR_FORMAT;
    jdt_free(format);
    jdt_free(tokenizer);
    shard_close(d, s);
    return st;
}

/* A remote shard laid out from the manifest: waits until it is downloaded (the caller's wait
 * for it counts as data wait), then validates it like a local shard and checks that it holds
 * the number of units the manifest promised. io_lock held. */
static jdt_status remote_shard_ready(jdt_data *d, int64_t i, jdt_err *e)
{
    shard *s = &d->shards[i];
    int64_t want = s->n_units;
    jdt_status st = jdt_remote_wait(d->remote, i, e);
    if (st != JDT_OK) return st;
    if ((st = shard_open(d, s, true, false, e)) != JDT_OK)
        return jdt_err_prefix(e, "%s", jdt_remote_list(d->remote)->items[i].url);
    if (s->n_units != want) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: holds %lld %s but the manifest says %lld",
                         jdt_remote_list(d->remote)->items[i].url, (long long)s->n_units,
                         d->info.kind == JDT_DATA_KIND_TOKENS ? "tokens" : "rows", (long long)want);
        s->n_units = want;
        return st;
    }
    s->pending = false;
    return JDT_OK;
}

/* Reads units [a, b) of the logical stream (dataset x or y) into dst, converting to mem_type.
 * unit_elems: elements per unit in dst (D for /x of arrays, else 1). io_lock held. */
static jdt_status read_units(jdt_data *d, bool y, int64_t a, int64_t b, hid_t mem_type,
                             size_t elem_size, int64_t unit_elems, void *dst, jdt_err *e)
{
    /* binary search for the shard holding unit a */
    int64_t lo = 0, hi = d->n_shards - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (d->shards[mid].start <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    char *out = dst;
    for (int64_t i = lo; a < b && i < d->n_shards; i++) {
        shard *s = &d->shards[i];
        int64_t s_end = s->start + s->n_units;
        if (a >= s_end) continue;
        int64_t c_end = b < s_end ? b : s_end;
        jdt_status st =
            s->pending ? remote_shard_ready(d, i, e) : shard_open(d, s, false, false, e);
        if (st != JDT_OK) return st;
        hid_t ds = y ? s->dy : s->dx;
        const char *name = d->info.kind == JDT_DATA_KIND_TOKENS ? "tokens" : (y ? "y" : "x");
        int rank = (!y && d->info.kind == JDT_DATA_KIND_ARRAYS) ? 2 : 1;
        hsize_t start[2] = {(hsize_t)(a - s->start), 0};
        hsize_t count[2] = {(hsize_t)(c_end - a), (hsize_t)unit_elems};
        hid_t fs = H5Dget_space(ds);
        hid_t ms = H5Screate_simple(rank, count, NULL);
        herr_t rc = -1;
        if (fs >= 0 && ms >= 0 &&
            H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0)
            rc = H5Dread(ds, mem_type, ms, fs, H5P_DEFAULT, out);
        if (ms >= 0) H5Sclose(ms);
        if (fs >= 0) H5Sclose(fs);
        if (rc < 0) {
            char dd[256];
            return jdt_err_set(e, JDT_ERR_IO, "%s: reading /%s[%lld:%lld]: %s", s->path, name,
                               (long long)start[0], (long long)(start[0] + count[0]),
                               jdt_h5_detail(dd, sizeof dd));
        }
        out += (size_t)(c_end - a) * (size_t)unit_elems * elem_size;
        a = c_end;
    }
    if (a < b) return jdt_err_set(e, JDT_ERR_INTERNAL, "%s: read past the end", d->path);
    return JDT_OK;
}

/* Names the shard holding logical unit u (for error messages) and sets *local to u's index
 * inside that shard's dataset, so the message points at the right file and the right row. */
static const char *shard_of(const jdt_data *d, int64_t u, int64_t *local)
{
    *local = u;
    for (int64_t i = 0; i < d->n_shards; i++)
        if (u < d->shards[i].start + d->shards[i].n_units) {
            *local = u - d->shards[i].start;
            return d->shards[i].path;
        }
    return d->path;
}

/* Sizes the per-read buffers for `rows` rows (they start at the rank's slice size; a larger
 * jdt_data_read_rows request grows them). io_lock held. */
static jdt_status ensure_scratch(jdt_data *d, int64_t rows, jdt_err *e)
{
    if (rows <= d->scratch_rows) return JDT_OK;
    int64_t *sample = jdt_realloc(d->sample, (size_t)rows * sizeof *sample);
    if (!sample) goto oom;
    d->sample = sample;
    if (d->info.kind == JDT_DATA_KIND_TOKENS) {
        size_t run = (size_t)rows * (size_t)d->o.seq_len + 1;
        int32_t *scratch = jdt_realloc(d->scratch, run * sizeof(int32_t));
        if (!scratch) goto oom;
        d->scratch = scratch;
        void *raw = jdt_realloc(d->raw, run * jdt_dtype_size(d->info.token_dtype));
        if (!raw) goto oom;
        d->raw = raw;
    }
    d->scratch_rows = rows;
    return JDT_OK;
oom:
    return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory for %lld rows", d->path,
                       (long long)rows);
}

static jdt_status read_rows_locked(jdt_data *d, int64_t k, int64_t r0, int64_t r1, void *xv,
                                   int32_t *y, jdt_err *e)
{
    int64_t rows = r1 - r0;
    jdt_status est = ensure_scratch(d, rows, e);
    if (est != JDT_OK) return est;
    for (int64_t j = 0; j < rows; j++)
        d->sample[j] = jdt_data_sample_index(d, k, r0 + j);
    bool tokens = d->info.kind == JDT_DATA_KIND_TOKENS;
    int64_t T = d->o.seq_len, D = d->info.dim;
    for (int64_t j = 0; j < rows;) {
        int64_t run = 1;
        while (j + run < rows && d->sample[j + run] == d->sample[j] + run)
            run++;
        int64_t w0 = d->sample[j];
        jdt_status st;
        if (tokens) {
            int64_t a = w0 * T, b = (w0 + run) * T + 1;
            /* Read in the on-disk type (no HDF5 conversion pass, which zero-fills a 1 MiB
             * buffer per read) and widen here, checking ids against the vocabulary. */
            bool u16 = d->info.token_dtype == JDT_DTYPE_U16;
            st = read_units(d, false, a, b, u16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32,
                            u16 ? 2 : 4, 1, d->raw, e);
            if (st != JDT_OK) return st;
            const uint16_t *r16 = d->raw;
            const uint32_t *r32 = d->raw;
            for (int64_t u = 0; u < b - a; u++) {
                uint32_t id = u16 ? r16[u] : r32[u];
                if (id >= (uint64_t)d->info.vocab_size) {
                    int64_t at;
                    const char *file = shard_of(d, a + u, &at);
                    return jdt_err_set(e, JDT_ERR_FORMAT,
                                       "%s: /tokens[%lld]: token id %u (stream position %lld) "
                                       "is outside the vocabulary [0, %lld)",
                                       file, (long long)at, id, (long long)(a + u),
                                       (long long)d->info.vocab_size);
                }
                d->scratch[u] = (int32_t)id;
            }
            int32_t *x = xv;
            for (int64_t i = 0; i < run; i++) {
                memcpy(x + (j + i) * T, d->scratch + i * T, (size_t)T * sizeof(int32_t));
                memcpy(y + (j + i) * T, d->scratch + i * T + 1, (size_t)T * sizeof(int32_t));
            }
        } else {
            float *x = xv;
            st = read_units(d, false, w0, w0 + run, H5T_NATIVE_FLOAT, sizeof(float), D, x + j * D,
                            e);
            if (st == JDT_OK)
                st = read_units(d, true, w0, w0 + run, H5T_NATIVE_INT32, sizeof(int32_t), 1, y + j,
                                e);
            if (st != JDT_OK) return st;
            const int64_t n_classes = label_bound(d);
            for (int64_t i = 0; i < run && n_classes > 0; i++) {
                if (y[j + i] < 0 || y[j + i] >= n_classes) {
                    int64_t at;
                    const char *file = shard_of(d, w0 + i, &at);
                    return jdt_err_set(e, JDT_ERR_FORMAT, "%s: /y[%lld] = %d is outside [0, %lld)",
                                       file, (long long)at, y[j + i], (long long)n_classes);
                }
            }
        }
        j += run;
    }
    return JDT_OK;
}

jdt_status jdt_data_read_rows(jdt_data *d, int64_t k, int64_t r0, int64_t r1, void *x, int32_t *y,
                              jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    if (k < 0 || r0 < 0 || r1 <= r0 || r1 > d->o.global_batch)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: batch %lld rows [%lld, %lld) outside a global "
                           "batch of %lld",
                           d->path, (long long)k, (long long)r0, (long long)r1,
                           (long long)d->o.global_batch);
    pthread_mutex_lock(&d->io_lock);
    jdt_status st = read_rows_locked(d, k, r0, r1, x, y, e);
    pthread_mutex_unlock(&d->io_lock);
    return st;
}

/* The fingerprint's windows: at least PRINT_MIN, three per shard, at most PRINT_MAX, each of
 * PRINT_UNITS tokens or PRINT_ROWS rows, spread evenly over the logical stream. */
#define PRINT_MIN 16
#define PRINT_MAX 3072
#define PRINT_UNITS 256
#define PRINT_ROWS 4

jdt_status jdt_data_fingerprint(jdt_data *d, uint64_t *out, jdt_err *e)
{
    jdt_err err_local_;
    if (!e) e = &err_local_;
    *out = 0;
    jdt_h5_quiet();
    const bool tokens = d->info.kind == JDT_DATA_KIND_TOKENS;
    const int64_t total = d->info.n_units, D = tokens ? 1 : d->info.dim;
    const int64_t per = tokens ? PRINT_UNITS : PRINT_ROWS, n = total < per ? total : per;
    int64_t windows = 3 * d->n_shards;
    windows = windows < PRINT_MIN ? PRINT_MIN : windows > PRINT_MAX ? PRINT_MAX : windows;
    /* a token takes at most 4 bytes as stored; a row D floats and a label */
    void *buf = jdt_malloc((size_t)(per * (D + 1)) * 4);
    if (!buf) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", d->path);
    uint64_t h = jdt_hash_u64(JDT_HASH_INIT, (uint64_t)total);
    jdt_status st = JDT_OK;
    pthread_mutex_lock(&d->io_lock);
    for (int64_t w = 0; w < windows && st == JDT_OK; w++) {
        const int64_t a = (total - n) * w / (windows - 1); /* the first at 0, the last at the end */
        if (tokens) { /* the stored ids, in their on-disk width */
            const bool u16 = d->info.token_dtype == JDT_DTYPE_U16;
            st = read_units(d, false, a, a + n, u16 ? H5T_NATIVE_UINT16 : H5T_NATIVE_UINT32,
                            u16 ? 2 : 4, 1, buf, e);
            if (st == JDT_OK) h = jdt_hash_bytes(h, buf, (size_t)n * (u16 ? 2 : 4));
        } else {
            float *x = buf;
            int32_t *y = (int32_t *)((char *)buf + (size_t)(n * D) * sizeof(float));
            st = read_units(d, false, a, a + n, H5T_NATIVE_FLOAT, sizeof(float), D, x, e);
            if (st == JDT_OK)
                st = read_units(d, true, a, a + n, H5T_NATIVE_INT32, sizeof(int32_t), 1, y, e);
            if (st == JDT_OK) h = jdt_hash_bytes(h, buf, (size_t)(n * (D + 1)) * 4);
        }
    }
    pthread_mutex_unlock(&d->io_lock);
    jdt_free(buf);
    if (st == JDT_OK) *out = h;
    return st;
}

/* ---- prefetch ---------------------------------------------------------------------------- */

static void *prefetch_main(void *arg)
{
    jdt_data *d = arg;
    jdt_h5_quiet();
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->fill_next >= d->want + (int64_t)(d->n_slots - 1))
            pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->stop) break;
        int64_t k = d->fill_next++;
        uint64_t gen = d->gen;
        slot *s = &d->slots[k % d->n_slots];
        s->k = -1;
        pthread_mutex_unlock(&d->mu);
        jdt_err_clear(&s->err);
        jdt_status st = jdt_data_read_rows(d, k, d->o.row_begin, d->o.row_end, s->x, s->y, &s->err);
        pthread_mutex_lock(&d->mu);
        if (gen == d->gen) {
            s->k = k;
            s->gen = gen;
            s->st = st;
            pthread_cond_broadcast(&d->cv_ready);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

jdt_status jdt_data_get(jdt_data *d, int64_t k, jdt_data_batch *out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    memset(out, 0, sizeof *out);
    if (k < 0)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: negative batch index %lld", d->path,
                           (long long)k);
    bool tokens = d->info.kind == JDT_DATA_KIND_TOKENS;
    out->index = k;
    out->rows = d->rows;
    out->x_dtype = tokens ? JDT_DTYPE_I32 : JDT_DTYPE_F32;
    out->x_cols = tokens ? d->o.seq_len : d->info.dim;
    out->y_cols = tokens ? d->o.seq_len : 1;
    if (!d->threaded) {
        jdt_status st = jdt_data_read_rows(d, k, d->o.row_begin, d->o.row_end, d->sx, d->sy, e);
        if (st == JDT_OK) {
            out->x = d->sx;
            out->y = d->sy;
        }
        return st;
    }
    pthread_mutex_lock(&d->mu);
    if (k != d->want) {
        d->gen++;
        d->want = k;
        d->fill_next = k;
        for (int i = 0; i < d->n_slots; i++)
            d->slots[i].k = -1;
        pthread_cond_broadcast(&d->cv_work);
    }
    slot *s = &d->slots[k % d->n_slots];
    while (!(s->k == k && s->gen == d->gen))
        pthread_cond_wait(&d->cv_ready, &d->mu);
    jdt_status st = s->st;
    if (st != JDT_OK && e) *e = s->err;
    d->want = k + 1;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    if (st == JDT_OK) {
        out->x = s->x;
        out->y = s->y;
    }
    return st;
}

/* ---- open / close ------------------------------------------------------------------------ */

typedef struct {
    const char *split;
} shard_filter;

static bool keep_shard(const char *name, void *ctx)
{
    const shard_filter *f = ctx;
    size_t n = strlen(name);
    if (n < 4 || strcmp(name + n - 3, ".h5") != 0) return false;
    if (f->split && f->split[0] && strncmp(name, f->split, strlen(f->split)) != 0) return false;
    return true;
}

/* "Natural" name order: runs of digits compare as numbers, so train_999.h5 < train_1000.h5
 * (plain strcmp would put train_1000 before train_101). Ties fall back to strcmp. */
int jdt_io_natural_cmp(const void *pa, const void *pb)
{
    const char *a = *(char *const *)pa, *b = *(char *const *)pb;
    const char *x = a, *y = b;
    while (*x && *y) {
        if (*x >= '0' && *x <= '9' && *y >= '0' && *y <= '9') {
            while (*x == '0')
                x++;
            while (*y == '0')
                y++;
            size_t nx = 0, ny = 0;
            while (x[nx] >= '0' && x[nx] <= '9')
                nx++;
            while (y[ny] >= '0' && y[ny] <= '9')
                ny++;
            if (nx != ny) return nx < ny ? -1 : 1;
            int c = strncmp(x, y, nx);
            if (c) return c;
            x += nx;
            y += ny;
        } else {
            if (*x != *y) return (unsigned char)*x < (unsigned char)*y ? -1 : 1;
            x++;
            y++;
        }
    }
    if (*x || *y) return *x ? 1 : -1;
    return strcmp(a, b);
}

/* How many shards stay open (a quarter of the descriptor limit, MIN..MAX_OPEN_SHARDS, no more
 * than there are) and how much chunk cache each compressed dataset gets (arrays open two). */
static void size_cache(jdt_data *d)
{
    struct rlimit rl;
    rlim_t soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
    int64_t n = soft == RLIM_INFINITY ? MAX_OPEN_SHARDS : (int64_t)(soft / 4);
    if (n < MIN_OPEN_SHARDS) n = MIN_OPEN_SHARDS;
    if (n > MAX_OPEN_SHARDS) n = MAX_OPEN_SHARDS;
    if (n > d->n_shards) n = d->n_shards;
    d->max_open = (int)n;
    size_t per = CHUNK_CACHE_TOTAL / (2 * (size_t)n);
    d->chunk_cache_bytes = per < CHUNK_CACHE_MAX ? per : CHUNK_CACHE_MAX;
}

static jdt_status check_opts(const jdt_data_opts *o, jdt_err *e)
{
    const char *p = o->path ? o->path : "(null)";
    if (!o->path || !o->path[0]) return jdt_err_set(e, JDT_ERR_INVALID, "data: no path given");
    if (o->global_batch < 1)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: global batch size must be >= 1 (got %lld)", p,
                           (long long)o->global_batch);
    if (o->kind == JDT_DATA_KIND_TOKENS && o->seq_len < 1)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: seq_len must be >= 1 (got %lld)", p,
                           (long long)o->seq_len);
    if (!(o->row_begin == 0 && o->row_end == 0) &&
        (o->row_begin < 0 || o->row_end <= o->row_begin || o->row_end > o->global_batch))
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: rows [%lld, %lld) are not a slice of a global "
                           "batch of %lld",
                           p, (long long)o->row_begin, (long long)o->row_end,
                           (long long)o->global_batch);
    if (o->n_classes < 0)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: n_classes must be >= 0 (got %lld)", p,
                           (long long)o->n_classes);
    if (o->prefetch < 0 || o->prefetch > MAX_PREFETCH)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: prefetch depth %d outside 0..%d", p,
                           o->prefetch, MAX_PREFETCH);
    return JDT_OK;
}

jdt_status jdt_data_open(const jdt_data_opts *opts, jdt_data **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    *out = NULL;
    jdt_status st = check_opts(opts, e);
    if (st != JDT_OK) return st;
    char **names = NULL;
    size_t n_names = 0;
    jdt_data *d = jdt_calloc(1, sizeof *d);
    if (!d) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", opts->path);
    pthread_mutex_init(&d->io_lock, NULL);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_ready, NULL);
    d->o = *opts;
    d->o.split = NULL;
    if (d->o.row_begin == 0 && d->o.row_end == 0) d->o.row_end = d->o.global_batch;
    d->rows = d->o.row_end - d->o.row_begin;
    d->path = jdt_strdup(opts->path);
    if (!d->path) goto oom;
    d->o.path = d->path;
    d->perm_key = jdt_rng_key(opts->seed, "data.shuffle");

    shard_filter flt = {opts->split};
    if (jdt_fetch_is_url(opts->path)) {
        if ((st = jdt_remote_open(opts->fetch, opts->path, keep_shard, &flt, &d->remote, e)))
            goto fail;
        const jdt_fetch_list *l = jdt_remote_list(d->remote);
        if (!(names = jdt_calloc((size_t)l->n_items, sizeof *names))) goto oom;
        n_names = (size_t)l->n_items;
        for (size_t i = 0; i < n_names; i++)
            if (!(names[i] = jdt_strdup(l->items[i].local))) goto oom;
    } else if (jdt_io_is_dir(opts->path)) {
        if ((st = jdt_io_list_dir(opts->path, keep_shard, &flt, &names, &n_names, e))) goto fail;
        if (n_names > 1) qsort(names, n_names, sizeof *names, jdt_io_natural_cmp);
        if (n_names == 0) {
            st = jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: no %s*.h5 shard files in this directory",
                             opts->path, opts->split ? opts->split : "");
            goto fail;
        }
    } else {
        names = jdt_calloc(1, sizeof *names);
        if (!names) goto oom;
        n_names = 1;
        names[0] = NULL; /* the path itself */
    }
    d->shards = jdt_calloc(n_names, sizeof *d->shards);
    if (!d->shards) goto oom;
    d->n_shards = (int64_t)n_names;
    size_cache(d);
    for (size_t i = 0; i < n_names; i++) {
        shard *s = &d->shards[i];
        s->file = s->dx = s->dy = H5I_INVALID_HID;
        s->path = names[i] && !d->remote ? jdt_io_join(opts->path, names[i])
                                         : jdt_strdup(names[i] ? names[i] : opts->path);
        if (!s->path) goto oom;
    }
    jdt_io_names_free(names, n_names);
    names = NULL;

    int64_t total = 0;
    /* remote data with a manifest: the stream is laid out from the manifest's lengths and
     * training starts once the first shard is here; without lengths, every shard first */
    bool stream = d->remote && jdt_remote_units_known(d->remote);
    jdt_progress prog; /* opening checks every byte's CRC: long for a large dataset */
    jdt_progress_begin(&prog, "checking the dataset's shards", (double)d->n_shards, "files");
    for (int64_t i = 0; i < d->n_shards; i++) {
        shard *s = &d->shards[i];
        if (stream && i > 0) {
            s->n_units = jdt_remote_list(d->remote)->items[i].n_units;
            s->pending = true;
            s->start = total;
            total += s->n_units;
            continue;
        }
        if (d->remote && (st = jdt_remote_wait(d->remote, i, e))) {
            jdt_progress_end(&prog); /* the error starts on a clean line */
            goto fail;
        }
        int64_t want = stream ? jdt_remote_list(d->remote)->items[i].n_units : -1;
        if ((st = shard_open(d, s, true, i == 0, e))) {
            if (d->remote) jdt_err_prefix(e, "%s", jdt_remote_list(d->remote)->items[i].url);
            jdt_progress_end(&prog);
            goto fail;
        }
        if (want >= 0 && s->n_units != want) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: holds %lld units but the manifest says %lld",
                             jdt_remote_list(d->remote)->items[i].url, (long long)s->n_units,
                             (long long)want);
            jdt_progress_end(&prog);
            goto fail;
        }
        s->start = total;
        total += s->n_units;
        if (!d->remote) jdt_progress_update(&prog, (double)(i + 1)); /* remote: its own line */
    }
    jdt_progress_end(&prog);
    d->info.n_files = d->n_shards;
    d->info.n_units = total;
    bool tokens = d->info.kind == JDT_DATA_KIND_TOKENS;
    if (tokens) {
        if (d->o.seq_len < 1) {
            st = jdt_err_set(e, JDT_ERR_INVALID, "%s: token data needs seq_len >= 1 (got %lld)",
                             opts->path, (long long)d->o.seq_len);
            goto fail;
        }
        if (total < d->o.seq_len + 1) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: dataset /tokens too short: %lld tokens, need "
                             "at least seq_len+1 = %lld for one sequence",
                             opts->path, (long long)total, (long long)(d->o.seq_len + 1));
            goto fail;
        }
        d->info.n_samples = (total - 1) / d->o.seq_len;
    } else {
        d->info.n_samples = total;
    }
    if ((st = ensure_scratch(d, d->rows, e))) goto fail;

    size_t x_bytes = (size_t)d->rows * (size_t)(tokens ? d->o.seq_len : d->info.dim) * 4;
    size_t y_bytes = (size_t)d->rows * (size_t)(tokens ? d->o.seq_len : 1) * 4;
    if (d->o.prefetch == 0) {
        d->sx = jdt_malloc(x_bytes);
        d->sy = jdt_malloc(y_bytes);
        if (!d->sx || !d->sy) goto oom;
    } else {
        d->n_slots = d->o.prefetch + 1;
        d->slots = jdt_calloc((size_t)d->n_slots, sizeof *d->slots);
        if (!d->slots) goto oom;
        for (int i = 0; i < d->n_slots; i++) {
            d->slots[i].k = -1;
            d->slots[i].x = jdt_malloc(x_bytes);
            d->slots[i].y = jdt_malloc(y_bytes);
            if (!d->slots[i].x || !d->slots[i].y) goto oom;
        }
        if (jdt_thread_create(&d->thread, prefetch_main, d) != 0) {
            st = jdt_err_set(e, JDT_ERR_INTERNAL, "%s: cannot start the prefetch thread",
                             opts->path);
            goto fail;
        }
        d->threaded = true;
    }
    *out = d;
    return JDT_OK;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory opening the dataset", opts->path);
fail:
    jdt_io_names_free(names, n_names);
    jdt_data_close(d);
    return st;
}

void jdt_data_get_info(const jdt_data *d, jdt_data_info *out)
{
    *out = d->info;
}

void jdt_data_close(jdt_data *d)
{
    if (!d) return;
    if (d->threaded) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_broadcast(&d->cv_work);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    for (int i = 0; i < d->n_slots && d->slots; i++) {
        jdt_free(d->slots[i].x);
        jdt_free(d->slots[i].y);
    }
    jdt_free(d->slots);
    for (int64_t i = 0; i < d->n_shards && d->shards; i++) {
        shard_close(d, &d->shards[i]);
        jdt_free(d->shards[i].path);
    }
    jdt_free(d->shards);
    jdt_remote_close(d->remote);
    jdt_free(d->scratch);
    jdt_free(d->raw);
    jdt_free(d->sample);
    jdt_free(d->sx);
    jdt_free(d->sy);
    jdt_free(d->path);
    pthread_cond_destroy(&d->cv_ready);
    pthread_cond_destroy(&d->cv_work);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->io_lock);
    jdt_free(d);
}
