/*
 * backend.c — opening and closing devices: dispatch to the backend built into this binary.
 */
#include "backend/backend-impl.h"

#include <stdio.h>
#include <string.h>

static jdt_device g_cpu = {.vt = &jdt_backend_cpu, .kind = JDT_DEVICE_CPU};

jdt_device *jdt_device_cpu_default(void)
{
    return &g_cpu;
}

bool jdt_device_built(jdt_device_kind kind)
{
#ifdef JDT_CUDA
    if (kind == JDT_DEVICE_CUDA) return true;
#endif
    return kind == JDT_DEVICE_CPU;
}

/* A device object of kind (the CPU vtable until a backend fills its own), or NULL with ERR_NOMEM.
 */
static jdt_device *device_new(jdt_device_kind kind, int index, const char *cache_dir, jdt_err *e)
{
    jdt_device *d = jdt_calloc(1, sizeof *d);
    if (!d) {
        jdt_err_set(e, JDT_ERR_NOMEM, "device: out of memory");
        return NULL;
    }
    d->kind = kind;
    d->index = index;
    if (cache_dir) snprintf(d->cache_dir, sizeof d->cache_dir, "%s", cache_dir);
    d->vt = &jdt_backend_cpu;
    return d;
}

jdt_status jdt_device_open(jdt_device_kind kind, int index, const char *cache_dir, jdt_device **out,
                           jdt_err *e)
{
    *out = NULL;
    if (!jdt_device_built(kind))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "backend cuda is not built into this binary (build with make CUDA=1)");
    jdt_device *d = device_new(kind, index, cache_dir, e);
    if (!d) return JDT_ERR_NOMEM;
#ifdef JDT_CUDA
    if (kind == JDT_DEVICE_CUDA) {
        jdt_status st = jdt_cuda_device_open(d, e);
        if (st != JDT_OK) {
            jdt_free(d);
            return st;
        }
    }
#endif
    *out = d;
    return JDT_OK;
}

jdt_status jdt_device_open_emit_only(jdt_device **out, jdt_err *e)
{
    *out = NULL;
    jdt_device *d = device_new(JDT_DEVICE_CUDA, 0, NULL, e);
    if (!d) return JDT_ERR_NOMEM;
#ifdef JDT_CUDA
    d->vt = jdt_cuda_emit_only_vt();
#else
    d->vt = &jdt_backend_cuda_emit_only;
#endif
    *out = d;
    return JDT_OK;
}

jdt_status jdt_device_open_aot(jdt_device_kind kind, int arch, const char *cache_dir,
                               jdt_device **out, jdt_err *e)
{
    *out = NULL;
    if (kind != JDT_DEVICE_CUDA || !jdt_device_built(kind))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "compiling CUDA kernels ahead of time needs a binary built with make "
                           "CUDA=1 (this one has backends: cpu)");
    jdt_device *d = device_new(kind, 0, cache_dir, e);
    if (!d) return JDT_ERR_NOMEM;
#ifdef JDT_CUDA
    jdt_status st = jdt_cuda_device_open_aot(d, arch, e);
    if (st != JDT_OK) {
        jdt_free(d);
        return st;
    }
#else
    (void)arch;
#endif
    *out = d;
    return JDT_OK;
}

void jdt_device_close(jdt_device *d)
{
    if (!d || d == &g_cpu) return;
    if (d->vt->close) d->vt->close(d);
    jdt_free(d);
}

jdt_device_kind jdt_device_get_kind(const jdt_device *d)
{
    return d ? d->kind : JDT_DEVICE_CPU;
}

char *jdt_device_describe(const jdt_device *d, char *buf, size_t n)
{
    if (!d) d = &g_cpu;
    if (d->vt->describe) return d->vt->describe(d, buf, n);
    snprintf(buf, n, "%s", d->vt->name);
    return buf;
}

jdt_status jdt_device_pull(jdt_device *d, jdt_err *e)
{
    return d && d->vt->pull ? d->vt->pull(d, e) : JDT_OK;
}

bool jdt_device_comm_times(const jdt_device *d, double *waited_s, double *moving_s)
{
    *waited_s = *moving_s = 0.0;
    return d && d->vt->comm_times ? d->vt->comm_times(d, waited_s, moving_s) : false;
}

bool jdt_device_memory(const jdt_device *d, jdt_device_mem *m)
{
    memset(m, 0, sizeof *m);
    return d && d->vt->memory ? d->vt->memory(d, m) : false;
}

void jdt_device_push(jdt_device *d)
{
    if (d && d->vt->push) d->vt->push(d);
}

#ifndef JDT_CUDA
void jdt_device_set_dist(jdt_device *d, struct jdt_dist *dist)
{
    (void)d;
    (void)dist;
}

void jdt_device_set_groups(jdt_device *d, jdt_device_group_fn fn, void *ctx)
{
    (void)d;
    (void)fn;
    (void)ctx;
}
#endif
