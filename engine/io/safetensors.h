/*
 * safetensors.h — reader and writer of the safetensors format (prefix jdt_st_), the weight
 * file of Hugging Face transformers: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {str: str}}), then the raw little-endian tensor bytes, offsets relative to
 * the end of the header. We write F32 tensors, sorted by name, packed in that order, the
 * header padded with spaces to a multiple of 8 bytes. We read F32, F16 and BF16 (converted to
 * f32); the reader checks that the offsets tile the data exactly and match dtype x shape.
 */
#ifndef JDT_SAFETENSORS_H
#define JDT_SAFETENSORS_H

#include "core/core.h"

#define JDT_ST_MAX_DIMS 8

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[JDT_ST_MAX_DIMS];
    const float *data; /* writer: numel floats, row-major */
} jdt_st_tensor;

/* Writes n tensors (names unique) and optional metadata pairs (meta[2i] = key, meta[2i+1] =
 * value; n_meta pairs) to path through path.tmp + fsync + rename. Errors: ERR_INVALID
 * (duplicate name, bad shape), ERR_IO, ERR_NOMEM. */
jdt_status jdt_st_write(const char *path, const jdt_st_tensor *t, int n, const char *const *meta,
                        int n_meta, jdt_err *e);

typedef struct jdt_st_file jdt_st_file;

/* Opens and validates a safetensors file (header and offsets; the data is read lazily).
 * Errors: ERR_NOT_FOUND, ERR_IO, ERR_FORMAT (naming the file and the problem), ERR_NOMEM. */
jdt_status jdt_st_open(const char *path, jdt_st_file **out, jdt_err *e);
/* Number of tensors and the i-th tensor's name/shape (data is NULL). */
int jdt_st_count(const jdt_st_file *f);
jdt_st_tensor jdt_st_info(const jdt_st_file *f, int i);
/* Index of the tensor called name, or -1. */
int jdt_st_find(const jdt_st_file *f, const char *name);
/* Reads tensor i as f32 into dst (numel floats). Errors: ERR_IO. */
jdt_status jdt_st_read(jdt_st_file *f, int i, float *dst, jdt_err *e);
/* jdt_st_close(NULL) is a no-op. */
void jdt_st_close(jdt_st_file *f);

#endif /* JDT_SAFETENSORS_H */
