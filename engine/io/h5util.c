/*
 * h5util.c — HDF5 and POSIX helpers for engine/io and datasets/ (see io-impl.h): quiet HDF5
 * errors turned into jdt_err messages that name the file and the object, typed scalar
 * attributes, dtype mapping, and the fsync/mkdir/rm/listing helpers of the atomic writers.
 */
#include "io/io-impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* HDF5 1.10 cannot close a file whose metadata flush once failed (ENOSPC, EIO): the close
 * fails ("slist already enabled?") and the library's exit-time cleanup then dereferences the
 * half-closed file and dies with SIGSEGV. We close every file explicitly, so that cleanup has
 * nothing to do for us: turn it off before the library initialises (a constructor runs before
 * main). Writers avoid the failure in the first place by reserving space (jdt_h5_reserve). */
__attribute__((constructor)) static void h5_no_exit_cleanup(void)
{
    H5dont_atexit();
}

void jdt_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

typedef struct {
    char *buf;
    size_t n;
    bool done;
} detail_ctx;

/* HDF5's file drivers put the whole failed system call into one record: "file write failed:
 * time = ..., filename = '...', file descriptor = 5, errno = 28, error message = 'No space
 * left on device', buf = ...". A user needs the error message (the caller names the file);
 * other records are cut at the first line break, so a detail is always one line. */
static void detail_from_desc(const char *desc, char *buf, size_t n)
{
    const char *en = strstr(desc, "errno = ");
    if (en) {
        int code = atoi(en + 8);
        if (code > 0) {
            const char *colon = strstr(desc, " failed");
            int head = colon ? (int)(colon - desc) : 0;
            if (head > 0 && head < 40)
                snprintf(buf, n, "%.*s failed: %s", head, desc, strerror(code));
            else
                snprintf(buf, n, "%s", strerror(code));
            return;
        }
    }
    size_t k = 0;
    for (const char *s = desc; *s && k + 1 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n' || c == '\r') break;
        buf[k++] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
    }
    while (k > 0 && (buf[k - 1] == ' ' || buf[k - 1] == ':' || buf[k - 1] == ','))
        k--;
    buf[k] = '\0';
}

static herr_t detail_cb(unsigned n, const H5E_error2_t *err, void *data)
{
    detail_ctx *c = data;
    (void)n;
    if (c->done || !err->desc || !err->desc[0]) return 0;
    detail_from_desc(err->desc, c->buf, c->n);
    c->done = c->buf[0] != '\0';
    return 0;
}

/* The most specific record on the HDF5 error stack into buf ("" when the stack is empty). */
static void stack_detail(char *buf, size_t n_bytes)
{
    buf[0] = '\0';
    detail_ctx c = {buf, n_bytes, false};
    /* UPWARD starts at the innermost (most specific) record. */
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, detail_cb, &c);
}

const char *jdt_h5_detail(char *buf, size_t n_bytes)
{
    int saved_errno = errno; /* the failed system call's, if HDF5 recorded none */
    if (n_bytes == 0) return buf;
    stack_detail(buf, n_bytes);
    if (!buf[0] && saved_errno != 0) snprintf(buf, n_bytes, "%s", strerror(saved_errno));
    if (!buf[0]) snprintf(buf, n_bytes, "HDF5 reported no detail");
    return buf;
}

/* Points the file's descriptor at /dev/null, so that whatever HDF5 still has to write for it
 * (dirty metadata, cached chunks) goes nowhere and its close cannot fail. */
static void abandon_fd(hid_t f)
{
    void *handle = NULL;
    if (H5Fget_vfd_handle(f, H5P_DEFAULT, &handle) < 0 || !handle) return;
    int fd = *(int *)handle;
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0) return;
    if (fd >= 0 && fd != null_fd) dup3(null_fd, fd, O_CLOEXEC);
    close(null_fd);
}

#define LEFT_OPEN                                                                                  \
    (H5F_OBJ_DATASET | H5F_OBJ_GROUP | H5F_OBJ_DATATYPE | H5F_OBJ_ATTR | H5F_OBJ_LOCAL)

/* Closes the objects of f that are still open: those whose close failed (HDF5 keeps the id
 * of an object whose close could not flush it). */
static void close_left_open(hid_t f)
{
    hid_t ids[64];
    ssize_t n;
    int rounds = 0;
    while ((n = H5Fget_obj_ids(f, LEFT_OPEN, 64, ids)) > 0 && rounds++ < 1000) {
        for (ssize_t i = 0; i < n; i++) {
            if (H5Iget_type(ids[i]) == H5I_ATTR)
                H5Aclose(ids[i]);
            else
                H5Oclose(ids[i]);
        }
    }
}

static void fmt_mib(char *buf, size_t n, double bytes)
{
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, n, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    else
        snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
}

jdt_status jdt_io_reserve_fd(int fd, int64_t n_bytes, const char *where, jdt_err *e)
{
    if (n_bytes <= 0) return JDT_OK;
    int rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)n_bytes);
    int err = rc == 0 ? 0 : errno;
    struct statvfs sv;
    if (err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
        /* no preallocation on this file system (some NFS): compare with the free space */
        err = 0;
        if (fstatvfs(fd, &sv) == 0 && (double)sv.f_bavail * (double)sv.f_frsize < (double)n_bytes)
            err = ENOSPC;
    }
    if (err == 0) return JDT_OK;
    char need[32], avail[32] = "unknown";
    fmt_mib(need, sizeof need, (double)n_bytes);
    if (fstatvfs(fd, &sv) == 0)
        fmt_mib(avail, sizeof avail, (double)sv.f_bavail * (double)sv.f_frsize);
    if (err == ENOSPC || err == EDQUOT || err == EFBIG)
        return jdt_err_set(e, JDT_ERR_IO, "%s: %s: needs %s, %s free there", where, strerror(err),
                           need, avail);
    return jdt_err_set(e, JDT_ERR_IO, "%s: reserving %s: %s", where, need, strerror(err));
}

jdt_status jdt_h5_reserve(hid_t f, int64_t n_bytes, const char *where, jdt_err *e)
{
    void *handle = NULL;
    if (n_bytes <= 0 || H5Fget_vfd_handle(f, H5P_DEFAULT, &handle) < 0 || !handle) return JDT_OK;
    return jdt_io_reserve_fd(*(int *)handle, n_bytes, where, e);
}

jdt_status jdt_h5_close_written(hid_t f, jdt_status st, const char *where, jdt_err *e)
{
    if (f < 0) return st;
    if (st == JDT_OK && H5Fget_obj_count(f, LEFT_OPEN) > 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: an object could not be written completely", where);
    if (st == JDT_OK && H5Fflush(f, H5F_SCOPE_LOCAL) < 0) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", where, jdt_h5_detail(d, sizeof d));
    }
    if (st != JDT_OK) {
        abandon_fd(f);
        close_left_open(f);
    }
    if (H5Fclose(f) < 0 && st == JDT_OK) {
        char d[256];
        st = jdt_err_set(e, JDT_ERR_IO, "%s: closing: %s", where, jdt_h5_detail(d, sizeof d));
    }
    return st;
}

hid_t jdt_h5_fapl(size_t sieve_bytes)
{
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return H5P_DEFAULT;
    if (H5Pset_file_locking(fapl, 1, 1) < 0 ||
        (sieve_bytes > 0 && H5Pset_sieve_buf_size(fapl, sieve_bytes) < 0)) {
        H5Pclose(fapl);
        return H5P_DEFAULT;
    }
    return fapl;
}

void jdt_h5_fapl_close(hid_t fapl)
{
    if (fapl != H5P_DEFAULT) H5Pclose(fapl);
}

hid_t jdt_h5_create(const char *path, unsigned flags)
{
    hid_t fapl = jdt_h5_fapl(0);
    hid_t f = H5Fcreate(path, flags, H5P_DEFAULT, fapl);
    jdt_h5_fapl_close(fapl);
    return f;
}

hid_t jdt_h5_open_ro(const char *path, size_t sieve_bytes, jdt_err *e)
{
    jdt_h5_quiet();
    struct stat st;
    if (stat(path, &st) != 0) {
        jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s", path,
                    strerror(errno));
        return H5I_INVALID_HID;
    }
    if (!S_ISREG(st.st_mode)) {
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: not a regular file", path);
        return H5I_INVALID_HID;
    }
    if (access(path, R_OK) != 0) {
        jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
        return H5I_INVALID_HID;
    }
    htri_t is = H5Fis_hdf5(path);
    if (is <= 0) {
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: not an HDF5 file (no HDF5 signature; %lld bytes)", path,
                    (long long)st.st_size);
        return H5I_INVALID_HID;
    }
    /* The detail is taken before closing the fapl: every HDF5 call clears the error stack, and
     * an empty stack once made this message end in whatever errno a library call left behind
     * ("Inappropriate ioctl for device"). stat and access above passed, so the failure is
     * HDF5's reading of the file, not a system call's: no errno text. */
    char d[256];
    hid_t fapl = jdt_h5_fapl(sieve_bytes);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f < 0) stack_detail(d, sizeof d);
    jdt_h5_fapl_close(fapl);
    if (f < 0)
        jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot open HDF5 file (corrupt or truncated?): %s",
                    path, d[0] ? d : "HDF5 reported no detail");
    return f;
}

bool jdt_h5_has_attr(hid_t obj, const char *name)
{
    return H5Aexists(obj, name) > 0;
}

jdt_status jdt_h5_attr_read_str(hid_t obj, const char *name, char **out, const char *where,
                                jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t a = H5I_INVALID_HID, t = H5I_INVALID_HID, mt = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    *out = NULL;
    if (!jdt_h5_has_attr(obj, name))
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: missing attribute '%s'", where, name);
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) goto fail_read;
    t = H5Aget_type(a);
    if (t < 0) goto fail_read;
    if (H5Tget_class(t) != H5T_STRING) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: attribute '%s' is not a string", where, name);
        goto out;
    }
    sp = H5Aget_space(a);
    if (sp < 0 || H5Sget_simple_extent_npoints(sp) != 1) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: attribute '%s' is not a scalar string", where,
                         name);
        goto out;
    }
    if (H5Tis_variable_str(t) > 0) {
        mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        char *vs = NULL;
        if (H5Aread(a, mt, &vs) < 0 || !vs) goto fail_read;
        *out = jdt_strdup(vs);
        H5free_memory(vs);
    } else {
        size_t n = H5Tget_size(t);
        mt = H5Tcopy(t);
        char *buf = jdt_calloc(n + 1, 1);
        if (!buf) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: attribute '%s': out of memory", where, name);
            goto out;
        }
        if (H5Aread(a, mt, buf) < 0) {
            jdt_free(buf);
            goto fail_read;
        }
        *out = buf;
    }
    if (!*out) st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: attribute '%s': out of memory", where, name);
    goto out;
fail_read : {
    char d[256];
    st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot read attribute '%s': %s", where, name,
                     jdt_h5_detail(d, sizeof d));
}
out:
    if (mt >= 0) H5Tclose(mt);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return st;
}

static jdt_status attr_read_int(hid_t obj, const char *name, hid_t mem_type, void *out,
                                const char *where, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t a = H5I_INVALID_HID, t = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    if (!jdt_h5_has_attr(obj, name))
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: missing attribute '%s'", where, name);
    a = H5Aopen(obj, name, H5P_DEFAULT);
    if (a < 0) goto fail_read;
    t = H5Aget_type(a);
    sp = H5Aget_space(a);
    if (t < 0 || sp < 0) goto fail_read;
    if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != 1) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: attribute '%s' is not a scalar integer", where,
                         name);
        goto out;
    }
    /* HDF5 converts between integer types and fails on overflow, which is what we want. */
    if (H5Aread(a, mem_type, out) < 0) goto fail_read;
    goto out;
fail_read : {
    char d[256];
    st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot read attribute '%s': %s", where, name,
                     jdt_h5_detail(d, sizeof d));
}
out:
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return st;
}

jdt_status jdt_h5_attr_read_i64(hid_t obj, const char *name, int64_t *out, const char *where,
                                jdt_err *e)
{
    return attr_read_int(obj, name, H5T_NATIVE_INT64, out, where, e);
}

jdt_status jdt_h5_attr_read_u64(hid_t obj, const char *name, uint64_t *out, const char *where,
                                jdt_err *e)
{
    return attr_read_int(obj, name, H5T_NATIVE_UINT64, out, where, e);
}

static jdt_status attr_write(hid_t obj, const char *name, hid_t file_type, hid_t mem_type,
                             const void *value, const char *where, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5I_INVALID_HID;
    if (sp < 0) goto fail;
    if (jdt_h5_has_attr(obj, name) && H5Adelete(obj, name) < 0) goto fail;
    a = H5Acreate2(obj, name, file_type, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, mem_type, value) < 0) goto fail;
    goto out;
fail : {
    char d[256];
    st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot write attribute '%s': %s", where, name,
                     jdt_h5_detail(d, sizeof d));
}
out:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

jdt_status jdt_h5_attr_write_str(hid_t obj, const char *name, const char *value, const char *where,
                                 jdt_err *e)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0) return jdt_err_set(e, JDT_ERR_INTERNAL, "%s: H5Tcopy failed", where);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    jdt_status st = attr_write(obj, name, t, t, &value, where, e);
    H5Tclose(t);
    return st;
}

jdt_status jdt_h5_attr_write_i64(hid_t obj, const char *name, int64_t value, const char *where,
                                 jdt_err *e)
{
    return attr_write(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, where, e);
}

jdt_status jdt_h5_attr_write_u64(hid_t obj, const char *name, uint64_t value, const char *where,
                                 jdt_err *e)
{
    return attr_write(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, where, e);
}

jdt_status jdt_h5_attr_write_i64v(hid_t obj, const char *name, const int64_t *v, int n,
                                  const char *where, jdt_err *e)
{
    jdt_status st = JDT_OK;
    hsize_t dims[1] = {(hsize_t)n};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    hid_t a = H5I_INVALID_HID;
    if (sp < 0) goto fail;
    if (jdt_h5_has_attr(obj, name) && H5Adelete(obj, name) < 0) goto fail;
    a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a < 0 || H5Awrite(a, H5T_NATIVE_INT64, v) < 0) goto fail;
    goto out;
fail : {
    char d[256];
    st = jdt_err_set(e, JDT_ERR_IO, "%s: cannot write attribute '%s': %s", where, name,
                     jdt_h5_detail(d, sizeof d));
}
out:
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return st;
}

jdt_status jdt_h5_attr_read_i64v(hid_t obj, const char *name, int64_t *v, int n, const char *where,
                                 jdt_err *e)
{
    jdt_status st = JDT_OK;
    hid_t a = H5I_INVALID_HID, t = H5I_INVALID_HID, sp = H5I_INVALID_HID;
    if (!jdt_h5_has_attr(obj, name))
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: missing attribute '%s'", where, name);
    a = H5Aopen(obj, name, H5P_DEFAULT);
    t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
    sp = a >= 0 ? H5Aget_space(a) : H5I_INVALID_HID;
    if (t < 0 || sp < 0) goto fail;
    if (H5Tget_class(t) != H5T_INTEGER || H5Sget_simple_extent_npoints(sp) != n) {
        st =
            jdt_err_set(e, JDT_ERR_FORMAT, "%s: attribute '%s' is not %d integers", where, name, n);
        goto out;
    }
    if (H5Aread(a, H5T_NATIVE_INT64, v) < 0) goto fail;
    goto out;
fail : {
    char d[256];
    st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: cannot read attribute '%s': %s", where, name,
                     jdt_h5_detail(d, sizeof d));
}
out:
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    if (a >= 0) H5Aclose(a);
    return st;
}

/* Switches, not tables: HDF5's predefined type ids are run-time values (set by H5open), so
 * they cannot sit in a static initializer. */
hid_t jdt_h5_file_type(jdt_dtype dt)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return H5T_IEEE_F32LE;
    case JDT_DTYPE_F64:
        return H5T_IEEE_F64LE;
    case JDT_DTYPE_BF16:
        return H5T_STD_U16LE;
    case JDT_DTYPE_I32:
        return H5T_STD_I32LE;
    case JDT_DTYPE_U16:
        return H5T_STD_U16LE;
    case JDT_DTYPE_U32:
        return H5T_STD_U32LE;
    case JDT_DTYPE_U8:
        return H5T_STD_U8LE;
    case JDT_DTYPE_COUNT:
        break;
    }
    return H5I_INVALID_HID;
}

hid_t jdt_h5_mem_type(jdt_dtype dt)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return H5T_NATIVE_FLOAT;
    case JDT_DTYPE_F64:
        return H5T_NATIVE_DOUBLE;
    case JDT_DTYPE_BF16:
        return H5T_NATIVE_UINT16;
    case JDT_DTYPE_I32:
        return H5T_NATIVE_INT32;
    case JDT_DTYPE_U16:
        return H5T_NATIVE_UINT16;
    case JDT_DTYPE_U32:
        return H5T_NATIVE_UINT32;
    case JDT_DTYPE_U8:
        return H5T_NATIVE_UINT8;
    case JDT_DTYPE_COUNT:
        break;
    }
    return H5I_INVALID_HID;
}

bool jdt_h5_classify(hid_t type, jdt_dtype *out)
{
    H5T_class_t cls = H5Tget_class(type);
    size_t size = H5Tget_size(type);
    if (cls == H5T_FLOAT) {
        if (size == 4)
            *out = JDT_DTYPE_F32;
        else if (size == 8)
            *out = JDT_DTYPE_F64;
        else
            return false;
        return true;
    }
    if (cls != H5T_INTEGER) return false;
    H5T_sign_t sign = H5Tget_sign(type);
    if (sign == H5T_SGN_2) {
        if (size != 4) return false;
        *out = JDT_DTYPE_I32;
        return true;
    }
    if (size == 1)
        *out = JDT_DTYPE_U8;
    else if (size == 2)
        *out = JDT_DTYPE_U16;
    else if (size == 4)
        *out = JDT_DTYPE_U32;
    else
        return false;
    return true;
}

/* ---- POSIX helpers ----------------------------------------------------------------------- */

jdt_status jdt_io_fsync_path(const char *path, jdt_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return jdt_err_set(e, JDT_ERR_IO, "%s: open for fsync: %s", path, strerror(errno));
    jdt_status st = JDT_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    return st;
}

void jdt_io_release_tail(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    struct stat sb;
    /* st_blocks counts 512-byte units whatever the block size */
    if (fstat(fd, &sb) == 0 && (int64_t)sb.st_blocks * 512 > (int64_t)sb.st_size)
        (void)fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, sb.st_size,
                        (off_t)sb.st_blocks * 512 - sb.st_size + (1 << 20));
    close(fd);
}

jdt_status jdt_io_mkdir_p(const char *path, jdt_err *e)
{
    char *p = jdt_strdup(path);
    if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
    jdt_status st = JDT_OK;
    size_t n = strlen(p);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            st = jdt_err_set(e, JDT_ERR_IO, "%s: mkdir: %s", p, strerror(errno));
            break;
        }
        p[i] = saved;
    }
    if (st == JDT_OK && !jdt_io_is_dir(path))
        st = jdt_err_set(e, JDT_ERR_IO, "%s: exists and is not a directory", path);
    jdt_free(p);
    return st;
}

jdt_status jdt_io_rm_rf(const char *path, jdt_err *e)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return JDT_OK;
        return jdt_err_set(e, JDT_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return jdt_err_set(e, JDT_ERR_IO, "%s: unlink: %s", path, strerror(errno));
        return JDT_OK;
    }
    DIR *d = opendir(path);
    if (!d) return jdt_err_set(e, JDT_ERR_IO, "%s: opendir: %s", path, strerror(errno));
    jdt_status s = JDT_OK;
    struct dirent *de;
    while (s == JDT_OK && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char *child = jdt_io_join(path, de->d_name);
        if (!child) {
            s = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        s = jdt_io_rm_rf(child, e);
        jdt_free(child);
    }
    closedir(d);
    if (s == JDT_OK && rmdir(path) != 0 && errno != ENOENT)
        s = jdt_err_set(e, JDT_ERR_IO, "%s: rmdir: %s", path, strerror(errno));
    return s;
}

char *jdt_io_join(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    bool slash = na > 0 && a[na - 1] != '/';
    char *p = jdt_malloc(na + nb + 2);
    if (!p) return NULL;
    memcpy(p, a, na);
    if (slash) p[na++] = '/';
    memcpy(p + na, b, nb + 1);
    return p;
}

bool jdt_io_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool jdt_io_same_dir(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    size_t na = strlen(a), nb = strlen(b);
    while (na > 1 && a[na - 1] == '/')
        na--;
    while (nb > 1 && b[nb - 1] == '/')
        nb--;
    return na == nb && memcmp(a, b, na) == 0;
}

bool jdt_io_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void jdt_io_names_free(char **names, size_t n_names)
{
    if (!names) return;
    for (size_t i = 0; i < n_names; i++)
        jdt_free(names[i]);
    jdt_free(names);
}

jdt_status jdt_io_list_dir(const char *dir, jdt_io_name_filter keep, void *ctx, char ***names,
                           size_t *n_names, jdt_err *e)
{
    *names = NULL;
    *n_names = 0;
    DIR *d = opendir(dir);
    if (!d)
        return jdt_err_set(e, errno == ENOENT ? JDT_ERR_NOT_FOUND : JDT_ERR_IO, "%s: %s", dir,
                           strerror(errno));
    jdt_status st = JDT_OK;
    char **v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (keep && !keep(de->d_name, ctx)) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            char **nv = jdt_realloc(v, nc * sizeof *nv);
            if (!nv) goto oom;
            v = nv;
            cap = nc;
        }
        v[n] = jdt_strdup(de->d_name);
        if (!v[n]) goto oom;
        n++;
    }
    closedir(d);
    if (n > 1) qsort(v, n, sizeof *v, cmp_names);
    *names = v;
    *n_names = n;
    return JDT_OK;
oom:
    closedir(d);
    jdt_io_names_free(v, n);
    st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: listing: out of memory", dir);
    return st;
}
