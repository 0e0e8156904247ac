"""A replayed step's host time, its launches enqueued the way before this session (typed
ctypes: nine arguments converted at each call) and now (each argument its C type made once),
alternating in one process: the time issuing one step behind a busy device, the wall time a
step back to back, and a pure-Python probe of the host's speed in each round.

    python3 enqueue_ab.py DEVICE WORKLOAD:BATCH [WORKLOAD:BATCH ...]
"""
import ctypes
import sys
import time

import numpy as np

from portanet import backends, bench
from portanet.backends import opencl


def host_probe():
    t = time.perf_counter()
    s = 0
    for i in range(100000):
        s += i
    return time.perf_counter() - t


typed = opencl._enqueue_api()


def typed_replay(replay):
    """The replay as it was: ints and arrays through the typed function."""
    ops = [(op.kernel.int_ptr, op.args[1].value, op.args[3], op.args[4])
           if isinstance(op, opencl._Launch) else op for op in replay.ops]

    def run():
        bk = replay.backend
        with bk._lock:
            handle = bk.queue.int_ptr
            for op in ops:
                if isinstance(op, tuple):
                    if typed(handle, op[0], op[1], None, op[2], op[3], 0, None, None):
                        raise RuntimeError("enqueue failed")
                else:
                    op(bk.queue)
    return run


bk = backends.device(sys.argv[1])
for item in sys.argv[2:]:
    workload, batch = item.split(":")
    net, step = bench.training_step(workload, bk, int(batch), np.random.default_rng(0))
    for _ in range(30):
        step()
    bk.synchronize()
    replay = next(g for g in net._graphs.values() if g)
    ways = {"before": typed_replay(replay), "after": replay}
    result = {name: ([], [], []) for name in ways}
    for _ in range(10):
        for name, run in ways.items():
            walls, issues, probes = result[name]
            t = time.perf_counter()
            for _ in range(50):
                run()
            bk.synchronize()
            walls.append((time.perf_counter() - t) / 50)
            run()
            run()
            t = time.perf_counter()
            run()
            issues.append(time.perf_counter() - t)
            bk.synchronize()
            probes.append(host_probe())
    for name, (walls, issues, probes) in result.items():
        print(f"{bk.name} {workload} {batch} {name:6s} ({len(replay.ops)} ops): replay "
              f"{1e6 * np.median(walls):6.1f} us a step (min {1e6 * min(walls):6.1f}); issuing "
              f"one {1e6 * np.median(issues):6.1f} us (min {1e6 * min(issues):6.1f}); host probe "
              f"{1e3 * np.median(probes):5.2f} ms", flush=True)
    net.free()
