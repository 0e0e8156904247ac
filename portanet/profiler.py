"""Where a training step's time goes: every kernel launch and vendor call of one step, its
device time, its host time, and the host time between calls (`portanet profile`).

Device times come from markers the backend puts in its queue around each call (CUDA events;
OpenCL marker events on a profiling queue): the time between the two is the call's device
time, launch latency included, without synchronising anything during the step. Host times
are the Python side: how long the call took to issue and the gap since the call before it,
which is the layer code, argument packing and the interpreter.
"""
import time
from dataclasses import dataclass

from .errors import DeviceError


@dataclass
class Call:
    label: str
    host_start: float
    host_end: float
    start: object               # backend markers
    end: object


class Trace:
    """The calls of a backend while it records (KernelBackend.trace)."""

    def __init__(self):
        self.calls = []

    def record(self, backend, label, call):
        start = backend._marker()
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        self.calls.append(Call(label, t0, t1, start, backend._marker()))


def profile(backend, step, warmup=2, warmup_seconds=0.0):
    """A report (dict) of one call of step() on backend: at least `warmup` calls and
    `warmup_seconds` of them first (builds, first allocations, GEMM routing, and a GPU's
    clocks, which idle low and take a moment to rise), then one recorded call."""
    if not hasattr(backend, "_marker"):
        raise DeviceError(f"{backend.name}: profiles need a device backend (opencl or cuda); "
                          f"the NumPy reference has no device queue to time")
    start, done = time.perf_counter(), 0
    while done < warmup or time.perf_counter() - start < warmup_seconds:
        step()
        backend.synchronize()
        done += 1
    with backend.profiling():
        step()                                  # once on the profiling queue, unrecorded
        backend.synchronize()
        backend.trace = trace = Trace()
        try:
            start = time.perf_counter()
            step()
            backend.synchronize()
            wall = time.perf_counter() - start
        finally:
            backend.trace = None
    rows, previous = [], start
    for c in trace.calls:
        rows.append({"call": c.label, "device_us": 1e6 * backend._elapsed(c.start, c.end),
                     "host_us": 1e6 * (c.host_end - c.host_start),
                     "gap_us": 1e6 * (c.host_start - previous)})
        previous = c.host_end
    return {"device": backend.name, "device_name": backend.info()["name"],
            "gemm_path": backend.gemm_path, "wall_us": 1e6 * wall, "calls": rows,
            "device_busy_us": sum(r["device_us"] for r in rows),
            "host_us": sum(r["host_us"] + r["gap_us"] for r in rows)}


def table(report, top=12):
    """The report as text: every call in order, then the costliest kinds of call."""
    lines = [f"{'#':>3s}  {'call':44s} {'device us':>10s} {'host us':>9s} {'gap us':>8s}"]
    for i, r in enumerate(report["calls"], 1):
        lines.append(f"{i:3d}  {r['call'][:44]:44s} {r['device_us']:10.1f} {r['host_us']:9.1f} "
                     f"{r['gap_us']:8.1f}")
    kinds = {}
    for r in report["calls"]:
        name = r["call"].split(" ")[0] if not r["call"].startswith("gemm") else r["call"]
        k = kinds.setdefault(name, [0, 0.0])
        k[0] += 1
        k[1] += r["device_us"]
    lines.append("")
    lines.append(f"costliest on the device ({len(report['calls'])} calls):")
    for name, (count, us) in sorted(kinds.items(), key=lambda kv: -kv[1][1])[:top]:
        share = 100 * us / max(report["device_busy_us"], 1e-9)
        lines.append(f"  {us:10.1f} us {share:5.1f}%  {count:3d} x {name}")
    lines.append(f"step: {report['wall_us']:.1f} us wall; device busy {report['device_busy_us']:.1f} us"
                 f" ({100 * report['device_busy_us'] / report['wall_us']:.0f}%); host in calls "
                 f"and between them {report['host_us']:.1f} us")
    return "\n".join(lines)
