/*
 * regions.c — how much can a second thread add when another process keeps one of two cores
 * busy? A synthetic "training step" of R parallel regions, each W microseconds of one core's
 * arithmetic cut into C equal chunks, run four ways: one thread (`one`); a 2-thread OpenMP team
 * (`omp`, run it with OMP_WAIT_POLICY=passive as jdt-train does); a 2-thread pool that never
 * waits for a thread that has not started (`pool`: the caller posts the chunks, whoever is
 * awake claims them, the region ends when the claimed chunks are done); the same pool with the
 * caller pinned to CPU 0 and the worker to CPU 1 (`pinned`, the busy core being CPU 1). It is
 * the ceiling test behind docs/perf.md (Busy machines, session 7): if no way of sharing the
 * work beats one thread here, no threading of jdt-train's step can. Built as build/bench/regions
 * (of the engine it uses only the clock, jdt_now_s); scripts/bench/regions.sh runs it.
 *
 * Usage: regions MODE R W C STEPS   (prints the mean milliseconds per step)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity; the Makefile defines it already */
#endif
#include "core/core.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile double sink;

/* a dependent multiply-add chain: pure core time, no memory traffic */
static void work(long iters)
{
    double a = 1.0, b = 1.0000001;
    for (long i = 0; i < iters; i++)
        a = a * b + 1e-9;
    sink += a;
}

static void pin(int cpu)
{
    cpu_set_t m;
    CPU_ZERO(&m);
    CPU_SET(cpu, &m);
    if (sched_setaffinity(0, sizeof m, &m) != 0) perror("regions: sched_setaffinity");
}

/* The pool: `state` packs the region's generation (high 32 bits) with its next unclaimed chunk,
 * so a worker that wakes late can never claim a chunk of a newer region. */
static _Atomic uint64_t state;
static _Atomic long done;
static _Atomic uint32_t gen_pub; /* futex word: the newest region's generation */
static _Atomic int asleep;
static long chunk_iters, n_chunks;
static int pinned;

static void claim_chunks(uint32_t gen)
{
    uint64_t s = atomic_load(&state);
    for (;;) {
        if ((uint32_t)(s >> 32) != gen || (long)(s & 0xffffffffu) >= n_chunks) return;
        if (!atomic_compare_exchange_weak(&state, &s, s + 1)) continue;
        work(chunk_iters);
        atomic_fetch_add(&done, 1);
        s = atomic_load(&state);
    }
}

static void *worker(void *arg)
{
    (void)arg;
    if (pinned) pin(1);
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load(&gen_pub)) == seen) {
            if (spins++ < 20000) continue; /* a short spin, then sleep */
            atomic_store(&asleep, 1);
            if (atomic_load(&gen_pub) == seen)
                syscall(SYS_futex, &gen_pub, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            atomic_store(&asleep, 0);
        }
        seen = g;
        claim_chunks(g);
    }
    return NULL;
}

static void pool_region(uint32_t gen)
{
    atomic_store(&done, 0);
    atomic_store(&state, (uint64_t)gen << 32);
    atomic_store(&gen_pub, gen);
    if (atomic_load(&asleep)) syscall(SYS_futex, &gen_pub, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    claim_chunks(gen);
    /* wait for chunks the worker claimed: spin briefly, then yield (never sleep, so the caller
     * is not woken onto the busy core) */
    for (int spins = 0; atomic_load(&done) < n_chunks;)
        if (++spins > 2000) sched_yield();
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: regions one|omp|pool|pinned R W_us C STEPS\n");
        return 2;
    }
    const char *mode = argv[1];
    int R = atoi(argv[2]), steps = atoi(argv[5]);
    double W = atof(argv[3]);
    n_chunks = atol(argv[4]);
    if (R < 1 || !(W > 0) || n_chunks < 1 || steps < 1) {
        fprintf(stderr, "regions: R, W, C and STEPS must be positive\n");
        return 2;
    }
    double t0 = jdt_now_s();
    work(50000000);
    double per_us = 50000000 / ((jdt_now_s() - t0) * 1e6); /* calibrated on an idle-ish core */
    chunk_iters = (long)(W * per_us / (double)n_chunks);
    pinned = !strcmp(mode, "pinned");
    bool pool = pinned || !strcmp(mode, "pool");
    if (pinned) pin(0);
    if (pool) {
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) != 0) return 1;
    }
    uint32_t gen = 0;
    double total = 0;
    for (int s = 0; s < steps; s++) {
        double a = jdt_now_s();
        for (int r = 0; r < R; r++) {
            if (pool) {
                pool_region(++gen);
            } else if (!strcmp(mode, "omp")) {
#pragma omp parallel for num_threads(2) schedule(dynamic, 1)
                for (long i = 0; i < n_chunks; i++)
                    work(chunk_iters);
            } else {
                for (long i = 0; i < n_chunks; i++)
                    work(chunk_iters);
            }
        }
        total += jdt_now_s() - a;
    }
    printf("%.2f\n", 1e3 * total / steps);
    return 0;
}
