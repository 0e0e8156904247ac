"""SGD momentum update kernels alone on half a million elements (Fashion-MNIST MLP's 535818
parameters), on six pairs of buffers of one process: momentum_updates as gpu.py launches it
on GPUs (STEPS 4) and built with STEPS 1, momentum_update (one element a work-item, CPUs'
way) and sgd_update; median us of 8 launches, from OpenCL profiling events.

    python3 update_kernels.py DEVICE
"""
import sys
import warnings

import numpy as np
import pyopencl as cl

import portanet as pn
from portanet.backends import sources

warnings.filterwarnings("ignore")
bk = pn.device(sys.argv[1])
ctx = bk.ctx
q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
path, text = sources.load("elementwise", "cl")
p4 = cl.Program(ctx, text).build(options=bk.options)
p1 = cl.Program(ctx, text.replace("#define STEPS 4", "#define STEPS 1")).build(options=bk.options)
n = 535818
rng = np.random.default_rng(0)
mf = cl.mem_flags
i32, f32 = np.int32, np.float32
skip = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=np.zeros(1, np.int32))
bufs = [cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR,
                  hostbuf=(rng.standard_normal(n) * 1e-3).astype(np.float32)) for _ in range(6)]


def median_us(kernel, items):
    ts = []
    for _ in range(8):
        e = cl.enqueue_nd_range_kernel(q, kernel, (-(-items // 256) * 256,), (256,))
        e.wait()
        ts.append((e.profile.end - e.profile.start) * 1e-3)
    return np.median(ts)


print(f"{sys.argv[1]}: {bk.device_text()}, {n} elements")
for wi, vi in ((0, 1), (2, 3), (4, 5), (1, 2), (3, 4), (0, 5)):
    w, v = bufs[wi], bufs[vi]
    row = []
    for prg, steps in ((p4, 4), (p1, 1)):
        k = cl.Kernel(prg, "momentum_updates")
        k.set_args(skip, i32(0), f32(0), w, i32(0), v, i32(0), i32(n), i32(n - 5000),
                   *([w, i32(0), v, i32(0), i32(0), i32(0)] * 3))
        row.append(median_us(k, -(-n // steps)))
    k = cl.Kernel(p4, "momentum_update")
    k.set_args(skip, i32(0), f32(0), w, i32(0), v, i32(0), i32(n), i32(n - 5000))
    row.append(median_us(k, n))
    k = cl.Kernel(p4, "sgd_update")
    k.set_args(skip, i32(0), w, i32(0), v, i32(0), bufs[(vi + 1) % 6], i32(0), f32(0.02),
               f32(0.9), f32(0), i32(0), i32(0), i32(n))
    row.append(median_us(k, n))
    print(f"buffers ({wi},{vi}): momentum_updates STEPS 4 {row[0]:8.1f}, STEPS 1 {row[1]:8.1f};"
          f" momentum_update {row[2]:6.1f}; sgd_update {row[3]:6.1f} us")
