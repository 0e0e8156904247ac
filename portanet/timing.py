"""Timing on a device: seconds per call of a function, as `portanet bench` and `portanet
tune` measure them. Warm-up calls excluded (program builds, first allocations); device
completion awaited (CUDA: events on the backend's stream; elsewhere synchronize and the
host clock); repeated samples, median with min and max."""
import math
import statistics
import time

# training steps (ours and PyTorch's) are timed in samples of at least this long (measure)
STEP_SAMPLE_S = 0.005
MAX_INNER = 200


def measure(fn, sync, repeats=10, inner=1, warmup=2, budget_s=20.0, events=None,
            sample_s=None):
    """Seconds per call of fn: up to `repeats` samples of `inner` calls. A call slower than
    budget_s / 20 gets one warm-up and samples of one call, and samples stop at 3 once the
    rest would blow budget_s. events: a CUDA event timer (see cuda_events). sample_s: at
    least that long a sample, in more calls (at most MAX_INNER) where `inner` are shorter,
    so that a short call, as a training loop runs it back to back, does not carry the
    host's wait for the device at each sample's end."""
    sync()
    start = time.perf_counter()
    fn()                                    # the first warm-up: builds, first allocations
    sync()
    if time.perf_counter() - start > budget_s / 20:
        warmup, inner = 1, 1
    for _ in range(warmup - 1):
        fn()
    sync()
    if sample_s and inner > 1:
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        once = (time.perf_counter() - start) / inner
        inner = max(inner, min(MAX_INNER, math.ceil(sample_s / max(once, 1e-9))))
    samples = []
    while len(samples) < repeats:
        if events:
            seconds = events(fn, inner)
        else:
            sync()
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            sync()
            seconds = time.perf_counter() - start
        samples.append(seconds / inner)
        if len(samples) >= 3 and sum(samples) * inner * repeats / len(samples) > budget_s:
            break
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "max_s": max(samples), "repeats": len(samples), "inner": inner}


def cuda_events(backend):
    """measure's timer of `events` on a CUDA backend's stream; None on other backends,
    which measure times by the host clock after synchronize."""
    if backend.kind != "cuda":
        return None
    import pycuda.driver as drv
    start, end = drv.Event(), drv.Event()

    def timed(fn, inner):
        start.record(backend.stream)
        for _ in range(inner):
            fn()
        end.record(backend.stream)
        end.synchronize()
        return end.time_since(start) / 1000.0
    return timed


def in_step(group, alone):
    """measure's arguments for a distributed step: every rank the same calls (each is a
    collective that waits for the others' matching one), as many a sample as the slowest
    rank's timing alone took, and no early end."""
    return {"repeats": 10, "inner": max(group.channel.allgather(alone["inner"])),
            "budget_s": math.inf}
