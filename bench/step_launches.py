"""Where a replayed training step's device time goes on OpenCL, launch by launch: the step
is recorded as fit records it, then each recorded launch is enqueued alone, back to back,
`--repeats` times and timed (device throughput of that launch, its launch gap included,
and the host's time to enqueue it), beside the whole replayed step and an empty kernel's
floor. `portanet profile` times one
eager step with markers around each call, which on NVIDIA's OpenCL adds ~20 us a call; this
shows what a replay pays.

On cuda, run it under Nsight Compute for the kernels' own durations:
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
      python bench/step_launches.py --device cuda

Usage: python bench/step_launches.py [--device opencl:0:0] [--workload lenet-step]
       [--batch 64] [--repeats 300]
"""
import argparse
import ctypes
import time

import numpy as np

from portanet import backends, bench


def timed(run, repeats, finish):
    """(wall seconds per call until finish() returns, host seconds per call to make it):
    run once first, then `repeats` times back to back (bench/cl_launch_cost.py too)."""
    run()
    finish()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    t1 = time.perf_counter()
    finish()
    return (time.perf_counter() - t0) / repeats, (t1 - t0) / repeats


def opencl(bk, net, repeats):
    import pyopencl as cl
    replay = next(g for g in net.plan.replays.graphs.values() if g)
    whole, host = timed(replay, repeats, bk.synchronize)
    print(f"replayed step: {whole * 1e6:8.1f} us on the device, {host * 1e6:.1f} us to "
          f"enqueue ({len(replay.ops)} ops)")
    floor = cl.Program(bk.ctx, "__kernel void nothing(__global float *x) {}").build()
    empty = cl.Kernel(floor, "nothing")
    scratch = cl.Buffer(bk.ctx, cl.mem_flags.READ_WRITE, 4)
    empty.set_args(scratch)
    t, _ = timed(lambda: cl.enqueue_nd_range_kernel(bk.queue, empty, (64,), (64,)), repeats,
                 bk.synchronize)
    print(f"empty kernel, back to back: {t * 1e6:.1f} us")
    total = host_total = 0.0
    print("  #  op                              global          local      us alone  host us")
    for i, op in enumerate(replay.ops):
        if hasattr(op, "kernel"):
            name, g, l = op.kernel.function_name, tuple(op.args[3]), tuple(op.args[4])

            def one(op=op):
                replay.enqueue(ctypes.c_void_p(bk.queue.int_ptr), *op.args)
        else:
            name, g, l = getattr(op, "__qualname__", "vendor call"), "", ""

            def one(op=op):
                op(bk.queue)
        t, host = timed(one, repeats, bk.synchronize)
        total, host_total = total + t, host_total + host
        print(f"{i + 1:3d}  {name:30s} {str(g):15s} {str(l):10s} {t * 1e6:8.1f} "
              f"{host * 1e6:8.1f}")
    print(f"sum of the launches alone: {total * 1e6:.1f} us on the device, "
          f"{host_total * 1e6:.1f} us to enqueue")


def cuda(bk, step):
    """One eager step between cuProfilerStart and Stop, for Nsight Compute."""
    lib = ctypes.CDLL("libcuda.so.1")
    bk.synchronize()
    lib.cuProfilerStart()
    step()
    bk.synchronize()
    lib.cuProfilerStop()
    print("one eager step profiled (run under ncu --profile-from-start off)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="opencl:0:0")
    parser.add_argument("--workload", default="lenet-step")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    bk = backends.device(args.device)
    net, step = bench.training_step(args.workload, bk, args.batch,
                                    np.random.default_rng(0), eager=bk.kind == "cuda")
    if bk.kind == "cuda":
        for _ in range(20):
            step()
        cuda(bk, step)
        return
    for _ in range(20):                  # routing measured, then recorded and replayed
        step()
    opencl(bk, net, args.repeats)


if __name__ == "__main__":
    main()
