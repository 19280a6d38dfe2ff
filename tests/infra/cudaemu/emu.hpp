/*
 * emu.hpp — the device side of the host CUDA emulator (tests/infra/cudaemu): what a CUDA C
 * kernel needs to compile as host C++20 and run on the CPU. The emulator's NVRTC
 * (cudaemu.c) preprocesses a program's source with __global__ marked, then compiles
 * `#include "emu.hpp"` + that text + one launcher per kernel into a shared object.
 *
 * Execution model. A launch runs its blocks one after another, the last first; a block's
 * threads are fibers (ucontext) on one OS thread, run round-robin. A fiber runs until it waits: at
 * __syncthreads (the block's barrier), at a warp collective (__shfl_*_sync, __syncwarp, ldmatrix,
 * mma: the warp's barrier) or at its end. A barrier opens when every live thread of its block
 * (warp) has arrived; a thread that exits counts as arrived, as on Volta and later. When no fiber
 * can move and some have not ended, the launch fails with "deadlock" (a __syncthreads under
 * divergent control flow, a warp collective some lanes skip): a bug the GPU may hang on.
 * On x86-64 a fiber that waits or ends switches straight to the pass's next one (emu_chain_pass):
 * the same order as a scheduler loop, at one context switch per fiber and barrier, not two.
 *
 * JDT_CUDAEMU_ORDER=reverse or shuffle changes the order of the round-robin passes (emu_order):
 * races between barriers show up as other results. JDT_CUDAEMU_BLOCKS=forward runs the blocks
 * first to last: a kernel whose result depends on which block finishes last (the attention's
 * split dK/dV) shows it as other bits.
 *
 * Memory: __shared__ arrays are static (blocks never overlap in time), in one section; it and
 * the dynamic shared memory (a per-launch buffer) are filled with 0xff bytes (NaN floats)
 * before every block, so a kernel that reads shared memory it did not write sees NaNs instead
 * of a stale copy. Atomics
 * are plain read-modify-writes (one OS thread). Warp-level matrix ops (ldmatrix.x4, with and
 * without .trans, and mma.sync.m16n8k16 bf16 -> f32) follow the PTX ISA's fragment layouts.
 * cp.async copies land only at the wait that lets them through (the latest a GPU may).
 * What it cannot check: the memory model (fences, races between blocks), the real
 * instruction set's layouts and rounding, performance.
 */
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <utility>

#define JDT_CUK_EMU 1

/* CUDA's keywords as plain C++. The preprocessed kernel text carries jdt_emu_global where the
 * source said __global__ (the NVRTC stand-in finds the kernels by it). */
#define jdt_emu_global
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* Static shared arrays live in one section of the module, poisoned (0xff bytes: NaN floats)
 * before every block like the dynamic shared memory: a kernel that reads shared memory it did
 * not write in this block sees NaNs, not the previous block's values. */
#define __shared__ static __attribute__((section("jdt_emu_shared")))
#define __restrict__ __restrict
#define __noinline__ __attribute__((noinline))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct uint3 {
    unsigned x, y, z;
};
/* Vector types carry CUDA's alignments (8 and 16 bytes): a kernel that loads one from an
 * address the GPU would fault on ("misaligned address") is caught by the alignment sanitizer
 * (JDT_CUDAEMU_CFLAGS=-fsanitize=alignment) instead of passing on x86. */
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) ushort4 {
    unsigned short x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d)
{
    return {a, b, c, d};
}
static inline float2 make_float2(float a, float b)
{
    return {a, b};
}
static inline uint2 make_uint2(unsigned a, unsigned b)
{
    return {a, b};
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return {a, b, c, d};
}
static inline ushort4 make_ushort4(unsigned short a, unsigned short b, unsigned short c,
                                   unsigned short d)
{
    return {a, b, c, d};
}

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static const int warpSize = 32;

/* ---- bit casts and math the CUDA device library has and libm lacks -------------------------- */

template <class To, class From> static inline To emu_bits(From x)
{
    static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
    To y;
    std::memcpy(&y, &x, sizeof y);
    return y;
}
static inline float __int_as_float(int i)
{
    return emu_bits<float>(i);
}
static inline float __uint_as_float(unsigned u)
{
    return emu_bits<float>(u);
}
static inline unsigned __float_as_uint(float f)
{
    return emu_bits<unsigned>(f);
}
static inline int __float_as_int(float f)
{
    return emu_bits<int>(f);
}
/* The _rn intrinsics are never contracted into an FMA on a GPU; with JDT_CUDAEMU_CFLAGS=
 * "-mfma -ffp-contract=fast" (NVRTC's default --fmad=true, mimicked) the host compiler would
 * contract them once inlined, so their operands and result pass through an empty asm it cannot
 * see into. */
static inline float emu_nofuse(float x)
{
#if defined(__x86_64__)
    __asm__("" : "+x"(x));
#elif defined(__aarch64__)
    __asm__("" : "+w"(x));
#else
    volatile float v = x;
    x = v;
#endif
    return x;
}
static inline float __fmul_rn(float a, float b)
{
    return emu_nofuse(emu_nofuse(a) * emu_nofuse(b));
}
static inline float __fadd_rn(float a, float b)
{
    return emu_nofuse(emu_nofuse(a) + emu_nofuse(b));
}
static inline float __fsub_rn(float a, float b)
{
    return emu_nofuse(emu_nofuse(a) - emu_nofuse(b));
}
static inline float rsqrtf(float x)
{
    return 1.0f / sqrtf(x);
}
static inline float __fdividef(float a, float b)
{
    return a / b;
}
static inline float __saturatef(float x)
{
    return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
}
static inline long long min(long long a, long long b)
{
    return a < b ? a : b;
}
static inline long long max(long long a, long long b)
{
    return a > b ? a : b;
}
static inline int min(int a, int b)
{
    return a < b ? a : b;
}
static inline int max(int a, int b)
{
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b)
{
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b)
{
    return a > b ? a : b;
}
static inline float min(float a, float b)
{
    return fminf(a, b);
}
static inline float max(float a, float b)
{
    return fmaxf(a, b);
}
template <class T> static inline T __ldg(const T *p)
{
    return *p;
}
static inline unsigned long long __cvta_generic_to_shared(const void *p)
{
    return (unsigned long long)(uintptr_t)p;
}

/* ---- the fiber scheduler ------------------------------------------------------------------ */

#define EMU_MAX_THREADS 1024
#define EMU_STACK (256 * 1024)

struct emu_bar {
    unsigned arrived, gen;
};
/* Context switches: on x86-64 a six-register switch (no signal-mask system call, which makes
 * swapcontext ~100x slower here); elsewhere ucontext. */
#if defined(__x86_64__)
#define EMU_FAST_SWITCH 1
extern "C" void jdt_emu_switch(void **save_sp, void *to_sp);
asm(".text\n.globl jdt_emu_switch\n.hidden jdt_emu_switch\n.type jdt_emu_switch,@function\n"
    "jdt_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size jdt_emu_switch, .-jdt_emu_switch\n");
#endif

struct emu_fiber {
#ifdef EMU_FAST_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    uint3 tid;
    bool done;
    bool at_block;    /* waiting at __syncthreads ... */
    unsigned bar_gen; /* ... of this generation of the block's barrier */
};

static emu_fiber emu_fib[EMU_MAX_THREADS];
static char *emu_stacks;
#ifdef EMU_FAST_SWITCH
static void *emu_main_sp;
#else
static ucontext_t emu_main;
#endif
static unsigned emu_cur, emu_nthreads, emu_live, emu_warp_live[EMU_MAX_THREADS / 32];
static emu_bar emu_block_bar, emu_warp_bar[EMU_MAX_THREADS / 32];
static unsigned long long emu_moves; /* barrier openings and thread ends: progress */
static unsigned long long emu_arrivals; /* barrier arrivals (JDT_CUDAEMU_ORDER=warps' progress) */
static void (*emu_body)(void *);
static void *emu_body_arg;
static unsigned char *emu_dyn;
static size_t emu_dyn_bytes;
extern "C" unsigned char __start_jdt_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" unsigned char __stop_jdt_emu_shared[] __attribute__((weak, visibility("hidden")));
static unsigned emu_perm[EMU_MAX_THREADS]; /* the order of a pass over the block's threads */
static unsigned long long emu_launches;
/* cp.async copies queued per thread (cuk_cp_async, below): what, which group, how many */
#define EMU_CPA_MAX 64
struct emu_cpa {
    void *dst;
    const void *src;
    unsigned grp, bytes;
    bool zero;
};
static emu_cpa emu_cpa_q[EMU_MAX_THREADS][EMU_CPA_MAX];
static unsigned emu_cpa_n[EMU_MAX_THREADS], emu_cpa_groups[EMU_MAX_THREADS];
static bool emu_cpa_early; /* JDT_CUDAEMU_CP_ASYNC=issue: copies land when issued */
/* Per thread, the number of its warp collectives that exchange values (shuffles, votes, mma,
 * ldmatrix) in this block. Each writes its lane's value into buffer [number % 2], waits at one
 * warp barrier and reads the other lanes' from the same buffer. One barrier instead of a second
 * one before the buffer may be written again: the next collective writes the other buffer, and
 * the one after it, writing this buffer again, does so only past the next collective's barrier,
 * which every lane reaches after its reads here. (All lanes of a warp run the same collectives
 * in the same order, as a GPU requires.) A barrier costs two context switches per thread, most
 * of the emulated attention's time. Without the second barrier a lane may read after another
 * has run on and exited, so whether a lane took part is the stamp it wrote with its value (the
 * block's number and the collective's), not whether it has exited by the time of the read. */
static unsigned emu_phase[EMU_MAX_THREADS];
static unsigned long long emu_blocks; /* blocks run, for the stamps */
/* A warp collective some lanes of its mask skipped (emu_took_part): the launch fails with it */
static char emu_fault[320];

/* A pass over the block's threads in the order emu_perm (on x86-64 chained: a thread that waits
 * or ends switches straight to the pass's next one the scheduler would not pass by, and only the
 * pass's last to the scheduler: one context switch per thread and barrier instead of two; the
 * emulated row kernels' block sums are mostly barriers). emu_pass_k is the running thread's
 * place in emu_perm. */
static unsigned emu_pass_k, emu_pass_end; /* the pass: emu_perm[emu_pass_k .. emu_pass_end) */
static bool emu_pass_skip_block; /* ... less the threads at the block's closed barrier ("warps") */
static unsigned emu_left;        /* the block's threads that have not ended */

/* Whether the scheduler passes thread t by: it has ended, or (emu_pass_skip_block) it waits at
 * the block's barrier, still closed. */
static inline bool emu_passed_by(unsigned t)
{
    const emu_fiber *f = &emu_fib[t];
    return f->done || (emu_pass_skip_block && f->at_block && f->bar_gen == emu_block_bar.gen);
}

#ifdef EMU_FAST_SWITCH
/* Saves the caller's stack pointer in *save and runs the pass's next thread (emu_passed_by),
 * or returns to the scheduler (at the pass's end, or on a fault). */
static inline void emu_chain_next(void **save)
{
    for (unsigned k = emu_pass_k + 1; k < emu_pass_end && !emu_fault[0]; k++) {
        unsigned t = emu_perm[k];
        if (emu_passed_by(t)) continue;
        emu_pass_k = k;
        emu_cur = t;
        threadIdx = emu_fib[t].tid;
        jdt_emu_switch(save, emu_fib[t].sp);
        return;
    }
    jdt_emu_switch(save, emu_main_sp);
}
#endif

static inline void emu_yield()
{
#ifdef EMU_FAST_SWITCH
    emu_chain_next(&emu_fib[emu_cur].sp);
#else
    swapcontext(&emu_fib[emu_cur].ctx, &emu_main);
#endif
}

/* Arrives at barrier b of `live` threads and waits until it opens. */
static inline void emu_arrive(emu_bar *b, unsigned live)
{
    unsigned g = b->gen;
    emu_arrivals++;
    if (++b->arrived >= live) {
        b->arrived = 0;
        b->gen++;
        emu_moves++;
        return;
    }
    while (b->gen == g)
        emu_yield();
}

static inline void __syncthreads()
{
    emu_fiber *f = &emu_fib[emu_cur];
    f->at_block = true;
    f->bar_gen = emu_block_bar.gen;
    emu_arrive(&emu_block_bar, emu_live);
    f->at_block = false;
}
static inline void __syncwarp(unsigned = 0xffffffffu)
{
    unsigned w = emu_cur >> 5;
    emu_arrive(&emu_warp_bar[w], emu_warp_live[w]);
}
static inline void __threadfence() {}
static inline void __threadfence_block() {}
[[noreturn]] static inline void __trap()
{
    std::fprintf(stderr, "cudaemu: __trap() in a kernel\n");
    std::abort();
}

/* Thread t has ended: counted in emu_left, and the barriers it was the last for opened (an
 * exited thread counts as arrived). False if it ended with cp.async copies not waited for. */
static bool emu_ended(unsigned t)
{
    if (emu_cpa_n[t]) return false;
    emu_left--;
    emu_moves++;
    emu_live--;
    emu_warp_live[t >> 5]--;
    emu_bar *wb = &emu_warp_bar[t >> 5];
    if (wb->arrived && wb->arrived >= emu_warp_live[t >> 5]) wb->arrived = 0, wb->gen++;
    if (emu_block_bar.arrived && emu_block_bar.arrived >= emu_live)
        emu_block_bar.arrived = 0, emu_block_bar.gen++;
    return true;
}

/* the message of a thread that ended with cp.async copies not waited for */
static void emu_cpa_left(unsigned t, char *msg, size_t msg_n)
{
    std::snprintf(msg, msg_n,
                  "thread %u of block (%u, %u, %u) ended with %u cp.async copies not waited for",
                  t, blockIdx.x, blockIdx.y, blockIdx.z, emu_cpa_n[t]);
}

static void emu_entry()
{
    emu_body(emu_body_arg);
    emu_fib[emu_cur].done = true;
#ifdef EMU_FAST_SWITCH
    /* the end counted here (emu_resume's part without the chain), then the pass's next thread */
    if (!emu_ended(emu_cur) && !emu_fault[0]) emu_cpa_left(emu_cur, emu_fault, sizeof emu_fault);
    void *dead;
    emu_chain_next(&dead); /* never resumed */
    __builtin_unreachable();
#endif
    /* ucontext: uc_link returns to the scheduler */
}

/* The order of the next pass over a block's nt threads into emu_perm (JDT_CUDAEMU_ORDER):
 * "forward" (0, 1, ...; the default), "reverse", or "shuffle" (a new permutation per pass,
 * seeded by the launch's number: runs repeat). A GPU promises no order between barriers, so
 * two threads that share memory without one (a race) give another result in some order:
 * reverse and shuffle find the races the forward order hides (a write before a read of
 * another thread in the same interval). In those orders every warp moves one warp collective
 * (shuffle, ldmatrix, mma) per pass, so warps stay in step; "warps" (mode 3) runs one warp at
 * a time, the last first, as far as it gets (to a __syncthreads or its end) before the next
 * starts, as a GPU may when the others stall: a warp that writes shared memory another warp
 * has still to read, with no __syncthreads between, shows there. */
static void emu_order(int mode, unsigned nt, unsigned long long *rng)
{
    for (unsigned k = 0; k < nt; k++)
        emu_perm[k] = mode == 1 || mode == 3 ? nt - 1 - k : k;
    if (mode != 2) return;
    for (unsigned k = nt; k > 1; k--) {
        unsigned long long x = *rng; /* xorshift64 */
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *rng = x;
        unsigned j = (unsigned)(x % k), tmp = emu_perm[k - 1];
        emu_perm[k - 1] = emu_perm[j], emu_perm[j] = tmp;
    }
}

#ifndef EMU_FAST_SWITCH
/* Runs thread t until it waits or ends (emu_ended counts an end). 0, or -1 with msg filled (it
 * ended with cp.async copies not waited for). */
static int emu_resume(unsigned t, char *msg, size_t msg_n)
{
    emu_fiber *f = &emu_fib[t];
    emu_cur = t;
    threadIdx = f->tid;
    swapcontext(&emu_main, &f->ctx);
    if (!f->done || emu_ended(t)) return 0;
    emu_cpa_left(t, msg, msg_n);
    return -1;
}
#else
/* One chained pass over emu_perm[k0 .. k1) (skip_block: emu_passed_by's second case): its
 * first thread the scheduler does not pass by runs, and each switches to the next. */
static void emu_chain_pass(unsigned k0, unsigned k1, bool skip_block)
{
    emu_pass_end = k1;
    emu_pass_skip_block = skip_block;
    unsigned k = k0;
    while (k < k1 && emu_passed_by(emu_perm[k]))
        k++;
    if (k == k1) return;
    emu_pass_k = k;
    emu_cur = emu_perm[k];
    threadIdx = emu_fib[emu_cur].tid;
    jdt_emu_switch(&emu_main_sp, emu_fib[emu_cur].sp);
}
#endif

/* Runs body over the grid. 0, or -1 with msg filled (deadlock). */
static int emu_run_grid(void (*body)(void *), void *arg, dim3 g, dim3 b, char *msg, size_t msg_n)
{
    unsigned nt = b.x * b.y * b.z;
    if (!emu_stacks) {
        emu_stacks =
            (char *)mmap(nullptr, (size_t)EMU_MAX_THREADS * EMU_STACK, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (emu_stacks == MAP_FAILED) {
            emu_stacks = nullptr;
            std::snprintf(msg, msg_n, "no memory for the emulated threads' stacks");
            return -1;
        }
    }
    const char *cpa = std::getenv("JDT_CUDAEMU_CP_ASYNC");
    emu_cpa_early = cpa && !std::strcmp(cpa, "issue");
    const char *ord = std::getenv("JDT_CUDAEMU_ORDER");
    int mode = !ord                         ? 0
               : !std::strcmp(ord, "reverse") ? 1
               : !std::strcmp(ord, "shuffle") ? 2
               : !std::strcmp(ord, "warps")   ? 3
                                              : 0;
    unsigned long long rng = 0x9e3779b97f4a7c15ull ^ ++emu_launches;
    gridDim = g;
    blockDim = b;
    emu_body = body;
    emu_body_arg = arg;
    emu_nthreads = nt;
    /* last block first: a GPU promises no order, and a kernel (or a merged launch of several)
     * whose blocks read what earlier blocks wrote fails here instead of passing by luck */
    const unsigned long long n_blocks = (unsigned long long)g.x * g.y * g.z;
    const char *bo = std::getenv("JDT_CUDAEMU_BLOCKS");
    const bool forward = bo && !std::strcmp(bo, "forward");
    for (unsigned long long j = n_blocks; j-- > 0;) {
        const unsigned long long i = forward ? n_blocks - 1 - j : j;
        const unsigned bx = (unsigned)(i % g.x), by = (unsigned)(i / g.x % g.y),
                       bz = (unsigned)(i / ((unsigned long long)g.x * g.y));
        blockIdx = {bx, by, bz};
        if (emu_dyn) std::memset(emu_dyn, 0xff, emu_dyn_bytes);
        if (__start_jdt_emu_shared && __stop_jdt_emu_shared > __start_jdt_emu_shared)
            std::memset(__start_jdt_emu_shared, 0xff,
                        (size_t)(__stop_jdt_emu_shared - __start_jdt_emu_shared));
        emu_live = nt;
        emu_blocks++;
        emu_block_bar = {0, 0};
        for (unsigned w = 0; w < (nt + 31) / 32; w++) {
            emu_warp_bar[w] = {0, 0};
            emu_warp_live[w] = nt - 32 * w < 32 ? nt - 32 * w : 32;
        }
        for (unsigned t = 0; t < nt; t++) {
            emu_fiber *f = &emu_fib[t];
            f->tid = {t % b.x, (t / b.x) % b.y, t / (b.x * b.y)};
            f->done = false;
            f->at_block = false;
            emu_cpa_n[t] = emu_cpa_groups[t] = 0;
            emu_phase[t] = 0;
#ifdef EMU_FAST_SWITCH
            /* r15 r14 r13 r12 rbx rbp, then emu_entry as the return address, then a
             * zero "caller": emu_entry starts with rsp = 8 mod 16, as after a call */
            void **sp = (void **)(emu_stacks + (size_t)(t + 1) * EMU_STACK) - 8;
            for (int i = 0; i < 6; i++)
                sp[i] = nullptr;
            sp[6] = (void *)emu_entry;
            sp[7] = nullptr;
            f->sp = sp;
#else
            getcontext(&f->ctx);
            f->ctx.uc_stack.ss_sp = emu_stacks + (size_t)t * EMU_STACK;
            f->ctx.uc_stack.ss_size = EMU_STACK;
            f->ctx.uc_link = &emu_main;
            makecontext(&f->ctx, emu_entry, 0);
#endif
        }
        emu_left = nt;
        if (mode != 2) emu_order(mode, nt, &rng); /* a fixed order: once per block */
        while (emu_left) {
            unsigned long long before = emu_moves;
            if (mode == 2) emu_order(mode, nt, &rng);
            if (mode == 3) { /* warp by warp, the last first, each as far as it gets */
                for (unsigned w0 = (nt - 1) & ~31u;; w0 -= 32) {
                    unsigned wn = nt - w0 < 32 ? nt - w0 : 32;
                    for (;;) {
                        unsigned long long seen = emu_arrivals + emu_moves;
#ifdef EMU_FAST_SWITCH /* the warp's lanes, the last first: emu_perm is nt - 1, ..., 0 */
                        emu_chain_pass(nt - w0 - wn, nt - w0, true);
                        if (emu_fault[0]) break;
#else
                        emu_pass_skip_block = true;
                        for (unsigned j = wn; j-- > 0;) {
                            if (emu_passed_by(w0 + j)) continue;
                            if (emu_resume(w0 + j, msg, msg_n)) return -1;
                        }
#endif
                        if (emu_arrivals + emu_moves == seen) break;
                    }
                    if (emu_fault[0]) break;
                    if (w0 == 0) break;
                }
            } else {
#ifdef EMU_FAST_SWITCH
                emu_chain_pass(0, nt, false);
#else
                emu_pass_skip_block = false;
                for (unsigned k = 0; k < nt; k++) {
                    unsigned t = emu_perm[k];
                    if (emu_passed_by(t)) continue;
                    if (emu_resume(t, msg, msg_n)) return -1;
                }
#endif
            }
            if (emu_fault[0]) {
                std::snprintf(msg, msg_n, "%s", emu_fault);
                emu_fault[0] = '\0';
                return -1;
            }
            if (emu_left && emu_moves == before) {
                std::snprintf(msg, msg_n,
                              "deadlock in block (%u, %u, %u): %u of %u threads wait at a "
                              "barrier that cannot open (__syncthreads or a warp "
                              "collective under divergent control flow)",
                              bx, by, bz, emu_left, nt);
                return -1;
            }
        }
    }
    return 0;
}

/* ---- warp collectives ---------------------------------------------------------------------- */

/* by parity (emu_phase): the lanes' values (shuffles, votes), and every collective's stamps */
static unsigned long long emu_xch[2][EMU_MAX_THREADS], emu_xch_stamp[2][EMU_MAX_THREADS];

/* The caller's buffer parity for this collective (its count advanced for the next one). */
static inline unsigned emu_flip()
{
    return emu_phase[emu_cur]++ & 1u;
}
/* The caller's stamp for its current collective (after emu_flip). */
static inline unsigned long long emu_stamp()
{
    return emu_blocks << 32 | emu_phase[emu_cur];
}
/* Per warp, the stamp of the last collective a lane of it has read (emu_first_read). */
static unsigned long long emu_warp_read[2][EMU_MAX_THREADS / 32];

/* Called after a collective's barrier: true for the first lane of the warp to read (it does
 * the warp's work once: the check below, mma's unpacking). */
static inline bool emu_first_read(unsigned ph)
{
    unsigned w = emu_cur >> 5;
    if (emu_warp_read[ph][w] == emu_stamp()) return false;
    emu_warp_read[ph][w] = emu_stamp();
    return true;
}

/* Every lane of mask inside the block and not exited took part in the caller's collective (has
 * its stamp in buffer ph). One that has not waits at another warp barrier: a warp collective
 * under divergent control flow, which a GPU may hang on or run with undefined values; the
 * launch fails (emu_fault). Called once per collective and warp, after its barrier. */
static void emu_took_part(unsigned mask, unsigned ph, const char *what)
{
    unsigned base = emu_cur & ~31u;
    for (unsigned l = 0; l < 32 && !emu_fault[0]; l++) {
        unsigned t = base + l;
        if (((mask >> l) & 1u) && t < emu_nthreads && !emu_fib[t].done &&
            emu_xch_stamp[ph][t] != emu_stamp())
            std::snprintf(emu_fault, sizeof emu_fault,
                          "%s in block (%u, %u, %u), thread %u: lane %u of its warp, in the "
                          "mask and not exited, waits at another warp barrier (a warp collective "
                          "under divergent control flow)",
                          what, blockIdx.x, blockIdx.y, blockIdx.z, emu_cur, l);
    }
}

/* The caller, its value for collective `what` over mask posted in buffer ph, posts its stamp
 * there and waits at the warp's barrier; the warp's first lane to read then checks that every
 * lane took part (emu_took_part) and gets true (to do the warp's other once-only work). */
static inline bool emu_meet(unsigned ph, unsigned mask, const char *what)
{
    emu_xch_stamp[ph][emu_cur] = emu_stamp();
    __syncwarp();
    if (!emu_first_read(ph)) return false;
    emu_took_part(mask, ph, what);
    return true;
}

/* The caller's lane must be in a warp collective's mask (on a GPU, undefined otherwise). */
static inline void emu_mask_check(unsigned mask, const char *what)
{
    unsigned lane = emu_cur & 31u;
    if (!((mask >> lane) & 1u)) {
        std::fprintf(stderr,
                     "cudaemu: %s with mask %#x in thread %u: its lane %u is not in the mask "
                     "(undefined on a GPU)\n",
                     what, mask, emu_cur, lane);
        std::abort();
    }
}
/* Whether lane l of the caller's warp takes part in the caller's collective over mask, whose
 * values are in buffer ph: named by it, inside the block, and arrived at this collective (its
 * stamp, emu_meet): not exited before it. Called after the collective's warp barrier. */
static inline bool emu_lane_on(unsigned mask, unsigned l, unsigned ph)
{
    unsigned t = (emu_cur & ~31u) + l;
    return ((mask >> l) & 1u) && t < emu_nthreads && emu_xch_stamp[ph][t] == emu_stamp();
}

/* A shuffle: the value of lane src_lane of the caller's warp. A source that does not take part
 * (outside the mask, past the block's last thread, or exited) gives an undefined value on a
 * GPU, poison (all bits set: a NaN) here. */
template <class T> static inline T emu_exchange(unsigned mask, T v, unsigned src_lane)
{
    static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
    emu_mask_check(mask, "__shfl_*_sync");
    unsigned long long w = 0;
    std::memcpy(&w, &v, sizeof v);
    unsigned base = emu_cur & ~31u, s = src_lane & 31u, ph = emu_flip();
    emu_xch[ph][emu_cur] = w;
    emu_meet(ph, mask, "__shfl_*_sync");
    T r;
    if (emu_lane_on(mask, s, ph))
        std::memcpy(&r, &emu_xch[ph][base + s], sizeof r);
    else
        std::memset(&r, 0xff, sizeof r);
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int x, int = 32)
{
    return emu_exchange(m, v, (emu_cur & 31u) ^ (unsigned)x);
}
template <class T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32)
{
    unsigned lane = emu_cur & 31u;
    return emu_exchange(m, v, (lane & ~(unsigned)(w - 1)) + ((unsigned)src & (unsigned)(w - 1)));
}
template <class T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32)
{
    unsigned lane = emu_cur & 31u, seg = lane & (unsigned)(w - 1);
    return emu_exchange(m, v, seg + d < (unsigned)w ? lane + d : lane);
}
template <class T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32)
{
    unsigned lane = emu_cur & 31u, seg = lane & (unsigned)(w - 1);
    return emu_exchange(m, v, seg >= d ? lane - d : lane);
}
/* The votes over the lanes that take part (emu_lane_on); *on gets their mask. */
static inline unsigned emu_vote(unsigned m, int p, unsigned *on, const char *what)
{
    emu_mask_check(m, what);
    unsigned base = emu_cur & ~31u, r = 0, a = 0, ph = emu_flip();
    emu_xch[ph][emu_cur] = p != 0;
    emu_meet(ph, m, what);
    for (unsigned l = 0; l < 32; l++)
        if (emu_lane_on(m, l, ph)) {
            a |= 1u << l;
            r |= (unsigned)(emu_xch[ph][base + l] != 0) << l;
        }
    *on = a;
    return r;
}
static inline unsigned __ballot_sync(unsigned m, int p)
{
    unsigned on;
    return emu_vote(m, p, &on, "__ballot_sync");
}
static inline int __any_sync(unsigned m, int p)
{
    unsigned on;
    return emu_vote(m, p, &on, "__any_sync") != 0;
}
static inline int __all_sync(unsigned m, int p)
{
    unsigned on;
    return emu_vote(m, p, &on, "__all_sync") == on;
}

/* ---- atomics (one OS thread: plain read-modify-writes) ------------------------------------- */

template <class T> static inline T atomicAdd(T *a, T v)
{
    T old = *a;
    *a = old + v;
    return old;
}
template <class T> static inline T atomicMax(T *a, T v)
{
    T old = *a;
    if (v > old) *a = v;
    return old;
}
template <class T> static inline T atomicMin(T *a, T v)
{
    T old = *a;
    if (v < old) *a = v;
    return old;
}
template <class T> static inline T atomicExch(T *a, T v)
{
    T old = *a;
    *a = v;
    return old;
}
template <class T> static inline T atomicCAS(T *a, T cmp, T v)
{
    T old = *a;
    if (old == cmp) *a = v;
    return old;
}

/* ---- tensor-core fragments (kernels/cuk_attention_tc.cu's cuk_mma_bf16 / cuk_ldsm_x4) ---------
 */

/* by parity (emu_phase): the lanes' fragments; per warp, A (row, k) and B (n, k) unpacked to
 * floats by its first lane to read them (emu_first_read) */
static unsigned emu_mma_a[2][EMU_MAX_THREADS][4], emu_mma_b[2][EMU_MAX_THREADS][2];
static float emu_mma_af[2][EMU_MAX_THREADS / 32][16][16],
    emu_mma_bf[2][EMU_MAX_THREADS / 32][8][16];
static const unsigned short *emu_rowp[2][EMU_MAX_THREADS];

static inline float emu_bf(unsigned r, int hi)
{
    return __uint_as_float((hi ? r >> 16 : r & 0xffffu) << 16);
}

/* d (16 x 8, f32) += a (16 x 16, bf16) b (16 x 8, bf16), one warp. A(row, k) sits in lane
 * 4 (row % 8) + (k % 8) / 2, register row / 8 + 2 (k / 8), half k % 2; B(k, n) in lane
 * 4 n + (k % 8) / 2, register k / 8, half k % 2; C(row, n) in lane 4 (row % 8) + n / 2,
 * element 2 (row / 8) + n % 2. */
static inline void cuk_mma_bf16(float d[4], const unsigned a[4], const unsigned b[2])
{
    unsigned tid = emu_cur, base = tid & ~31u, lane = tid & 31u, ph = emu_flip();
    unsigned(*ma)[4] = emu_mma_a[ph], (*mb)[2] = emu_mma_b[ph];
    for (int i = 0; i < 4; i++)
        ma[tid][i] = a[i];
    mb[tid][0] = b[0];
    mb[tid][1] = b[1];
    unsigned w = tid >> 5;
    float(*af)[16] = emu_mma_af[ph][w], (*bf)[16] = emu_mma_bf[ph][w];
    if (emu_meet(ph, 0xffffffffu, "mma.sync")) { /* the warp's first lane to read unpacks */
        for (int kx = 0; kx < 16; kx++) {
            for (int row = 0; row < 16; row++)
                af[row][kx] = emu_bf(
                    ma[base + (row & 7) * 4 + ((kx & 7) >> 1)][(row >> 3) + 2 * (kx >> 3)], kx & 1);
            for (int n = 0; n < 8; n++)
                bf[n][kx] = emu_bf(mb[base + n * 4 + ((kx & 7) >> 1)][kx >> 3], kx & 1);
        }
    }
    int g = (int)(lane >> 2), t = (int)(lane & 3);
    /* each element's products summed over k in order, then added to d; the four sums side by
     * side (independent chains) */
    const float *a0 = af[g], *a1 = af[g + 8], *b0 = bf[2 * t], *b1 = bf[2 * t + 1];
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int kx = 0; kx < 16; kx++) {
        s0 += a0[kx] * b0[kx];
        s1 += a0[kx] * b1[kx];
        s2 += a1[kx] * b0[kx];
        s3 += a1[kx] * b1[kx];
    }
    d[0] += s0, d[1] += s1, d[2] += s2, d[3] += s3;
}

/* ldmatrix.x4: lane l's register i = matrix i (row addresses from lanes 8 i .. 8 i + 7) at row
 * l / 4, columns 2 (l % 4) and + 1; transposed: column l / 4 of rows 2 (l % 4) and + 1. */
template <bool TRANS> static inline void cuk_ldsm_x4(unsigned r[4], const unsigned short *row)
{
    unsigned tid = emu_cur, base = tid & ~31u, lane = tid & 31u;
    if ((uintptr_t)row & 15u) { /* the GPU: "misaligned address" */
        std::fprintf(stderr, "cudaemu: ldmatrix row address %p is not 16-byte aligned\n",
                     (const void *)row);
        std::abort();
    }
    unsigned ph = emu_flip();
    emu_rowp[ph][tid] = row;
    emu_meet(ph, 0xffffffffu, "ldmatrix");
    unsigned g = lane >> 2, t = lane & 3;
    for (unsigned i = 0; i < 4; i++) {
        const unsigned short *const *m = emu_rowp[ph] + base + 8 * i;
        r[i] = TRANS ? (unsigned)m[2 * t][g] | (unsigned)m[2 * t + 1][g] << 16
                     : (unsigned)m[g][2 * t] | (unsigned)m[g][2 * t + 1] << 16;
    }
}

/* ---- cp.async (kernels/cuk_attention_tc.cu's cuk_cp_async / _commit / _wait) -------------
 * A copy is queued and made only at the cuk_cp_async_wait of its thread that lets its group
 * through: the latest a GPU may complete it. So a tile read before its wait, or before the
 * barrier that publishes other threads' copies, reads the poisoned or the previous contents
 * (a race on a GPU) instead of the data by luck; the source is read at the wait. A thread that
 * ends with copies queued fails the launch (emu_run_grid). JDT_CUDAEMU_CP_ASYNC=issue lands
 * each copy when it is issued instead, the earliest a GPU may: a copy into a buffer other
 * threads still read (no barrier between their reads and the issue) then corrupts their data. */

static inline void emu_cp_async(void *dst, const void *src, bool full, unsigned bytes)
{
    unsigned t = emu_cur;
    if ((uintptr_t)dst % bytes || (uintptr_t)src % bytes) { /* the GPU: "misaligned address" */
        std::fprintf(stderr, "cudaemu: cp.async address %p <- %p is not %u-byte aligned\n", dst,
                     src, bytes);
        std::abort();
    }
    if (emu_cpa_early) { /* the earliest a GPU may land it: a write-after-read race shows */
        full ? (void)std::memcpy(dst, src, bytes) : (void)std::memset(dst, 0, bytes);
        return;
    }
    if (emu_cpa_n[t] == EMU_CPA_MAX) {
        std::fprintf(stderr, "cudaemu: more than %d cp.async copies of one thread in flight\n",
                     EMU_CPA_MAX);
        std::abort();
    }
    emu_cpa_q[t][emu_cpa_n[t]++] = {dst, src, emu_cpa_groups[t], bytes, !full};
}
template <int N> static inline void cuk_cp_async(void *dst, const void *src, bool full)
{
    emu_cp_async(dst, src, full, N);
}
static inline void cuk_cp_async_commit()
{
    emu_cpa_groups[emu_cur]++;
}
template <int N> static inline void cuk_cp_async_wait()
{
    unsigned t = emu_cur, kept = 0;
    for (unsigned i = 0; i < emu_cpa_n[t]; i++) {
        const emu_cpa c = emu_cpa_q[t][i];
        if (c.grp + N < emu_cpa_groups[t]) /* committed, and not among the N newest groups */
            c.zero ? (void)std::memset(c.dst, 0, c.bytes) : (void)std::memcpy(c.dst, c.src, c.bytes);
        else
            emu_cpa_q[t][kept++] = c;
    }
    emu_cpa_n[t] = kept;
}

/* The dynamic shared memory (cuk_common.cuh's CUK_DYN_SMEM). */
#define CUK_DYN_SMEM(T, name) T *name = (T *)emu_dyn

/* ---- launchers ----------------------------------------------------------------------------- */

/* Kernel F's arguments from cudaLaunchKernel's array (pointers to each value), then the grid. */
template <class... A, size_t... I>
static int emu_launch_impl(void (*f)(A...), void **args, dim3 g, dim3 b, char *msg, size_t msg_n,
                           std::index_sequence<I...>)
{
    struct call {
        void (*f)(A...);
        std::tuple<std::decay_t<A>...> v;
    } c{f, std::tuple<std::decay_t<A>...>(*(std::decay_t<A> *)args[I]...)};
    return emu_run_grid(
        [](void *p) {
            call *cp = (call *)p;
            std::apply(cp->f, cp->v);
        },
        &c, g, b, msg, msg_n);
}

template <class... A>
static int emu_launch(void (*f)(A...), void **args, dim3 g, dim3 b, char *msg, size_t msg_n)
{
    return emu_launch_impl(f, args, g, b, msg, msg_n, std::index_sequence_for<A...>{});
}

typedef int (*jdt_emu_launch_fn)(void **args, const unsigned *g, const unsigned *b, char *msg,
                                 size_t msg_n);

/* The entry the NVRTC stand-in appends per kernel: g and b are the grid and block (x, y, z). */
#define JDT_EMU_KERNEL(name)                                                                       \
    static int jdt_emu_l_##name(void **args, const unsigned *g, const unsigned *b, char *msg,      \
                                size_t msg_n)                                                      \
    {                                                                                              \
        return emu_launch(&name, args, dim3{g[0], g[1], g[2]}, dim3{b[0], b[1], b[2]}, msg,        \
                          msg_n);                                                                  \
    }

/* Sets the dynamic shared memory of the next launch (called by the runtime stand-in). */
extern "C" int jdt_emu_set_dyn(size_t bytes)
{
    static size_t cap;
    if (bytes > cap) {
        std::free(emu_dyn);
        emu_dyn = (unsigned char *)std::malloc(bytes);
        if (!emu_dyn) {
            cap = 0;
            return -1;
        }
        cap = bytes;
    }
    emu_dyn_bytes = bytes;
    return 0;
}

/* The dynamic shared memory goes with the module (the runtime stand-in dlcloses it). */
__attribute__((destructor)) static void emu_free_dyn(void)
{
    std::free(emu_dyn);
    emu_dyn = nullptr;
}

/* The generated kernels declare the fixed-width types and constants themselves (NVRTC has no
 * system headers): rename them away from the host's. Last, so nothing above sees this. */
#define int8_t jdt_i8_
#define uint8_t jdt_u8_
#define int16_t jdt_i16_
#define uint16_t jdt_u16_
#define int32_t jdt_i32_
#define uint32_t jdt_u32_
#define int64_t jdt_i64_
#define uint64_t jdt_u64_
#undef INFINITY
#undef NAN
#undef INT32_MAX
#undef INT32_MIN
