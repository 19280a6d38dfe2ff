/*
 * cpu-impl.h — internals of the CPU backend (engine/backend/cpu): the C emitter and the
 * backend's run loop over generated kernels and the hand-written kernels of engine/runtime.
 */
#ifndef JDT_CPU_IMPL_H
#define JDT_CPU_IMPL_H

#include "backend/backend-impl.h"

/* emit.c: the C translation unit for every kernel step of c; *src owned by the caller
 * (jdt_free). ERR_UNSUPPORTED when a group has too many accesses, ERR_NOMEM. */
jdt_status jdt_cpu_codegen(const cprog *c, char **src, jdt_err *e);

#endif /* JDT_CPU_IMPL_H */
