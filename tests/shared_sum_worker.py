"""Run by tests/test_shared_sum.py under mpiexec: shared_sum.SharedSum over this job's
ranks, grouped as `hosts` groups of ranks that share memory, sums each rank's vector in
pieces over both turns, then closes it and does the same with a window twice as large;
each rank writes its sums to OUT/<rank>.npy.
Usage: shared_sum_worker.py OUT N HOSTS"""
import sys
from pathlib import Path

import numpy as np

from portanet import launch, shared_sum

out, n, hosts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
channel = launch.MpiChannel()
node = channel.comm.Split(channel.rank * hosts // channel.size)
grouped = shared_sum.Node(channel, node)
sums = []
for size in (n, 2 * n):                         # a window, then a larger one in its place
    summing = shared_sum.SharedSum(grouped, size, np.float64)
    for turn in (0, 1, 0):
        value = np.random.default_rng([channel.rank, turn, size]).standard_normal(size)
        summing.mine[...] = value
        for start in range(0, size, 7):         # pieces of 7, the last shorter
            summing.add(start, min(7, size - start), turn)
        sums.append(summing.results[turn].copy())
    summing.close()
np.save(out / f"{channel.rank}.npy", np.array(sums, dtype=object), allow_pickle=True)
