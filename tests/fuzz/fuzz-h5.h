/*
 * fuzz-h5.h — builds small HDF5 files whose structure the fuzzer's input chooses (tests/fuzz/):
 * which attributes exist, with which type and value, which datasets, with which element type,
 * rank, shape, layout and content. The readers under test (token/array datasets, checkpoints)
 * then meet every shape of well-formed-but-wrong file, which is where their own logic can go
 * wrong; HDF5's parser of raw bytes is not what these targets test.
 */
#ifndef JDT_FUZZ_H5_H
#define JDT_FUZZ_H5_H

#include "fuzz-input.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* A per-process scratch file for the built HDF5 file. */
static inline const char *fz_h5_path(const char *tag)
{
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/jdt-fuzz-%s-%d.h5", dir, tag, (int)getpid());
    return path;
}

static inline void fz_attr_i64(hid_t obj, const char *name, int64_t v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, H5T_NATIVE_INT64, &v);
        H5Aclose(a);
    }
    H5Sclose(sp);
}

static inline void fz_attr_str(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, t, &v);
        H5Aclose(a);
    }
    H5Sclose(sp);
    H5Tclose(t);
}

/* An attribute `name`: absent, the sane value (sane_i / sane_s, as the reader expects), a
 * fuzzed integer, a fuzzed string, a double, an integer array, a fixed-length string. */
static inline void fz_attr(hid_t obj, const char *name, fz_in *in, int64_t sane_i,
                           const char *sane_s)
{
    char s[64];
    switch (fz_pick(in, 10)) {
    case 0:
        return;
    case 1: case 2: case 3: case 4: /* mostly sane, so the fuzzer gets past the checks */
        if (sane_s) fz_attr_str(obj, name, sane_s);
        else fz_attr_i64(obj, name, sane_i);
        return;
    case 5:
        fz_attr_i64(obj, name, (int64_t)fz_u64(in));
        return;
    case 6:
        fz_str(in, s, sizeof s);
        fz_attr_str(obj, name, s);
        return;
    case 7: {
        double d = (double)(int32_t)fz_u32(in) / 7.0;
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(obj, name, H5T_IEEE_F64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, H5T_NATIVE_DOUBLE, &d);
            H5Aclose(a);
        }
        H5Sclose(sp);
        return;
    }
    case 8: {
        hsize_t n = 1 + fz_pick(in, 3);
        int64_t v[3] = {(int64_t)fz_u32(in), sane_i, -1};
        hid_t sp = H5Screate_simple(1, &n, NULL);
        hid_t a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, H5T_NATIVE_INT64, v);
            H5Aclose(a);
        }
        H5Sclose(sp);
        return;
    }
    default: {
        fz_str(in, s, sizeof s);
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, strlen(s) + 1);
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, t, s);
            H5Aclose(a);
        }
        H5Sclose(sp);
        H5Tclose(t);
        return;
    }
    }
}

/* Element types a dataset may get (file type, memory type, bytes). */
static inline void fz_type(int k, hid_t *ft, hid_t *mt, size_t *sz)
{
    switch (k) {
    case 0: *ft = H5T_STD_U16LE; *mt = H5T_NATIVE_UINT16; *sz = 2; return;
    case 1: *ft = H5T_STD_U32LE; *mt = H5T_NATIVE_UINT32; *sz = 4; return;
    case 2: *ft = H5T_STD_I32LE; *mt = H5T_NATIVE_INT32; *sz = 4; return;
    case 3: *ft = H5T_IEEE_F32LE; *mt = H5T_NATIVE_FLOAT; *sz = 4; return;
    case 4: *ft = H5T_IEEE_F64LE; *mt = H5T_NATIVE_DOUBLE; *sz = 8; return;
    case 5: *ft = H5T_STD_U8LE; *mt = H5T_NATIVE_UINT8; *sz = 1; return;
    default: *ft = H5T_STD_I64LE; *mt = H5T_NATIVE_INT64; *sz = 8; return;
    }
}

/* Creates dataset `name` (intermediate groups too). type_k < 0: the fuzzer picks the type;
 * rank_want < 0: it picks the rank (0..3); dims[0] = len0 when len0 > 0. The content comes
 * from the input (cycled) unless fill is given (fill_bytes of it). Returns the element count
 * written (0 if none), with the raw bytes in *raw (malloc'd, caller frees) when raw != NULL. */
static inline int64_t fz_dset(hid_t f, const char *name, fz_in *in, int type_k, int rank_want,
                              int64_t len0, int64_t max_dim, const void *fill, size_t fill_bytes,
                              uint8_t **raw, size_t *raw_bytes)
{
    hid_t ft, mt;
    size_t sz;
    fz_type(type_k >= 0 ? type_k : fz_pick(in, 7), &ft, &mt, &sz);
    int rank = rank_want >= 0 ? rank_want : fz_pick(in, 4);
    hsize_t dims[3] = {1, 1, 1};
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        dims[i] = (i == 0 && len0 > 0) ? (hsize_t)len0 : (hsize_t)(fz_u8(in) % (max_dim + 1));
        n *= (int64_t)dims[i];
    }
    if (n > (1 << 16)) return 0;
    hid_t sp = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    int layout = fz_pick(in, 3);
    if (rank > 0 && n > 0 && layout > 0) {
        hsize_t ch[3];
        for (int i = 0; i < rank; i++) ch[i] = dims[i] ? (dims[i] + 1) / 2 : 1;
        H5Pset_chunk(dcpl, rank, ch);
        if (layout == 2) H5Pset_fletcher32(dcpl);
    }
    hid_t ds = H5Dcreate2(f, name, ft, sp, lcpl, dcpl, H5P_DEFAULT);
    uint8_t *buf = NULL;
    if (ds >= 0 && n > 0) {
        buf = malloc((size_t)n * sz);
        if (buf) {
            for (size_t i = 0; i < (size_t)n * sz; i++)
                buf[i] = fill ? ((const uint8_t *)fill)[i % fill_bytes]
                              : (in->n ? in->p[(in->off + i) % in->n] : 0);
            H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        }
    }
    if (ds >= 0) H5Dclose(ds);
    H5Pclose(lcpl);
    H5Pclose(dcpl);
    H5Sclose(sp);
    if (raw) {
        *raw = buf;
        *raw_bytes = buf ? (size_t)n * sz : 0;
    } else {
        free(buf);
    }
    return ds >= 0 ? n : 0;
}

#endif /* JDT_FUZZ_H5_H */
