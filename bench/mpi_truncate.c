/* What an MPI does with a message longer than the receive posted for it.
 *
 * Rank 1 posts MPI_Irecv of L bytes into a buffer of 3L zeroed bytes
 * (MPI_ERRORS_RETURN), then both meet at a barrier and rank 0 sends M
 * bytes of 7s; once MPI_Test completes the receive, rank 1 prints its
 * return code and how many bytes past L were written. Open MPI 4.1.4's
 * ob1 writes a rendezvous-sized message whole, past the buffer
 * (BENCHMARKS.md, 2026-12-02): why braid receives by probe.
 *
 *   mpicc -O2 bench/mpi_truncate.c -o /tmp/mpi_truncate
 *   mpirun -np 2 /tmp/mpi_truncate M L      (e.g. 200000 100000)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int c, char**v){
  MPI_Init(&c,&v); int r; MPI_Comm_rank(MPI_COMM_WORLD,&r);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int L=atoi(v[2]), M=atoi(v[1]);
  if(r==0){ char*b=malloc(M); memset(b,7,M); MPI_Barrier(MPI_COMM_WORLD); MPI_Send(b,M,MPI_BYTE,1,5,MPI_COMM_WORLD); }
  else { char*b=malloc(3*L); memset(b,0,3*L); MPI_Request q; MPI_Irecv(b,L,MPI_BYTE,0,5,MPI_COMM_WORLD,&q); MPI_Barrier(MPI_COMM_WORLD);
    int f=0; MPI_Status st; int rc; do { rc=MPI_Test(&q,&f,&st);} while(!f);
    int n=0; for(int i=L;i<3*L;i++) if(b[i]) n++;
    printf("rc %d, bytes written beyond %d\n", rc, n); }
  MPI_Finalize(); }
