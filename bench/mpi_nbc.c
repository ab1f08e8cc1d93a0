// Blocking MPI collectives against their nonblocking forms (MPI_Ialltoall,
// MPI_Iallreduce, MPI_Iallgather driven by MPI_Test), alone and after a
// 16-byte MPI_Iallreduce of a call signature (what braid would need to fail
// mismatched calls first). Build: mpicc -O2 bench/mpi_nbc.c -o mpi_nbc;
// run: mpirun -np N [--mca btl tcp,self | self,vader] ./mpi_nbc.
// Prints us per call (the slowest rank), 3 rounds a point.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static double t_block(int op, char*s, char*r, int n, int iters){
  MPI_Barrier(MPI_COMM_WORLD); double t=MPI_Wtime();
  for(int i=0;i<iters;i++){
    if(op==0) MPI_Alltoall(s,n,MPI_BYTE,r,n,MPI_BYTE,MPI_COMM_WORLD);
    else if(op==2) MPI_Allgather(s,n,MPI_BYTE,r,n,MPI_BYTE,MPI_COMM_WORLD);
    else MPI_Allreduce(s,r,n/8,MPI_DOUBLE,MPI_SUM,MPI_COMM_WORLD);
  }
  double d=(MPI_Wtime()-t)/iters, m; MPI_Allreduce(&d,&m,1,MPI_DOUBLE,MPI_MAX,MPI_COMM_WORLD); return m;
}
static double t_nb(int op, char*s, char*r, int n, int iters, int agree){
  MPI_Barrier(MPI_COMM_WORLD); double t=MPI_Wtime();
  for(int i=0;i<iters;i++){
    MPI_Request q; int done=0;
    if(agree){ long sig[2]={n,-n}, out[2]; MPI_Iallreduce(sig,out,2,MPI_LONG,MPI_MAX,MPI_COMM_WORLD,&q);
      while(!done) MPI_Test(&q,&done,MPI_STATUS_IGNORE); done=0; }
    if(op==0) MPI_Ialltoall(s,n,MPI_BYTE,r,n,MPI_BYTE,MPI_COMM_WORLD,&q);
    else if(op==2) MPI_Iallgather(s,n,MPI_BYTE,r,n,MPI_BYTE,MPI_COMM_WORLD,&q);
    else MPI_Iallreduce(s,r,n/8,MPI_DOUBLE,MPI_SUM,MPI_COMM_WORLD,&q);
    while(!done) MPI_Test(&q,&done,MPI_STATUS_IGNORE);
  }
  double d=(MPI_Wtime()-t)/iters, m; MPI_Allreduce(&d,&m,1,MPI_DOUBLE,MPI_MAX,MPI_COMM_WORLD); return m;
}
int main(int c, char**v){
  MPI_Init(&c,&v); int rank,size; MPI_Comm_rank(MPI_COMM_WORLD,&rank); MPI_Comm_size(MPI_COMM_WORLD,&size);
  int sizes[]={1<<20, 16<<20, 64<<20};
  for(int si=0;si<3;si++){ int total=sizes[si]; int n=total/size; 
    char*s=malloc(total), *r=malloc(total); memset(s,1,total); memset(r,0,total);
    int it = total>(32<<20)?4: total>(4<<20)?10:50;
    for(int op=0;op<3;op++){ int nn = op==1? total : n;
      for(int round=0;round<3;round++){
        double a=t_block(op,s,r,nn,it), b=t_nb(op,s,r,nn,it,0), cc=t_nb(op,s,r,nn,it,1);
        if(rank==0) printf("%s np=%d %d B: blocking %.1f us, nonblocking %.1f (%.2f), +agree %.1f (%.2f)\n", op==1?"allreduce":op==2?"allgather":"alltoall", size,total,a*1e6,b*1e6,a/b,cc*1e6,a/cc);
      }}
    free(s);free(r);}
  MPI_Finalize();}
