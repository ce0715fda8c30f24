"""mpi4py allreduce of rank + 1, launched by mpirun."""
from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(float(comm.Get_rank() + 1), op=MPI.SUM)
print(f"RESULT mpi rank={comm.Get_rank()} size={comm.Get_size()} sum={[total]}", flush=True)
