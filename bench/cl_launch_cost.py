"""What one enqueue costs an OpenCL driver: host microseconds per call and device
microseconds per launch (back to back, `--repeats` of them), for an empty kernel with and
without arguments, through pyopencl (an Event per call) and straight through the OpenCL
library (no event, as a replayed step enqueues), on an in-order and an out-of-order queue;
and the host cost of a batch's upload from pageable and from pinned memory. It says what
bounds a step of small kernels on a driver (NVIDIA's OpenCL pays ~8 us a launch).

Usage: python bench/cl_launch_cost.py [--device opencl:0:0] [--repeats 2000]
"""
import argparse
import ctypes

import numpy as np
import pyopencl as cl

from portanet import backends
from portanet.backends.opencl import _enqueue_api
from step_launches import timed         # bench/, the script's folder, is on sys.path

SOURCE = """
__kernel void nothing(__global float *x) {}
__kernel void many(__global float *a, __global float *b, __global float *c, __global float *d,
                   __global float *e, __global float *f, int i, int j, int k, float s) {}
"""


def per_call(queue, run, repeats):
    """(host us per call, wall us per call until the queue is done)."""
    wall, host = timed(run, repeats, queue.finish)
    return host * 1e6, wall * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="opencl:0:0")
    parser.add_argument("--repeats", type=int, default=2000)
    args = parser.parse_args()
    bk = backends.device(args.device)
    ctx, n = bk.ctx, args.repeats
    print(f"{bk.name}: {bk.device.name.strip()}, {bk.platform.name.strip()} "
          f"{bk.device.driver_version}")
    program = cl.Program(ctx, SOURCE).build()
    bufs = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096) for _ in range(6)]
    nothing = cl.Kernel(program, "nothing")
    nothing.set_args(bufs[0])
    many = cl.Kernel(program, "many")
    many.set_args(*bufs, np.int32(1), np.int32(2), np.int32(3), np.float32(0.5))
    enqueue = _enqueue_api()
    size = (ctypes.c_size_t * 1)(256)
    queues = {"in-order": cl.CommandQueue(ctx),
              "out-of-order": cl.CommandQueue(
                  ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)}
    print(f"{'what':52s} {'host us':>8s} {'wall us':>8s}")
    for qname, q in queues.items():
        for kname, k in (("no arguments", nothing), ("10 arguments", many)):
            rows = [("pyopencl", lambda: cl.enqueue_nd_range_kernel(q, k, (256,), (256,)))]
            if enqueue is not None:
                rows.append(("direct, no event", lambda: enqueue(
                    q.int_ptr, k.int_ptr, 1, None, size, size, 0, None, None)))
                rows.append(("direct, no event, local size NULL", lambda: enqueue(
                    q.int_ptr, k.int_ptr, 1, None, size, None, 0, None, None)))
            for how, run in rows:
                host, wall = per_call(q, run, n)
                print(f"{qname + ', ' + kname + ', ' + how:52s} {host:8.2f} {wall:8.2f}")
    q = queues["in-order"]
    host, wall = per_call(q, q.flush, n)
    print(f"{'clFlush of an empty queue':52s} {host:8.2f} {wall:8.2f}")
    batch = np.random.default_rng(0).random(64 * 784, dtype=np.float32)  # a LeNet batch
    dst = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, batch.nbytes)
    host, wall = per_call(q, lambda: cl.enqueue_copy(q, dst, batch, is_blocking=False),
                          max(1, n // 4))
    print(f"{'write 196 KiB from pageable memory, no wait':52s} {host:8.2f} {wall:8.2f}")
    pinned_buf = cl.Buffer(ctx, cl.mem_flags.ALLOC_HOST_PTR, batch.nbytes)
    pinned, _ = cl.enqueue_map_buffer(q, pinned_buf, cl.map_flags.WRITE, 0, batch.shape,
                                      batch.dtype)
    pinned[...] = batch
    host, wall = per_call(q, lambda: cl.enqueue_copy(q, dst, pinned, is_blocking=False),
                          max(1, n // 4))
    print(f"{'write 196 KiB from pinned memory, no wait':52s} {host:8.2f} {wall:8.2f}")
    host, wall = per_call(q, lambda: cl.enqueue_copy(q, dst, batch, is_blocking=True),
                          max(1, n // 4))
    print(f"{'write 196 KiB from pageable memory, blocking':52s} {host:8.2f} {wall:8.2f}")
    host, wall = per_call(q, lambda: cl.enqueue_marker(q), n)
    print(f"{'marker':52s} {host:8.2f} {wall:8.2f}")


if __name__ == "__main__":
    main()
