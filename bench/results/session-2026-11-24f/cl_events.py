"""A recorded step's launches on a profiling queue, each with its event: the device's
time per launch and the gaps between them (OpenCL, median of the repeats)."""
import sys
import numpy as np
import pyopencl as cl
from portanet import backends, bench
from portanet.backends import opencl

def main(device, workload, batch, repeats=60):
    bk = backends.device(device)
    net, step = bench.training_step(workload, bk, batch, np.random.default_rng(0))
    for _ in range(20):
        step()
    bk.synchronize()
    replay = next(g for g in net._graphs.values() if g)
    pq = cl.CommandQueue(bk.ctx, bk.device,
                         properties=cl.command_queue_properties.PROFILING_ENABLE)
    names, rows = [], []
    for r in range(repeats):
        evs = []
        for op in replay.ops:
            if isinstance(op, opencl._Launch):
                e = cl.enqueue_nd_range_kernel(pq, op.kernel, tuple(op.global_size),
                                               tuple(op.local_size))
                if r == 0:
                    names.append(op.kernel.function_name + str(tuple(op.global_size)))
            else:
                b = cl.enqueue_marker(pq)
                op(pq)
                e = cl.enqueue_marker(pq)
                evs.append(b)
                if r == 0:
                    names.append("vendor " + getattr(op, "__qualname__", "?"))
            evs.append(e)
        pq.finish()
        rows.append([(ev.profile.start, ev.profile.end) for ev in evs])
    # one vendor op gives two events (markers): take the pair's span
    med = lambda v: float(np.median(v)) / 1e3
    spans, gaps, i = [], [], 0
    per = []
    for row in rows:
        items, j = [], 0
        for name in names:
            if name.startswith("vendor"):
                items.append((row[j][0], row[j + 1][1])); j += 2
            else:
                items.append(row[j]); j += 1
        per.append(items)
    print(f"{workload} batch {batch} on {device}: {len(names)} ops")
    total_busy = []
    for k, name in enumerate(names):
        d = [p[k][1] - p[k][0] for p in per]
        g = [p[k][0] - p[k - 1][1] for p in per] if k else [0]
        print(f"  {k + 1:2d} {name:44s} busy {med(d):7.1f} us   gap before {med(g):6.1f} us")
    step = [p[-1][1] - p[0][0] for p in per]
    busy = [sum(a[1] - a[0] for a in p) for p in per]
    print(f"  step span {med(step):.1f} us, busy {med(busy):.1f} us, gaps {med(step) - med(busy):.1f} us")

for spec in sys.argv[1:]:
    d, w, b = spec.split("/")
    main(d, w, int(b))
