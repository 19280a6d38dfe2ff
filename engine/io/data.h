/*
 * data.h — HDF5 datasets: writing token and array datasets, and streaming deterministic
 * training batches from them (engine/io, prefix jdt_data_). Formats: docs/data.md.
 *
 * Token dataset: one file or a directory of shard files, each with a 1-D /tokens (uint16 when
 * vocab_size <= 65536, else uint32) and root attributes format="jdt-tokens", version=1,
 * vocab_size, tokenizer, n_tokens. The shards of a directory, in natural name order (digit
 * runs compare as numbers), form one logical token stream. Array dataset: /x (N, D) f32 and /y (N)
 * i32, format="jdt-arrays".
 *
 * Batch k is a pure function of (seed, k, global_batch, seq_len): global sequence g = k*B + j
 * lives in epoch g / N at position g % N of that epoch's order over the N samples (N token
 * windows of T+1 tokens starting at multiples of T, or N rows). Sequential mode takes the
 * windows in order; shuffle mode permutes them with a keyed Feistel bijection per epoch. A
 * data-parallel rank reads only its rows [r0, r1) of each global batch, so the ranks' slices
 * concatenated are exactly the single-process batch. Reads touch only the hyperslabs needed.
 */
#ifndef JDT_IO_DATA_H
#define JDT_IO_DATA_H

#include "core/core.h"

#define JDT_DATA_FORMAT_TOKENS "jdt-tokens"
#define JDT_DATA_FORMAT_ARRAYS "jdt-arrays"
#define JDT_DATA_VERSION 1
/* Root attribute: zlib CRC-32 of the dataset's little-endian bytes (/tokens; /x then /y for
 * arrays), recorded by the writers and checked once when a shard is first opened. */
#define JDT_DATA_CRC_ATTR "crc32"

/* ---- writers ------------------------------------------------------------------------------ */

typedef struct {
    int compress_level; /* 0: no compression; 1..9: deflate (gzip) level, with byte shuffle */
    int64_t chunk_rows; /* chunk length along dim 0 (tokens or rows); 0: ~64 KiB chunks */
} jdt_data_write_opts;

/* An incremental token-file writer, for datasets larger than memory: the file is created as
 * "<path>.tmp" with a fixed n_tokens, filled by appends, and renamed to path only by a
 * successful _commit (after fsync), so a reader never sees a half-written file. */
typedef struct jdt_data_tokw jdt_data_tokw;

/* Starts writing a token file of exactly n_tokens (> 0) tokens with ids < vocab_size
 * (1 <= vocab_size <= 2^31) produced by `tokenizer` (e.g. "byte"). opts may be NULL (no
 * compression). Returns JDT_OK and *out (owned by the caller until _commit or _abort). */
jdt_status jdt_data_tokw_open(const char *path, int64_t n_tokens, uint32_t vocab_size,
                              const char *tokenizer, const jdt_data_write_opts *opts,
                              jdt_data_tokw **out, jdt_err *e);
/* Appends n tokens. ERR_INVALID (naming the position) if an id is >= vocab_size or the total
 * would exceed n_tokens; the writer stays usable only for _abort after an error. */
jdt_status jdt_data_tokw_append(jdt_data_tokw *w, const uint32_t *tokens, int64_t n, jdt_err *e);
/* Checks that exactly n_tokens were appended, flushes, fsyncs and renames the file into place.
 * Always frees w; on error the temp file is removed. */
jdt_status jdt_data_tokw_commit(jdt_data_tokw *w, jdt_err *e);
/* Discards an unfinished writer and its temp file. NULL is a no-op. */
void jdt_data_tokw_abort(jdt_data_tokw *w);

/* Writes tokens[0..n) as a token file at path (temp file + rename), uncompressed. */
jdt_status jdt_data_write_tokens(const char *path, const uint32_t *tokens, int64_t n,
                                 uint32_t vocab_size, const char *tokenizer, jdt_err *e);

/* Writes an array dataset: x (n_rows, dim) f32 row-major, y (n_rows) i32 class labels in
 * [0, n_classes) (n_classes 0: no check, regression-style integer targets). opts may be NULL. */
jdt_status jdt_data_write_arrays(const char *path, const float *x, const int32_t *y, int64_t n_rows,
                                 int64_t dim, int64_t n_classes, const jdt_data_write_opts *opts,
                                 jdt_err *e);

/* ---- streaming ---------------------------------------------------------------------------- */

typedef enum {
    JDT_DATA_KIND_AUTO = 0, /* take the kind from the files' format attribute */
    JDT_DATA_KIND_TOKENS,
    JDT_DATA_KIND_ARRAYS
} jdt_data_kind;

typedef struct {
    const char *path;     /* a .h5 file or a directory of shards */
    const char *split;    /* directory only: use files named "<split>*.h5" ("train", "val");
                             NULL or "": every *.h5 file */
    jdt_data_kind kind;   /* expected kind; AUTO accepts either */
    int64_t seq_len;      /* T, tokens per sequence (token datasets; ignored for arrays) */
    int64_t global_batch; /* B, sequences (rows) per global batch, over all ranks */
    int64_t row_begin;    /* this rank's rows [row_begin, row_end) of each global batch; */
    int64_t row_end;      /*   both 0: all rows [0, B) */
    int64_t n_classes;    /* array data: the classes the model predicts; a file whose
                             n_classes attribute differs is refused, and every label must lie
                             in [0, n_classes). 0: the files' own n_classes (0 there too:
                             labels unchecked) */
    uint64_t seed;        /* shuffle seed */
    bool shuffle;         /* false: windows in order, wrapping around at the end */
    int prefetch;         /* batches read ahead by a background thread; 0: read on demand */
    const struct jdt_fetch_opts *fetch; /* path is an http(s):// URL: how to fetch it
                                           (fetch.h; NULL: defaults) */
} jdt_data_opts;

typedef struct {
    jdt_data_kind kind;
    int64_t n_files;
    int64_t n_units;       /* tokens (token data) or rows (array data), all shards together */
    int64_t n_samples;     /* N: windows (n_units - 1) / T, or rows */
    int64_t vocab_size;    /* token data */
    jdt_dtype token_dtype; /* U16 or U32 on disk (token data) */
    char tokenizer[32];    /* token data */
    int64_t dim;           /* D (array data) */
    int64_t n_classes;     /* array data; 0 if the file does not say */
} jdt_data_info;

/* One batch slice, as handed out by jdt_data_get. The buffers belong to the loader and stay
 * valid until the next jdt_data_get or jdt_data_close. */
typedef struct {
    int64_t index;     /* k */
    int64_t rows;      /* row_end - row_begin */
    jdt_dtype x_dtype; /* I32 (token ids) or F32 (array features) */
    int64_t x_cols;    /* T or D */
    void *x;           /* (rows, x_cols) inputs */
    int64_t y_cols;    /* T (token data) or 1 (array data) */
    int32_t *y;        /* (rows, y_cols) targets: for tokens, x shifted left by one */
} jdt_data_batch;

typedef struct jdt_data jdt_data;

/* Opens and validates a dataset: every shard's format, version, dtypes and sizes (for arrays
 * also the n_rows, dim and n_classes attributes against /x, /y and opts->n_classes, and every
 * label), and that the data holds at least one sample (T+1 tokens). An http(s):// path is
 * fetched into the cache (fetch.h: one .h5, a listing or a manifest, split applying to the
 * names); with a manifest that gives every shard's length this returns once the first shard is
 * local, the others download in the background and are validated when first read (a read
 * waits for its shard). Errors name the file and the dataset: ERR_NOT_FOUND (missing path, no
 * matching shards), ERR_FORMAT (not HDF5, truncated, wrong format/version/dtype, missing
 * attribute or dataset, an attribute disagreeing with the data or the model, a label out of
 * range, too short), ERR_INVALID (bad opts); a remote error names the URL (fetch.h).
 * Starts the prefetch thread if opts->prefetch > 0. On success the caller owns *out. */
jdt_status jdt_data_open(const jdt_data_opts *opts, jdt_data **out, jdt_err *e);

/* Fills *out with what the dataset holds. */
void jdt_data_get_info(const jdt_data *d, jdt_data_info *out);

/* Returns this rank's slice of global batch k (k >= 0) in *out. Batches are usually requested
 * in order k, k+1, ...; the prefetcher reads ahead along that order, and any other k restarts
 * it there (e.g. after resuming). A read error (including one met by the prefetch thread)
 * comes back here as the status, with the file and dataset in e. One thread at a time calls
 * this on a given loader (the training loop). */
jdt_status jdt_data_get(jdt_data *d, int64_t k, jdt_data_batch *out, jdt_err *e);

/* Reads rows [r0, r1) of global batch k synchronously into caller buffers: x (r1-r0, x_cols)
 * of the info's x dtype, y (r1-r0, y_cols). Independent of the prefetcher; thread-safe. */
jdt_status jdt_data_read_rows(jdt_data *d, int64_t k, int64_t r0, int64_t r1, void *x, int32_t *y,
                              jdt_err *e);

/* A fingerprint of the dataset's content, for comparing copies of it (every rank of a job must
 * read the same data, data.train_path naming each host's copy): its length in tokens (rows),
 * and windows of 256 tokens (array data: 4 rows, features and labels) as stored, spread evenly
 * over the whole stream from its first unit to its last: three per shard (at least 16, at most
 * 3072), so however the copies are split into files. Cheap (a small read per window) and not
 * a checksum: copies that differ only between the windows print alike. Reads a remote
 * dataset's shards, waiting for them to download (a caller may skip those). Thread-safe. */
jdt_status jdt_data_fingerprint(jdt_data *d, uint64_t *out, jdt_err *e);

/* The sample (window or row) index that global sequence j of batch k reads: a pure function
 * of (seed, shuffle, k, global_batch, N). */
int64_t jdt_data_sample_index(const jdt_data *d, int64_t k, int64_t j);

/* Stops the prefetch thread, closes the files, frees d. NULL is a no-op. */
void jdt_data_close(jdt_data *d);

#endif /* JDT_IO_DATA_H */
