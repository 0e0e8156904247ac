"""Where the per-process speed of NVIDIA's OpenCL comes from: two contexts (two backends
made apart) for the same device in one process, each timing mlp-small's step (as the bench
times it) in turn, twice; run under different PYTHONHASHSEEDs. Prints the median ms of
each and the routes each context chose."""
import os
import sys

import numpy as np

from portanet import bench
from portanet.backends.opencl import OpenCLBackend

workload = sys.argv[1] if len(sys.argv) > 1 else "mlp-small"
batch = {"mlp-small": 1000, "lenet-step": 64}[workload]
backends = [OpenCLBackend(0, 0, np.float32) for _ in range(2)]
times = {0: [], 1: []}
for rnd in range(2):
    for i, bk in enumerate(backends):
        net, step = bench.training_step(workload, bk, batch, np.random.default_rng(0))
        try:
            t = bench._step_timing(bk, step)
        finally:
            net.free()
        times[i].append(1e3 * t["median_s"])
routes = [sorted((str(k), v) for k, v in bk._routes.items()) for bk in backends]
same = sum(a == b for a, b in zip(*routes))
print(f"PYTHONHASHSEED={os.environ.get('PYTHONHASHSEED', '-')} {workload}: context 0 "
      + " ".join(f"{x:.4f}" for x in times[0]) + " | context 1 "
      + " ".join(f"{x:.4f}" for x in times[1]) + f" ms | routes alike {same}/{len(routes[0])}")
