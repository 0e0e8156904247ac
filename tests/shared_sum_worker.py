"""Run by tests/test_shared_sum.py under mpiexec: shared_sum.SharedSum over this job's
ranks, grouped as `hosts` groups of ranks that share memory, sums each rank's vector in
pieces over both turns; each rank writes its sums to OUT/<rank>.npy.
Usage: shared_sum_worker.py OUT N HOSTS"""
import sys
from pathlib import Path

import numpy as np

from portanet import launch, shared_sum

out, n, hosts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
channel = launch.MpiChannel()
node = channel.comm.Split(channel.rank * hosts // channel.size)
summing = shared_sum.SharedSum(shared_sum.Node(channel, node), n, np.float64)
sums = []
for turn in (0, 1, 0):
    value = np.random.default_rng([channel.rank, turn]).standard_normal(n)
    summing.mine[...] = value
    for start in range(0, n, 7):                # pieces of 7, the last shorter
        summing.add(start, min(7, n - start), turn)
    sums.append(summing.results[turn].copy())
summing.close()
np.save(out / f"{channel.rank}.npy", np.array(sums))
