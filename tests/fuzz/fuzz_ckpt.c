/*
 * fuzz_ckpt.c — libFuzzer target: the HDF5 checkpoint reader (engine/io/ckpt.c). The input
 * chooses a state.h5's structure (fuzz-h5.h): root attributes format, version, step,
 * rng_state, data_position, config and meta_checksum (sane — the checksum computed as the
 * writer does, docs/checkpoints.md — wrong-typed or wild), and up to four tensors under
 * params/ and opt/ with any element type, rank, shape, layout and `dtype` attribute. The
 * reader must refuse what is wrong with an error and read what is right: open, metadata, list,
 * tensor info, whole and sliced reads with the expected and with a wrong shape.
 */
#include "core/core.h"
#include "fuzz-h5.h"
#include "io/ckpt.h"

static uint64_t meta_checksum(int64_t version, int64_t step, uint64_t rng, int64_t dp,
                              const char *config)
{
    uint64_t h = JDT_HASH_INIT;
    h = jdt_hash_str(h, "version");
    h = jdt_hash_u64(h, (uint64_t)version);
    h = jdt_hash_str(h, "step");
    h = jdt_hash_u64(h, (uint64_t)step);
    h = jdt_hash_str(h, "rng_state");
    h = jdt_hash_u64(h, rng);
    h = jdt_hash_str(h, "data_position");
    h = jdt_hash_u64(h, (uint64_t)dp);
    h = jdt_hash_str(h, "config");
    return jdt_hash_str(h, config);
}

static const char *const NAMES[] = {"params/wte", "params/blocks.0.attn.q.w", "opt/m/wte",
                                    "params/a/b/c/d", "x", "params/"};
static const char *const DTYPES[] = {"u16", "u32", "i32", "f32", "f64", "u8", "bf16", "i64"};

static void build(const char *path, fz_in *in)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return;
    int64_t version = fz_pick(in, 4) ? JDT_CKPT_VERSION : fz_pick(in, 4);
    int64_t step = fz_pick(in, 4) ? fz_u8(in) : (int64_t)fz_u64(in);
    uint64_t rng = fz_u64(in);
    int64_t dp = fz_u8(in);
    char config[64];
    fz_str(in, config, sizeof config);
    fz_attr(f, "format", in, 0, JDT_CKPT_FORMAT);
    fz_attr(f, "version", in, version, NULL);
    fz_attr(f, "step", in, step, NULL);
    if (fz_pick(in, 6)) {
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, "rng_state", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, H5T_NATIVE_UINT64, &rng);
            H5Aclose(a);
        }
        H5Sclose(sp);
    } else {
        fz_attr(f, "rng_state", in, (int64_t)rng, NULL);
    }
    fz_attr(f, "data_position", in, dp, NULL);
    fz_attr(f, "config", in, 0, config);
    uint64_t sum = meta_checksum(version, step, rng, dp, config);
    if (fz_pick(in, 5)) {
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, "meta_checksum", H5T_STD_U64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) {
            H5Awrite(a, H5T_NATIVE_UINT64, &sum);
            H5Aclose(a);
        }
        H5Sclose(sp);
    } else {
        fz_attr(f, "meta_checksum", in, (int64_t)sum, NULL);
    }
    int n_t = fz_pick(in, 5);
    for (int i = 0; i < n_t; i++) {
        const char *name = NAMES[fz_pick(in, 6)];
        int type_k = fz_pick(in, 4) ? 3 : -1; /* mostly f32 */
        if (fz_dset(f, name, in, type_k, -1, 0, 6, NULL, 0, NULL, NULL) <= 0 && H5Lexists(f, name, H5P_DEFAULT) <= 0)
            continue;
        hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
        if (ds < 0) continue;
        if (fz_pick(in, 5)) fz_attr_str(ds, "dtype", type_k == 3 ? "f32" : DTYPES[fz_pick(in, 8)]);
        else fz_attr(ds, "dtype", in, 0, "f32");
        H5Dclose(ds);
    }
    H5Fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    const char *path = fz_h5_path("ckpt");
    build(path, &in);
    jdt_ckpt *c = NULL;
    jdt_err e;
    if (jdt_ckpt_open(path, &c, &e) == JDT_OK) {
        jdt_ckpt_meta meta;
        jdt_ckpt_get_meta(c, &meta);
        char **names = NULL;
        size_t n = 0;
        if (jdt_ckpt_list(c, &names, &n, &e) == JDT_OK) {
            for (size_t i = 0; i < n; i++) {
                jdt_ckpt_tensor want = {0};
                want.name = names[i];
                int ndim = 0;
                if (jdt_ckpt_tensor_info(c, names[i], &want.dtype, &ndim, want.shape, &e) ==
                    JDT_OK) {
                    want.ndim = ndim;
                    int64_t vol = 1;
                    for (int d = 0; d < ndim; d++) vol *= want.shape[d];
                    if (vol >= 0 && vol <= (1 << 16)) {
                        void *dst = malloc((size_t)vol * 8 + 8);
                        if (dst) {
                            jdt_ckpt_read(c, &want, dst, &e); /* whole */
                            if (ndim > 0 && want.shape[0] > 1) { /* a slice */
                                want.extent[0] = want.shape[0] / 2;
                                for (int d = 1; d < ndim; d++) want.extent[d] = want.shape[d];
                                want.offset[0] = fz_u8(&in) % (want.shape[0] + 1);
                                jdt_ckpt_read(c, &want, dst, &e);
                            }
                            memset(want.offset, 0, sizeof want.offset);
                            memset(want.extent, 0, sizeof want.extent);
                            want.shape[0] += 1; /* wrong expected shape */
                            jdt_ckpt_read(c, &want, dst, &e);
                            free(dst);
                        }
                    }
                }
                jdt_free(names[i]);
            }
            jdt_free(names);
        }
        jdt_ckpt_close(c);
    }
    unlink(path);
    return 0;
}
