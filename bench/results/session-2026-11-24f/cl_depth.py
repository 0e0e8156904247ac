"""Does NVIDIA's OpenCL block an enqueue while the device is behind? Host time of each
clEnqueueNDRangeKernel (ctypes, no event) and of small writes, with the device idle and
behind a long kernel."""
import ctypes, time, sys
import numpy as np
import pyopencl as cl
from portanet import backends
from portanet.backends import opencl

bk = backends.device(sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0")
q, ctx = bk.queue, bk.ctx
src = """
__kernel void nothing(__global float *x) {}
__kernel void many(__global float *a, __global float *b, __global float *c, int m, int n,
                   int k, float al, float be, int o1, int o2, int o3, int o4) {}
__kernel void spin(__global float *x, int n) {
    float a = x[0];
    for (int i = 0; i < n; i++) a = a * 1.0000001f + 1e-7f;
    if (a == 12345.f) x[0] = a;
}"""
prg = cl.Program(ctx, src).build()
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 20)
nothing, many, spin = cl.Kernel(prg, "nothing"), cl.Kernel(prg, "many"), cl.Kernel(prg, "spin")
nothing.set_args(buf)
many.set_args(buf, buf, buf, np.int32(1), np.int32(1), np.int32(1), np.float32(1),
              np.float32(0), np.int32(0), np.int32(0), np.int32(0), np.int32(0))
enqueue = opencl._enqueue_api()
one = (ctypes.c_size_t * 1)(64)

def launch(k):
    return enqueue(q.int_ptr, k.int_ptr, 1, None, one, one, 0, None, None)

def spin_for(ms):
    n = 1000
    while True:
        spin.set_args(buf, np.int32(n))
        t = time.perf_counter()
        cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.finish()
        dt = time.perf_counter() - t
        if dt * 1e3 > ms / 2:
            spin.set_args(buf, np.int32(int(n * ms / (dt * 1e3))))
            return
        n *= 4

def per_call(f, count):
    out = []
    for _ in range(count):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return np.array(out) * 1e6

def show(label, us):
    big = np.nonzero(us > 50)[0]
    print(f"{label:52s} median {np.median(us):6.1f} us, mean {us.mean():7.1f}, max "
          f"{us.max():8.1f}; calls > 50 us: {len(big)} (first at {big[:5].tolist()})")

spin_for(20)
for name, k in (("empty kernel", nothing), ("12-argument kernel", many)):
    q.finish(); show(f"{name}, device idle", per_call(lambda: launch(k), 300))
    q.finish(); cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()
    t = time.perf_counter()
    us = per_call(lambda: launch(k), 1000)
    show(f"{name}, behind a 20 ms kernel", us)
    q.finish()
    print(f"   1000 enqueues took {us.sum() / 1e3:.2f} ms; all done at "
          f"{(time.perf_counter() - t) * 1e3:.2f} ms")
small = np.zeros(64, np.int32)
batch = np.zeros(64 * 784, np.float32)
for label, host in (("write 256 B non-blocking", small), ("write 200 KB non-blocking", batch)):
    q.finish(); show(label + ", device idle",
                     per_call(lambda: cl.enqueue_copy(q, buf, host, is_blocking=False), 200))
    q.finish(); cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()
    show(label + ", behind a 20 ms kernel",
         per_call(lambda: cl.enqueue_copy(q, buf, host, is_blocking=False), 50))
    q.finish()
# a mix as in an epoch: write 200 KB, then 20 launches, repeated
q.finish(); cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()
def batch_like():
    cl.enqueue_copy(q, buf, batch, is_blocking=False)
    for _ in range(20):
        launch(many)
show("200 KB write + 20 launches, behind a 20 ms kernel", per_call(batch_like, 50))
q.finish()
show("200 KB write + 20 launches, device idle between", per_call(batch_like, 50))
