"""Non-blocking writes on NVIDIA's OpenCL behind a busy device: pageable numpy memory
against pinned memory (an ALLOC_HOST_PTR buffer, mapped), on the same queue."""
import time, sys
import numpy as np
import pyopencl as cl
from portanet import backends

bk = backends.device(sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0")
q, ctx = bk.queue, bk.ctx
prg = cl.Program(ctx, """__kernel void spin(__global float *x, int n) {
    float a = x[0];
    for (int i = 0; i < n; i++) a = a * 1.0000001f + 1e-7f;
    if (a == 12345.f) x[0] = a; }""").build()
spin = cl.Kernel(prg, "spin")
dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 20)
n = 1000
while True:
    spin.set_args(dst, np.int32(n)); t = time.perf_counter()
    cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.finish()
    if time.perf_counter() - t > 0.01:
        break
    n *= 2
print(f"spin of {n} iterations: {(time.perf_counter() - t) * 1e3:.1f} ms")

def probe(label, host, count=20):
    q.finish()
    cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()
    t0 = time.perf_counter(); us = []
    for _ in range(count):
        t = time.perf_counter()
        ev = cl.enqueue_copy(q, dst, host, is_blocking=False)
        us.append((time.perf_counter() - t) * 1e6)
    queued = (time.perf_counter() - t0) * 1e3
    q.finish()
    print(f"{label:40s} first {us[0]:9.1f} us, then median {np.median(us[1:]):6.1f} us; "
          f"{count} queued in {queued:.2f} ms, done at {(time.perf_counter() - t0) * 1e3:.2f} ms")

for nbytes in (256, 200704):
    pageable = np.ones(nbytes // 4, np.float32)
    pin = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
    mapped, _ = cl.enqueue_map_buffer(q, pin, cl.map_flags.WRITE, 0, (nbytes // 4,), np.float32)
    mapped[:] = 1
    probe(f"{nbytes} B pageable", pageable)
    probe(f"{nbytes} B pinned (mapped ALLOC_HOST_PTR)", mapped)
    probe(f"{nbytes} B pinned, a copy buffer -> buffer", None) if False else None
    q.finish()
    cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()
    t = time.perf_counter()
    cl.enqueue_copy(q, dst, pin)            # buffer to buffer: never host memory
    print(f"{nbytes} B from the pinned buffer object (device copy): "
          f"{(time.perf_counter() - t) * 1e6:.1f} us"); q.finish()
