/*
 * prepare.c — dataset preparation (see datasets.h): the byte tokenizer, text -> token shards
 * with a train/val split, the import of llm.c's token files, and synthetic token/array
 * generators. Writes through the io/data.h writers, so every file lands by temp file + rename.
 */
#include "datasets/datasets.h"
#include "datasets/bpe.h"
#include "io/data.h"
#include "io/io-impl.h"
#include "io/json.h"
#include "io/fetch.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { BLOCK_BYTES = 1 << 20 };

static bool is_jsonl(const char *path);

/* The val split of n tokens: the tail fraction val_fraction, at least 2 tokens (one target)
 * when there is a split at all. */
static int64_t val_tokens(int64_t n, double val_fraction)
{
    int64_t n_val = (int64_t)floor((double)n * val_fraction);
    return val_fraction > 0 && n_val < 2 ? 2 : n_val;
}

int64_t jdt_prep_byte_encode(const void *text, size_t n_bytes, uint32_t *out)
{
    const unsigned char *p = text;
    for (size_t i = 0; i < n_bytes; i++)
        out[i] = p[i];
    return (int64_t)n_bytes;
}

void jdt_prep_byte_decode(const uint32_t *tokens, int64_t n, char *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = tokens[i] < 256 ? (char)tokens[i] : '?';
}

/* Streams bytes [begin, end) of f (already positioned at begin) into a new token file,
 * reporting the stream position (MB) to prog after each block. */
static jdt_status write_shard(FILE *f, const char *text_path, int64_t begin, int64_t end,
                              const char *out_path, int compress_level, unsigned char *buf,
                              uint32_t *toks, jdt_progress *prog, jdt_err *e)
{
    jdt_data_write_opts wo = {.compress_level = compress_level, .chunk_rows = 0};
    jdt_data_tokw *w = NULL;
    jdt_status st =
        jdt_data_tokw_open(out_path, end - begin, JDT_PREP_BYTE_VOCAB, "byte", &wo, &w, e);
    if (st != JDT_OK) return st;
    for (int64_t pos = begin; pos < end;) {
        size_t want = (size_t)(end - pos < BLOCK_BYTES ? end - pos : BLOCK_BYTES);
        size_t got = fread(buf, 1, want, f);
        if (got != want) {
            st = jdt_err_set(e, JDT_ERR_IO,
                             "%s: short read at byte %lld (file changed while "
                             "preparing?)",
                             text_path, (long long)(pos + (int64_t)got));
            goto fail;
        }
        int64_t n = jdt_prep_byte_encode(buf, got, toks);
        if ((st = jdt_data_tokw_append(w, toks, n, e))) goto fail;
        pos += (int64_t)got;
        jdt_progress_update(prog, (double)pos / 1048576.0);
    }
    return jdt_data_tokw_commit(w, e);
fail:
    jdt_data_tokw_abort(w);
    return st;
}

/* Parses "train_NNN.h5" / "val_NNN.h5"; returns the index or -1. */
static int shard_index(const char *name, const char *prefix)
{
    size_t np = strlen(prefix);
    if (strncmp(name, prefix, np) != 0) return -1;
    const char *p = name + np;
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || strcmp(end, ".h5") != 0 || v < 0 || v > 1000000) return -1;
    return (int)v;
}

/* Removes stale shards (index >= keep) and leftover temp files of an earlier run. */
static jdt_status remove_stale(const char *dir, int keep_train, int keep_val, jdt_err *e)
{
    char **names = NULL;
    size_t n = 0;
    jdt_status st = jdt_io_list_dir(dir, NULL, NULL, &names, &n, e);
    if (st != JDT_OK) return st;
    for (size_t i = 0; i < n && st == JDT_OK; i++) {
        int ti = shard_index(names[i], "train_"), vi = shard_index(names[i], "val_");
        size_t len = strlen(names[i]);
        bool tmp = len > 7 && strcmp(names[i] + len - 7, ".h5.tmp") == 0 &&
                   (strncmp(names[i], "train_", 6) == 0 || strncmp(names[i], "val_", 4) == 0);
        if ((ti >= keep_train) || (vi >= keep_val) || tmp) {
            char *p = jdt_io_join(dir, names[i]);
            if (!p)
                st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", dir);
            else
                st = jdt_io_rm_rf(p, e);
            jdt_free(p);
        }
    }
    jdt_io_names_free(names, n);
    return st;
}

/* keeps train_NNN.h5 names (jdt_io_list_dir's filter) */
static bool is_train_shard(const char *name, void *ctx)
{
    (void)ctx;
    return shard_index(name, "train_") >= 0;
}

const char *jdt_prep_val_dir(const char *train_path, const char *val_path, bool *shadowed)
{
    *shadowed = false;
    if (!val_path[0] || jdt_io_same_dir(val_path, train_path)) return NULL;
    char **names = NULL;
    size_t n = 0;
    jdt_err e;
    if (jdt_io_list_dir(val_path, is_train_shard, NULL, &names, &n, &e) == JDT_OK) {
        jdt_io_names_free(names, n);
        if (n > 0) {
            *shadowed = true;
            return NULL;
        }
    }
    return val_path;
}

/* The directory val_000.h5 goes to: opts->val_dir, or out_dir (also where val_dir names it
 * another way). Called once out_dir exists, so that the answer does not change. */
static const char *val_dir_of(const jdt_prep_text_opts *o)
{
    return o->val_dir && o->val_dir[0] && !jdt_io_same_dir(o->val_dir, o->out_dir) ? o->val_dir
                                                                                   : o->out_dir;
}

/* A buffer for "<out_dir or val_dir>/<name of up to 31 bytes>", or NULL. */
static char *shard_path_buf(const jdt_prep_text_opts *o)
{
    size_t a = strlen(o->out_dir), b = strlen(val_dir_of(o));
    return jdt_malloc((a > b ? a : b) + 32);
}

/* Creates the val directory if it is not out_dir and a val shard is due. */
static jdt_status make_val_dir(const jdt_prep_text_opts *o, int64_t n_val, jdt_err *e)
{
    return n_val > 0 && val_dir_of(o) != o->out_dir ? jdt_io_mkdir_p(val_dir_of(o), e) : JDT_OK;
}

/* remove_stale for the shards just written: out_dir keeps n_shards train shards and its val
 * shard if val goes there; a separate val_dir keeps its val shard (if any) and every train_
 * file it may hold (none to clean where it does not exist: no val shard was due). */
static jdt_status remove_stale_all(const jdt_prep_text_opts *o, int64_t n_val, jdt_err *e)
{
    const char *vdir = val_dir_of(o);
    const bool apart = vdir != o->out_dir;
    jdt_status st = remove_stale(o->out_dir, o->n_shards, apart || n_val == 0 ? 0 : 1, e);
    if (st == JDT_OK && apart && jdt_io_is_dir(vdir))
        st = remove_stale(vdir, INT_MAX, n_val > 0 ? 1 : 0, e);
    return st;
}

jdt_status jdt_prep_text(const jdt_prep_text_opts *o, jdt_prep_result *res, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_status st = JDT_OK;
    FILE *f = NULL;
    unsigned char *buf = NULL;
    uint32_t *toks = NULL;
    char *path = NULL;
    if (!o->text_path || !o->out_dir)
        return jdt_err_set(e, JDT_ERR_INVALID, "prepare: text_path and out_dir are required");
    if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0))
        return jdt_err_set(e, JDT_ERR_INVALID, "prepare: val_fraction %g outside [0, 1)",
                           o->val_fraction);
    if (o->n_shards < 1 || o->n_shards > 100000)
        return jdt_err_set(e, JDT_ERR_INVALID, "prepare: n_shards %d outside 1..100000",
                           o->n_shards);
    if (jdt_prep_is_llmc(o->text_path)) return jdt_prep_llmc(o, res, e);
    if (is_jsonl(o->text_path)) return jdt_prep_jsonl(o, res, e);
    if (o->tokenizer == JDT_PREP_TOK_BPE) return jdt_prep_text_bpe(o, res, e);
    f = fopen(o->text_path, "rb");
    if (!f)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s",
                           o->text_path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: not a regular file", o->text_path);
        goto out;
    }
    /* Byte tokens: one token per byte, so the token count is known without a first pass and
     * every byte offset is a token boundary. */
    int64_t n = (int64_t)sb.st_size;
    int64_t n_val = val_tokens(n, o->val_fraction);
    int64_t n_train = n - n_val;
    if (n == 0 || n_train < o->n_shards) {
        st = jdt_err_set(e, JDT_ERR_INVALID,
                         "%s: %lld tokens are too few for %d train shards "
                         "and val_fraction %g",
                         o->text_path, (long long)n, o->n_shards, o->val_fraction);
        goto out;
    }
    if ((st = jdt_io_mkdir_p(o->out_dir, e)) || (st = make_val_dir(o, n_val, e))) goto out;
    buf = jdt_malloc(BLOCK_BYTES);
    toks = jdt_malloc(BLOCK_BYTES * sizeof *toks);
    path = shard_path_buf(o);
    if (!buf || !toks || !path) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
        goto out;
    }
    jdt_progress prog;
    jdt_progress_begin(&prog, "prepare: writing shards", (double)n / 1048576.0, "MB");
    for (int i = 0; i < o->n_shards; i++) {
        int64_t b = n_train * i / o->n_shards, en = n_train * (i + 1) / o->n_shards;
        sprintf(path, "%s/train_%03d.h5", o->out_dir, i);
        if ((st = write_shard(f, o->text_path, b, en, path, o->compress_level, buf, toks, &prog,
                              e))) {
            jdt_progress_end(&prog); /* the error line starts on a clean line */
            goto out;
        }
    }
    if (n_val > 0) {
        sprintf(path, "%s/val_%03d.h5", val_dir_of(o), 0);
        if ((st = write_shard(f, o->text_path, n_train, n, path, o->compress_level, buf, toks,
                              &prog, e))) {
            jdt_progress_end(&prog);
            goto out;
        }
    }
    jdt_progress_end(&prog);
    if ((st = remove_stale_all(o, n_val, e))) goto out;
    if (res) {
        res->n_train_tokens = n_train;
        res->n_val_tokens = n_val;
        res->n_train_files = o->n_shards;
        res->n_val_files = n_val > 0 ? 1 : 0;
        res->vocab_size = JDT_PREP_BYTE_VOCAB;
    }
out:
    jdt_free(path);
    jdt_free(toks);
    jdt_free(buf);
    if (f) fclose(f);
    return st;
}

/* ---- llm.c token files ----------------------------------------------------------------------
 * llm.c's dev/data scripts write `.bin` shards: a header of 256 little-endian int32 (magic,
 * version, number of tokens, then zeros), then the ids: uint16 for GPT-2 (magic 20240520,
 * version 1), uint32 for Llama 3 (magic 20240801, version 7). */
enum { LLMC_HEADER_BYTES = 1024, LLMC_GPT2 = 20240520, LLMC_LLAMA3 = 20240801 };

typedef struct {
    char *path;
    int64_t n;      /* tokens */
    int elt;        /* bytes per id */
    int64_t header; /* bytes before the ids: 1024 (llm.c), 0 (nanoGPT's headerless uint16) */
    bool is_val;    /* the file's name says val: fineweb_val_000000.bin */
} llmc_file;

/* The header's element size, or 0 if buf does not start an llm.c token file. */
static int llmc_elt(const unsigned char *h)
{
    int32_t magic, version;
    memcpy(&magic, h, 4);
    memcpy(&version, h + 4, 4);
    return magic == LLMC_GPT2 && version == 1 ? 2 : magic == LLMC_LLAMA3 && version == 7 ? 4 : 0;
}

static bool is_bin_name(const char *name, void *ctx)
{
    (void)ctx;
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".bin") == 0;
}

bool jdt_prep_is_llmc(const char *source)
{
    if (jdt_io_is_dir(source)) {
        char **names = NULL;
        size_t n = 0;
        jdt_err e;
        bool any = jdt_io_list_dir(source, is_bin_name, NULL, &names, &n, &e) == JDT_OK && n > 0;
        jdt_io_names_free(names, n);
        return any;
    }
    FILE *f = fopen(source, "rb");
    unsigned char h[8];
    bool yes = f && fread(h, 1, 8, f) == 8 && llmc_elt(h) != 0;
    if (f) fclose(f);
    return yes || is_bin_name(source, NULL); /* nanoGPT's train.bin has no header */
}

/* Reads and checks one file's header: the magic, and that the size is the header plus n ids.
 * A .bin without llm.c's magic is nanoGPT's (its prepare.py: the uint16 ids and nothing else);
 * its ids are checked against the tokenizer like any others, which garbage rarely passes. */
static jdt_status llmc_open_file(llmc_file *lf, jdt_err *e)
{
    FILE *f = fopen(lf->path, "rb");
    if (!f)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s", lf->path,
                           strerror(errno));
    unsigned char h[12];
    struct stat sb;
    jdt_status st = JDT_OK;
    lf->header = LLMC_HEADER_BYTES;
    if (fstat(fileno(f), &sb) != 0) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", lf->path, strerror(errno));
    } else if (fread(h, 1, sizeof h, f) != sizeof h || !(lf->elt = llmc_elt(h))) {
        lf->header = 0;
        lf->elt = 2;
        lf->n = (int64_t)sb.st_size / 2;
        if (sb.st_size == 0 || sb.st_size % 2)
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: neither an llm.c token file (no magic %d or %d) nor nanoGPT's "
                             "uint16 ids (%lld bytes, not a positive even count)",
                             lf->path, LLMC_GPT2, LLMC_LLAMA3, (long long)sb.st_size);
    } else {
        int32_t n;
        memcpy(&n, h + 8, 4);
        lf->n = n;
        if (n <= 0 || (int64_t)sb.st_size != LLMC_HEADER_BYTES + (int64_t)n * lf->elt)
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: the header says %d tokens of %d bytes (%lld bytes with the "
                             "header) but the file has %lld bytes: truncated or not llm.c's",
                             lf->path, n, lf->elt,
                             (long long)(LLMC_HEADER_BYTES + (int64_t)n * lf->elt),
                             (long long)sb.st_size);
    }
    fclose(f);
    return st;
}

/* Appends ids [begin, end) of lf to w, checking each against vocab (ids in blocks). */
static jdt_status llmc_copy(const llmc_file *lf, int64_t begin, int64_t end, uint32_t vocab,
                            jdt_data_tokw *w, uint32_t *ids, unsigned char *buf, jdt_progress *prog,
                            int64_t *done, jdt_err *e)
{
    FILE *f = fopen(lf->path, "rb");
    if (!f) return jdt_err_set(e, JDT_ERR_IO, "%s: %s", lf->path, strerror(errno));
    jdt_status st = JDT_OK;
    if (fseeko(f, lf->header + begin * lf->elt, SEEK_SET) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: seek: %s", lf->path, strerror(errno));
    const int64_t block = BLOCK_BYTES / 4;
    for (int64_t pos = begin; st == JDT_OK && pos < end;) {
        int64_t k = end - pos < block ? end - pos : block;
        if (fread(buf, (size_t)lf->elt, (size_t)k, f) != (size_t)k) {
            st = jdt_err_set(e, JDT_ERR_IO,
                             "%s: short read at token %lld (file changed while "
                             "preparing?)",
                             lf->path, (long long)pos);
            break;
        }
        for (int64_t i = 0; i < k; i++) {
            uint16_t v16;
            if (lf->elt == 2) {
                memcpy(&v16, buf + 2 * i, 2);
                ids[i] = v16;
            } else {
                memcpy(&ids[i], buf + 4 * i, 4);
            }
            if (ids[i] >= vocab) {
                st = jdt_err_set(e, JDT_ERR_FORMAT,
                                 "%s: token %lld is id %u, not below the tokenizer's %u ids (was "
                                 "the file made with another tokenizer?)",
                                 lf->path, (long long)(pos + i), ids[i], vocab);
                break;
            }
        }
        if (st == JDT_OK) st = jdt_data_tokw_append(w, ids, k, e);
        pos += k;
        *done += k;
        jdt_progress_update(prog, (double)*done / 1e6);
    }
    fclose(f);
    return st;
}

/* Writes one token file from the concatenation of files[..]'s ranges [lo, hi) of the global
 * token stream (file i covers [start[i], start[i] + n)). */
static jdt_status llmc_write(const llmc_file *files, const int64_t *start, int n_files, int64_t lo,
                             int64_t hi, const char *path, uint32_t vocab, const char *tok_name,
                             int compress_level, uint32_t *ids, unsigned char *buf,
                             jdt_progress *prog, int64_t *done, jdt_err *e)
{
    jdt_data_write_opts wo = {.compress_level = compress_level, .chunk_rows = 0};
    jdt_data_tokw *w = NULL;
    jdt_status st = jdt_data_tokw_open(path, hi - lo, vocab, tok_name, &wo, &w, e);
    for (int i = 0; st == JDT_OK && i < n_files; i++) {
        int64_t b = lo > start[i] ? lo : start[i];
        int64_t en = hi < start[i] + files[i].n ? hi : start[i] + files[i].n;
        if (b < en)
            st = llmc_copy(&files[i], b - start[i], en - start[i], vocab, w, ids, buf, prog, done,
                           e);
    }
    if (st != JDT_OK) {
        if (w) jdt_data_tokw_abort(w);
        return st;
    }
    return jdt_data_tokw_commit(w, e);
}

jdt_status jdt_prep_llmc(const jdt_prep_text_opts *o, jdt_prep_result *res, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    if (o->tokenizer != JDT_PREP_TOK_BPE || !o->tokenizer_path || !o->tokenizer_path[0])
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "%s holds llm.c token files (BPE ids): set data.tokenizer: bpe and "
                           "data.tokenizer_path to the tokenizer that made them (GPT-2's "
                           "tokenizer.json, or vocab.bpe with encoder.json beside it)",
                           o->text_path);
    llmc_file *files = NULL;
    int64_t *start = NULL;
    char **names = NULL, *path = NULL, *tok_json = NULL;
    size_t n_names = 0, n_json = 0;
    uint32_t *ids = NULL;
    unsigned char *buf = NULL;
    jdt_bpe *tok = NULL;
    int n_files = 0;
    jdt_status st = JDT_OK;
    if (jdt_io_is_dir(o->text_path)) {
        if ((st = jdt_io_list_dir(o->text_path, is_bin_name, NULL, &names, &n_names, e))) goto out;
    } else {
        if (!(names = jdt_malloc(sizeof *names)) || !(names[0] = jdt_strdup(o->text_path)))
            goto oom;
        n_names = 1;
    }
    if (!(files = jdt_calloc(n_names, sizeof *files)) ||
        !(start = jdt_calloc(n_names + 1, sizeof *start)))
        goto oom;
    /* train files first, then val files, each in name order: the global stream */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < n_names; i++) {
            const char *slash = strrchr(names[i], '/');
            bool val = strstr(slash ? slash + 1 : names[i], "val") != NULL;
            if (val != (pass == 1)) continue;
            llmc_file *lf = &files[n_files];
            lf->is_val = val;
            lf->path = jdt_io_is_dir(o->text_path) ? jdt_io_join(o->text_path, names[i])
                                                   : jdt_strdup(names[i]);
            if (!lf->path) goto oom;
            n_files++;
            if ((st = llmc_open_file(lf, e))) goto out;
            if (lf->elt != files[0].elt) {
                st = jdt_err_set(e, JDT_ERR_FORMAT,
                                 "%s: ids of %d bytes, but %s has ids of %d: files of two "
                                 "tokenizers",
                                 lf->path, lf->elt, files[0].path, files[0].elt);
                goto out;
            }
            start[n_files] = start[n_files - 1] + lf->n;
        }
    int n_train_files = 0;
    for (int i = 0; i < n_files; i++)
        n_train_files += !files[i].is_val;
    const int64_t total = start[n_files];
    int64_t train_end = start[n_train_files]; /* the val files follow the train files */
    const bool val_files = n_train_files < n_files;
    if (n_train_files == 0) {
        st = jdt_err_set(e, JDT_ERR_INVALID,
                         "%s: only val files (names with 'val'), no train files", o->text_path);
        goto out;
    }
    if (!val_files && o->val_fraction > 0) { /* no val file: the tail, as for text */
        train_end = total - val_tokens(total, o->val_fraction);
    }
    if (train_end < 1) {
        st = jdt_err_set(e, JDT_ERR_INVALID, "%s: %lld tokens are too few for val_fraction %g",
                         o->text_path, (long long)total, o->val_fraction);
        goto out;
    }
    /* the tokenizer goes beside the shards, and its hash into every shard (as for text) */
    if ((st = jdt_bpe_load(o->tokenizer_path, &tok, e))) goto out;
    uint32_t vocab = (uint32_t)jdt_bpe_vocab_size(tok);
    if ((int)vocab > o->vocab_size) {
        st = jdt_err_set(e, JDT_ERR_CONFIG,
                         "%s: the tokenizer has %u ids but model.vocab_size is %d (set "
                         "model.vocab_size to at least %u)",
                         o->tokenizer_path, vocab, o->vocab_size, vocab);
        goto out;
    }
    if ((st = jdt_io_mkdir_p(o->out_dir, e))) goto out;
    if (!(path = shard_path_buf(o))) goto oom;
    sprintf(path, "%s/tokenizer.json", o->out_dir);
    if ((st = jdt_bpe_save(tok, path, e)) || (st = jdt_io_read_all(path, &tok_json, &n_json, e)))
        goto out;
    char tok_name[32];
    snprintf(tok_name, sizeof tok_name, "bpe-%016llx",
             (unsigned long long)jdt_hash_bytes(JDT_HASH_INIT, tok_json, n_json));
    if (!(ids = jdt_malloc(BLOCK_BYTES)) || !(buf = jdt_malloc(BLOCK_BYTES))) goto oom;
    const int64_t n_val = total - train_end;
    if ((st = make_val_dir(o, n_val, e))) goto out;
    jdt_progress prog;
    jdt_progress_begin(&prog, "prepare: importing llm.c tokens", (double)total / 1e6, "M tokens");
    int64_t done = 0;
    /* one train shard per train file (its part before the val tail) */
    int n_train_shards = 0;
    for (int i = 0; st == JDT_OK && i < n_train_files; i++) {
        int64_t hi = start[i + 1] < train_end ? start[i + 1] : train_end;
        if (start[i] >= hi) break;
        sprintf(path, "%s/train_%03d.h5", o->out_dir, n_train_shards++);
        st = llmc_write(files, start, n_files, start[i], hi, path, vocab, tok_name,
                        o->compress_level, ids, buf, &prog, &done, e);
    }
    /* one val shard per val file, or one of the tail */
    int n_val_shards = 0;
    for (int i = val_files ? n_train_files : n_files; st == JDT_OK && i < n_files; i++) {
        sprintf(path, "%s/val_%03d.h5", val_dir_of(o), n_val_shards++);
        st = llmc_write(files, start, n_files, start[i], start[i + 1], path, vocab, tok_name,
                        o->compress_level, ids, buf, &prog, &done, e);
    }
    if (st == JDT_OK && !val_files && n_val > 0) {
        sprintf(path, "%s/val_%03d.h5", val_dir_of(o), n_val_shards++);
        st = llmc_write(files, start, n_files, train_end, total, path, vocab, tok_name,
                        o->compress_level, ids, buf, &prog, &done, e);
    }
    jdt_progress_end(&prog);
    if (st) goto out;
    /* stale shards of an earlier, larger preparation */
    const char *vdir = val_dir_of(o);
    const bool apart = vdir != o->out_dir;
    if ((st = remove_stale(o->out_dir, n_train_shards, apart ? 0 : n_val_shards, e))) goto out;
    if (apart && jdt_io_is_dir(vdir) && (st = remove_stale(vdir, INT_MAX, n_val_shards, e)))
        goto out;
    if (val_files && o->val_fraction > 0)
        JDT_INFO("prepare: %s has val files; data.val_fraction %g is not used", o->text_path,
                 o->val_fraction);
    if (res) {
        res->n_train_tokens = train_end;
        res->n_val_tokens = n_val;
        res->n_train_files = n_train_shards;
        res->n_val_files = n_val_shards;
        res->vocab_size = (int)vocab;
    }
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
out:
    for (int i = 0; files && i < (int)n_names; i++)
        jdt_free(files[i].path);
    jdt_free(files);
    jdt_free(start);
    jdt_io_names_free(names, n_names);
    jdt_free(path);
    jdt_free(tok_json);
    jdt_free(ids);
    jdt_free(buf);
    jdt_bpe_free(tok);
    return st;
}

/* ---- JSON Lines documents -----------------------------------------------------------------
 * One JSON object per line with a "text" string: the form Hugging Face datasets export
 * (`to_json`) and most corpora ship in. With a loaded BPE each document is encoded on its own,
 * after an end-of-text id (llm.c's data scripts put <|endoftext|> before every document), into
 * temporary llm.c-format files that jdt_prep_llmc then splits into shards: memory holds one
 * document. Otherwise (bytes, or a BPE still to be trained on the text) the documents are
 * joined into a temporary text file, "<|endoftext|>" before each for BPE (the trainer and the
 * encoder cut it out as the special token, so the ids are the same as the streamed ones) and a
 * blank line between them for bytes, which goes the text path. */
enum { JSONL_PART_TOKENS = 1 << 30 };

static bool is_jsonl(const char *path)
{
    size_t n = strlen(path);
    return n > 6 && strcmp(path + n - 6, ".jsonl") == 0;
}

/* An llm.c-format part file being written: header patched with the count when it closes. */
typedef struct {
    FILE *f;
    char *path;
    int64_t n;
} jsonl_part;

static jdt_status part_close(jsonl_part *p, jdt_err *e)
{
    if (!p->f) return JDT_OK;
    int32_t h[256] = {LLMC_LLAMA3, 7, (int32_t)p->n};
    bool ok = fseek(p->f, 0, SEEK_SET) == 0 && fwrite(h, sizeof h, 1, p->f) == 1;
    ok = (fclose(p->f) == 0) && ok;
    p->f = NULL;
    return ok ? JDT_OK : jdt_err_set(e, JDT_ERR_IO, "%s: %s", p->path, strerror(errno));
}

static jdt_status part_open(jsonl_part *p, const char *dir, int index, jdt_err *e)
{
    jdt_free(p->path);
    if (!(p->path = jdt_malloc(strlen(dir) + 32)))
        return jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
    sprintf(p->path, "%s/part_%06d.bin", dir, index);
    p->n = 0;
    static const int32_t zero[256];
    if (!(p->f = fopen(p->path, "wb")) || fwrite(zero, sizeof zero, 1, p->f) != 1)
        return jdt_err_set(e, JDT_ERR_IO, "%s: %s", p->path, strerror(errno));
    return JDT_OK;
}

/* Encodes one document (after the n_pre ids at pre: the end-of-text id, or the tokenizer's
 * BOS) into *ids (grown as needed, *cap elements) and appends the ids to the open part,
 * starting a new part (in dir) when this one would pass JSONL_PART_TOKENS. */
static jdt_status stream_doc(jdt_bpe *tok, const uint32_t *pre, int n_pre, const char *text,
                             size_t n, uint32_t **ids, size_t *cap, jsonl_part *part,
                             const char *dir, int *n_parts, jdt_err *e)
{
    size_t n_ids = 0;
    jdt_status st = JDT_OK;
    if (n_pre > 0) {
        if (*cap < 64) {
            uint32_t *p = jdt_realloc(*ids, 64 * sizeof *p);
            if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
            *ids = p;
            *cap = 64;
        }
        for (int i = 0; i < n_pre; i++)
            (*ids)[n_ids++] = pre[i];
    }
    if (st == JDT_OK) st = jdt_bpe_encode(tok, text, n, ids, &n_ids, cap, e);
    if (st == JDT_OK && part->f && part->n + (int64_t)n_ids > JSONL_PART_TOKENS)
        st = part_close(part, e);
    if (st == JDT_OK && !part->f) st = part_open(part, dir, ++*n_parts, e);
    if (st == JDT_OK && fwrite(*ids, sizeof **ids, n_ids, part->f) != n_ids)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", part->path, strerror(errno));
    if (st == JDT_OK) part->n += (int64_t)n_ids;
    return st;
}

jdt_status jdt_prep_jsonl(const jdt_prep_text_opts *o, jdt_prep_result *res, jdt_err *e)
{
    jdt_err err_local_;
    if (!e) e = &err_local_;
    const bool stream =
        o->tokenizer == JDT_PREP_TOK_BPE && o->tokenizer_path && o->tokenizer_path[0];
    FILE *in = fopen(o->text_path, "rb");
    if (!in)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s",
                           o->text_path, strerror(errno));
    jdt_status st = JDT_OK;
    char *line = NULL, *tmp = NULL;
    size_t line_cap = 0, cap = 0;
    uint32_t *ids = NULL;
    jdt_bpe *tok = NULL;
    FILE *txt = NULL;
    jsonl_part part = {0};
    int n_parts = 0, eot = -1, n_pre = 0;
    uint32_t eot_u32 = 0;
    const uint32_t *pre = NULL;
    int64_t n_docs = 0, lineno = 0;
    struct stat sb;
    double total_mb = fstat(fileno(in), &sb) == 0 ? (double)sb.st_size / 1048576.0 : 0;
    if ((st = jdt_io_mkdir_p(o->out_dir, e))) goto out;
    if (!(tmp = jdt_malloc(strlen(o->out_dir) + 32))) goto oom;
    sprintf(tmp, stream ? "%s/.jsonl-ids.tmp" : "%s/.jsonl-text.tmp", o->out_dir);
    if ((st = jdt_io_rm_rf(tmp, e))) goto out; /* an interrupted run's */
    if (stream) {
        if ((st = jdt_bpe_load(o->tokenizer_path, &tok, e)) || (st = jdt_io_mkdir_p(tmp, e)))
            goto out;
        eot = jdt_bpe_special_id(tok, "<|endoftext|>");
        if (eot < 0) eot = jdt_bpe_special_id(tok, "<|end_of_text|>");
        if (eot >= 0) {
            eot_u32 = (uint32_t)eot;
            pre = &eot_u32;
            n_pre = 1;
        } else {
            /* Llama 2, Mistral, Gemma: each document starts with the BOS the tokenizer's
             * template puts before a text (<s>, <bos>), as transformers' tokenizer(text) */
            jdt_err pe;
            if (jdt_bpe_prompt_prefix(tok, &pre, &n_pre, &pe) != JDT_OK) n_pre = 0;
            if (n_pre == 0)
                JDT_WARN(
                    "prepare: %s has neither <|endoftext|> nor <|end_of_text|> nor a template's "
                    "BOS: documents are joined with no id between them",
                    o->tokenizer_path);
        }
    } else if (!(txt = fopen(tmp, "wb"))) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    jdt_progress prog;
    jdt_progress_begin(&prog, "prepare: reading documents", total_mb, "MB");
    ssize_t len;
    while ((len = getline(&line, &line_cap, in)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue; /* blank line */
        char what[64];
        snprintf(what, sizeof what, "line %lld", (long long)lineno);
        jdt_json_doc *doc = NULL;
        if ((st = jdt_json_parse(line, (size_t)len, what, &doc, e))) {
            /* json.c says "line N:1:C: problem" (its own line 1 of our line N) */
            char why[sizeof e->msg];
            int jl = 0, jc = 0, off = 0;
            size_t nw = strlen(what);
            if (strncmp(e->msg, what, nw) == 0 &&
                sscanf(e->msg + nw, ":%d:%d: %n", &jl, &jc, &off) == 2 && off > 0)
                snprintf(why, sizeof why, "%s, column %d: %s", what, jc, e->msg + nw + off);
            else
                snprintf(why, sizeof why, "%s", e->msg);
            jdt_err_set(e, st, "%s: %s", o->text_path, why);
            break;
        }
        const jdt_json *t = jdt_json_get(jdt_json_root(doc), "text");
        if (!t || t->type != JDT_JSON_STRING) {
            jdt_json_doc_free(doc);
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: line %lld: no \"text\" string (each line is a "
                             "JSON object with the document in \"text\")",
                             o->text_path, (long long)lineno);
            break;
        }
        if (stream) {
            st = stream_doc(tok, pre, n_pre, t->str, t->len, &ids, &cap, &part, tmp, &n_parts, e);
        } else {
            const char *sep = o->tokenizer == JDT_PREP_TOK_BPE ? "<|endoftext|>"
                              : n_docs                         ? "\n\n"
                                                               : "";
            if (fputs(sep, txt) == EOF || fwrite(t->str, 1, t->len, txt) != t->len)
                st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        }
        jdt_json_doc_free(doc);
        if (st) break;
        n_docs++;
        jdt_progress_update(&prog, (double)ftello(in) / 1048576.0);
    }
    jdt_progress_end(&prog);
    if (st) goto out;
    if (ferror(in)) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", o->text_path, strerror(errno));
        goto out;
    }
    if (n_docs == 0) {
        st = jdt_err_set(e, JDT_ERR_INVALID,
                         "%s: no documents (one JSON object per line with a "
                         "\"text\" string)",
                         o->text_path);
        goto out;
    }
    JDT_INFO("prepare: %lld documents from %s", (long long)n_docs, o->text_path);
    jdt_prep_text_opts o2 = *o;
    o2.text_path = tmp;
    if (stream) {
        if ((st = part_close(&part, e))) goto out;
        st = jdt_prep_llmc(&o2, res, e);
    } else {
        bool ok = fclose(txt) == 0;
        txt = NULL;
        st = ok ? jdt_prep_text(&o2, res, e)
                : jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
    }
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
out:
    if (part.f) fclose(part.f);
    jdt_free(part.path);
    if (txt) fclose(txt);
    if (tmp) {
        jdt_err e2;
        jdt_io_rm_rf(tmp, &e2);
    }
    jdt_free(tmp);
    jdt_free(line);
    jdt_free(ids);
    jdt_bpe_free(tok);
    fclose(in);
    return st;
}

/* Writes ids[begin, end) as one token file. */
static jdt_status write_ids(const uint32_t *ids, int64_t begin, int64_t end, const char *path,
                            uint32_t vocab_size, const char *tokenizer, int compress_level,
                            jdt_err *e)
{
    jdt_data_write_opts wo = {.compress_level = compress_level, .chunk_rows = 0};
    jdt_data_tokw *w = NULL;
    jdt_status st = jdt_data_tokw_open(path, end - begin, vocab_size, tokenizer, &wo, &w, e);
    if (st != JDT_OK) return st;
    if ((st = jdt_data_tokw_append(w, ids + begin, end - begin, e))) {
        jdt_data_tokw_abort(w);
        return st;
    }
    return jdt_data_tokw_commit(w, e);
}

jdt_status jdt_prep_text_bpe(const jdt_prep_text_opts *o, jdt_prep_result *res, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    char *text = NULL, *path = NULL, *tok_json = NULL;
    size_t n_text = 0, n_ids = 0, cap = 0, n_json = 0;
    uint32_t *ids = NULL;
    jdt_bpe *tok = NULL;
    jdt_status st = jdt_io_read_all(o->text_path, &text, &n_text, e);
    if (st) return st;
    if (n_text == 0) {
        st = jdt_err_set(e, JDT_ERR_INVALID, "%s: the text is empty", o->text_path);
        goto out;
    }
    if (o->tokenizer_path && o->tokenizer_path[0]) {
        if ((st = jdt_bpe_load(o->tokenizer_path, &tok, e))) goto out;
        if (jdt_bpe_vocab_size(tok) > o->vocab_size) {
            st = jdt_err_set(e, JDT_ERR_CONFIG,
                             "%s: the tokenizer has %d ids but model.vocab_size is %d (set "
                             "model.vocab_size to at least %d)",
                             o->tokenizer_path, jdt_bpe_vocab_size(tok), o->vocab_size,
                             jdt_bpe_vocab_size(tok));
            goto out;
        }
    } else {
        if (o->vocab_size < 257 || o->vocab_size > (1 << 24)) {
            st = jdt_err_set(e, JDT_ERR_CONFIG,
                             "model.vocab_size %d: training a BPE needs 257..16777216 ids (256 "
                             "bytes + <|endoftext|> + merges), or set data.tokenizer_path",
                             o->vocab_size);
            goto out;
        }
        /* train on the head that becomes train data, so val stays unseen */
        size_t n_head = n_text - (size_t)floor((double)n_text * o->val_fraction);
        double t0 = jdt_now_s();
        if ((st = jdt_bpe_train(text, n_head ? n_head : n_text, o->vocab_size, true, &tok, e)))
            goto out;
        JDT_INFO("trained a byte-level BPE of %d ids on %zu bytes in %.1f s",
                 jdt_bpe_vocab_size(tok), n_head, jdt_now_s() - t0);
    }
    if ((st = jdt_io_mkdir_p(o->out_dir, e))) goto out;
    if (!(path = shard_path_buf(o))) goto oom;
    sprintf(path, "%s/tokenizer.json", o->out_dir);
    if ((st = jdt_bpe_save(tok, path, e))) goto out;
    if ((st = jdt_io_read_all(path, &tok_json, &n_json, e))) goto out;
    char tok_name[32];
    snprintf(tok_name, sizeof tok_name, "bpe-%016llx",
             (unsigned long long)jdt_hash_bytes(JDT_HASH_INIT, tok_json, n_json));
    jdt_progress prog;
    jdt_progress_begin(&prog, "prepare: encoding", (double)n_text / 1048576.0, "MB");
    jdt_bpe_set_progress(tok, &prog);
    st = jdt_bpe_encode(tok, text, n_text, &ids, &n_ids, &cap, e);
    jdt_bpe_set_progress(tok, NULL);
    jdt_progress_end(&prog);
    if (st) goto out;
    int64_t n = (int64_t)n_ids;
    int64_t n_val = val_tokens(n, o->val_fraction);
    int64_t n_train = n - n_val;
    if (n_train < o->n_shards) {
        st = jdt_err_set(e, JDT_ERR_INVALID,
                         "%s: %lld tokens are too few for %d train shards and val_fraction %g",
                         o->text_path, (long long)n, o->n_shards, o->val_fraction);
        goto out;
    }
    uint32_t vocab = (uint32_t)jdt_bpe_vocab_size(tok);
    for (int i = 0; i < o->n_shards; i++) {
        int64_t b = n_train * i / o->n_shards, en = n_train * (i + 1) / o->n_shards;
        sprintf(path, "%s/train_%03d.h5", o->out_dir, i);
        if ((st = write_ids(ids, b, en, path, vocab, tok_name, o->compress_level, e))) goto out;
    }
    if ((st = make_val_dir(o, n_val, e))) goto out;
    if (n_val > 0) {
        sprintf(path, "%s/val_%03d.h5", val_dir_of(o), 0);
        if ((st = write_ids(ids, n_train, n, path, vocab, tok_name, o->compress_level, e)))
            goto out;
    }
    if ((st = remove_stale_all(o, n_val, e))) goto out;
    if (res) {
        res->n_train_tokens = n_train;
        res->n_val_tokens = n_val;
        res->n_train_files = o->n_shards;
        res->n_val_files = n_val > 0 ? 1 : 0;
        res->vocab_size = (int)vocab;
    }
    goto out;
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "prepare: out of memory");
out:
    jdt_bpe_free(tok);
    jdt_free(ids);
    jdt_free(tok_json);
    jdt_free(path);
    jdt_free(text);
    return st;
}

jdt_status jdt_prep_bpe_for_run(const char *data_path, const char *tokenizer_path,
                                struct jdt_bpe **out, jdt_err *e)
{
    *out = NULL;
    char *p = NULL;
    if (jdt_fetch_is_url(data_path) && !(tokenizer_path && tokenizer_path[0])) {
        /* remote data: the tokenizer.json beside the shards, fetched into the cache */
        jdt_status st = jdt_fetch_beside(NULL, data_path, "tokenizer.json", &p, e);
        if (st == JDT_OK) st = jdt_bpe_load(p, out, e);
        jdt_free(p);
        return st;
    }
    if (data_path && data_path[0]) {
        if (jdt_io_is_dir(data_path)) {
            p = jdt_io_join(data_path, "tokenizer.json");
        } else {
            const char *slash = strrchr(data_path, '/');
            size_t d = slash ? (size_t)(slash - data_path) : 1;
            if ((p = jdt_malloc(d + 20)))
                snprintf(p, d + 20, "%.*s/tokenizer.json", (int)d, slash ? data_path : ".");
        }
        if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
        if (jdt_io_is_file(p)) {
            jdt_status st = jdt_bpe_load(p, out, e);
            jdt_free(p);
            return st;
        }
    }
    if (tokenizer_path && tokenizer_path[0]) {
        jdt_free(p);
        return jdt_bpe_load(tokenizer_path, out, e);
    }
    jdt_status st = jdt_err_set(e, JDT_ERR_NOT_FOUND,
                                "data.tokenizer is bpe but there is no %s and no "
                                "data.tokenizer_path (run `jdt-train prepare` first)",
                                p ? p : "tokenizer.json beside data.train_path");
    jdt_free(p);
    return st;
}

jdt_status jdt_prep_synth_tokens(const char *path, int64_t n_tokens, uint32_t vocab_size,
                                 uint64_t seed, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    if (n_tokens <= 0 || vocab_size < 2)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: synthetic tokens need n_tokens > 0 and "
                           "vocab_size >= 2",
                           path);
    enum { BLOCK = 1 << 16 };
    uint64_t key = jdt_rng_key(seed, "synth.tokens");
    uint32_t *blk = jdt_malloc(BLOCK * sizeof *blk);
    if (!blk) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    jdt_data_tokw *w = NULL;
    jdt_status st = jdt_data_tokw_open(path, n_tokens, vocab_size, "synthetic", NULL, &w, e);
    if (st != JDT_OK) goto out;
    uint32_t prev = 0;
    for (int64_t pos = 0; pos < n_tokens;) {
        int64_t m = n_tokens - pos < BLOCK ? n_tokens - pos : BLOCK;
        for (int64_t i = 0; i < m; i++) {
            jdt_philox_ctr r = jdt_philox(key, 0, (uint64_t)(pos + i));
            /* successor table: the "fixed random successor" of prev, keyed by prev alone */
            jdt_philox_ctr s = jdt_philox(key, 1, prev);
            uint32_t t = (r.v[0] & 3u) != 0 ? s.v[0] % vocab_size : r.v[1] % vocab_size;
            blk[i] = t;
            prev = t;
        }
        if ((st = jdt_data_tokw_append(w, blk, m, e))) goto out_abort;
        pos += m;
    }
    st = jdt_data_tokw_commit(w, e);
    goto out;
out_abort:
    jdt_data_tokw_abort(w);
out:
    jdt_free(blk);
    return st;
}

jdt_status jdt_prep_synth_arrays(const char *path, int64_t n_rows, int64_t dim, int64_t n_classes,
                                 uint64_t seed, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    if (n_rows <= 0 || dim <= 0 || n_classes < 2 || n_rows > (1LL << 40) / dim)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: synthetic arrays need n_rows > 0, dim > 0, "
                           "n_classes >= 2",
                           path);
    jdt_status st = JDT_OK;
    float *x = jdt_malloc((size_t)n_rows * (size_t)dim * sizeof *x);    /* (N, D) */
    int32_t *y = jdt_malloc((size_t)n_rows * sizeof *y);                /* (N) */
    float *w = jdt_malloc((size_t)dim * (size_t)n_classes * sizeof *w); /* (D, C) */
    if (!x || !y || !w) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory for %lld x %lld arrays", path,
                         (long long)n_rows, (long long)dim);
        goto out;
    }
    jdt_rng_normal(jdt_rng_key(seed, "synth.x"), 0, (size_t)(n_rows * dim), x);
    jdt_rng_normal(jdt_rng_key(seed, "synth.w"), 0, (size_t)(dim * n_classes), w);
    for (int64_t i = 0; i < n_rows; i++) {
        int32_t best = 0;
        double best_v = -INFINITY;
        for (int64_t c = 0; c < n_classes; c++) {
            double acc = 0;
            for (int64_t j = 0; j < dim; j++)
                acc += (double)x[i * dim + j] * w[j * n_classes + c];
            if (acc > best_v) {
                best_v = acc;
                best = (int32_t)c;
            }
        }
        y[i] = best;
    }
    st = jdt_data_write_arrays(path, x, y, n_rows, dim, n_classes, NULL, e);
out:
    jdt_free(w);
    jdt_free(y);
    jdt_free(x);
    return st;
}
