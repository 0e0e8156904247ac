"""What one clEnqueueNDRangeKernel costs the host on NVIDIA's OpenCL, by what the kernel
takes: scalar arguments, buffer arguments (one buffer or distinct ones), the scalars as one
struct, and the mlp-small step's own launches (their count of arguments and host time).
Each launch is a ctypes call (as _HostReplay makes it) of a kernel whose arguments were set
once; 15 kernel objects take turns (as a step's launches do), with the device kept busy."""
import ctypes, sys, time
import numpy as np
import pyopencl as cl
from portanet import backends
from portanet.backends import opencl

bk = backends.device(sys.argv[1] if len(sys.argv) > 1 else "opencl:0:0")
q, ctx = bk.queue, bk.ctx
ints = lambda n: ", ".join(f"int s{i}" for i in range(n))
bufs = lambda n: ", ".join(f"__global float* b{i}" for i in range(n))
src = f"""
typedef struct {{ int v[16]; }} params16;
typedef struct {{ int v[32]; }} params32;
__kernel void k1({bufs(1)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = 1; }}
__kernel void k1i8({bufs(1)}, {ints(8)}) {{ if (get_global_id(0) == s7) b0[0] = s0; }}
__kernel void k1i16({bufs(1)}, {ints(16)}) {{ if (get_global_id(0) == s15) b0[0] = s0; }}
__kernel void k1i32({bufs(1)}, {ints(32)}) {{ if (get_global_id(0) == s31) b0[0] = s0; }}
__kernel void k1s16({bufs(1)}, const params16 p) {{ if (get_global_id(0) == p.v[15]) b0[0] = p.v[0]; }}
__kernel void k1s32({bufs(1)}, const params32 p) {{ if (get_global_id(0) == p.v[31]) b0[0] = p.v[0]; }}
__kernel void k4({bufs(4)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b3[0]; }}
__kernel void k8({bufs(8)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b7[0]; }}
__kernel void k16({bufs(16)}) {{ if (get_global_id(0) == 1 << 30) b0[0] = b15[0]; }}
__kernel void k6i15({bufs(6)}, {ints(15)}) {{ if (get_global_id(0) == s14) b0[0] = b5[0]; }}
__kernel void k6s16({bufs(6)}, const params16 p) {{ if (get_global_id(0) == p.v[15]) b0[0] = b5[0]; }}
__kernel void spin(__global float *x, int n) {{
    float a = x[0];
    for (int i = 0; i < n; i++) a = a * 1.0000001f + 1e-7f;
    if (a == 12345.f) x[0] = a;
}}"""
prg = cl.Program(ctx, src).build(options=["-cl-kernel-arg-info"])
pool = [cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 1 << 16) for _ in range(16)]
enqueue = opencl._enqueue_api()
size = (ctypes.c_size_t * 1)(64)


def objects(name, distinct):
    """15 kernel objects of `name`, arguments set; buffers all pool[0] or distinct."""
    ks = []
    for j in range(15):
        k = cl.Kernel(prg, name)
        args = []
        n = k.get_info(cl.kernel_info.NUM_ARGS)
        nb = 0
        for i in range(n):
            t = k.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME)
            if t.endswith("*"):
                args.append(pool[(nb + j) % 16] if distinct else pool[0]); nb += 1
            elif t.startswith("params"):
                args.append(np.arange(int(t[6:]), dtype=np.int32).tobytes())
            else:
                args.append(np.int32(i))
        k.set_args(*args)
        ks.append(k)
    return ks


spin = cl.Kernel(prg, "spin")


def busy(ms=30):
    spin.set_args(pool[1], np.int32(int(ms * 6000)))
    cl.enqueue_nd_range_kernel(q, spin, (1,), (1,)); q.flush()


def per_launch(ks, rounds=20):
    """median host us per enqueue, each of `rounds` rounds enqueuing the 15 objects in turn
    (behind a busy device, so that no enqueue waits on an idle GPU's start)."""
    out = []
    for _ in range(rounds):
        q.finish(); busy(5)
        t = time.perf_counter()
        for _ in range(4):
            for k in ks:
                enqueue(q.int_ptr, k.int_ptr, 1, None, size, size, 0, None, None)
        out.append((time.perf_counter() - t) / (4 * len(ks)))
    q.finish()
    return 1e6 * np.median(out), 1e6 * np.min(out)


per_launch(objects("k1", False), 3)      # warm up
print("kernel                 args  buffers      median us  min us")
for name, label in (("k1", "1 buffer"), ("k1i8", "1 buffer + 8 ints"),
                    ("k1i16", "1 buffer + 16 ints"), ("k1i32", "1 buffer + 32 ints"),
                    ("k1s16", "1 buffer + struct of 16 ints"),
                    ("k1s32", "1 buffer + struct of 32 ints"),
                    ("k4", "4 buffers"), ("k8", "8 buffers"), ("k16", "16 buffers"),
                    ("k6i15", "6 buffers + 15 ints"), ("k6s16", "6 buffers + struct of 16")):
    for distinct in (False, True):
        if distinct and name in ("k1i8", "k1i16", "k1i32", "k1s16", "k1s32"):
            continue
        med, low = per_launch(objects(name, distinct))
        print(f"{label:32s} {'distinct' if distinct else 'one     '}  {med:7.2f}  {low:7.2f}")

# ctypes' own cost: the same 9-argument call to a function that returns at once
libc = ctypes.CDLL(None)
t = time.perf_counter()
for _ in range(10000):
    libc.abs(1)
print(f"ctypes call of libc abs: {1e6 * (time.perf_counter() - t) / 10000:.2f} us")

# the mlp-small step's launches as replayed
from portanet import bench
rng = np.random.default_rng(0)
net, step = bench.training_step("mlp-small", bk, 1000, rng)
for _ in range(20):
    step()
bk.synchronize()
import gc
found = [o for o in gc.get_objects() if isinstance(o, opencl._HostReplay)]
print(f"{len(found)} recorded steps found")
for r in found:
    ops = r.ops
    times = np.zeros(len(ops))
    for _ in range(50):
        q.finish(); busy(3)
        for i, op in enumerate(ops):
            t = time.perf_counter()
            if isinstance(op, opencl._Launch):
                enqueue(q.int_ptr, op.handle, op.dims, None, op.global_size, op.local_size, 0,
                        None, None)
            else:
                op(q)
            times[i] += time.perf_counter() - t
    q.finish()
    total = 0
    for i, op in enumerate(ops):
        us = times[i] / 50 * 1e6
        total += us
        if isinstance(op, opencl._Launch):
            k = op.kernel
            n = k.get_info(cl.kernel_info.NUM_ARGS)
            try:
                nb = sum(k.get_arg_info(j, cl.kernel_arg_info.TYPE_NAME).endswith("*")
                         for j in range(n))
            except cl.Error:
                nb = -1
            print(f"  {i + 1:2d} {k.function_name:24s} {n:3d} args {nb:2d} buffers {us:6.2f} us")
        else:
            print(f"  {i + 1:2d} (not a launch)  {us:6.2f} us")
    print(f"  step's enqueues: {total:.1f} us")
    t0 = time.perf_counter()
    for _ in range(200):
        r()
    q.finish()
    print(f"  replayed back to back: {(time.perf_counter() - t0) / 200 * 1e6:.1f} us a step")
