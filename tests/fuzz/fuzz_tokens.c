/*
 * fuzz_tokens.c — libFuzzer target: the HDF5 token and array dataset reader (engine/io/data.c).
 * The input chooses a file's structure (fuzz-h5.h): format, version, vocab_size, n_tokens,
 * tokenizer and crc32 attributes (sane, wrong-typed or wild), /tokens or /x and /y datasets of
 * any element type, rank, shape and layout, valid or out-of-vocabulary content, then the
 * loader's options (T, B, shuffle). jdt_data_open must refuse bad files with an error and
 * read good ones; every batch read must stay in bounds and yield ids below the vocabulary.
 */
#include "fuzz-h5.h"
#include "io/data.h"

#include <zlib.h>

static void build(const char *path, fz_in *in)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return;
    bool arrays = fz_pick(in, 4) == 0;
    int64_t vocab = 1 + fz_u8(in) + (fz_pick(in, 8) == 0 ? 70000 : 0); /* u32 sometimes */
    int64_t n = 1 + fz_u8(in) * 4;
    uint8_t *raw = NULL;
    size_t raw_bytes = 0;
    int64_t written = 0;
    uLong crc = crc32(0L, Z_NULL, 0);
    if (!arrays) {
        int type_k = fz_pick(in, 4) ? (vocab <= 65536 ? 0 : 1) : -1;
        written = fz_dset(f, "tokens", in, type_k, fz_pick(in, 5) ? 1 : -1, n, 8, NULL, 0, &raw,
                          &raw_bytes);
        if (raw && type_k == 0 && fz_pick(in, 3)) /* mostly in-vocabulary ids */
            for (size_t i = 0; i + 1 < raw_bytes; i += 2) {
                uint16_t v = (uint16_t)((raw[i] | raw[i + 1] << 8) % vocab);
                raw[i] = (uint8_t)v;
                raw[i + 1] = (uint8_t)(v >> 8);
            }
        if (raw && type_k == 0) { /* rewrite with the adjusted ids */
            hid_t ds = H5Dopen2(f, "tokens", H5P_DEFAULT);
            if (ds >= 0) {
                H5Dwrite(ds, H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw);
                H5Dclose(ds);
            }
        }
        if (raw) crc = crc32_z(crc, raw, raw_bytes);
        fz_attr(f, "format", in, 0, "jdt-tokens");
        fz_attr(f, "vocab_size", in, vocab, NULL);
        fz_attr(f, "n_tokens", in, written, NULL);
        fz_attr(f, "tokenizer", in, 0, "byte");
    } else {
        int64_t d = 1 + fz_u8(in) % 8;
        uint8_t *rx = NULL, *ry = NULL;
        size_t bx = 0, by = 0;
        written = fz_dset(f, "x", in, fz_pick(in, 4) ? 3 : -1, fz_pick(in, 5) ? 2 : -1, n, d,
                          NULL, 0, &rx, &bx);
        fz_dset(f, "y", in, fz_pick(in, 4) ? 2 : -1, fz_pick(in, 5) ? 1 : -1, n, 8, NULL, 0, &ry,
                &by);
        if (rx) crc = crc32_z(crc, rx, bx);
        if (ry) crc = crc32_z(crc, ry, by);
        free(rx);
        free(ry);
        fz_attr(f, "format", in, 0, "jdt-arrays");
        fz_attr(f, "n_rows", in, written, NULL);
        fz_attr(f, "dim", in, d, NULL);
        fz_attr(f, "n_classes", in, fz_pick(in, 2) ? 0 : 1 + fz_u8(in) % 10, NULL);
    }
    fz_attr(f, "version", in, JDT_DATA_VERSION, NULL);
    fz_attr(f, JDT_DATA_CRC_ATTR, in, (int64_t)(uint32_t)crc, NULL);
    free(raw);
    H5Fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    const char *path = fz_h5_path("tokens");
    build(path, &in);
    jdt_data_opts o = {0};
    o.path = path;
    o.kind = JDT_DATA_KIND_AUTO;
    o.seq_len = 1 + fz_u8(&in) % 16;
    o.global_batch = 1 + fz_u8(&in) % 4;
    o.shuffle = fz_u8(&in) & 1;
    o.seed = fz_u8(&in);
    jdt_data *d = NULL;
    jdt_err e;
    if (jdt_data_open(&o, &d, &e) == JDT_OK) {
        jdt_data_info info;
        jdt_data_get_info(d, &info);
        int64_t cols = info.kind == JDT_DATA_KIND_TOKENS ? o.seq_len : info.dim;
        float *x = malloc((size_t)(o.global_batch * cols) * 4 + 4);
        int32_t *y = malloc((size_t)(o.global_batch * (o.seq_len + 1)) * 4 + 4);
        for (int64_t k = 0; k < 3 && x && y; k++) {
            if (jdt_data_read_rows(d, k, 0, o.global_batch, x, y, &e) != JDT_OK) break;
            if (info.kind == JDT_DATA_KIND_TOKENS)
                for (int64_t i = 0; i < o.global_batch * o.seq_len; i++)
                    if (((int32_t *)x)[i] < 0 || ((int32_t *)x)[i] >= info.vocab_size) abort();
        }
        free(x);
        free(y);
        jdt_data_close(d);
    }
    unlink(path);
    return 0;
}
