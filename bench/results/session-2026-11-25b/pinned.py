"""One process's mlp-small step on NVIDIA's OpenCL, and its cost of one enqueue, in one
line: run under different CPU affinities (taskset, which every thread the driver starts
inherits) to see whether where the process's threads run sets its speed."""
import ctypes, os, sys, time
import numpy as np
import pyopencl as cl
from portanet import backends, bench
from portanet.backends import opencl

bk = backends.device("opencl:0:0")
q = bk.queue
prg = cl.Program(bk.ctx, "__kernel void k1(__global float* b0) "
                 "{ if (get_global_id(0) == 1 << 30) b0[0] = 1; }").build()
buf = cl.Buffer(bk.ctx, cl.mem_flags.READ_WRITE, 1 << 16)
ks = [cl.Kernel(prg, "k1") for _ in range(15)]
for k in ks:
    k.set_args(buf)
enqueue, size = opencl._enqueue_api(), (ctypes.c_size_t * 1)(64)


def enqueue_us():
    out = []
    for _ in range(30):
        q.finish()
        t = time.perf_counter()
        for _ in range(4):
            for k in ks:
                enqueue(q.int_ptr, k.int_ptr, 1, None, size, size, 0, None, None)
        out.append((time.perf_counter() - t) / 60)
    q.finish()
    return 1e6 * np.median(out)


net, step = bench.training_step("mlp-small", bk, 1000, np.random.default_rng(0))
for _ in range(50):
    step()
bk.synchronize()
steps = []
for _ in range(20):
    t = time.perf_counter()
    for _ in range(50):
        step()
    bk.synchronize()
    steps.append((time.perf_counter() - t) / 50)
cpus = sorted(os.sched_getaffinity(0))
cpu_text = f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 2 else ",".join(map(str, cpus))
print(f"cpus {cpu_text:8s} {sys.argv[1] if len(sys.argv) > 1 else '':12s} enqueue "
      f"{enqueue_us():5.2f} us   mlp-small step {1e6 * np.median(steps):6.1f} us "
      f"(min {1e6 * min(steps):6.1f})  threads {len(os.listdir('/proc/self/task'))}",
      flush=True)
