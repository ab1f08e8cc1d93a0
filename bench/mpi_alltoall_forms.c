/* AllToAll of BYTES per rank (BYTES/n a peer) over MPI, written four ways and alternated:
 * 0 MPI_Alltoall; 1 Irecv preposted + Isend, one message a peer;
 * 2 braid's pattern: a 32-byte header then the data a peer on one tag, both received by Improbe + Imrecv;
 * 3 header by Improbe, data on its own tag with its Irecv preposted before the sends.
 * Each call's header and data tags are its own (as braid's OpIds); the probes ask for the call's header tag.
 * Own block copied by memcpy in 1-3. Built against an MPI:
 *   mpicc -O2 bench/mpi_alltoall_forms.c -o forms && mpirun -np N ./forms BYTES ITERS ROUNDS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int n, me;
static void form(int f, char *s, char *r, size_t blk, int it) {
    int th = 2 * (it % 8000) + 2, td = f == 3 ? th + 1 : th;
    if (f == 0) { MPI_Alltoall(s, (int)blk, MPI_BYTE, r, (int)blk, MPI_BYTE, MPI_COMM_WORLD); return; }
    MPI_Request rq[64]; int k = 0; char hdr[64][32], hin[64][32];
    if (f == 1 || f == 3)
        for (int p = 0; p < n; p++) if (p != me)
            MPI_Irecv(r + p * blk, (int)blk, MPI_BYTE, p, f == 1 ? 0 : td, MPI_COMM_WORLD, &rq[k++]);
    for (int p = 0; p < n; p++) if (p != me) {
        if (f >= 2) { memset(hdr[p], p, 32); MPI_Isend(hdr[p], 32, MPI_BYTE, p, th, MPI_COMM_WORLD, &rq[k++]); }
        MPI_Isend(s + p * blk, (int)blk, MPI_BYTE, p, f == 1 ? 0 : td, MPI_COMM_WORLD, &rq[k++]);
    }
    memcpy(r + me * blk, s + me * blk, blk);
    if (f >= 2) {
        int want = (f == 2 ? 2 : 1) * (n - 1), got = 0, seen[64] = {0};
        while (got < want) {
            int flag; MPI_Message m; MPI_Status st;
            MPI_Improbe(MPI_ANY_SOURCE, th, MPI_COMM_WORLD, &flag, &m, &st);
            if (!flag) { int d; MPI_Testall(k, rq, &d, MPI_STATUSES_IGNORE); continue; }
            int src = st.MPI_SOURCE;
            if (seen[src]++ == 0) MPI_Imrecv(hin[src], 32, MPI_BYTE, &m, &rq[k++]);
            else MPI_Imrecv(r + src * blk, (int)blk, MPI_BYTE, &m, &rq[k++]);
            got++;
        }
    }
    MPI_Waitall(k, rq, MPI_STATUSES_IGNORE);
}
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me); MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t bytes = (size_t)atol(argv[1]); int iters = atoi(argv[2]), rounds = atoi(argv[3]);
    size_t blk = bytes / n;
    char *s = malloc(bytes), *r = malloc(bytes); memset(s, 1, bytes); memset(r, 2, bytes);
    const char *names[4] = {"MPI_Alltoall", "prepost 1 msg", "braid hdr+data probe", "hdr probe + data prepost"};
    double all[4][64];
    for (int k = 0; k < rounds; k++) {
        for (int f0 = 0; f0 < 4; f0++) {
            int f = (f0 + k) % 4;
            for (int i = 0; i < 5; i++) form(f, s, r, blk, i);
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            for (int i = 0; i < iters; i++) form(f, s, r, blk, i + 5);
            t = MPI_Wtime() - t; double mx;
            MPI_Reduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            all[f][k] = mx / iters * 1e6;
        }
    }
    if (me == 0) for (int f = 0; f < 4; f++) {
        printf("%d ranks %zu B %-26s", n, bytes, names[f]);
        for (int k = 0; k < rounds; k++) printf(" %7.1f", all[f][k]);
        printf("\n");
    }
    MPI_Finalize();
}
