"""torch.sort baseline for `braid-bench gpu-sort`: N random int64 keys,
stable, with the sorting permutation (CUB's radix sort underneath).
Prints the median of REPS timed sorts (CUDA events) after a warm-up."""
import sys

import torch

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000_000
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
keys = torch.randint(-(2**63), 2**63 - 1, (n,), dtype=torch.int64, device="cuda")
torch.sort(keys, stable=True)
torch.cuda.synchronize()
times = []
for _ in range(reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    v, i = torch.sort(keys, stable=True)
    b.record()
    torch.cuda.synchronize()
    times.append(a.elapsed_time(b))
times.sort()
med = times[len(times) // 2]
print(f"torch.sort: {n} int64 keys, stable, with indices on {torch.cuda.get_device_name()}: "
      f"median {med:.2f} ms ({n / med / 1e6:.2f} Gkeys/s), runs {[round(t, 2) for t in times]}")
