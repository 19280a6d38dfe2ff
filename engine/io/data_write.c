/*
 * data_write.c — writers for the token and array dataset formats (see data.h, docs/data.md).
 * Every file is written under "<path>.tmp", closed, fsync'd and renamed into place, so a
 * reader never sees a half-written dataset.
 */
#include "io/data.h"
#include "io/io-impl.h"

#include <errno.h>
#include <zlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct jdt_data_tokw {
    char *path;     /* final name */
    char *tmp_path; /* "<path>.tmp" while writing */
    hid_t file;
    hid_t dset;
    int64_t n_tokens;
    int64_t n_written;
    uint32_t vocab_size;
    jdt_dtype dtype; /* on disk: u16 or u32 */
    uint32_t crc;    /* zlib CRC-32 of the little-endian bytes of /tokens written so far */
};

static char *tmp_name(const char *path)
{
    size_t n = strlen(path);
    char *p = jdt_malloc(n + 5);
    if (p) {
        memcpy(p, path, n);
        memcpy(p + n, ".tmp", 5);
    }
    return p;
}

/* fsyncs the directory that holds path (so a rename in it is durable). */
static jdt_status fsync_parent(const char *path, jdt_err *e)
{
    char *dir = jdt_strdup(path);
    if (!dir) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        slash[1] = '\0';
    else
        *slash = '\0';
    jdt_status st = jdt_io_fsync_path(dir, e);
    jdt_free(dir);
    return st;
}

/* Closes the HDF5 file at tmp, fsyncs it, renames it to path and fsyncs the directory. */
static jdt_status commit_file(const char *tmp, const char *path, jdt_err *e)
{
    jdt_status st = jdt_io_fsync_path(tmp, e);
    if (st != JDT_OK) return st;
    if (rename(tmp, path) != 0)
        return jdt_err_set(e, JDT_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
    return fsync_parent(path, e);
}

static hid_t make_dcpl(int rank, const hsize_t *chunk, const jdt_data_write_opts *opts,
                       const char *where, jdt_err *e)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0) goto fail;
    if (H5Pset_chunk(dcpl, rank, chunk) < 0) goto fail;
    if (opts && opts->compress_level > 0) {
        if (opts->compress_level > 9) {
            jdt_err_set(e, JDT_ERR_INVALID, "%s: compress_level %d out of range 0..9", where,
                        opts->compress_level);
            H5Pclose(dcpl);
            return H5I_INVALID_HID;
        }
        if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0) {
            jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: this HDF5 library has no deflate filter",
                        where);
            H5Pclose(dcpl);
            return H5I_INVALID_HID;
        }
        if (H5Pset_shuffle(dcpl) < 0 || H5Pset_deflate(dcpl, (unsigned)opts->compress_level) < 0)
            goto fail;
    }
    return dcpl;
fail : {
    char d[256];
    jdt_err_set(e, JDT_ERR_IO, "%s: dataset creation properties: %s", where,
                jdt_h5_detail(d, sizeof d));
    if (dcpl >= 0) H5Pclose(dcpl);
    return H5I_INVALID_HID;
}
}

static hsize_t chunk_len(int64_t n_rows, size_t row_bytes, const jdt_data_write_opts *opts)
{
    int64_t c = (opts && opts->chunk_rows > 0)
                    ? opts->chunk_rows
                    : (int64_t)((64 * 1024) / (row_bytes ? row_bytes : 1));
    if (c < 1) c = 1;
    if (c > n_rows) c = n_rows;
    return (hsize_t)c;
}

jdt_status jdt_data_tokw_open(const char *path, int64_t n_tokens, uint32_t vocab_size,
                              const char *tokenizer, const jdt_data_write_opts *opts,
                              jdt_data_tokw **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    *out = NULL;
    if (n_tokens <= 0)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: n_tokens must be > 0 (got %lld)", path,
                           (long long)n_tokens);
    if (vocab_size == 0 || vocab_size > (1u << 31))
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: vocab_size %u out of range 1..2^31", path,
                           vocab_size);
    if (!tokenizer || !tokenizer[0] || strlen(tokenizer) >= 32)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: tokenizer name must be 1..31 characters", path);
    jdt_status st = JDT_OK;
    hid_t sp = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
    jdt_data_tokw *w = jdt_calloc(1, sizeof *w);
    if (!w) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    w->file = w->dset = H5I_INVALID_HID;
    w->n_tokens = n_tokens;
    w->vocab_size = vocab_size;
    w->path = jdt_strdup(path);
    w->tmp_path = tmp_name(path);
    if (!w->path || !w->tmp_path) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    w->file = jdt_h5_create(w->tmp_path, H5F_ACC_TRUNC);
    if (w->file < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot create file: %s", w->tmp_path,
                         jdt_h5_detail(d, sizeof d));
        goto fail;
    }
    jdt_dtype dt = vocab_size <= 65536 ? JDT_DTYPE_U16 : JDT_DTYPE_U32;
    w->dtype = dt;
    w->crc = (uint32_t)crc32(0L, Z_NULL, 0);
    /* uncompressed size plus slack: HDF5 must never meet a full disk (see jdt_h5_reserve) */
    if ((st = jdt_h5_reserve(w->file, n_tokens * (int64_t)jdt_dtype_size(dt) + (1 << 20),
                             w->tmp_path, e)))
        goto fail;
    hsize_t dims[1] = {(hsize_t)n_tokens};
    hsize_t chunk[1] = {chunk_len(n_tokens, jdt_dtype_size(dt), opts)};
    sp = H5Screate_simple(1, dims, NULL);
    dcpl = make_dcpl(1, chunk, opts, w->tmp_path, e);
    if (dcpl < 0) {
        st = e ? e->code : JDT_ERR_IO;
        goto fail;
    }
    w->dset =
        H5Dcreate2(w->file, "tokens", jdt_h5_file_type(dt), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (sp < 0 || w->dset < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot create dataset /tokens: %s", w->tmp_path,
                         jdt_h5_detail(d, sizeof d));
        goto fail;
    }
    if ((st = jdt_h5_attr_write_str(w->file, "format", JDT_DATA_FORMAT_TOKENS, w->tmp_path, e)) ||
        (st = jdt_h5_attr_write_i64(w->file, "version", JDT_DATA_VERSION, w->tmp_path, e)) ||
        (st = jdt_h5_attr_write_i64(w->file, "vocab_size", vocab_size, w->tmp_path, e)) ||
        (st = jdt_h5_attr_write_str(w->file, "tokenizer", tokenizer, w->tmp_path, e)) ||
        (st = jdt_h5_attr_write_i64(w->file, "n_tokens", n_tokens, w->tmp_path, e)))
        goto fail;
    H5Pclose(dcpl);
    H5Sclose(sp);
    *out = w;
    return JDT_OK;
fail:
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    jdt_data_tokw_abort(w);
    return st;
}

jdt_status jdt_data_tokw_append(jdt_data_tokw *w, const uint32_t *tokens, int64_t n, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    if (n < 0 || w->n_written + n > w->n_tokens)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: appending %lld tokens to %lld of %lld exceeds the declared size",
                           w->path, (long long)n, (long long)w->n_written, (long long)w->n_tokens);
    if (n == 0) return JDT_OK;
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] >= w->vocab_size)
            return jdt_err_set(e, JDT_ERR_INVALID, "%s: token %u at position %lld >= vocab_size %u",
                               w->path, tokens[i], (long long)(w->n_written + i), w->vocab_size);
    }
    jdt_status st = JDT_OK;
    hsize_t start[1] = {(hsize_t)w->n_written}, count[1] = {(hsize_t)n};
    hid_t fs = H5Dget_space(w->dset);
    hid_t ms = H5Screate_simple(1, count, NULL);
    if (fs < 0 || ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
        H5Dwrite(w->dset, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, tokens) < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: writing /tokens[%lld:%lld]: %s", w->tmp_path,
                         (long long)w->n_written, (long long)(w->n_written + n),
                         jdt_h5_detail(d, sizeof d));
    } else {
        w->n_written += n;
        jdt_data_crc_tokens(&w->crc, tokens, n, w->dtype);
    }
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    return st;
}

jdt_status jdt_data_tokw_commit(jdt_data_tokw *w, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    jdt_status st = JDT_OK;
    if (w->n_written != w->n_tokens) {
        st = jdt_err_set(e, JDT_ERR_INVALID, "%s: %lld tokens written, %lld declared", w->path,
                         (long long)w->n_written, (long long)w->n_tokens);
        goto fail;
    }
    herr_t rc = H5Dclose(w->dset);
    w->dset = H5I_INVALID_HID;
    if (rc < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: writing /tokens: %s", w->tmp_path,
                         jdt_h5_detail(d, sizeof d));
    } else {
        st = jdt_h5_attr_write_i64(w->file, JDT_DATA_CRC_ATTR, (int64_t)w->crc, w->tmp_path, e);
    }
    st = jdt_h5_close_written(w->file, st, w->tmp_path, e);
    w->file = H5I_INVALID_HID;
    if (st != JDT_OK) goto fail;
    jdt_io_release_tail(w->tmp_path);
    st = commit_file(w->tmp_path, w->path, e);
    if (st != JDT_OK) goto fail;
    jdt_free(w->tmp_path);
    jdt_free(w->path);
    jdt_free(w);
    return JDT_OK;
fail:
    jdt_data_tokw_abort(w);
    return st;
}

void jdt_data_tokw_abort(jdt_data_tokw *w)
{
    if (!w) return;
    if (w->dset >= 0) H5Dclose(w->dset);
    if (w->file >= 0) jdt_h5_close_written(w->file, JDT_ERR_IO, w->tmp_path, NULL);
    if (w->tmp_path) unlink(w->tmp_path);
    jdt_free(w->tmp_path);
    jdt_free(w->path);
    jdt_free(w);
}

void jdt_data_crc_tokens(uint32_t *crc, const uint32_t *tokens, int64_t n, jdt_dtype dtype)
{
    unsigned char buf[8192];
    size_t k = 0, w = jdt_dtype_size(dtype);
    uLong c = *crc;
    for (int64_t i = 0; i < n; i++) {
        uint32_t t = tokens[i];
        buf[k++] = (unsigned char)t;
        buf[k++] = (unsigned char)(t >> 8);
        if (w == 4) {
            buf[k++] = (unsigned char)(t >> 16);
            buf[k++] = (unsigned char)(t >> 24);
        }
        if (k + 4 > sizeof buf) {
            c = crc32_z(c, buf, k);
            k = 0;
        }
    }
    if (k) c = crc32_z(c, buf, k);
    *crc = (uint32_t)c;
}

jdt_status jdt_data_write_tokens(const char *path, const uint32_t *tokens, int64_t n,
                                 uint32_t vocab_size, const char *tokenizer, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_data_tokw *w = NULL;
    jdt_status st = jdt_data_tokw_open(path, n, vocab_size, tokenizer, NULL, &w, e);
    if (st != JDT_OK) return st;
    st = jdt_data_tokw_append(w, tokens, n, e);
    if (st != JDT_OK) {
        jdt_data_tokw_abort(w);
        return st;
    }
    return jdt_data_tokw_commit(w, e);
}

/* Creates dataset `name` of dt with the given dims in f and writes buf (all of it). */
static jdt_status write_whole(hid_t f, const char *name, jdt_dtype dt, int rank,
                              const hsize_t *dims, const void *buf, const jdt_data_write_opts *opts,
                              const char *where, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hsize_t chunk[2] = {0, 0};
    size_t row_bytes = jdt_dtype_size(dt) * (rank == 2 ? dims[1] : 1);
    chunk[0] = chunk_len((int64_t)dims[0], row_bytes, opts);
    if (rank == 2) chunk[1] = dims[1];
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = make_dcpl(rank, chunk, opts, where, e);
    hid_t ds = H5I_INVALID_HID;
    if (dcpl < 0) {
        st = e ? e->code : JDT_ERR_IO;
        goto out;
    }
    ds = H5Dcreate2(f, name, jdt_h5_file_type(dt), sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (sp < 0 || ds < 0 ||
        H5Dwrite(ds, jdt_h5_mem_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: writing dataset /%s: %s", where, name,
                         jdt_h5_detail(d, sizeof d));
    }
out:
    if (ds >= 0 && H5Dclose(ds) < 0 && st == JDT_OK) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: writing dataset /%s: %s", where, name,
                         jdt_h5_detail(d, sizeof d));
    }
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

jdt_status jdt_data_write_arrays(const char *path, const float *x, const int32_t *y, int64_t n_rows,
                                 int64_t dim, int64_t n_classes, const jdt_data_write_opts *opts,
                                 jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    if (n_rows <= 0 || dim <= 0 || n_classes < 0)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "%s: bad array shape n_rows=%lld dim=%lld "
                           "n_classes=%lld",
                           path, (long long)n_rows, (long long)dim, (long long)n_classes);
    if (n_classes > 0) {
        for (int64_t i = 0; i < n_rows; i++) {
            if (y[i] < 0 || y[i] >= n_classes)
                return jdt_err_set(e, JDT_ERR_INVALID, "%s: label y[%lld] = %d outside [0, %lld)",
                                   path, (long long)i, y[i], (long long)n_classes);
        }
    }
    jdt_status st = JDT_OK;
    char *tmp = tmp_name(path);
    if (!tmp) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    hid_t f = jdt_h5_create(tmp, H5F_ACC_TRUNC);
    if (f < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot create file: %s", tmp,
                         jdt_h5_detail(d, sizeof d));
        goto out;
    }
    hsize_t xd[2] = {(hsize_t)n_rows, (hsize_t)dim}, yd[1] = {(hsize_t)n_rows};
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32_z(crc, (const Bytef *)x, (size_t)(n_rows * dim) * sizeof *x);
    crc = crc32_z(crc, (const Bytef *)y, (size_t)n_rows * sizeof *y);
    if ((st = jdt_h5_reserve(f, n_rows * (dim + 1) * 4 + (1 << 20), tmp, e)) ||
        (st = write_whole(f, "x", JDT_DTYPE_F32, 2, xd, x, opts, tmp, e)) ||
        (st = write_whole(f, "y", JDT_DTYPE_I32, 1, yd, y, opts, tmp, e)) ||
        (st = jdt_h5_attr_write_str(f, "format", JDT_DATA_FORMAT_ARRAYS, tmp, e)) ||
        (st = jdt_h5_attr_write_i64(f, "version", JDT_DATA_VERSION, tmp, e)) ||
        (st = jdt_h5_attr_write_i64(f, "n_rows", n_rows, tmp, e)) ||
        (st = jdt_h5_attr_write_i64(f, "dim", dim, tmp, e)) ||
        (st = jdt_h5_attr_write_i64(f, "n_classes", n_classes, tmp, e)) ||
        (st = jdt_h5_attr_write_i64(f, JDT_DATA_CRC_ATTR, (int64_t)crc, tmp, e)))
        goto out_close;
    st = jdt_h5_close_written(f, JDT_OK, tmp, e);
    f = H5I_INVALID_HID;
    if (st != JDT_OK) goto out;
    jdt_io_release_tail(tmp);
    st = commit_file(tmp, path, e);
    goto out;
out_close:
    jdt_h5_close_written(f, st, tmp, NULL);
out:
    if (st != JDT_OK) unlink(tmp);
    jdt_free(tmp);
    return st;
}
