/*
 * dnnl-impl.h — what the runtime's two oneDNN users share (bf16.c: bf16 GEMMs; sgemm_dnnl.c:
 * f32 GEMM tiles): the oneDNN 2.x C API only (Debian 12's libdnnl; 3.x changed descriptors, so
 * JDT_HAVE_DNNL is dropped for it), and running a matmul primitive on caller memory.
 */
#ifndef JDT_DNNL_IMPL_H
#define JDT_DNNL_IMPL_H

#include <stdbool.h>

#ifdef JDT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#if DNNL_VERSION_MAJOR != 2
#undef JDT_HAVE_DNNL
#endif
#endif

#ifdef JDT_HAVE_DNNL
/* Runs prim (engine eng) on stream with its n arguments — which[i] a DNNL_ARG_*, ptr[i] the
 * caller's memory laid out as prim expects for it — and waits for it. Memory objects are made
 * for the call and released. False on any oneDNN failure (the outputs are then undefined). */
bool jdt_rt_dnnl_exec(dnnl_primitive_t prim, dnnl_engine_t eng, dnnl_stream_t stream, int n,
                      const int *which, void *const *ptr);
#endif

#endif /* JDT_DNNL_IMPL_H */
