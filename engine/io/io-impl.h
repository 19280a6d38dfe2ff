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

/* Copies the most specific message on the calling thread's HDF5 error stack into buf as one
 * printable line and returns buf. A failed system call becomes its strerror text ("write
 * failed: No space left on device"); an empty stack gives "HDF5 reported no detail", so a
 * message never ends in ": ". */
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

/* Reserves n_bytes of disk for the file f just created (fallocate, keeping its size), so that
 * HDF5's own writes cannot run out of space later: HDF5 1.10 cannot recover from a failed
 * metadata flush. Where the file system cannot preallocate, compares with its free space
 * instead. ERR_IO naming `where` with the figures ("No space left on device: needs 1.2 GiB,
 * 310.5 MiB free there"); then close f with jdt_h5_close_written(f, that status, ...), which
 * cannot fail since nothing was flushed yet, and delete the file. */
jdt_status jdt_h5_reserve(hid_t f, int64_t n_bytes, const char *where, jdt_err *e);

/* Closes a file opened for writing, st being the status of the writes so far. With st ==
 * JDT_OK it flushes first, and a failed flush (ENOSPC, EIO) becomes ERR_IO naming `where`.
 * After any failure the file's descriptor is pointed at /dev/null before H5Fclose, so the
 * library can drop its cached state: a failed H5Fclose otherwise leaves the file half-open
 * and HDF5 crashes (SIGSEGV) in its exit-time cleanup. The file's content is then garbage:
 * the caller deletes it. Every handle inside f must already be closed. Returns the final
 * status (st unless the flush or the close failed). */
jdt_status jdt_h5_close_written(hid_t f, jdt_status st, const char *where, jdt_err *e);

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

/* Continues the CRC-32 *crc over n tokens as stored on disk in dtype (u16: 2 little-endian
 * bytes each, u32: 4), so writer and reader agree whatever the memory layout. */
void jdt_data_crc_tokens(uint32_t *crc, const uint32_t *tokens, int64_t n, jdt_dtype dtype);

/* ---- POSIX helpers ----------------------------------------------------------------------- */

/* fsync(2)s a file or directory by path. */
jdt_status jdt_io_fsync_path(const char *path, jdt_err *e);
/* Preallocates n_bytes for the open file fd (fallocate, keeping its size), or where the file
 * system cannot, checks that much is free. ERR_IO naming `where` with both figures when the
 * space is not there. jdt_h5_reserve's engine; also the checkpoint pre-flight's. */
jdt_status jdt_io_reserve_fd(int fd, int64_t n_bytes, const char *where, jdt_err *e);
/* Gives back the blocks a file holds past its end (what jdt_h5_reserve preallocated and the
 * file did not use), by punching a hole there. Best effort: errors are ignored. */
void jdt_io_release_tail(const char *path);
/* mkdir -p; existing directories are fine. */
jdt_status jdt_io_mkdir_p(const char *path, jdt_err *e);
/* rm -r of path (a file or a directory tree); a missing path is fine. */
jdt_status jdt_io_rm_rf(const char *path, jdt_err *e);
/* Returns a jdt_malloc'd "a/b" (NULL on OOM). */
char *jdt_io_join(const char *a, const char *b);
/* Returns true if path is a directory / a regular file. */
bool jdt_io_is_dir(const char *path);
bool jdt_io_is_file(const char *path);
/* Whether paths a and b name the same directory: the same inode where both exist, else the
 * same text up to trailing slashes. */
bool jdt_io_same_dir(const char *a, const char *b);

/* Sorted list of names in dir (jdt_malloc'd array of jdt_malloc'd strings) for which
 * keep(name, ctx) is true; skips "." and "..". Free with jdt_io_names_free. */
typedef bool (*jdt_io_name_filter)(const char *name, void *ctx);
jdt_status jdt_io_list_dir(const char *dir, jdt_io_name_filter keep, void *ctx, char ***names,
                           size_t *n_names, jdt_err *e);
void jdt_io_names_free(char **names, size_t n_names);
/* qsort comparator over char * names in "natural" order: digit runs compare as numbers, so
 * train_999.h5 sorts before train_1000.h5; ties fall back to strcmp. */
int jdt_io_natural_cmp(const void *pa, const void *pb);

#endif /* JDT_IO_IMPL_H */
