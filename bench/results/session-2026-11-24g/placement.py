"""Does where the buffers lie set the speed of a step on NVIDIA's OpenCL? In one process,
LeNet's step (batch 64) and mlp-small's on networks made anew five times, each after a pad
buffer of a different size, so that their buffers lie elsewhere."""
import sys
import numpy as np
import portanet as pn
from portanet import bench

dev = sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0"
bk = pn.device(dev)
pads = []
for workload, batch in (("lenet-step", 64), ("mlp-small", 1000)):
    routes = None
    for i, pad_mib in enumerate((0, 1, 7, 33, 129)):
        pads.append(bk.empty((pad_mib * 2**18 + 1,)))
        net, step = bench.training_step(workload, bk, batch, np.random.default_rng(0))
        if routes is not None:                    # the first network's routes, kept
            bk._routes.update(routes)
        for _ in range(3):
            step()
        routes = dict(bk._routes)
        t = bench._step_timing(bk, step)
        print(f"{dev} {workload} network {i + 1} after {pad_mib} MiB more: "
              f"{t['median_s'] * 1e3:.3f} ms", flush=True)
        net.free()
