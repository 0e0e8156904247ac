"""mlp-small's step (and LeNet's at 64) routed anew several times in one process: its
median time after each routing, and the routes that differ from the first routing's, to
tell routing's noise from a process's own speed. With an argument REPEATS, routing's
ROUTING_REPEATS is set to it first."""
import sys
import numpy as np
import portanet as pn
from portanet import bench
from portanet.backends import gpu

dev = sys.argv[1]
if len(sys.argv) > 2:
    gpu.ROUTING_REPEATS = int(sys.argv[2])
bk = pn.device(dev)
for workload, batch in (("mlp-small", 1000), ("lenet-step", 64)):
    net, step = bench.training_step(workload, bk, batch, np.random.default_rng(0))
    first = None
    for i in range(5):
        bk._routes, bk._route_tilings = {}, {}
        net._graphs.clear()
        for _ in range(3):
            step()
        t = bench._step_timing(bk, step)
        routes = dict(bk._routes)
        if first is None:
            first = routes
        changed = {k: (first.get(k), v) for k, v in routes.items() if first.get(k) != v}
        print(f"{dev} {workload} routing {i + 1}: {t['median_s'] * 1e3:.3f} ms; "
              f"{len(changed)} of {len(routes)} routes differ from the first: {changed}",
              flush=True)
    net.free()
