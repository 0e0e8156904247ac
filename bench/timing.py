"""Timing done right for device work: warm-up excluded, completion awaited, several
repeats, median with min and max."""
import statistics
import time


def measure(fn, sync, repeats=10, inner=1, warmup=2):
    """Seconds per call of fn: `repeats` samples of `inner` calls each, device work
    awaited by sync() around each sample. Returns {median, min, max, samples}."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / inner)
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": samples}
