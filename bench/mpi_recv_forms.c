/* A ping-pong of BYTES between 2 ranks, three receive forms alternated in one run:
 * 0 posted MPI_Send/MPI_Recv; 1 MPI_Mprobe+MPI_Mrecv; 2 braid's pattern:
 * MPI_Isend + MPI_Test loop, MPI_Improbe(any, any) loop + MPI_Imrecv + MPI_Test loop.
 * Built against an MPI and run on 2 ranks:
 *   mpicc -O2 bench/mpi_recv_forms.c -o forms && mpirun -np 2 ./forms BYTES ITERS ROUNDS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static void send_nb(char *b, int n, int peer) {
    MPI_Request r; int done = 0;
    MPI_Isend(b, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &r);
    while (!done) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
}
static void recv_nb(char *b, int n) {
    MPI_Message m; MPI_Status st; int found = 0, done = 0; MPI_Request r;
    while (!found) MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &found, &m, &st);
    MPI_Imrecv(b, n, MPI_BYTE, &m, &r);
    while (!done) MPI_Test(&r, &done, MPI_STATUS_IGNORE);
}
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int n = atoi(argv[1]), iters = atoi(argv[2]), rounds = atoi(argv[3]);
    char *s = malloc(n), *r = malloc(n); memset(s, 1, n); memset(r, 2, n);
    int peer = 1 - rank;
    for (int k = 0; k < rounds; k++) {
        double us[3];
        for (int f0 = 0; f0 < 3; f0++) {
            int f = (f0 + k) % 3;
            MPI_Barrier(MPI_COMM_WORLD);
            double t = MPI_Wtime();
            for (int i = 0; i < iters; i++) {
                if (rank == 0) {
                    if (f == 2) send_nb(s, n, peer); else MPI_Send(s, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                }
                if (f == 0) MPI_Recv(r, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                else if (f == 1) { MPI_Message m; MPI_Status st; MPI_Mprobe(peer, 0, MPI_COMM_WORLD, &m, &st); MPI_Mrecv(r, n, MPI_BYTE, &m, MPI_STATUS_IGNORE); }
                else recv_nb(r, n);
                if (rank == 1) {
                    if (f == 2) send_nb(r, n, peer); else MPI_Send(r, n, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
                }
            }
            us[f] = (MPI_Wtime() - t) / iters / 2 * 1e6;
        }
        if (rank == 0) printf("round %d: posted %.2f  mprobe %.2f  braid-pattern %.2f us one way\n", k, us[0], us[1], us[2]);
    }
    MPI_Finalize();
}
