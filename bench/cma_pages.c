/* How page size affects single-copy (CMA) transfers, the path OpenMPI's
 * shared-memory transport (vader/sm) takes for large messages: the
 * receiver calls process_vm_readv, which pins the sender's pages and
 * copies into its own buffer.
 *
 * Copies SIZE MiB from a source buffer into 16 destination buffers, for
 * each pairing of 4 KiB and 2 MiB (MADV_HUGEPAGE) pages on either side,
 * the four pairings alternated ROUNDS times. Prints mean and best time
 * per copy. (Reads from its own pid: the kernel path is the same as
 * between two processes.)
 *
 *   cc -O2 bench/cma_pages.c -o cma_pages && ./cma_pages 16 20
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NBUF 16
#define HUGE (2UL << 20)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* n bytes on 2 MiB boundaries, huge pages or not, touched. */
static char *alloc(size_t n, int huge)
{
    char *p = mmap(NULL, n + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    p = (char *)(((size_t)p + HUGE - 1) & ~(HUGE - 1));
    madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    memset(p, 1, n);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s SIZE_MIB ROUNDS\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int rounds = atoi(argv[2]);
    char *src[2] = {alloc(n, 0), alloc(n, 1)};
    char *dst[2][NBUF];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < NBUF; i++)
            dst[h][i] = alloc(n, h);
    double sum[4] = {0}, best[4] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < 4; c++) {
            int sh = c >> 1, dh = c & 1;
            double t = now_ms();
            for (int i = 0; i < NBUF; i++) {
                struct iovec l = {dst[dh][i], n}, rm = {src[sh], n};
                if (process_vm_readv(getpid(), &l, 1, &rm, 1, 0) != (ssize_t)n) {
                    perror("process_vm_readv");
                    return 1;
                }
            }
            double d = (now_ms() - t) / NBUF;
            sum[c] += d;
            if (d < best[c])
                best[c] = d;
        }
    const char *name[4] = {"source 4 KiB, destination 4 KiB", "source 4 KiB, destination 2 MiB",
                           "source 2 MiB, destination 4 KiB", "source 2 MiB, destination 2 MiB"};
    for (int c = 0; c < 4; c++)
        printf("%s, %zu MiB: mean %.3f ms, best %.3f ms\n", name[c], n >> 20, sum[c] / rounds, best[c]);
    return 0;
}
