"""The host cost of one clEnqueueNDRangeKernel on NVIDIA's OpenCL by the kernel's arguments,
measured interleaved: each round enqueues every variant in turn (random order), 15 kernel
objects of it taking turns 4 times (60 launches, as a step's launches take turns), behind
a busy device; the median, quartiles over 40 rounds. enqueue_args.py measured the variants
one after the other, and the CPU's state drifted under it."""
import ctypes, random, sys, time
import numpy as np
import pyopencl as cl
from portanet import backends
from portanet.backends import opencl

bk = backends.device(sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0")
q, ctx = bk.queue, bk.ctx
ooo = cl.CommandQueue(ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
ints = lambda n: ", ".join(f"int s{i}" for i in range(n))
bufs = lambda n: ", ".join(f"__global float* b{i}" for i in range(n))
src = f"""
typedef struct {{ int v[16]; }} params16;
__kernel void k1({bufs(1)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = 1; }}
__kernel void k1i8({bufs(1)}, {ints(8)}) {{ if (get_global_id(0) == s7) b0[0] = s0; }}
__kernel void k1i16({bufs(1)}, {ints(16)}) {{ if (get_global_id(0) == s15) b0[0] = s0; }}
__kernel void k1s16({bufs(1)}, const params16 p) {{ if (get_global_id(0) == p.v[15]) b0[0] = p.v[0]; }}
__kernel void k4({bufs(4)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b3[0]; }}
__kernel void k8({bufs(8)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b7[0]; }}
__kernel void k16({bufs(16)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b15[0]; }}
__kernel void k6i15({bufs(6)}, {ints(15)}) {{ if (get_global_id(0) == s14) b0[0] = b5[0]; }}
__kernel void k6s16({bufs(6)}, const params16 p) {{ if (get_global_id(0) == p.v[15]) b0[0] = b5[0]; }}
__kernel void k6c({bufs(6)}, __constant int* p) {{ if (get_global_id(0) == p[15]) b0[0] = b5[0]; }}
__kernel void spin(__global float *x, int n) {{
    float a = x[0];
    for (int i = 0; i < n; i++) a = a * 1.0000001f + 1e-7f;
    if (a == 12345.f) x[0] = a;
}}"""
prg = cl.Program(ctx, src).build(options=["-cl-kernel-arg-info"])
pool = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 16) for _ in range(24)]
enqueue = opencl._enqueue_api()
size = (ctypes.c_size_t * 1)(64)


def objects(name, distinct=True, count=15):
    ks = []
    for j in range(count):
        k = cl.Kernel(prg, name)
        args, nb = [], 0
        for i in range(k.get_info(cl.kernel_info.NUM_ARGS)):
            t = k.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME)
            if t.endswith("*"):
                args.append(pool[(nb + 7 * j) % 24] if distinct else pool[0]); nb += 1
            elif t.startswith("params"):
                args.append(np.arange(16, dtype=np.int32).tobytes())
            else:
                args.append(np.int32(i))
        k.set_args(*args)
        ks.append(k)
    return ks


spin = cl.Kernel(prg, "spin")
VARIANTS = {
    "1 buffer": (objects("k1"), q),
    "1 buffer + 8 ints": (objects("k1i8"), q),
    "1 buffer + 16 ints": (objects("k1i16"), q),
    "1 buffer + struct of 16 ints": (objects("k1s16"), q),
    "4 buffers": (objects("k4"), q),
    "8 buffers": (objects("k8"), q),
    "16 buffers": (objects("k16"), q),
    "6 buffers + 15 ints (gemm-like)": (objects("k6i15"), q),
    "6 buffers + struct of 16 ints": (objects("k6s16"), q),
    "6 buffers + 15 ints, one buffer": (objects("k6i15", False), q),
    "6 buffers + 15 ints, one object": (objects("k6i15") [:1] * 15, q),
    "6 buffers + 15 ints, out-of-order queue": (objects("k6i15"), ooo),
}


def busy(queue, ms=3):
    spin.set_args(pool[23], np.int32(int(ms * 6000)))
    cl.enqueue_nd_range_kernel(queue, spin, (1,), (1,)); queue.flush()


def one_round(ks, queue):
    queue.finish(); busy(queue)
    t = time.perf_counter()
    for _ in range(4):
        for k in ks:
            enqueue(queue.int_ptr, k.int_ptr, 1, None, size, size, 0, None, None)
    dt = (time.perf_counter() - t) / (4 * len(ks))
    queue.finish()
    return dt


for name, (ks, queue) in VARIANTS.items():
    one_round(ks, queue)
times = {name: [] for name in VARIANTS}
random.seed(0)
for _ in range(40):
    names = list(VARIANTS)
    random.shuffle(names)
    for name in names:
        times[name].append(one_round(*VARIANTS[name]))
print(f"{'kernel (15 objects in turn, behind a busy device)':44s} median us   25%    75%")
for name, t in times.items():
    t = 1e6 * np.array(t)
    print(f"{name:44s} {np.median(t):7.2f} {np.percentile(t, 25):7.2f} {np.percentile(t, 75):7.2f}")
