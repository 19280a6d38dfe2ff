/*
 * fuzz-input.h — a byte reader for libFuzzer targets (tests/fuzz/): the structure-aware
 * targets draw their choices (which attribute, which type, how long) from the fuzzer's input,
 * so mutations explore file and message structures instead of HDF5's own parser. Reading past
 * the end yields zeros, so every input is a valid program.
 */
#ifndef JDT_FUZZ_INPUT_H
#define JDT_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const uint8_t *p;
    size_t n, off;
} fz_in;

static inline uint8_t fz_u8(fz_in *in)
{
    return in->off < in->n ? in->p[in->off++] : 0;
}

static inline uint32_t fz_u32(fz_in *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)fz_u8(in) << (8 * i);
    return v;
}

static inline uint64_t fz_u64(fz_in *in)
{
    return (uint64_t)fz_u32(in) | ((uint64_t)fz_u32(in) << 32);
}

/* A string of up to cap-1 bytes (length from the input), NUL-terminated. */
static inline void fz_str(fz_in *in, char *out, size_t cap)
{
    size_t len = fz_u8(in) % cap;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) out[k++] = (char)fz_u8(in);
    out[k] = '\0';
}

/* One of n choices. */
static inline int fz_pick(fz_in *in, int n)
{
    return (int)(fz_u8(in) % (unsigned)n);
}

#endif /* JDT_FUZZ_INPUT_H */
