/*
 * ckpt.c — atomic HDF5 checkpoints (see ckpt.h, docs/checkpoints.md).
 *
 * Save: clean leftover step_*.tmp, write step_N.tmp/state.h5 (tensors chunked with Fletcher-32
 * checksums so bit rot is caught on load), fsync the file and the temp dir, rename (or
 * atomically exchange with an existing step_N), fsync the parent, prune to keep_last. The
 * rename is the commit: resume looks only at directories named exactly step_<digits>.
 */
#include "io/ckpt.h"
#include "io/io-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct jdt_ckpt {
    char *file; /* path of state.h5 */
    hid_t f;
    int64_t step;
    uint64_t rng_state;
    int64_t data_position;
    char *config_text;
};

/* ---- names and shapes ------------------------------------------------------------------- */

/* Validates a tensor name; returns the name without a leading '/' or NULL. */
static const char *clean_name(const char *name)
{
    if (!name) return NULL;
    if (name[0] == '/') name++;
    size_t n = strlen(name);
    if (n == 0 || n > 1000 || name[n - 1] == '/') return NULL;
    const char *comp = name;
    for (size_t i = 0; i <= n; i++) {
        char c = name[i];
        if (c == '/' || c == '\0') {
            size_t len = (size_t)(name + i - comp);
            if (len == 0) return NULL;
            if ((len == 1 && comp[0] == '.') || (len == 2 && comp[0] == '.' && comp[1] == '.'))
                return NULL;
            comp = name + i + 1;
            continue;
        }
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        if (!ok) return NULL;
    }
    return name;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "%s)", ndim == 1 ? "," : "");
}

static bool whole_extent(const jdt_ckpt_tensor *t)
{
    for (int i = 0; i < t->ndim; i++)
        if (t->extent[i] != 0) return false;
    return true;
}

/* The slice of t as offset/extent arrays (whole tensor when extent is all zero); checks the
 * global shape and that the slice lies inside it. */
static jdt_status slice_of(const jdt_ckpt_tensor *t, const char *where, const char *name,
                           int64_t *off, int64_t *ext, jdt_err *e)
{
    if (t->ndim < 0 || t->ndim > JDT_CKPT_MAX_DIMS)
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s': ndim %d outside 0..%d", where,
                           name, t->ndim, JDT_CKPT_MAX_DIMS);
    bool whole = whole_extent(t);
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 1)
            return jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s': dim %d has size %lld", where,
                               name, i, (long long)t->shape[i]);
        off[i] = whole ? 0 : t->offset[i];
        ext[i] = whole ? t->shape[i] : t->extent[i];
        if (off[i] < 0 || ext[i] < 1 || off[i] + ext[i] > t->shape[i]) {
            char s[160];
            fmt_shape(s, sizeof s, t->ndim, t->shape);
            return jdt_err_set(e, JDT_ERR_SHAPE,
                               "%s: tensor '%s': slice [%lld, %lld) of dim %d is "
                               "outside the global shape %s",
                               where, name, (long long)off[i], (long long)(off[i] + ext[i]), i, s);
        }
    }
    return JDT_OK;
}

static int64_t volume(int ndim, const int64_t *ext)
{
    int64_t v = 1;
    for (int i = 0; i < ndim; i++)
        v *= ext[i];
    return v;
}

/* ---- save ------------------------------------------------------------------------------- */

/* An upper bound of the bytes an HDF5 file holding these tensors (each slice as its own
 * dataset when `slices`, else each name once at its global shape) takes: the raw data, a
 * Fletcher-32 word and a chunk-index record per chunk, an object header with attributes per
 * dataset, the root attributes with the config text, and 1 MiB of slack for the superblock,
 * groups and heaps. Reserved before writing (jdt_h5_reserve), released after. */
static int64_t file_bytes_bound(const jdt_ckpt_meta *meta, const jdt_ckpt_tensor *ts, size_t n,
                                bool slices)
{
    int64_t total =
        (1 << 20) + (meta && meta->config_text ? (int64_t)strlen(meta->config_text) : 0);
    for (size_t i = 0; i < n; i++) {
        const jdt_ckpt_tensor *t = &ts[i];
        bool dup = false;
        for (size_t j = 0; !slices && j < i && !dup && j < 4096; j++)
            dup = strcmp(clean_name(t->name), clean_name(ts[j].name)) == 0;
        if (dup) continue;
        int64_t v =
            (slices && !whole_extent(t)) ? volume(t->ndim, t->extent) : volume(t->ndim, t->shape);
        int64_t bytes = v * (int64_t)jdt_dtype_size(t->dtype);
        total += bytes + (bytes / (4 << 20) + 1) * 96 + 8192;
    }
    return total;
}

/* Chunk dims: whole inner dims while the chunk stays under ~4 MiB, then part of one dim. */
static void chunk_dims(int ndim, const int64_t *shape, size_t elem_size, hsize_t *chunk)
{
    int64_t budget = (int64_t)((4u << 20) / elem_size);
    for (int i = ndim - 1; i >= 0; i--) {
        if (budget >= shape[i]) {
            chunk[i] = (hsize_t)shape[i];
            budget /= shape[i];
        } else {
            chunk[i] = (hsize_t)(budget > 1 ? budget : 1);
            budget = 1;
        }
    }
}

static hid_t create_tensor(hid_t f, const char *name, const jdt_ckpt_tensor *t, const char *where,
                           jdt_err *e)
{
    hid_t sp = H5I_INVALID_HID, dcpl = H5I_INVALID_HID, lcpl = H5I_INVALID_HID;
    hid_t ds = H5I_INVALID_HID;
    hsize_t dims[JDT_CKPT_MAX_DIMS], chunk[JDT_CKPT_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++)
        dims[i] = (hsize_t)t->shape[i];
    sp = t->ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(t->ndim, dims, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (sp < 0 || dcpl < 0 || lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) goto fail;
    if (t->ndim > 0) {
        chunk_dims(t->ndim, t->shape, jdt_dtype_size(t->dtype), chunk);
        if (H5Pset_chunk(dcpl, t->ndim, chunk) < 0 || H5Pset_fletcher32(dcpl) < 0) goto fail;
    }
    ds = H5Dcreate2(f, name, jdt_h5_file_type(t->dtype), sp, lcpl, dcpl, H5P_DEFAULT);
    if (ds < 0) goto fail;
    if (jdt_h5_attr_write_str(ds, "dtype", jdt_dtype_name(t->dtype), where, e) != JDT_OK) {
        H5Dclose(ds);
        ds = H5I_INVALID_HID;
        goto out;
    }
    goto out;
fail : {
    char d[256];
    jdt_err_set(e, JDT_ERR_IO, "%s: cannot create tensor '%s': %s", where, name,
                jdt_h5_detail(d, sizeof d));
    ds = H5I_INVALID_HID;
}
out:
    if (lcpl >= 0) H5Pclose(lcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return ds;
}

/* Selects [off, off+ext) in a fresh copy of ds's space; *ms gets the matching memory space. */
static hid_t select_slice(hid_t ds, int ndim, const int64_t *off, const int64_t *ext, hid_t *ms)
{
    hid_t fs = H5Dget_space(ds);
    *ms = H5I_INVALID_HID;
    if (fs < 0) return fs;
    if (ndim == 0) {
        *ms = H5Screate(H5S_SCALAR);
        return fs;
    }
    hsize_t start[JDT_CKPT_MAX_DIMS], count[JDT_CKPT_MAX_DIMS];
    for (int i = 0; i < ndim; i++) {
        start[i] = (hsize_t)off[i];
        count[i] = (hsize_t)ext[i];
    }
    if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0) {
        H5Sclose(fs);
        return H5I_INVALID_HID;
    }
    *ms = H5Screate_simple(ndim, count, NULL);
    return fs;
}

static bool same_name(const jdt_ckpt_tensor *a, const jdt_ckpt_tensor *b)
{
    return strcmp(clean_name(a->name), clean_name(b->name)) == 0;
}

/* Checks every tensor's name/shape/slice, that same-named slices agree on dtype and global
 * shape, are disjoint, and cover the whole tensor. */
static jdt_status check_tensors(const jdt_ckpt_tensor *ts, size_t n, bool require_cover,
                                const char *where, jdt_err *e)
{
    for (size_t i = 0; i < n; i++) {
        const char *nm = clean_name(ts[i].name);
        if (!nm)
            return jdt_err_set(e, JDT_ERR_INVALID,
                               "%s: bad tensor name '%s' (use [A-Za-z0-9_.-] "
                               "components separated by '/')",
                               where, ts[i].name ? ts[i].name : "(null)");
        if ((int)ts[i].dtype < 0 || ts[i].dtype >= JDT_DTYPE_COUNT)
            return jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s': bad dtype", where, nm);
        if (!ts[i].data)
            return jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s': no data", where, nm);
        int64_t off[JDT_CKPT_MAX_DIMS], ext[JDT_CKPT_MAX_DIMS];
        jdt_status st = slice_of(&ts[i], where, nm, off, ext, e);
        if (st != JDT_OK) return st;
    }
    for (size_t i = 0; i < n; i++) {
        const char *nm = clean_name(ts[i].name);
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = !same_name(&ts[i], &ts[j]);
        if (!first) continue;
        int64_t covered = 0, oi[JDT_CKPT_MAX_DIMS], xi[JDT_CKPT_MAX_DIMS];
        for (size_t j = i; j < n; j++) {
            if (!same_name(&ts[i], &ts[j])) continue;
            const jdt_ckpt_tensor *a = &ts[i], *b = &ts[j];
            bool agree = a->dtype == b->dtype && a->ndim == b->ndim;
            for (int d = 0; agree && d < a->ndim; d++)
                agree = a->shape[d] == b->shape[d];
            if (!agree)
                return jdt_err_set(e, JDT_ERR_INVALID,
                                   "%s: tensor '%s' is given twice with "
                                   "different dtype or global shape",
                                   where, nm);
            int64_t oj[JDT_CKPT_MAX_DIMS], xj[JDT_CKPT_MAX_DIMS];
            slice_of(b, where, nm, oj, xj, e);
            covered += volume(b->ndim, xj);
            for (size_t m = i; m < j; m++) {
                if (!same_name(&ts[m], b)) continue;
                slice_of(&ts[m], where, nm, oi, xi, e);
                bool overlap = true;
                for (int d = 0; d < b->ndim; d++)
                    overlap = overlap && oi[d] < oj[d] + xj[d] && oj[d] < oi[d] + xi[d];
                if (overlap)
                    return jdt_err_set(e, JDT_ERR_INVALID, "%s: tensor '%s': slices overlap", where,
                                       nm);
            }
        }
        if (require_cover && covered != volume(ts[i].ndim, ts[i].shape))
            return jdt_err_set(e, JDT_ERR_INVALID,
                               "%s: tensor '%s': the slices cover %lld of %lld "
                               "elements (every element must be saved by exactly one rank)",
                               where, nm, (long long)covered,
                               (long long)volume(ts[i].ndim, ts[i].shape));
    }
    return JDT_OK;
}

/* FNV-1a over the root attributes a resume trusts, each with its name, in a fixed order: a
 * flipped bit in the step, the RNG state, the data position or the config text is caught on
 * open instead of resuming "at step 12" from step 8. */
static uint64_t meta_checksum(int64_t version, const jdt_ckpt_meta *meta)
{
    uint64_t h = JDT_HASH_INIT;
    h = jdt_hash_str(h, "version");
    h = jdt_hash_u64(h, (uint64_t)version);
    h = jdt_hash_str(h, "step");
    h = jdt_hash_u64(h, (uint64_t)meta->step);
    h = jdt_hash_str(h, "rng_state");
    h = jdt_hash_u64(h, meta->rng_state);
    h = jdt_hash_str(h, "data_position");
    h = jdt_hash_u64(h, (uint64_t)meta->data_position);
    h = jdt_hash_str(h, "config");
    return jdt_hash_str(h, meta->config_text ? meta->config_text : "");
}

static jdt_status write_root_attrs(hid_t f, const jdt_ckpt_meta *meta, const char *file, jdt_err *e)
{
    jdt_status st;
    if ((st = jdt_h5_attr_write_str(f, "format", JDT_CKPT_FORMAT, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "version", JDT_CKPT_VERSION, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "step", meta->step, file, e)) ||
        (st = jdt_h5_attr_write_u64(f, "rng_state", meta->rng_state, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "data_position", meta->data_position, file, e)) ||
        (st = jdt_h5_attr_write_str(f, "config", meta->config_text ? meta->config_text : "", file,
                                    e)) ||
        (st = jdt_h5_attr_write_str(f, "jdt_version", JDT_VERSION_STRING, file, e)) ||
        (st = jdt_h5_attr_write_u64(f, "meta_checksum", meta_checksum(JDT_CKPT_VERSION, meta), file,
                                    e)))
        return st;
    return JDT_OK;
}

static jdt_status write_state(const char *file, const jdt_ckpt_meta *meta,
                              const jdt_ckpt_tensor *ts, size_t n, const jdt_ckpt_save_opts *opts,
                              jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t f = jdt_h5_create(file, H5F_ACC_EXCL);
    if (f < 0) {
        char d[256];
        return jdt_err_set(e, JDT_ERR_IO, "%s: cannot create: %s", file,
                           jdt_h5_detail(d, sizeof d));
    }
    int64_t reserved = file_bytes_bound(meta, ts, n, false);
    if ((st = jdt_h5_reserve(f, reserved, file, e))) goto out;
    if ((st = write_root_attrs(f, meta, file, e))) goto out;
    for (size_t i = 0; i < n; i++) {
        const jdt_ckpt_tensor *t = &ts[i];
        const char *nm = clean_name(t->name);
        int64_t off[JDT_CKPT_MAX_DIMS], ext[JDT_CKPT_MAX_DIMS];
        slice_of(t, file, nm, off, ext, e);
        hid_t ds;
        if (H5Lexists(f, nm, H5P_DEFAULT) > 0)
            ds = H5Dopen2(f, nm, H5P_DEFAULT);
        else
            ds = create_tensor(f, nm, t, file, e);
        if (ds < 0) {
            st = e ? e->code : JDT_ERR_IO;
            if (st == JDT_OK) st = JDT_ERR_IO;
            goto out;
        }
        hid_t ms;
        hid_t fs = select_slice(ds, t->ndim, off, ext, &ms);
        herr_t rc = -1;
        if (fs >= 0 && ms >= 0)
            rc = H5Dwrite(ds, jdt_h5_mem_type(t->dtype), ms, fs, H5P_DEFAULT, t->data);
        if (ms >= 0) H5Sclose(ms);
        if (fs >= 0) H5Sclose(fs);
        if (H5Dclose(ds) < 0) rc = -1; /* flushing its cached chunks failed */
        if (rc < 0) {
            char d[256];
            st = jdt_err_set(e, JDT_ERR_IO, "%s: writing tensor '%s': %s", file, nm,
                             jdt_h5_detail(d, sizeof d));
            goto out;
        }
        if (opts && opts->on_progress) opts->on_progress(opts->progress_ctx, i + 1, n);
    }
out:
    st = jdt_h5_close_written(f, st, file, e);
    if (st == JDT_OK) jdt_io_release_tail(file);
    return st;
}

/* ---- multi-process save ------------------------------------------------------------------ */

#define RANK_FORMAT "jdt-ckpt-shard"

/* Writes this rank's slices to file: /slices/s<i> holds slice i (its extent), with attributes
 * name, ndim, global_shape, offset and dtype. */
static jdt_status write_rank_file(const char *file, int rank, int world_size,
                                  const jdt_ckpt_meta *meta, const jdt_ckpt_tensor *ts, size_t n,
                                  const jdt_ckpt_save_opts *opts, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t f = jdt_h5_create(file, H5F_ACC_EXCL);
    if (f < 0) {
        char d[256];
        return jdt_err_set(e, JDT_ERR_IO, "%s: cannot create (rank %d): %s", file, rank,
                           jdt_h5_detail(d, sizeof d));
    }
    if ((st = jdt_h5_attr_write_str(f, "format", RANK_FORMAT, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "version", JDT_CKPT_VERSION, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "step", meta->step, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "rank", rank, file, e)) ||
        (st = jdt_h5_attr_write_i64(f, "world_size", world_size, file, e)))
        goto out;
    if ((st = jdt_h5_reserve(f, file_bytes_bound(NULL, ts, n, true), file, e))) goto out;
    for (size_t i = 0; i < n; i++) {
        const jdt_ckpt_tensor *t = &ts[i];
        const char *nm = clean_name(t->name);
        jdt_ckpt_tensor local = *t; /* the slice as a tensor of its own */
        int64_t off[JDT_CKPT_MAX_DIMS], ext[JDT_CKPT_MAX_DIMS];
        slice_of(t, file, nm, off, ext, e);
        for (int d = 0; d < t->ndim; d++)
            local.shape[d] = ext[d];
        char sname[64];
        snprintf(sname, sizeof sname, "slices/s%zu", i);
        hid_t ds = create_tensor(f, sname, &local, file, e);
        if (ds < 0) {
            st = e->code != JDT_OK ? e->code : JDT_ERR_IO;
            goto out;
        }
        herr_t rc = H5Dwrite(ds, jdt_h5_mem_type(t->dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t->data);
        if (rc < 0) {
            char d[256];
            st = jdt_err_set(e, JDT_ERR_IO, "%s: writing slice of '%s': %s", file, nm,
                             jdt_h5_detail(d, sizeof d));
        } else if (!(st = jdt_h5_attr_write_str(ds, "name", nm, file, e)) &&
                   !(st = jdt_h5_attr_write_i64(ds, "ndim", t->ndim, file, e)) && t->ndim > 0) {
            if (!(st = jdt_h5_attr_write_i64v(ds, "global_shape", t->shape, t->ndim, file, e)))
                st = jdt_h5_attr_write_i64v(ds, "offset", off, t->ndim, file, e);
        }
        if (H5Dclose(ds) < 0 && st == JDT_OK) {
            char d[256];
            st = jdt_err_set(e, JDT_ERR_IO, "%s: writing slice of '%s': %s", file, nm,
                             jdt_h5_detail(d, sizeof d));
        }
        if (st != JDT_OK) goto out;
        if (opts->on_progress) opts->on_progress(opts->progress_ctx, i + 1, n);
    }
out:
    st = jdt_h5_close_written(f, st, file, e);
    if (st == JDT_OK) jdt_io_release_tail(file);
    return st;
}

typedef struct {
    jdt_ckpt_tensor t; /* name owned (jdt_malloc'd); shape/offset/extent of the slice */
    int rank;
    size_t index; /* /slices/s<index> in the rank's file */
} slice_rec;

static void free_recs(slice_rec *r, size_t n)
{
    for (size_t i = 0; i < n && r; i++)
        jdt_free((char *)r[i].t.name);
    jdt_free(r);
}

/* Reads the slice table of one rank file and appends it to *recs. */
static jdt_status read_rank_file(const char *file, int rank, int world_size, int64_t step,
                                 slice_rec **recs, size_t *n, size_t *cap, jdt_err *e)
{
    jdt_status st = JDT_OK;
    char *format = NULL;
    hid_t f = jdt_h5_open_ro(file, 0, e);
    if (f < 0)
        return jdt_err_prefix(e, "checkpoint step %lld: rank %d's slices are missing",
                              (long long)step, rank);
    int64_t v_step, v_world;
    if ((st = jdt_h5_attr_read_str(f, "format", &format, file, e)) ||
        (st = jdt_h5_attr_read_i64(f, "step", &v_step, file, e)) ||
        (st = jdt_h5_attr_read_i64(f, "world_size", &v_world, file, e)))
        goto out;
    if (strcmp(format, RANK_FORMAT) != 0 || v_step != step || v_world != world_size) {
        st =
            jdt_err_set(e, JDT_ERR_FORMAT,
                        "%s: not rank %d's slices of step %lld (format '%s', "
                        "step %lld, world size %lld)",
                        file, rank, (long long)step, format, (long long)v_step, (long long)v_world);
        goto out;
    }
    for (size_t i = 0;; i++) {
        char sname[64];
        snprintf(sname, sizeof sname, "slices/s%zu", i);
        if (H5Lexists(f, "slices", H5P_DEFAULT) <= 0 || H5Lexists(f, sname, H5P_DEFAULT) <= 0)
            break;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 64;
            slice_rec *nr = jdt_realloc(*recs, nc * sizeof *nr);
            if (!nr) {
                st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", file);
                goto out;
            }
            *recs = nr;
            *cap = nc;
        }
        slice_rec *r = &(*recs)[*n];
        memset(r, 0, sizeof *r);
        r->rank = rank;
        r->index = i;
        char *name = NULL, *dtname = NULL;
        int64_t ndim = 0;
        hid_t ds = H5Dopen2(f, sname, H5P_DEFAULT);
        hid_t sp = ds >= 0 ? H5Dget_space(ds) : H5I_INVALID_HID;
        if (sp < 0) {
            char d[256];
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: slice %zu unreadable: %s", file, i,
                             jdt_h5_detail(d, sizeof d));
        } else if (!(st = jdt_h5_attr_read_str(ds, "name", &name, file, e)) &&
                   !(st = jdt_h5_attr_read_str(ds, "dtype", &dtname, file, e)) &&
                   !(st = jdt_h5_attr_read_i64(ds, "ndim", &ndim, file, e))) {
            if (ndim < 0 || ndim > JDT_CKPT_MAX_DIMS || !jdt_dtype_parse(dtname, &r->t.dtype) ||
                H5Sget_simple_extent_ndims(sp) != ndim) {
                st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: slice %zu has a bad ndim or dtype", file,
                                 i);
            } else if (ndim > 0 && (!(st = jdt_h5_attr_read_i64v(ds, "global_shape", r->t.shape,
                                                                 (int)ndim, file, e)) &&
                                    !(st = jdt_h5_attr_read_i64v(ds, "offset", r->t.offset,
                                                                 (int)ndim, file, e)))) {
                hsize_t dims[JDT_CKPT_MAX_DIMS];
                H5Sget_simple_extent_dims(sp, dims, NULL);
                for (int d = 0; d < ndim; d++)
                    r->t.extent[d] = (int64_t)dims[d];
            }
        }
        if (sp >= 0) H5Sclose(sp);
        if (ds >= 0) H5Dclose(ds);
        jdt_free(dtname);
        r->t.ndim = (int)ndim;
        r->t.name = name;
        r->t.data = r; /* non-NULL: check_tensors wants data */
        if (st != JDT_OK) {
            jdt_free(name);
            goto out;
        }
        (*n)++;
    }
out:
    jdt_free(format);
    H5Fclose(f);
    return st;
}

/* Rank 0: gathers every rank's slice table, checks coverage, and writes state.h5 with one
 * virtual dataset per tensor (scalars are copied). */
static jdt_status write_manifest(const char *tmp, const char *state_file, const char *final,
                                 const jdt_ckpt_meta *meta, int world_size, jdt_err *e)
{
    jdt_status st = JDT_OK;
    slice_rec *recs = NULL;
    size_t n = 0, cap = 0;
    jdt_ckpt_tensor *ts = NULL;
    hid_t f = H5I_INVALID_HID, lcpl = H5I_INVALID_HID, ocpl = H5I_INVALID_HID;
    char rank_name[64], *rank_path = NULL;
    for (int r = 0; r < world_size && st == JDT_OK; r++) {
        snprintf(rank_name, sizeof rank_name, "rank_%05d.h5", r);
        rank_path = jdt_io_join(tmp, rank_name);
        if (!rank_path)
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", tmp);
        else
            st = read_rank_file(rank_path, r, world_size, meta->step, &recs, &n, &cap, e);
        jdt_free(rank_path);
        rank_path = NULL;
    }
    if (st != JDT_OK) goto out;
    ts = jdt_calloc(n + 1, sizeof *ts);
    if (!ts) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", tmp);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        ts[i] = recs[i].t;
    if ((st = check_tensors(ts, n, true, final, e))) goto out;
    f = jdt_h5_create(state_file, H5F_ACC_EXCL);
    lcpl = H5Pcreate(H5P_LINK_CREATE);
    ocpl = H5Pcreate(H5P_OBJECT_COPY);
    if (f < 0 || lcpl < 0 || ocpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot create: %s", state_file,
                         jdt_h5_detail(d, sizeof d));
        goto out;
    }
    if ((st = jdt_h5_reserve(f,
                             (1 << 20) + (int64_t)n * 16384 +
                                 (meta->config_text ? (int64_t)strlen(meta->config_text) : 0),
                             state_file, e)))
        goto out;
    if ((st = write_root_attrs(f, meta, state_file, e))) goto out;
    for (size_t i = 0; i < n && st == JDT_OK; i++) {
        bool first = true;
        for (size_t j = 0; j < i && first; j++)
            first = !same_name(&ts[i], &ts[j]);
        if (!first) continue;
        const char *nm = clean_name(ts[i].name);
        char src[64];
        snprintf(src, sizeof src, "/slices/s%zu", recs[i].index);
        snprintf(rank_name, sizeof rank_name, "rank_%05d.h5", recs[i].rank);
        if (ts[i].ndim == 0) {
            /* virtual datasets need a simple dataspace: copy the scalar itself */
            rank_path = jdt_io_join(tmp, rank_name);
            hid_t rf = rank_path ? H5Fopen(rank_path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
            if (rf < 0 || H5Ocopy(rf, src, f, nm, ocpl, lcpl) < 0) {
                char d[256];
                st = jdt_err_set(e, JDT_ERR_IO, "%s: copying scalar '%s': %s", state_file, nm,
                                 jdt_h5_detail(d, sizeof d));
            }
            if (rf >= 0) H5Fclose(rf);
            jdt_free(rank_path);
            rank_path = NULL;
            continue;
        }
        hsize_t gdims[JDT_CKPT_MAX_DIMS];
        for (int d = 0; d < ts[i].ndim; d++)
            gdims[d] = (hsize_t)ts[i].shape[d];
        hid_t vsp = H5Screate_simple(ts[i].ndim, gdims, NULL);
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        herr_t rc = (vsp < 0 || dcpl < 0) ? -1 : 0;
        for (size_t j = i; j < n && rc >= 0; j++) {
            if (!same_name(&ts[i], &ts[j])) continue;
            hsize_t start[JDT_CKPT_MAX_DIMS], count[JDT_CKPT_MAX_DIMS];
            for (int d = 0; d < ts[j].ndim; d++) {
                start[d] = (hsize_t)ts[j].offset[d];
                count[d] = (hsize_t)ts[j].extent[d];
            }
            hid_t ssp = H5Screate_simple(ts[j].ndim, count, NULL);
            snprintf(src, sizeof src, "/slices/s%zu", recs[j].index);
            snprintf(rank_name, sizeof rank_name, "rank_%05d.h5", recs[j].rank);
            /* relative source names resolve against the directory of state.h5 */
            if (ssp < 0 || H5Sselect_hyperslab(vsp, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
                H5Pset_virtual(dcpl, vsp, rank_name, src, ssp) < 0)
                rc = -1;
            if (ssp >= 0) H5Sclose(ssp);
        }
        hid_t ds = H5I_INVALID_HID;
        if (rc >= 0 && H5Sselect_all(vsp) >= 0)
            ds = H5Dcreate2(f, nm, jdt_h5_file_type(ts[i].dtype), vsp, lcpl, dcpl, H5P_DEFAULT);
        if (ds < 0) {
            char d[256];
            st = jdt_err_set(e, JDT_ERR_IO, "%s: creating virtual dataset '%s': %s", state_file, nm,
                             jdt_h5_detail(d, sizeof d));
        } else {
            st = jdt_h5_attr_write_str(ds, "dtype", jdt_dtype_name(ts[i].dtype), state_file, e);
            H5Dclose(ds);
        }
        if (dcpl >= 0) H5Pclose(dcpl);
        if (vsp >= 0) H5Sclose(vsp);
    }
out:
    if (ocpl >= 0) H5Pclose(ocpl);
    if (lcpl >= 0) H5Pclose(lcpl);
    st = jdt_h5_close_written(f, st, state_file, e);
    if (st == JDT_OK) jdt_io_release_tail(state_file);
    jdt_free(ts);
    free_recs(recs, n);
    return st;
}

/* Parses "step_<digits>" (exactly) into *step. */
static bool parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step_", 5) != 0) return false;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || *end != '\0' || v < 0) return false;
    *step = v;
    return true;
}

static bool is_tmp_name(const char *name, void *ctx)
{
    (void)ctx;
    size_t n = strlen(name);
    return strncmp(name, "step_", 5) == 0 && n > 9 && strcmp(name + n - 4, ".tmp") == 0;
}

typedef struct {
    const char *dir;
} complete_ctx;

static bool is_complete(const char *name, void *ctx)
{
    const complete_ctx *c = ctx;
    int64_t step;
    if (!parse_step_name(name, &step)) return false;
    char *d = jdt_io_join(c->dir, name);
    char *f = d ? jdt_io_join(d, JDT_CKPT_FILE) : NULL;
    bool ok = f && jdt_io_is_file(f);
    jdt_free(f);
    jdt_free(d);
    return ok;
}

/* Complete checkpoints of dir, sorted by step ascending (names and steps arrays). */
static jdt_status list_complete(const char *dir, char ***names, int64_t **steps, size_t *n,
                                jdt_err *e)
{
    complete_ctx c = {dir};
    *steps = NULL;
    jdt_status st = jdt_io_list_dir(dir, is_complete, &c, names, n, e);
    if (st != JDT_OK) return st;
    *steps = jdt_malloc((*n + 1) * sizeof **steps);
    if (!*steps) {
        jdt_io_names_free(*names, *n);
        *names = NULL;
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", dir);
    }
    for (size_t i = 0; i < *n; i++)
        parse_step_name((*names)[i], &(*steps)[i]);
    /* insertion sort by step (names sort lexically, which differs past 6 digits) */
    for (size_t i = 1; i < *n; i++) {
        for (size_t j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            int64_t ts = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = ts;
            char *tn = (*names)[j];
            (*names)[j] = (*names)[j - 1];
            (*names)[j - 1] = tn;
        }
    }
    return JDT_OK;
}

/* Deletes all but the newest `keep` complete checkpoints, never the one of step `protect`
 * (the one just written, which may be older than leftovers of another run); -1: none. */
static jdt_status prune(const char *ckpt_dir, int keep, int64_t protect, jdt_err *e)
{
    if (keep <= 0) return JDT_OK;
    char **names = NULL;
    int64_t *steps = NULL;
    size_t n = 0;
    jdt_status st = list_complete(ckpt_dir, &names, &steps, &n, e);
    if (st != JDT_OK) return st;
    size_t n_delete = n > (size_t)keep ? n - (size_t)keep : 0;
    for (size_t i = 0; i < n && n_delete > 0 && st == JDT_OK; i++) {
        if (steps[i] == protect) continue;
        n_delete--;
        char *p = jdt_io_join(ckpt_dir, names[i]);
        if (!p) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
            break;
        }
        /* rename first so a crash mid-delete leaves a .tmp (ignored), never a partial step */
        char *tmp = jdt_malloc(strlen(p) + sizeof ".del.tmp");
        if (tmp) {
            sprintf(tmp, "%s.del.tmp", p);
            if (rename(p, tmp) == 0)
                st = jdt_io_rm_rf(tmp, e);
            else
                st = jdt_err_set(e, JDT_ERR_IO, "%s: rename for deletion: %s", p, strerror(errno));
        } else {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
        }
        jdt_free(tmp);
        jdt_free(p);
    }
    jdt_io_names_free(names, n);
    jdt_free(steps);
    return st;
}

jdt_status jdt_ckpt_prune(const char *ckpt_dir, int keep, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    return prune(ckpt_dir, keep, -1, e);
}

static jdt_status remove_leftovers(const char *dir, jdt_err *e)
{
    char **names = NULL;
    size_t n = 0;
    jdt_status st = jdt_io_list_dir(dir, is_tmp_name, NULL, &names, &n, e);
    for (size_t i = 0; i < n && st == JDT_OK; i++) {
        char *p = jdt_io_join(dir, names[i]);
        if (!p)
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", dir);
        else {
            JDT_INFO("checkpoint: removing unfinished %s", p);
            st = jdt_io_rm_rf(p, e);
        }
        jdt_free(p);
    }
    jdt_io_names_free(names, n);
    return st;
}

/* Makes tmp the checkpoint `final`: fsync tmp, rename (or exchange with an existing final and
 * delete the old copy), fsync ckpt_dir, prune, warn if a newer checkpoint exists. */
static jdt_status commit(const char *ckpt_dir, const char *tmp, const char *final,
                         const jdt_ckpt_meta *meta, const jdt_ckpt_save_opts *opts, jdt_err *e)
{
    jdt_status st = jdt_io_fsync_path(tmp, e);
    if (st != JDT_OK) return st;
    if (jdt_io_is_dir(final)) {
        /* re-save of a step: swap atomically, then delete the old one (now under tmp) */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
            return jdt_err_set(e, JDT_ERR_IO, "%s: exchange with %s: %s", final, tmp,
                               strerror(errno));
    } else if (rename(tmp, final) != 0) {
        return jdt_err_set(e, JDT_ERR_IO, "%s: rename from %s: %s", final, tmp, strerror(errno));
    }
    if ((st = jdt_io_fsync_path(ckpt_dir, e))) return st;
    jdt_io_rm_rf(tmp, NULL); /* the swapped-out old copy, if any */
    if (opts && (st = prune(ckpt_dir, opts->keep_last, meta->step, e))) return st;
    int64_t newest = -1;
    char *newest_path = NULL;
    if (jdt_ckpt_find_latest(ckpt_dir, &newest_path, &newest, NULL) == JDT_OK &&
        newest > meta->step)
        JDT_WARN("checkpoint: %s is newer than the step just saved (%lld); resume: auto will "
                 "pick it",
                 newest_path, (long long)meta->step);
    jdt_free(newest_path);
    return JDT_OK;
}

/* Runs one barrier of a multi-process save. Returns false if the barrier itself failed (the
 * protocol cannot go on); *st then holds that failure unless it already held an error. */
static bool sync_ranks(const jdt_ckpt_save_opts *o, jdt_status *st, jdt_err *e)
{
    jdt_err be;
    jdt_err_clear(&be);
    jdt_status bst = o->barrier(o->barrier_ctx, &be);
    if (bst == JDT_OK) return true;
    if (*st == JDT_OK) {
        *e = be;
        *st = jdt_err_prefix(e, "checkpoint barrier (rank %d)", o->rank);
        if (*st == JDT_OK) *st = bst;
    }
    return false;
}

/* The multi-process protocol (see ckpt.h): every rank passes all three barriers. */
static jdt_status save_multi(const char *ckpt_dir, const char *tmp, const char *final,
                             const char *state_file, const jdt_ckpt_meta *meta,
                             const jdt_ckpt_tensor *ts, size_t n, const jdt_ckpt_save_opts *o,
                             jdt_err *e)
{
    /* After an out-of-memory on the names this rank still takes part in the barriers. */
    char rank_name[64], *rank_file = NULL;
    snprintf(rank_name, sizeof rank_name, "rank_%05d.h5", o->rank);
    rank_file = state_file ? jdt_io_join(tmp, rank_name) : NULL;
    jdt_status st = rank_file ? check_tensors(ts, n, false, final, e)
                              : jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
    if (o->rank == 0 && st == JDT_OK) {
        if (!(st = jdt_io_mkdir_p(ckpt_dir, e)) && !(st = remove_leftovers(ckpt_dir, e)) &&
            mkdir(tmp, 0777) != 0)
            st = jdt_err_set(e, JDT_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
    }
    if (!sync_ranks(o, &st, e)) goto out; /* 1: the temp dir exists */
    if (st == JDT_OK) {
        st = write_rank_file(rank_file, o->rank, o->world_size, meta, ts, n, o, e);
        if (st == JDT_OK) st = jdt_io_fsync_path(rank_file, e);
        if (st != JDT_OK) unlink(rank_file); /* rank 0 then sees it missing and gives up */
    }
    if (!sync_ranks(o, &st, e)) goto out; /* 2: every rank's slices are on disk */
    if (o->rank == 0) {
        if (st == JDT_OK) st = write_manifest(tmp, state_file, final, meta, o->world_size, e);
        if (st == JDT_OK) st = jdt_io_fsync_path(state_file, e);
        if (st == JDT_OK) st = commit(ckpt_dir, tmp, final, meta, o, e);
        if (st != JDT_OK && tmp) jdt_io_rm_rf(tmp, NULL);
    }
    /* 3: committed (or abandoned). Rank 0's status is the checkpoint's: once committed it is
     * saved, even when a rank is lost before this barrier (the caller's next collective then
     * reports the loss); before, rank 0 said "not saved" of a checkpoint in place */
    if (o->rank == 0 && st == JDT_OK) {
        jdt_err be;
        jdt_err_clear(&be);
        (void)o->barrier(o->barrier_ctx, &be);
    } else {
        sync_ranks(o, &st, e);
    }
out:
    jdt_free(rank_file);
    return st;
}

jdt_status jdt_ckpt_save(const char *ckpt_dir, const jdt_ckpt_meta *meta,
                         const jdt_ckpt_tensor *tensors, size_t n_tensors,
                         const jdt_ckpt_save_opts *opts, char **saved_path, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    if (saved_path) *saved_path = NULL;
    bool multi = opts && opts->world_size > 1;
    if (multi && (opts->rank < 0 || opts->rank >= opts->world_size || !opts->barrier))
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: rank %d of world size %d needs a barrier",
                           ckpt_dir, opts->rank, opts->world_size);
    if (meta->step < 0) /* every rank sees the same meta, so every rank returns here */
        return jdt_err_set(e, JDT_ERR_INVALID, "%s: negative step %lld", ckpt_dir,
                           (long long)meta->step);
    jdt_status st = JDT_OK;
    char *final = NULL, *tmp = NULL, *file = NULL;
    char name[64];
    snprintf(name, sizeof name, "step_%06lld", (long long)meta->step);
    final = jdt_io_join(ckpt_dir, name);
    tmp = final ? jdt_malloc(strlen(final) + 5) : NULL;
    if (tmp) sprintf(tmp, "%s.tmp", final);
    file = tmp ? jdt_io_join(tmp, JDT_CKPT_FILE) : NULL;
    if (multi) {
        st = save_multi(ckpt_dir, tmp, final, file, meta, tensors, n_tensors, opts, e);
        if (st == JDT_OK) goto out_saved;
        goto out;
    }
    if (!file) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
        goto out;
    }
    if ((st = check_tensors(tensors, n_tensors, true, final, e))) goto out;
    if ((st = jdt_io_mkdir_p(ckpt_dir, e))) goto out;
    if ((st = remove_leftovers(ckpt_dir, e))) goto out;
    if (mkdir(tmp, 0777) != 0) {
        st = jdt_err_set(e, JDT_ERR_IO, "%s: mkdir: %s", tmp, strerror(errno));
        goto out;
    }
    if ((st = write_state(file, meta, tensors, n_tensors, opts, e))) goto out_rm_tmp;
    if ((st = jdt_io_fsync_path(file, e))) goto out_rm_tmp;
    if ((st = commit(ckpt_dir, tmp, final, meta, opts, e))) goto out_rm_tmp;
out_saved:
    if (saved_path) {
        *saved_path = final;
        final = NULL;
    }
    goto out;
out_rm_tmp:
    jdt_io_rm_rf(tmp, NULL);
out:
    jdt_free(file);
    jdt_free(tmp);
    jdt_free(final);
    return st;
}

jdt_status jdt_ckpt_preflight(const char *ckpt_dir, const jdt_ckpt_meta *meta,
                              const jdt_ckpt_tensor *tensors, size_t n_tensors, jdt_err *e)
{
    jdt_status st = jdt_io_mkdir_p(ckpt_dir, e);
    if (st != JDT_OK) return st;
    char probe[64];
    snprintf(probe, sizeof probe, ".jdt-preflight.%ld", (long)getpid());
    char *path = jdt_io_join(ckpt_dir, probe);
    if (!path) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = jdt_err_set(e, JDT_ERR_IO, "checkpoint directory %s is not writable: %s", ckpt_dir,
                         strerror(errno));
        jdt_free(path);
        return st;
    }
    char where[1200];
    snprintf(where, sizeof where, "checkpoint directory %s has no room for one checkpoint",
             ckpt_dir);
    st = jdt_io_reserve_fd(fd, file_bytes_bound(meta, tensors, n_tensors, false), where, e);
    close(fd);
    unlink(path);
    jdt_free(path);
    return st;
}

/* ---- find / resolve --------------------------------------------------------------------- */

jdt_status jdt_ckpt_find_latest(const char *ckpt_dir, char **path, int64_t *step, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *path = NULL;
    if (!jdt_io_is_dir(ckpt_dir))
        return jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: no checkpoint directory", ckpt_dir);
    char **names = NULL;
    int64_t *steps = NULL;
    size_t n = 0;
    jdt_status st = list_complete(ckpt_dir, &names, &steps, &n, e);
    if (st != JDT_OK) return st;
    if (n == 0) {
        st = jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: no complete checkpoint (step_NNN/%s)", ckpt_dir,
                         JDT_CKPT_FILE);
    } else {
        *path = jdt_io_join(ckpt_dir, names[n - 1]);
        if (!*path) st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
        if (step) *step = steps[n - 1];
    }
    jdt_io_names_free(names, n);
    jdt_free(steps);
    return st;
}

static bool is_step_entry(const char *name, void *ctx)
{
    int64_t step;
    (void)ctx;
    return parse_step_name(name, &step);
}

/* A step_N entry newer than the latest complete checkpoint (latest: -1 when none) that is not
 * a complete one: a directory without a regular state.h5, or not a directory. The writer
 * renames whole directories into place and prunes by renaming away first, so only damage
 * leaves one; resuming past it would silently start over from an older step, or step 0. */
static jdt_status check_newer_entries(const char *ckpt_dir, int64_t latest, jdt_err *e)
{
    char **names = NULL;
    size_t n = 0;
    jdt_status st = jdt_io_list_dir(ckpt_dir, is_step_entry, NULL, &names, &n, e);
    if (st != JDT_OK) return st;
    for (size_t i = 0; i < n && st == JDT_OK; i++) {
        int64_t step;
        parse_step_name(names[i], &step);
        if (step <= latest) continue;
        char *d = jdt_io_join(ckpt_dir, names[i]);
        char *f = d ? jdt_io_join(d, JDT_CKPT_FILE) : NULL;
        if (!f)
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", ckpt_dir);
        else if (!jdt_io_is_file(f))
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: damaged checkpoint (no readable %s), newer than the latest "
                             "complete one: remove it, or set checkpoint.resume to a checkpoint "
                             "or none",
                             d, JDT_CKPT_FILE);
        jdt_free(f);
        jdt_free(d);
    }
    jdt_io_names_free(names, n);
    return st;
}

jdt_status jdt_ckpt_resolve(const char *resume, const char *ckpt_dir, char **path, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    *path = NULL;
    if (!resume || !resume[0] || strcmp(resume, "none") == 0) return JDT_OK;
    if (strcmp(resume, "auto") == 0) {
        int64_t latest = -1;
        jdt_status st = jdt_ckpt_find_latest(ckpt_dir, path, &latest, e);
        if (st == JDT_ERR_NOT_FOUND) {
            jdt_err_clear(e);
            if (!jdt_io_is_dir(ckpt_dir)) return JDT_OK;
            st = JDT_OK;
        }
        if (st == JDT_OK) st = check_newer_entries(ckpt_dir, latest, e);
        if (st != JDT_OK) {
            jdt_free(*path);
            *path = NULL;
        }
        return st;
    }
    if (!jdt_io_is_dir(resume) && !jdt_io_is_file(resume))
        return jdt_err_set(e, JDT_ERR_NOT_FOUND, "resume: checkpoint %s %s", resume,
                           access(resume, F_OK) == 0
                               ? "is neither a checkpoint directory nor a regular file"
                               : "does not exist");
    *path = jdt_strdup(resume);
    return *path ? JDT_OK : jdt_err_set(e, JDT_ERR_NOMEM, "resume: out of memory");
}

/* ---- load ------------------------------------------------------------------------------- */

jdt_status jdt_ckpt_open(const char *path, jdt_ckpt **out, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    *out = NULL;
    jdt_status st = JDT_OK;
    char *format = NULL;
    jdt_ckpt *c = jdt_calloc(1, sizeof *c);
    if (!c) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    c->f = H5I_INVALID_HID;
    c->file = jdt_io_is_dir(path) ? jdt_io_join(path, JDT_CKPT_FILE) : jdt_strdup(path);
    if (!c->file) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    const char *p = c->file;
    c->f = jdt_h5_open_ro(p, 0, e);
    if (c->f < 0) {
        st = e ? e->code : JDT_ERR_FORMAT;
        goto fail;
    }
    if ((st = jdt_h5_attr_read_str(c->f, "format", &format, p, e))) goto fail;
    if (strcmp(format, JDT_CKPT_FORMAT) != 0) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: format '%s' is not a checkpoint ('%s')", p, format,
                         JDT_CKPT_FORMAT);
        goto fail;
    }
    int64_t version;
    if ((st = jdt_h5_attr_read_i64(c->f, "version", &version, p, e))) goto fail;
    if (version != JDT_CKPT_VERSION && version != 1) {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: checkpoint version %lld is not supported (this "
                         "build reads versions 1 and %d)",
                         p, (long long)version, JDT_CKPT_VERSION);
        goto fail;
    }
    if ((st = jdt_h5_attr_read_i64(c->f, "step", &c->step, p, e)) ||
        (st = jdt_h5_attr_read_u64(c->f, "rng_state", &c->rng_state, p, e)) ||
        (st = jdt_h5_attr_read_i64(c->f, "data_position", &c->data_position, p, e)) ||
        (st = jdt_h5_attr_read_str(c->f, "config", &c->config_text, p, e)))
        goto fail;
    if (version >= 2) { /* version 1 predates the checksum */
        uint64_t want;
        if ((st = jdt_h5_attr_read_u64(c->f, "meta_checksum", &want, p, e))) goto fail;
        jdt_ckpt_meta m = {.step = c->step,
                           .rng_state = c->rng_state,
                           .data_position = c->data_position,
                           .config_text = c->config_text};
        if (meta_checksum(version, &m) != want) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: the checkpoint's metadata (step %lld, RNG state, data "
                             "position or config) fails its checksum: the file is damaged; "
                             "resume from an older checkpoint",
                             p, (long long)c->step);
            goto fail;
        }
    }
    jdt_free(format);
    *out = c;
    return JDT_OK;
fail:
    jdt_free(format);
    jdt_ckpt_close(c);
    return st;
}

void jdt_ckpt_get_meta(const jdt_ckpt *c, jdt_ckpt_meta *out)
{
    out->step = c->step;
    out->rng_state = c->rng_state;
    out->data_position = c->data_position;
    out->config_text = c->config_text;
}

/* True if every component of name exists as a link (H5Lexists needs its parents to exist). */
static bool path_exists(hid_t f, const char *name)
{
    char buf[1024];
    size_t n = strlen(name);
    if (n >= sizeof buf) return false;
    memcpy(buf, name, n + 1);
    for (size_t i = 0; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (H5Lexists(f, buf, H5P_DEFAULT) <= 0) return false;
        buf[i] = saved;
    }
    return true;
}

/* A virtual dataset (multi-process checkpoint) reads missing source files as zeros without
 * complaint, so check that every rank file it maps exists next to state.h5. */
static jdt_status check_sources(jdt_ckpt *c, hid_t ds, const char *nm, jdt_err *e)
{
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) return JDT_OK;
    jdt_status st = JDT_OK;
    size_t count = 0;
    if (H5Pget_layout(dcpl) == H5D_VIRTUAL && H5Pget_virtual_count(dcpl, &count) >= 0) {
        char *dir = jdt_strdup(c->file);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = '\0';
        for (size_t i = 0; i < count && dir && st == JDT_OK; i++) {
            char fn[512];
            if (H5Pget_virtual_filename(dcpl, i, fn, sizeof fn) < 0 || strcmp(fn, ".") == 0)
                continue;
            char *src = fn[0] == '/' || !slash ? jdt_strdup(fn) : jdt_io_join(dir, fn);
            if (src && !jdt_io_is_file(src))
                st = jdt_err_set(e, JDT_ERR_FORMAT,
                                 "%s: tensor '%s': its slice file %s is "
                                 "missing",
                                 c->file, nm, src);
            jdt_free(src);
        }
        jdt_free(dir);
    }
    H5Pclose(dcpl);
    return st;
}

/* Opens tensor name as a dataset and reads its dtype and shape. */
static jdt_status open_tensor(jdt_ckpt *c, const char *name, hid_t *ds_out, jdt_dtype *dtype,
                              int *ndim, int64_t *shape, jdt_err *e)
{
    *ds_out = H5I_INVALID_HID;
    const char *nm = clean_name(name);
    if (!nm) return jdt_err_set(e, JDT_ERR_INVALID, "%s: bad tensor name '%s'", c->file, name);
    if (!path_exists(c->f, nm))
        return jdt_err_set(e, JDT_ERR_NOT_FOUND, "%s: tensor '%s' is missing from the checkpoint",
                           c->file, nm);
    jdt_status st = JDT_OK;
    char *dtname = NULL;
    hid_t ds = H5Dopen2(c->f, nm, H5P_DEFAULT);
    hid_t sp = ds >= 0 ? H5Dget_space(ds) : H5I_INVALID_HID;
    hid_t t = ds >= 0 ? H5Dget_type(ds) : H5I_INVALID_HID;
    if (ds < 0 || sp < 0 || t < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' is not a readable dataset: %s",
                         c->file, nm, jdt_h5_detail(d, sizeof d));
        goto out;
    }
    int rank = H5Sget_simple_extent_ndims(sp);
    if (rank < 0 || rank > JDT_CKPT_MAX_DIMS) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' has %d dims", c->file, nm, rank);
        goto out;
    }
    hsize_t dims[JDT_CKPT_MAX_DIMS];
    H5Sget_simple_extent_dims(sp, dims, NULL);
    *ndim = rank;
    for (int i = 0; i < rank; i++)
        shape[i] = (int64_t)dims[i];
    if (!jdt_h5_classify(t, dtype)) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: tensor '%s' has an unsupported element type",
                         c->file, nm);
        goto out;
    }
    if (jdt_h5_has_attr(ds, "dtype")) {
        jdt_dtype named;
        if ((st = jdt_h5_attr_read_str(ds, "dtype", &dtname, c->file, e))) goto out;
        /* the stored element type must be the one the writer uses for that dtype (bf16: u16),
         * not merely as wide: f32 over i32 storage read integers converted to floats */
        jdt_dtype stored = JDT_DTYPE_COUNT;
        hid_t ft = jdt_dtype_parse(dtname, &named) ? jdt_h5_file_type(named) : H5I_INVALID_HID;
        if (ft < 0 || !jdt_h5_classify(ft, &stored) || stored != *dtype) {
            st = jdt_err_set(e, JDT_ERR_FORMAT,
                             "%s: tensor '%s': dtype attribute '%s' does not "
                             "match its element type",
                             c->file, nm, dtname);
            goto out;
        }
        *dtype = named;
    }
    st = check_sources(c, ds, nm, e);
out:
    jdt_free(dtname);
    if (t >= 0) H5Tclose(t);
    if (sp >= 0) H5Sclose(sp);
    if (st != JDT_OK) {
        if (ds >= 0) H5Dclose(ds);
    } else {
        *ds_out = ds;
    }
    return st;
}

jdt_status jdt_ckpt_tensor_info(jdt_ckpt *c, const char *name, jdt_dtype *dtype, int *ndim,
                                int64_t *shape, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    hid_t ds;
    jdt_status st = open_tensor(c, name, &ds, dtype, ndim, shape, e);
    if (st == JDT_OK) H5Dclose(ds);
    return st;
}

jdt_status jdt_ckpt_read(jdt_ckpt *c, const jdt_ckpt_tensor *want, void *dst, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    hid_t ds;
    jdt_dtype dt;
    int ndim;
    int64_t shape[JDT_CKPT_MAX_DIMS];
    jdt_status st = open_tensor(c, want->name, &ds, &dt, &ndim, shape, e);
    if (st != JDT_OK) return st;
    const char *nm = clean_name(want->name);
    int64_t off[JDT_CKPT_MAX_DIMS], ext[JDT_CKPT_MAX_DIMS];
    bool same = ndim == want->ndim;
    for (int i = 0; same && i < ndim; i++)
        same = shape[i] == want->shape[i];
    if (!same) {
        char have[160], exp[160];
        fmt_shape(have, sizeof have, ndim, shape);
        fmt_shape(exp, sizeof exp, want->ndim, want->shape);
        st = jdt_err_set(e, JDT_ERR_SHAPE,
                         "%s: tensor '%s' has shape %s in the checkpoint, the "
                         "model expects %s",
                         c->file, nm, have, exp);
        goto out;
    }
    if (dt != want->dtype) {
        st = jdt_err_set(e, JDT_ERR_FORMAT,
                         "%s: tensor '%s' is %s in the checkpoint, the model "
                         "expects %s",
                         c->file, nm, jdt_dtype_name(dt), jdt_dtype_name(want->dtype));
        goto out;
    }
    if ((st = slice_of(want, c->file, nm, off, ext, e))) goto out;
    hid_t ms;
    hid_t fs = select_slice(ds, ndim, off, ext, &ms);
    herr_t rc = -1;
    if (fs >= 0 && ms >= 0) rc = H5Dread(ds, jdt_h5_mem_type(dt), ms, fs, H5P_DEFAULT, dst);
    if (ms >= 0) H5Sclose(ms);
    if (fs >= 0) H5Sclose(fs);
    if (rc < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: reading tensor '%s' failed (corrupt file?): %s",
                         c->file, nm, jdt_h5_detail(d, sizeof d));
    }
out:
    H5Dclose(ds);
    return st;
}

typedef struct {
    char **v;
    size_t n, cap;
    bool oom;
} name_list;

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static herr_t visit_cb(hid_t obj, const char *name, const H5O_info_t *info, void *data)
{
    (void)obj;
    name_list *l = data;
    if (info->type != H5O_TYPE_DATASET) return 0;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 32;
        char **nv = jdt_realloc(l->v, nc * sizeof *nv);
        if (!nv) {
            l->oom = true;
            return 1;
        }
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n] = jdt_strdup(name);
    if (!l->v[l->n]) {
        l->oom = true;
        return 1;
    }
    l->n++;
    return 0;
}

jdt_status jdt_ckpt_list(jdt_ckpt *c, char ***names, size_t *n_names, jdt_err *e)
{
    jdt_err err_local_; /* e may be NULL: keep the detail locally */
    if (!e) e = &err_local_;
    jdt_h5_quiet();
    name_list l = {0};
    *names = NULL;
    *n_names = 0;
    herr_t rc = H5Ovisit(c->f, H5_INDEX_NAME, H5_ITER_INC, visit_cb, &l);
    if (rc < 0 || l.oom) {
        jdt_io_names_free(l.v, l.n);
        if (l.oom)
            return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory listing tensors", c->file);
        char d[256];
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot list tensors: %s", c->file,
                           jdt_h5_detail(d, sizeof d));
    }
    if (l.n > 1) qsort(l.v, l.n, sizeof *l.v, cmp_str);
    *names = l.v;
    *n_names = l.n;
    return JDT_OK;
}

void jdt_ckpt_close(jdt_ckpt *c)
{
    if (!c) return;
    if (c->f >= 0) H5Fclose(c->f);
    jdt_free(c->config_text);
    jdt_free(c->file);
    jdt_free(c);
}
