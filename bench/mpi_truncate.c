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
