/*
 * fetch.h — remote data over HTTP(S) through libcurl (engine/io, prefix jdt_fetch_ and
 * jdt_remote_). A URL names one file, a directory (a server's HTML listing, e.g. nginx
 * autoindex) or a jdt manifest; its files are downloaded into a local cache with Range-request
 * resume, retries with exponential backoff, TLS verification, size and sha256 checks, and one
 * lock per cache entry so that the processes of a host share one download. jdt_remote_* runs
 * the downloads of a dataset's shards in a background thread ahead of the loader (data.c).
 * Formats, cache layout and error behaviour: docs/data.md, "Remote data".
 */
#ifndef JDT_IO_FETCH_H
#define JDT_IO_FETCH_H

#include "core/core.h"

/* A manifest is a text file whose first line is this magic, then one line per file:
 * "NAME N_BYTES SHA256 N_UNITS" (SHA256 and N_UNITS may be "-": unknown). */
#define JDT_FETCH_MANIFEST_MAGIC "# jdt-manifest 1"
/* The name `prepare` writes and a directory listing is searched for. */
#define JDT_FETCH_MANIFEST_NAME "manifest.txt"

typedef struct jdt_fetch_opts {
    const char *cache_dir; /* cache root: files go to cache_dir/data/HOST_PORT/URL-PATH;
                              NULL: $JDT_CACHE_DIR, else ~/.cache/jdt-train */
    int retries;           /* attempts after the first on timeouts, 5xx, resets (>= 0) */
    double backoff_s;      /* wait before the first retry; doubled each time, at most 30 s */
    double timeout_s;      /* connect timeout, and the longest a transfer may go without data */
} jdt_fetch_opts;

/* Defaults: 5 retries, 1 s backoff, 30 s timeout, the default cache root. */
void jdt_fetch_opts_default(jdt_fetch_opts *o);

/* True if s starts with http:// or https:// (case-insensitive). */
bool jdt_fetch_is_url(const char *s);

/* One file to fetch. */
typedef struct {
    char *name;      /* path relative to the listing or manifest (the file name for one file) */
    char *url;       /* where it is fetched from */
    char *local;     /* where it lives in the cache */
    int64_t n_bytes; /* expected size, -1: unknown */
    char sha256[65]; /* expected lowercase hex digest, "": unknown */
    int64_t n_units; /* tokens or rows (manifest), -1: unknown */
} jdt_fetch_item;

typedef struct {
    char *url;             /* as given */
    char *local_dir;       /* the cache folder that mirrors the URL's folder */
    jdt_fetch_item *items; /* (n_items), in natural name order for listings and as listed in a
                              manifest */
    int64_t n_items;
    bool manifest;     /* the items came from a manifest */
    int64_t n_folders; /* subfolders a listing links to (not followed) */
} jdt_fetch_list;

/* Which names of a listing or manifest to keep (NULL: all). */
typedef bool (*jdt_fetch_filter)(const char *name, void *ctx);

/* Resolves url into the files it names: a URL whose path ends in ".h5" is that one file (no
 * request is made); otherwise the URL is fetched (at most 16 MiB) and read as a jdt manifest
 * (first line JDT_FETCH_MANIFEST_MAGIC) or as an HTML directory listing, whose hrefs to files
 * in that folder are the items; a listing that holds JDT_FETCH_MANIFEST_NAME is read through
 * that manifest instead (sizes and checksums). keep filters the names. Errors name the URL:
 * ERR_NOT_FOUND (HTTP 404, no files left after the filter), ERR_FORMAT (bad manifest line, a
 * page that is neither), ERR_NET / ERR_TIMEOUT (after the retries). Caller frees *out. */
jdt_status jdt_fetch_resolve(const jdt_fetch_opts *o, const char *url, jdt_fetch_filter keep,
                             void *keep_ctx, jdt_fetch_list **out, jdt_err *e);
void jdt_fetch_list_free(jdt_fetch_list *l);

/* The parsing half of jdt_fetch_resolve, with no request (tests, fuzzing): reads body, what
 * url returned, as a manifest or an HTML listing under the same rules and errors (a listing's
 * link to the manifest name is just another file here). Caller frees *out. */
jdt_status jdt_fetch_parse(const jdt_fetch_opts *o, const char *url, const char *body,
                           jdt_fetch_filter keep, void *keep_ctx, jdt_fetch_list **out, jdt_err *e);

/* Makes it->local a complete, verified copy of it->url. Under an flock on "<local>.lock" (so
 * one process of a host downloads and the others wait and reuse the file): a complete cached
 * file that matches the expected size and sha256 is used as is; otherwise the download
 * continues "<local>.part" with a Range request (If-Range on the ETag recorded beside it), and
 * the part is renamed to local only when complete and verified, so a partial file is never
 * used as if whole. Transient failures (connect errors, resets, stalls longer than timeout_s,
 * HTTP 5xx/408/429) are retried with backoff; HTTP 4xx, TLS verification failures, a size or
 * sha256 mismatch (the part is deleted) and local I/O errors are not. *cancel (may be NULL),
 * set by another thread, stops a transfer or a wait with ERR_INTERRUPTED. progress: a line
 * through jdt_progress unless NULL. Errors are one line naming the URL and what went wrong:
 * ERR_NOT_FOUND (404), ERR_NET, ERR_TIMEOUT, ERR_FORMAT (size/sha), ERR_AUTH (TLS), ERR_IO. */
jdt_status jdt_fetch_file(const jdt_fetch_opts *o, const jdt_fetch_item *it, const int *cancel,
                          jdt_progress *progress, jdt_err *e);

/* Resolves url (every file of a listing or manifest) and fetches all of it; *local_dir (caller
 * frees) is then a complete local copy of the URL's folder, or the one file's path. Used for
 * checkpoint.init_from. */
jdt_status jdt_fetch_mirror(const jdt_fetch_opts *o, const char *url, char **local_dir, jdt_err *e);

/* Fetches the file `name` from the folder of url (url itself if it ends in '/'; else url without
 * its last segment when that has a '.', as in ".../train_000.h5" or ".../manifest.txt"; else
 * url + "/") into the cache, like jdt_fetch_file with nothing expected of it. *local (caller
 * frees) is its cache path. o may be NULL (defaults). Used for the tokenizer.json beside a
 * remote dataset. */
jdt_status jdt_fetch_beside(const jdt_fetch_opts *o, const char *url, const char *name,
                            char **local, jdt_err *e);

/* Writes dir/manifest.txt (temp file + rename) for the *.h5 shards and tokenizer.json in dir:
 * name, size, sha256, and n_tokens or n_rows for shards. `prepare` calls it. */
jdt_status jdt_fetch_write_manifest(const char *dir, jdt_err *e);

/* ---- a dataset's shards, downloaded in the background ------------------------------------- */

typedef struct jdt_remote jdt_remote;

/* Resolves url (keep filters the names, as for jdt_fetch_resolve) and starts one thread that
 * downloads the items in order, one at a time, with a progress line. ERR_NOT_FOUND if nothing
 * is left after the filter. Caller frees *out with jdt_remote_close. */
jdt_status jdt_remote_open(const jdt_fetch_opts *o, const char *url, jdt_fetch_filter keep,
                           void *keep_ctx, jdt_remote **out, jdt_err *e);
/* The resolved list (owned by r). */
const jdt_fetch_list *jdt_remote_list(const jdt_remote *r);
/* True when every item's n_units is known (a manifest), so a loader can lay the stream out
 * before the files arrive. */
bool jdt_remote_units_known(const jdt_remote *r);
/* Blocks until item i is local and verified (moving it to the front of the queue if it is
 * still waiting). Returns the download's error if it failed; once one download fails the
 * thread stops and every later wait for a file not yet local returns that error. Thread-safe. */
jdt_status jdt_remote_wait(jdt_remote *r, int64_t i, jdt_err *e);
/* Stops the thread (an unfinished download keeps its .part for the next run) and frees r.
 * NULL is a no-op. */
void jdt_remote_close(jdt_remote *r);

/* ---- SHA-256 (OpenSSL EVP) ----------------------------------------------------------------- */

/* A running SHA-256. Zero it before the first _init ({0}); _free it when done. */
typedef struct {
    void *ctx; /* EVP_MD_CTX */
} jdt_sha256;

/* Starts (or restarts) a digest; false when libcrypto cannot allocate its context. */
bool jdt_sha256_init(jdt_sha256 *s);
void jdt_sha256_update(jdt_sha256 *s, const void *data, size_t n_bytes);
/* Finishes the digest into 64 lowercase hex digits and a NUL (s may then be _init'ed again);
 * false (out "") if the digest was never started. */
bool jdt_sha256_hex(jdt_sha256 *s, char out[65]);
/* Frees the context; a zeroed or freed s is a no-op. */
void jdt_sha256_free(jdt_sha256 *s);

#endif /* JDT_IO_FETCH_H */
