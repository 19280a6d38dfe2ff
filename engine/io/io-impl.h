/*
 * io-impl.h — internals shared by engine/io (data streaming, checkpoints) and datasets/:
 * HDF5 helpers that turn HDF5's error stack into our jdt_err messages, typed attribute
 * read/write, the dtype <-> HDF5 type mapping, and the POSIX file helpers (fsync, mkdir -p,
 * rm -r) that the atomic write protocols need. Not a public header: cmd/ must not include it.
 */
#ifndef JDT_IO_IMPL_H
#define JDT_IO_IMPL_H

#include "core/core.h"

#include <hdf5.h>

/* Turns off HDF5's automatic error printing for the calling thread. HDF5 (thread-safe build)
 * keeps one error stack per thread, so every entry point and every worker thread calls this. */
void jdt_h5_quiet(void);

/* Copies the most specific message on the calling thread's HDF5 error stack into buf (empty
 * string if there is none) and returns buf. */
const char *jdt_h5_detail(char *buf, size_t n_bytes);

/* A file-access property list for our opens and creates: file locking stays on, but a file
 * system without flock support (some NFS/Lustre mounts) is not an error; sieve_bytes > 0 sets
 * the sieve buffer. Returns H5P_DEFAULT if the list cannot be made; close it with
 * jdt_h5_fapl_close. */
hid_t jdt_h5_fapl(size_t sieve_bytes);
void jdt_h5_fapl_close(hid_t fapl);

/* H5Fcreate(path, flags) with jdt_h5_fapl(0); returns the file id or a negative id. */
hid_t jdt_h5_create(const char *path, unsigned flags);

/* Opens path read-only with a clear error (missing file, not HDF5, truncated/corrupt). Returns
 * the file id (>= 0) or H5I_INVALID_HID with e filled. sieve_bytes > 0 sets HDF5's data sieve
 * buffer (the minimum read size of uncached raw data); 0 keeps the default (64 KiB). */
hid_t jdt_h5_open_ro(const char *path, size_t sieve_bytes, jdt_err *e);

/* True if obj has an attribute called name. */
bool jdt_h5_has_attr(hid_t obj, const char *name);

/* Reads a string attribute (fixed or variable length) into a jdt_malloc'd string (*out; caller
 * frees). Errors name `where` (the file) and the attribute: ERR_FORMAT if missing or not a
 * string. */
jdt_status jdt_h5_attr_read_str(hid_t obj, const char *name, char **out, const char *where,
                                jdt_err *e);
/* Reads an integer attribute (any integer type that fits) as int64 / uint64. */
jdt_status jdt_h5_attr_read_i64(hid_t obj, const char *name, int64_t *out, const char *where,
                                jdt_err *e);
jdt_status jdt_h5_attr_read_u64(hid_t obj, const char *name, uint64_t *out, const char *where,
                                jdt_err *e);
/* Writes scalar attributes (variable-length UTF-8 string, int64, uint64). */
jdt_status jdt_h5_attr_write_str(hid_t obj, const char *name, const char *value, const char *where,
                                 jdt_err *e);
jdt_status jdt_h5_attr_write_i64(hid_t obj, const char *name, int64_t value, const char *where,
                                 jdt_err *e);
jdt_status jdt_h5_attr_write_u64(hid_t obj, const char *name, uint64_t value, const char *where,
                                 jdt_err *e);

/* 1-D int64 array attributes of exactly n (>= 1) values. */
jdt_status jdt_h5_attr_write_i64v(hid_t obj, const char *name, const int64_t *v, int n,
                                  const char *where, jdt_err *e);
jdt_status jdt_h5_attr_read_i64v(hid_t obj, const char *name, int64_t *v, int n, const char *where,
                                 jdt_err *e);

/* The HDF5 type used on disk for dt (little-endian standard types; bf16 is stored as uint16
 * with a "dtype" attribute saying bf16) and the native memory type. Both are predefined ids:
 * never H5Tclose them. */
hid_t jdt_h5_file_type(jdt_dtype dt);
hid_t jdt_h5_mem_type(jdt_dtype dt);
/* Classifies an on-disk type: true and *out set if it is one of our file types. bf16 is
 * reported as U16 (the caller checks the dtype attribute). */
bool jdt_h5_classify(hid_t type, jdt_dtype *out);

/* ---- POSIX helpers ----------------------------------------------------------------------- */

/* fsync(2)s a file or directory by path. */
jdt_status jdt_io_fsync_path(const char *path, jdt_err *e);
/* mkdir -p; existing directories are fine. */
jdt_status jdt_io_mkdir_p(const char *path, jdt_err *e);
/* rm -r of path (a file or a directory tree); a missing path is fine. */
jdt_status jdt_io_rm_rf(const char *path, jdt_err *e);
/* Returns a jdt_malloc'd "a/b" (NULL on OOM). */
char *jdt_io_join(const char *a, const char *b);
/* Returns true if path is a directory / a regular file. */
bool jdt_io_is_dir(const char *path);
bool jdt_io_is_file(const char *path);

/* Sorted list of names in dir (jdt_malloc'd array of jdt_malloc'd strings) for which
 * keep(name, ctx) is true; skips "." and "..". Free with jdt_io_names_free. */
typedef bool (*jdt_io_name_filter)(const char *name, void *ctx);
jdt_status jdt_io_list_dir(const char *dir, jdt_io_name_filter keep, void *ctx, char ***names,
                           size_t *n_names, jdt_err *e);
void jdt_io_names_free(char **names, size_t n_names);

#endif /* JDT_IO_IMPL_H */
