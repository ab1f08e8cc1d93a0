/* What a host charges for what braid's in-process ranks do most: read the
 * monotonic clock (every polling pass), copy memory (a collective's
 * result), and see a cache line another core wrote (every hand-over).
 *
 *   cc -O2 -pthread -o host_probe bench/host_probe.c && ./host_probe
 *
 * Prints, in this order: ns per clock_gettime(CLOCK_MONOTONIC) (median of
 * 7 rounds of 1e6 calls); one thread's memcpy between two kept buffers of
 * 1 MiB and 16 MiB, GB/s (median of 7 rounds); the round trip of a
 * cache-line ping-pong between two threads pinned to cores 0 and 1, then
 * 0 and N/2, ns (median of 7 rounds of 1e5). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static _Alignas(64) atomic_long ball;
enum { TRIPS = 100000, ROUNDS = 7 };

static void pin(int core) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *pong(void *arg) {
    pin(*(int *)arg);
    for (long i = 0; i < (long)TRIPS * ROUNDS; i++) {
        while (atomic_load_explicit(&ball, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&ball, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

static double pingpong(int a, int b) {
    pthread_t t;
    double r[ROUNDS];
    atomic_store(&ball, 0);
    if (pthread_create(&t, NULL, pong, &b) != 0) {
        perror("pthread_create");
        exit(1);
    }
    pin(a);
    long v = 0;
    for (int k = 0; k < ROUNDS; k++) {
        double t0 = now_ns();
        for (int i = 0; i < TRIPS; i++) {
            atomic_store_explicit(&ball, v + 1, memory_order_release);
            while (atomic_load_explicit(&ball, memory_order_acquire) != v + 2) {
            }
            v += 2;
        }
        r[k] = (now_ns() - t0) / TRIPS;
    }
    pthread_join(t, NULL);
    qsort(r, ROUNDS, sizeof r[0], cmp);
    return r[ROUNDS / 2];
}

int main(void) {
    double r[ROUNDS];
    volatile double sink = 0;
    for (int k = 0; k < ROUNDS; k++) {
        double t0 = now_ns();
        for (int i = 0; i < 1000000; i++) sink += now_ns();
        r[k] = (now_ns() - t0) / 1e6;
    }
    qsort(r, ROUNDS, sizeof r[0], cmp);
    printf("clock_gettime(CLOCK_MONOTONIC): %.1f ns a call (median of %d rounds of 1e6)\n", r[ROUNDS / 2], ROUNDS);
    for (size_t len = 1 << 20; len <= (16 << 20); len <<= 4) {
        char *a = malloc(len), *b = malloc(len);
        if (!a || !b) {
            fprintf(stderr, "out of memory for two buffers of %zu bytes\n", len);
            return 1;
        }
        memset(a, 1, len);
        memset(b, 2, len);
        int reps = (int)((256 << 20) / len);
        for (int k = 0; k < ROUNDS; k++) {
            double t0 = now_ns();
            for (int i = 0; i < reps; i++) {
                memcpy(b, a, len);
                a[i % len] ^= b[(i * 7) % len];
            }
            r[k] = (double)len * reps / (now_ns() - t0);
        }
        qsort(r, ROUNDS, sizeof r[0], cmp);
        printf("memcpy of %zu MiB between kept buffers: %.1f GB/s\n", len >> 20, r[ROUNDS / 2]);
        free(a);
        free(b);
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n >= 2) printf("cache-line round trip, cores 0 and 1: %.1f ns\n", pingpong(0, 1));
    if (n >= 4) printf("cache-line round trip, cores 0 and %ld: %.1f ns\n", n / 2, pingpong(0, (int)(n / 2)));
    return 0;
}
