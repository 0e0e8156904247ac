"""Where a process's speed on NVIDIA's OpenCL comes from (issue 11's spread between
processes). One process times each workload's replayed step: the wall time a step over 20
rounds of 50 back to back, the host time issuing one step behind a busy device, a
pure-Python probe of the host's speed between rounds, and the CPU it ran on. The wall-clock
start and end of the timing let nvidia-smi's log of the GPU's clocks be lined up with it.

    python3 spread_probe.py DEVICE WORKLOAD:BATCH [WORKLOAD:BATCH ...]
"""
import os
import sys
import time

import numpy as np

from portanet import backends, bench


def host_probe():
    """Seconds of a fixed pure-Python loop: the host's speed for the interpreter's work."""
    t = time.perf_counter()
    s = 0
    for i in range(100000):
        s += i
    return time.perf_counter() - t


def cpu():
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


spec = sys.argv[1]
bk = backends.device(spec)
cache = os.environ.get("XDG_CACHE_HOME", "default")
for item in sys.argv[2:]:
    workload, batch = item.split(":")
    net, step = bench.training_step(workload, bk, int(batch), np.random.default_rng(0))
    for _ in range(30):
        step()
    bk.synchronize()
    walls, issues, probes = [], [], []
    start = time.time()
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(50):
            step()
        bk.synchronize()
        walls.append((time.perf_counter() - t) / 50)
        step()
        step()                  # the device busy, then the issue time of one step
        t = time.perf_counter()
        step()
        issues.append(time.perf_counter() - t)
        bk.synchronize()
        probes.append(host_probe())
    end = time.time()
    print(f"pid {os.getpid()} cpu {cpu():2d} cache {cache:12s} {spec} {workload} {batch}: "
          f"step {1e6 * np.median(walls):6.1f} us (min {1e6 * min(walls):6.1f}, max "
          f"{1e6 * max(walls):6.1f}); issuing one {1e6 * np.median(issues):6.1f} us; "
          f"host probe {1e3 * np.median(probes):5.2f} ms; timed {start:.1f}-{end:.1f}",
          flush=True)
    net.free()
