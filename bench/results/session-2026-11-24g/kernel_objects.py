"""Does NVIDIA's OpenCL enqueue slow down with the kernel objects alive? LeNet's step
(batch 64) timed, then with 1000 and 3000 more kernel objects with their arguments set,
then with them released."""
import gc, sys
import numpy as np
import pyopencl as cl
import portanet as pn
from portanet import bench

dev = sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0"
bk = pn.device(dev)
net, step = bench.training_step("lenet-step", bk, 64, np.random.default_rng(0))
for _ in range(3):
    step()
def timed(what):
    t = bench._step_timing(bk, step)
    print(f"{dev}: {what}: {t['median_s'] * 1e3:.3f} ms (bound kernels {len(bk._bound)}, programs {len(getattr(bk, "_programs", {}))})",
          flush=True)
timed("as routed")
fill = bk._named("fill")
x = bk.empty((16,))
extra = []
for n in (1000, 3000):
    while len(extra) < n:
        k = cl.Kernel(fill.program, fill.function_name)
        k.set_args(x.buf, np.int32(0), np.float32(0), np.int32(1))
        extra.append(k)
    timed(f"{n} more kernel objects")
extra.clear()
gc.collect()
timed("released")
