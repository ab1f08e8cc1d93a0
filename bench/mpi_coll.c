/*
 * mpi_coll: OpenMPI baseline for braid's collective benchmarks.
 *
 * Times one MPI operation over ITERS iterations (after 5 warm-up iterations
 * and a barrier) and prints, on rank 0, a single line:
 *
 *   RESULT op=<OP> bytes=<SIZE used> ranks=<n> iters=<ITERS> us_per_iter=<f>
 *
 * The time is the maximum elapsed time over all ranks. For pingpong it is
 * the one-way latency (round trip / 2). With MPI_COLL_TIMING=per-call in
 * the environment each call is timed alone, after a barrier that is not
 * timed (as the OSU benchmarks time collectives: a call's latency, where
 * back-to-back calls may overlap, a broadcast's root running ahead); the
 * time is then the sum of a rank's call times over ITERS.
 *
 * Usage: mpi_coll OP SIZE_BYTES ITERS
 *   OP: pingpong bw barrier bcast allgather allreduce reduce_scatter
 *       alltoall alltoallv sendrecv
 *
 * Build: mpicc -O2 -o mpi_coll mpi_coll.c   (see bench/install_mpi.sh)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARMUP 5

static int rank, nranks;
static int per_call; /* MPI_COLL_TIMING=per-call (see the top) */

/* Benchmark state shared by the op functions. */
static size_t bytes;         /* size actually used (reported) */
static char *sbuf, *rbuf;    /* send / receive buffers */
static int *counts, *displs; /* for alltoallv */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "mpi_coll: out of memory (%zu bytes)\n", n);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

static void fill(char *buf, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)(1 + (i + (size_t)seed) % 251);
}

static void fill_doubles(char *buf, size_t n)
{
    double *d = (double *)buf;
    for (size_t i = 0; i < n / sizeof(double); i++)
        d[i] = 1.0 + (double)((i + (size_t)rank) % 97);
}

/* ---- one function per op; each runs a single iteration ---- */

/* Streaming bandwidth (like osu_bw): rank 0 posts WINDOW sends of SIZE
 * bytes, rank 1 WINDOW receives; then rank 1 acknowledges with 1 byte. The
 * reported time is per message (iteration time / WINDOW). */
#define WINDOW 16

static void op_bw(void)
{
    int n = (int)bytes;
    MPI_Request reqs[WINDOW];
    char ack = 0;
    if (rank == 0) {
        for (int w = 0; w < WINDOW; w++)
            MPI_Isend(sbuf, n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, &reqs[w]);
        MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
        MPI_Recv(&ack, 1, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        /* One receive buffer per window slot, as osu_bw does. */
        for (int w = 0; w < WINDOW; w++)
            MPI_Irecv(rbuf + (size_t)w * (size_t)n, n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, &reqs[w]);
        MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
        MPI_Send(&ack, 1, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }
}

static void op_pingpong(void)
{
    int n = (int)bytes;
    if (rank == 0) {
        MPI_Send(sbuf, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(rbuf, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
        MPI_Recv(rbuf, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(rbuf, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
    }
}

static void op_barrier(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
}

static void op_bcast(void)
{
    MPI_Bcast(sbuf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
}

static void op_allgather(void)
{
    MPI_Allgather(sbuf, (int)bytes, MPI_BYTE, rbuf, (int)bytes, MPI_BYTE,
                  MPI_COMM_WORLD);
}

static void op_allreduce(void)
{
    MPI_Allreduce(sbuf, rbuf, (int)(bytes / sizeof(double)), MPI_DOUBLE,
                  MPI_SUM, MPI_COMM_WORLD);
}

static void op_reduce_scatter(void)
{
    int per_rank = (int)(bytes / sizeof(double) / (size_t)nranks);
    MPI_Reduce_scatter_block(sbuf, rbuf, per_rank, MPI_DOUBLE, MPI_SUM,
                             MPI_COMM_WORLD);
}

static void op_alltoall(void)
{
    int per_peer = (int)(bytes / (size_t)nranks);
    MPI_Alltoall(sbuf, per_peer, MPI_BYTE, rbuf, per_peer, MPI_BYTE,
                 MPI_COMM_WORLD);
}

static void op_alltoallv(void)
{
    MPI_Alltoallv(sbuf, counts, displs, MPI_BYTE, rbuf, counts, displs,
                  MPI_BYTE, MPI_COMM_WORLD);
}

static void op_sendrecv(void)
{
    int n = (int)bytes;
    MPI_Sendrecv(sbuf, n, MPI_BYTE, (rank + 1) % nranks, 0, rbuf, n, MPI_BYTE,
                 (rank - 1 + nranks) % nranks, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
}

/* ---- op table: name, function, buffer setup ---- */

struct op {
    const char *name;
    void (*run)(void);
};

static const struct op OPS[] = {
    {"pingpong", op_pingpong},   {"barrier", op_barrier},
    {"bcast", op_bcast},         {"allgather", op_allgather},
    {"allreduce", op_allreduce}, {"reduce_scatter", op_reduce_scatter},
    {"alltoall", op_alltoall},   {"alltoallv", op_alltoallv},
    {"sendrecv", op_sendrecv},   {"bw", op_bw},
};

static void usage_exit(const char *msg)
{
    if (rank == 0) {
        fprintf(stderr, "mpi_coll: %s\n", msg);
        fprintf(stderr, "usage: mpi_coll OP SIZE_BYTES ITERS\n"
                        "  OP: pingpong barrier bcast allgather allreduce "
                        "reduce_scatter alltoall alltoallv sendrecv\n");
    }
    MPI_Finalize();
    exit(2);
}

static int parse_ulong(const char *s, unsigned long long *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return 0;
    *out = strtoull(s, &end, 10);
    return *end == '\0';
}

/* Round the requested size per op and allocate/fill buffers. */
static void setup(const char *name, size_t req)
{
    size_t n = (size_t)nranks;
    size_t sn, rn; /* send / receive buffer sizes */

    if ((!strcmp(name, "pingpong") || !strcmp(name, "bw")) && nranks != 2)
        usage_exit("pingpong needs exactly 2 ranks");

    if (!strcmp(name, "barrier")) {
        bytes = 0;
    } else if (!strcmp(name, "allreduce")) {
        bytes = req / 8 * 8;
        if (bytes < 8)
            bytes = 8;
    } else if (!strcmp(name, "reduce_scatter")) {
        bytes = req / (8 * n) * (8 * n);
        if (bytes < 8 * n)
            bytes = 8 * n;
    } else if (!strcmp(name, "alltoall") || !strcmp(name, "alltoallv")) {
        bytes = req / n * n;
        if (bytes < n)
            bytes = n;
    } else {
        bytes = req;
    }
    if (bytes > (size_t)0x7fffffff)
        usage_exit("SIZE_BYTES too large (counts must fit in int)");

    sn = bytes;
    rn = bytes;
    if (!strcmp(name, "allgather"))
        rn = bytes * n;
    else if (!strcmp(name, "bw"))
        rn = bytes * WINDOW;
    else if (!strcmp(name, "reduce_scatter"))
        rn = bytes / n;

    sbuf = xmalloc(sn);
    rbuf = xmalloc(rn);
    if (!strcmp(name, "allreduce") || !strcmp(name, "reduce_scatter"))
        fill_doubles(sbuf, sn);
    else
        fill(sbuf, sn, rank);
    fill(rbuf, rn, rank + 7);

    if (!strcmp(name, "alltoallv")) {
        counts = xmalloc(n * sizeof(int));
        displs = xmalloc(n * sizeof(int));
        for (int i = 0; i < nranks; i++) {
            counts[i] = (int)(bytes / n);
            displs[i] = i * counts[i];
        }
    }
}

/* Times one (op, size) point and prints its RESULT line on rank 0. */
static void run_point(const struct op *op, size_t size, unsigned long long iters)
{
    setup(op->name, size);

    for (int i = 0; i < WARMUP; i++)
        op->run();
    MPI_Barrier(MPI_COMM_WORLD);

    double elapsed = 0.0, max_elapsed = 0.0;
    if (per_call) {
        for (unsigned long long i = 0; i < iters; i++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            op->run();
            elapsed += MPI_Wtime() - t;
        }
    } else {
        double t0 = MPI_Wtime();
        for (unsigned long long i = 0; i < iters; i++)
            op->run();
        elapsed = MPI_Wtime() - t0;
    }

    MPI_Reduce(&elapsed, &max_elapsed, 1, MPI_DOUBLE, MPI_MAX, 0,
               MPI_COMM_WORLD);

    if (rank == 0) {
        double us = max_elapsed * 1e6 / (double)iters;
        if (!strcmp(op->name, "pingpong"))
            us /= 2.0; /* one-way */
        else if (!strcmp(op->name, "bw"))
            us /= (double)WINDOW; /* per message */
        printf("RESULT op=%s bytes=%zu ranks=%d iters=%llu us_per_iter=%.3f\n",
               op->name, bytes, nranks, iters, us);
        fflush(stdout);
    }

    free(sbuf);
    free(rbuf);
    free(counts);
    free(displs);
    sbuf = rbuf = NULL;
    counts = displs = NULL;
}

int main(int argc, char **argv)
{
    const struct op *op = NULL;
    unsigned long long size, iters;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const char *timing = getenv("MPI_COLL_TIMING");
    per_call = timing && !strcmp(timing, "per-call");

    /* mpi_coll OP SIZE ITERS, or mpi_coll OP SIZE:ITERS[,SIZE:ITERS...] */
    if (argc != 4 && argc != 3)
        usage_exit("expected OP SIZE ITERS or OP SIZE:ITERS,...");
    for (size_t i = 0; i < sizeof(OPS) / sizeof(OPS[0]); i++)
        if (!strcmp(argv[1], OPS[i].name))
            op = &OPS[i];
    if (!op)
        usage_exit("unknown OP");
    if (argc == 4) {
        if (!parse_ulong(argv[2], &size))
            usage_exit("SIZE_BYTES must be a non-negative integer");
        if (!parse_ulong(argv[3], &iters) || iters == 0)
            usage_exit("ITERS must be a positive integer");
        run_point(op, (size_t)size, iters);
    } else {
        char *list = argv[2], *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            char *colon = strchr(tok, ':');
            if (!colon)
                usage_exit("expected SIZE:ITERS");
            *colon = '\0';
            if (!parse_ulong(tok, &size) || !parse_ulong(colon + 1, &iters) || iters == 0)
                usage_exit("bad SIZE:ITERS");
            run_point(op, (size_t)size, iters);
        }
    }
    MPI_Finalize();
    return 0;
}
