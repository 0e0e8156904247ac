"""OpenCL programs compiled ahead in worker processes, so that the driver's cache (or
pyopencl's) holds them when the runtime builds them itself. A driver may compile one
program at a time per process: NVIDIA's OpenCL built LeNet's 41 first-step programs in 12 s
from 16 threads of one process, 0.3 s each, where one process builds one in 0.8 s. Each
worker is a Python of its own that imports pyopencl alone, makes a context on the device
and builds its share; what it compiles lands in the cache every process of the user reads
(NVIDIA's ComputeCache, PoCL's kcache, pyopencl's folder), keyed by the source, the options
and the device, so the runtime's own build is then a cache read. A worker that fails costs
nothing but the time: the runtime's build compiles and reports as before."""
import json
import logging
import os
import subprocess
import sys
import time

log = logging.getLogger("portanet")

MAX_WORKERS = 16        # processes at once: each holds a context (tens of MiB on a GPU)
WORKER_S = 300          # a worker still compiling after this long is left to the runtime

_WORKER = r"""
import json, sys, warnings
import pyopencl as cl
task = json.load(sys.stdin)
platform = cl.get_platforms()[task["platform"]]
ctx = cl.Context([platform.get_devices()[task["device"]]])
warnings.simplefilter("ignore")
for text, options in task["builds"]:
    try:
        cl.Program(ctx, text).build(options=options, cache_dir=task["cache"])
    except Exception:
        pass                # the runtime's own build says why
"""


def compile_ahead(platform, device, builds, cache, workers=None):
    """Compile `builds` ((source text, [options]) each) for the pyopencl `device` of
    `platform` in up to `workers` worker processes (default: one per core, at most
    MAX_WORKERS), pyopencl's binaries kept in `cache`; returns once every worker is done.
    Seconds taken."""
    import pyopencl as cl
    start = time.perf_counter()
    platforms = cl.get_platforms()
    where = {"platform": next(i for i, p in enumerate(platforms) if p.int_ptr == platform.int_ptr),
             "cache": str(cache)}
    where["device"] = next(i for i, d in enumerate(platforms[where["platform"]].get_devices())
                           if d.int_ptr == device.int_ptr)
    count = min(workers or MAX_WORKERS, os.cpu_count() or 1, len(builds))
    shares = [builds[i::count] for i in range(count)]
    jobs = []
    for share in shares:
        job = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               text=True)
        job.stdin.write(json.dumps(dict(where, builds=share)))
        job.stdin.close()
        jobs.append(job)
    for job in jobs:
        try:
            job.wait(timeout=WORKER_S)
        except subprocess.TimeoutExpired:
            job.kill()
    seconds = time.perf_counter() - start
    log.debug("%d programs compiled ahead in %d processes in %.2f s", len(builds), count,
              seconds)
    return seconds
