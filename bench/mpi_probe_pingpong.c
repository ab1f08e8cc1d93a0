/* Ping-pong between 2 ranks, receiving two ways: MPI_Recv posted (as
 * bench/mpi_coll.c does) or by probe (MPI_Mprobe + MPI_Mrecv, as braid's mpi
 * backend receives, so every message arrives unexpected). Prints the one-way
 * time. Used to check what receiving by probe costs in MPI itself:
 *   mpicc -O2 bench/mpi_probe_pingpong.c -o pp && mpirun -np 2 ./pp BYTES ITERS 0|1
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int n = atoi(argv[1]), iters = atoi(argv[2]), probe = atoi(argv[3]);
    char *s = malloc(n), *r = malloc(n); memset(s, 1, n); memset(r, 2, n);
    for (int k = 0; k < 2; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime();
        for (int i = 0; i < (k ? iters : 20); i++) {
            if (rank == 0) MPI_Send(s, n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            if (probe) {
                MPI_Message m; MPI_Status st;
                MPI_Mprobe(1 - rank, 0, MPI_COMM_WORLD, &m, &st);
                MPI_Mrecv(r, n, MPI_BYTE, &m, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(r, n, MPI_BYTE, 1 - rank, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            }
            if (rank == 1) MPI_Send(r, n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        t = MPI_Wtime() - t;
        if (k && rank == 0) printf("%s %.2f us one way\n", probe ? "probe " : "posted", t / iters / 2 * 1e6);
    }
    MPI_Finalize();
}
