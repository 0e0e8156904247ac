"""`portanet bench`: the same workloads on every device, timed the same way (timing.py),
beside PyTorch where it is importable (peer.py). Slow devices get fewer samples (at least
3). The JSON it writes is documented in docs/benchmarks.md.
"""
import json
import math
import platform
import sys
import time

import numpy as np

from . import __version__, backends, files, models, training
from . import peer as torch_peer
from . import precision as precision_module
from .errors import PortanetError
from .layers import Dense, MultiHeadAttention
from .models import GPT_STEP, MLPS
from .network import Sequential
from .optim import SGD, AdamW
from .timing import STEP_SAMPLE_S, cuda_events, in_step, measure

SCHEMA = "portanet-bench-2"          # 2: rows have a precision; peak_gflops by precision


# -- workloads ---------------------------------------------------------------------------

def _is_slow(bk):
    """Devices that are not GPUs run the big workloads at a smaller size (see `case`)."""
    return not bk.is_gpu


def _targets(loss, n_out, m, rng):
    if loss == "softmax_cross_entropy":
        return rng.integers(0, n_out, m)
    return (rng.random((m, n_out)) > 0.5).astype(np.float32)


def wl_gemm(bk, rng):
    sizes = [512, 1024, 2048] if _is_slow(bk) else [1024, 2048, 4096]
    for n in sizes:
        def run(n=n):
            a, b = (bk.upload(rng.standard_normal((n, n), dtype=np.float32).astype(bk.dtype))
                    for _ in range(2))
            c = bk.empty((n, n))
            try:
                t = measure(lambda: bk.gemm(1.0, a, b, 0.0, c), bk.synchronize,
                            repeats=10, inner=3, events=cuda_events(bk))
            finally:
                for x in (a, b, c):
                    bk.free(x)
            t["gflops"] = 2 * n ** 3 / t["median_s"] / 1e9
            t["throughput"], t["throughput_unit"] = t["gflops"], "GFLOP/s"
            return t
        yield f"{n}^3", run


def training_step(workload, bk, batch, rng, eager=False):
    """(net, step) for one training step of an mlp or lenet workload on bk, its batch
    already on the device: step() is what the bench times (as fit runs it: replayed from a
    recorded graph where the device records them) and, with eager=True, what
    `portanet profile` traces launch by launch."""
    if workload in MLPS:
        sizes, acts, loss, _ = MLPS[workload]
        net = Sequential([Dense(n, a) for n, a in zip(sizes[1:], acts)], sizes[0], loss,
                         device=bk)
        x = rng.standard_normal((batch, sizes[0]), dtype=np.float32)
        y, opt = _targets(loss, sizes[-1], batch, rng), SGD(0.01, 0.9)
    elif workload in ("lenet-step", "resnet-step"):
        net = (models.lenet if workload == "lenet-step" else models.resnet)(device=bk)
        x = rng.random((batch, 1, 28, 28), dtype=np.float32)
        y, opt = rng.integers(0, 10, batch), SGD(0.02, 0.9)
    elif workload == "gpt-step":
        g = GPT_STEP
        net = models.gpt(g["vocab"], g["context"], g["layers"], g["heads"], g["dim"],
                         g["dropout"], device=bk)
        x, y = (rng.integers(0, g["vocab"], (batch, g["context"])) for _ in range(2))
        opt = AdamW(1e-3, betas=(0.9, 0.99), weight_decay=0.1)      # nanoGPT's
    else:
        raise PortanetError(f"{workload!r} has no training step: use one of "
                            f"{', '.join(sorted(STEPS))}")
    net.train_batch(x, y, opt)            # sizes the buffers; the batch stays on the device
    return net, (lambda: training.step(net, opt)) if eager else \
        (lambda: training.train_step(net, opt))


def _step_timing(bk, step, flops=None, repeats=10, inner=3):
    t = measure(step, bk.synchronize, repeats=repeats, inner=inner, sample_s=STEP_SAMPLE_S,
                events=cuda_events(bk))
    if flops:
        t["gflops"] = flops / t["median_s"] / 1e9
    return t


def step_batches(workload, bk):
    """The batch sizes a training-step workload times on bk."""
    if workload == "lenet-step":
        return 64, 256
    if workload == "resnet-step":
        return (16,) if _is_slow(bk) else (128, 512)
    if workload == "gpt-step":
        return (2,) if _is_slow(bk) else (GPT_STEP["batch"],)
    batch = MLPS[workload][3]
    return (batch // 10 if _is_slow(bk) and workload == "mlp-big" else batch,)


def _products_flops(net, m):
    """The matrix products of a training step of net on m samples: each Dense's and
    Conv2D's forward and weight gradient, and its input gradient where a trained layer
    comes before it (the layers inside Residual blocks included); an attention's
    projections so, and its two products a head (q k^T, then by v) forward and four
    backward, half of them where it is causal (the scores the backward makes again are
    not counted: the model's FLOPs, not the kernels')."""
    flops, first = 0, True
    for _, layer in net.walk():
        if isinstance(layer, Dense):            # (Conv2D is one; a sequence's tokens)
            positions = math.prod(layer.out_shape[1:])
            product = 2 * layer.units * layer.n_in * positions * m
            flops += product * (2 if first else 3)
        if isinstance(layer, MultiHeadAttention):
            d, t = layer.dim, layer.tokens
            flops += 2 * 4 * d * d * t * m * (2 if first else 3)
            flops += 12 * t * t * d * m // (2 if layer.causal else 1)
        if not layer.sublayers():               # (a block's layers count, not the block)
            first = first and not layer.trainable
    return flops


def _unit(workload):
    """What a training-step workload's throughput counts, a second."""
    return "samples/s" if workload in MLPS else "tokens/s" if workload == "gpt-step" \
        else "images/s"


def _per_sample(workload):
    """What a sample of the workload counts in its throughput: a GPT's tokens, else 1."""
    return GPT_STEP["context"] if workload == "gpt-step" else 1


def wl_step(name):
    """A training step (STEPS) at each of its batches: samples a second, and GFLOP/s of
    its products."""
    unit, per = _unit(name), _per_sample(name)

    def workload(bk, rng):
        for m in step_batches(name, bk):
            def run(m=m):
                net, step = training_step(name, bk, m, rng)
                try:
                    t = _step_timing(bk, step, _products_flops(net, m))
                finally:
                    net.free()
                t["throughput"], t["throughput_unit"] = per * m / t["median_s"], unit
                return t
            yield f"batch {m}", run
    return workload


def wl_lenet_infer(bk, rng):
    """predict on m images in the batches the memory plan chooses by default, and (GPUs)
    in one batch of m, whose patch matrices stay within the conv workspace's cap."""
    m = 1000 if _is_slow(bk) else 10000
    for batch in (None,) if _is_slow(bk) else (None, m):
        def run(batch=batch):
            net = models.lenet(device=bk)
            try:
                x = rng.random((m, 1, 28, 28), dtype=np.float32)
                net.predict(x, batch_size=batch)       # warm-up: buffers, kernels, routes
                t = measure(lambda: net.predict(x, batch_size=batch), bk.synchronize,
                            repeats=5)
            finally:
                net.free()
            t["throughput"], t["throughput_unit"] = m / t["median_s"], "images/s"
            return t
        yield f"{m} images, " + (f"batch {batch}" if batch else "default batches"), run


WORKLOADS = {
    "gemm": (wl_gemm, "SGEMM n x n x n, several n (vendor or own GEMM as configured)"),
    "mlp-big": (wl_step("mlp-big"), "training step, batch 10000 (1000 on CPUs), "
                                   "10000-5000 tanh-1000 sigmoid-10 sigmoid, BCE"),
    "mlp-small": (wl_step("mlp-small"), "training step, batch 1000, 1000-500 relu-100 relu-10 "
                                       "softmax-CE"),
    "lenet-step": (wl_step("lenet-step"), "LeNet training step, batch 64 and 256"),
    "resnet-step": (wl_step("resnet-step"), "ResNet training step (models.resnet: BatchNorm, "
                                            "residual blocks), batch 128 and 512 (16 on CPUs)"),
    "lenet-infer": (wl_lenet_infer, "LeNet inference throughput, images/s (upload and "
                                    "download included)"),
    "gpt-step": (wl_step("gpt-step"), "GPT training step (nanoGPT's baby GPT: 6 layers, 6 "
                                      "heads, 384 wide, context 256, AdamW), batch 64 (2 on "
                                      "CPUs), tokens/s"),
}
GEMM_BOUND = {"gemm", "mlp-big", "mlp-small", "lenet-step", "resnet-step"}
STEPS = {"mlp-big", "mlp-small", "lenet-step", "resnet-step", "gpt-step"}   # training steps


# -- the run -----------------------------------------------------------------------------

def environment():
    env = {"python": sys.version.split()[0], "platform": platform.platform(),
           "numpy": np.__version__, "portanet": __version__}
    for name in ("pyopencl", "pycuda", "pyclblast", "nvmath", "torch"):
        try:
            module = __import__(name)
            env[name] = getattr(module, "__version__", getattr(module, "VERSION_TEXT", "?"))
        except Exception:
            env[name] = None
    return env


def run(devices=None, workloads=None, peer=True, progress=print, precisions=()):
    """Every workload on every device in every precision (default: PORTANET_PRECISION, else
    fp32); a failure is recorded with its error, never dropped."""
    workloads = list(workloads or WORKLOADS)
    for w in workloads:
        if w not in WORKLOADS:
            raise PortanetError(f"unknown workload {w!r}: see `portanet bench --list`")
    precisions = list(dict.fromkeys(precision_module.resolve(p, np.float32)   # once each
                                    for p in (precisions or
                                              [precision_module.default(None, np.float32)])))
    if not devices:
        devices = [spec for spec, _ in backends.list_devices()[0]]
    report = {"schema": SCHEMA, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "environment": environment(), "devices": {}, "results": []}
    for spec in devices:
        for precision in precisions:
            try:
                bk = backends.device(spec, precision=precision)
            except Exception as e:
                error = _error(e)
                report["results"] += [_row(w, "-", spec, error=error, precision=precision)
                                      for w in workloads]
                progress(f"{spec} {precision}: failed: {e}")
                continue
            if spec not in report["devices"]:                 # its first backend
                info = {k: v for k, v in bk.info().items() if k != "gemm_params"}
                report["devices"][spec] = {**info, "gemm_path": bk.gemm_path,
                                           "precisions": list(bk.precisions), "status": "ok"}
            report["results"] += _device_rows(bk, spec, workloads, peer, progress)
        if spec not in report["devices"]:
            report["devices"][spec] = {"status": "failed", "error": next(
                r["error"] for r in report["results"] if r["device"] == spec)}
        _shares_of_peak(report, spec)
    return report


def _shares_of_peak(report, spec):
    """Each GEMM-bound row's rate as a share of the fastest GEMM measured on its device in
    its precision in this run; the device's peak_gflops by precision."""
    peaks = {}
    for r in report["results"]:
        if r["device"] == spec and r["workload"] == "gemm" and r.get("gflops"):
            peaks[r["precision"]] = max(peaks.get(r["precision"], 0), r["gflops"])
    if report["devices"][spec]["status"] == "ok":
        report["devices"][spec]["peak_gflops"] = peaks or None
    for r in report["results"]:
        peak = peaks.get(r["precision"])
        if r["device"] == spec and r["workload"] in GEMM_BOUND and r.get("gflops") and peak:
            r["fraction_of_peak"] = r["gflops"] / peak


def _device_rows(bk, spec, workloads, peer, progress):
    """The rows of every workload on one backend (a device in one precision), each beside
    PyTorch computing alike where it can."""
    rows = []
    rng = np.random.default_rng(0)
    torch_device, torch_reason = torch_peer.device_of(bk) if peer else (None, "not asked for")
    for w in workloads:
        try:
            cases = list(WORKLOADS[w][0](bk, rng))
        except Exception as e:
            rows.append(_row(w, "-", spec, error=_error(e), precision=bk.precision))
            continue
        for case, fn in cases:
            bk.synchronize()
            baseline = bk.allocated_bytes
            bk.peak_bytes = baseline
            try:
                timing = fn()
                row = _row(w, case, spec, timing=timing, gemm_path=bk.gemm_path,
                           peak_bytes=bk.peak_bytes - baseline, precision=bk.precision)
            except Exception as e:
                row = _row(w, case, spec, error=_error(e), precision=bk.precision)
            if torch_device and row["status"] == "ok":
                for key, graph in (("torch", False), ("torch_graph", True)):
                    if graph and (w not in STEPS or not torch_device.startswith("cuda")):
                        row[key] = {"status": "unavailable", "reason": "CUDA training "
                                    "steps only"}
                        continue
                    try:
                        t = torch_peer.torch_case(w, case, torch_device, graph, bk.precision)
                        row[key] = {"status": "ok", "device": torch_device, **t}
                        row[f"ratio_to_{key}"] = row["median_s"] / t["median_s"]
                    except Exception as e:
                        row[key] = {"status": "failed", "error": _error(e)}
            elif not torch_device:
                row["torch"] = row["torch_graph"] = {"status": "unavailable",
                                                     "reason": torch_reason}
            rows.append(row)
            progress(_line(row))
    return rows


def run_distributed(workloads=None, progress=print, peer=True):
    """The training-step workloads on every rank of a distributed job (torchrun, srun or
    mpiexec; see distributed.py), each rank on its device with its own batch of the
    workload's size (weak scaling: the global batch is ranks x batch): each case's step
    alone (the ranks not averaging: one device's time) and as a distributed step, whose
    throughput is the global batch's samples a second and whose scaling efficiency is
    alone / distributed; with peer, PyTorch DDP's alike in "torch" (torch_ddp_case).
    Every rank returns the report; rank 0's has every rank's rows."""
    from . import distributed
    group = distributed.init()
    workloads = [w for w in (workloads or STEPS) if w in STEPS]
    if not workloads:
        raise PortanetError(f"--distributed times training steps: give a workload among "
                            f"{', '.join(sorted(STEPS))}")
    bk = backends.device(precision=precision_module.default(None, np.float32))
    report = {"schema": SCHEMA, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "environment": environment(), "distributed": group.describe(),
              "devices": {bk.name: {k: v for k, v in bk.info().items() if k != "gemm_params"}},
              "results": []}
    rng = np.random.default_rng(group.rank)
    rows = []
    # rank 0's cases on every rank (a slow device times fewer alone): each is collective
    cases = group.channel.bcast([(w, m) for w in sorted(workloads) for m in step_batches(w, bk)])
    for w, m in cases:
        net, step = training_step(w, bk, m, rng)
        try:
            with distributed.paused():
                alone = _step_timing(bk, step)
            net.optimizer_state.share = 1.0 / group.size     # equal batches
            before = group.averages
            step()                                            # the averaging's first
            bk.synchronize()
            averages = group.averages - before
            together = measure(step, bk.synchronize, **in_step(group, alone),
                               events=cuda_events(bk))
        finally:
            net.free()
        row = _row(w, f"batch {m} per rank", bk.name, timing=together)
        row.update(rank=group.rank, alone=alone, averages_per_step=averages,
                   throughput=group.size * m * _per_sample(w) / together["median_s"],
                   throughput_unit=f"{_unit(w)} (all ranks)",
                   scaling_efficiency=alone["median_s"] / together["median_s"])
        row["torch"] = _ddp_row(w, m, bk, group) if peer else \
            {"status": "unavailable", "reason": "--no-torch"}
        rows.append(row)
        if group.rank == 0:             # as it goes; every rank's at the end
            progress(_distributed_line(row))
    everyone = group.gather(rows)
    if group.rank == 0:
        report["results"] = [r for ranks in everyone for r in ranks]
        progress("every rank:")
        for r in report["results"]:
            progress(_distributed_line(r))
    return report


def _distributed_line(r):
    ddp = r["torch"]
    peer = (f"  | DDP alone {ddp['alone']['median_s'] * 1e3:8.3f} ms  distributed "
            f"{ddp['median_s'] * 1e3:8.3f} ms  {ddp['throughput']:12.1f} "
            f"{_unit(r['workload'])}  "
            f"efficiency {ddp['scaling_efficiency']:.2f}"
            if ddp.get("status") == "ok" else
            f"  | DDP {ddp.get('status')}: {ddp.get('reason') or ddp.get('error')}")
    return (f"rank {r['rank']} {r['device']:12s} {r['workload']:10s} {r['case']:20s} "
            f"alone {r['alone']['median_s'] * 1e3:9.3f} ms  distributed "
            f"{r['median_s'] * 1e3:9.3f} ms  {r['throughput']:12.1f} {_unit(r['workload'])}  "
            f"efficiency {r['scaling_efficiency']:.2f}" + peer)


def _ddp_row(workload, m, bk, group):
    """PyTorch DDP's figures of the same case (torch_ddp_case), where torch and CUDA are
    here and every rank is a CUDA device: its step alone and distributed, throughput and
    efficiency as ours; else why not."""
    torch_device, reason = torch_peer.device_of(bk)
    if not all(d.startswith("cuda") for d in group.devices):
        torch_device, reason = None, "DDP is timed on jobs of CUDA ranks"
    elif torch_device is None or not torch_device.startswith("cuda"):
        torch_device, reason = None, reason or "DDP is timed on CUDA"
    # every rank times DDP or none does: its steps are collectives
    if not all(group.channel.allgather(torch_device is not None)):
        return {"status": "unavailable", "reason": reason or "a rank cannot time DDP"}
    try:
        t, error = torch_peer.torch_ddp_case(workload, m, torch_device, group), None
    except Exception as e:
        t, error = None, _error(e)
    if not all(group.channel.allgather(error is None)):
        return {"status": "failed", "error": error or "DDP failed on another rank"}
    return {"status": "ok", "device": torch_device, **t["distributed"], "alone": t["alone"],
            "throughput": group.size * m * _per_sample(workload) / t["distributed"]["median_s"],
            "scaling_efficiency": t["alone"]["median_s"] / t["distributed"]["median_s"]}


def _error(e):
    return f"{type(e).__name__}: {e}".strip()[:2000]


def _row(workload, case, device, timing=None, error=None, gemm_path=None, peak_bytes=None,
         precision="fp32"):
    row = {"workload": workload, "case": case, "device": device, "precision": precision,
           "status": "failed" if error else "ok", "error": error, "median_s": None,
           "min_s": None, "max_s": None, "repeats": 0, "inner": 0, "throughput": None,
           "throughput_unit": None, "gflops": None, "fraction_of_peak": None,
           "peak_bytes": peak_bytes, "gemm_path": gemm_path, "torch": None,
           "ratio_to_torch": None, "torch_graph": None, "ratio_to_torch_graph": None}
    if timing:
        row.update(timing)
    return row


def _line(r):
    if r["status"] != "ok":
        return (f"{r['device']:12s} {r['precision']:4s} {r['workload']:12s} {r['case']:22s} "
                f"FAILED {r['error'].splitlines()[0]}")
    return (f"{r['device']:12s} {r['precision']:4s} {r['workload']:12s} {r['case']:22s} "
            f"{r['median_s'] * 1e3:10.3f} ms  {r['throughput']:12.1f} {r['throughput_unit']}")


def table(report):
    """The report as a text table."""
    head = (f"{'device':12s} {'prec':4s} {'workload':12s} {'case':22s} {'gemm':9s} "
            f"{'median ms':>10s} {'min':>9s} {'max':>9s} {'throughput':>18s} {'%best':>6s} "
            f"{'peak MiB':>9s} {'torch MiB':>9s} {'torch ms':>9s} {'ratio':>6s} {'graph ms':>9s} "
            f"{'ratio':>6s}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        if r["status"] != "ok":
            lines.append(f"{r['device']:12s} {r['precision']:4s} {r['workload']:12s} "
                         f"{r['case']:22s} FAILED: "
                         f"{(r['error'] or '').splitlines()[0]}")
            continue
        torch_peak = (r.get("torch") or {}).get("peak_bytes")
        peers = f" {torch_peak / 2**20:9.1f}" if torch_peak is not None else f" {'n/a':>9s}"
        for key in ("torch", "torch_graph"):
            peer = r.get(key) or {}
            peers += f" {peer['median_s'] * 1e3:9.3f}" if peer.get("status") == "ok" else \
                f" {'n/a':>9s}"
            ratio = r.get(f"ratio_to_{key}")
            peers += f" {ratio:6.2f}" if ratio else f" {'-':>6s}"
        frac = f"{100 * r['fraction_of_peak']:5.0f}%" if r.get("fraction_of_peak") else f"{'-':>6s}"
        thr = f"{r['throughput']:.4g} {r['throughput_unit']}"
        lines.append(f"{r['device']:12s} {r['precision']:4s} {r['workload']:12s} "
                     f"{r['case']:22s} {r['gemm_path'] or '-':9s} {r['median_s'] * 1e3:10.3f} "
                     f"{r['min_s'] * 1e3:9.3f} {r['max_s'] * 1e3:9.3f} {thr:>18s} {frac} "
                     f"{(r['peak_bytes'] or 0) / 2**20:9.1f}{peers}")
    notes = {r["device"]: r["torch"].get("reason") for r in report["results"]
             if (r.get("torch") or {}).get("status") == "unavailable"}
    for device, reason in notes.items():
        lines.append(f"torch column for {device}: {reason}")
    lines.append("%best: GFLOP/s as a share of the fastest GEMM measured on the same device in "
                 "this run, in the row's precision (not the hardware's peak); peak MiB: "
                 "device memory at the case's peak; torch MiB: PyTorch's eager peak "
                 "(max_memory_allocated, CUDA only)")
    return "\n".join(lines)


def plot(report, path):
    """A bar chart of median time per workload case, one bar per device (log scale),
    written to `path` by files.write_atomically's rule (the suffix picks the format)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PortanetError("--plot needs matplotlib: pip install 'portanet[plot]'") from e
    files.check_destination(path, "the bench plot")            # before any drawing
    ok = [r for r in report["results"] if r["status"] == "ok"]
    ok = [{**r, "device": _series(r)} for r in ok]      # a series per device and precision
    cases = list(dict.fromkeys(f"{r['workload']}\n{r['case']}" for r in ok))
    series = list(dict.fromkeys(r["device"] for r in ok))
    if any(r.get("torch", {}) and r["torch"].get("status") == "ok" for r in ok):
        series += [f"torch ({d})" for d in dict.fromkeys(
            r["device"] for r in ok if (r.get("torch") or {}).get("status") == "ok")]
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(cases)), 5))
    width = 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        values = []
        for case in cases:
            w, c = case.split("\n")
            if s.startswith("torch ("):
                d = s[7:-1]
                r = next((r for r in ok if r["device"] == d and r["workload"] == w
                          and r["case"] == c and (r.get("torch") or {}).get("status") == "ok"), None)
                values.append(r["torch"]["median_s"] * 1e3 if r else np.nan)
            else:
                r = next((r for r in ok if r["device"] == s and r["workload"] == w
                          and r["case"] == c), None)
                values.append(r["median_s"] * 1e3 if r else np.nan)
        ax.bar(np.arange(len(cases)) + i * width, values, width, label=s)
    ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2, cases, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (ms)")
    ax.set_title(f"portanet bench, {report['date']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        files.write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120), "the bench plot")
    finally:
        plt.close(fig)


def _series(row):
    """A plot's name for a row's device and precision (fp32 unnamed)."""
    precision = row.get("precision", "fp32")
    return row["device"] + ("" if precision == "fp32" else f" {precision}")


def write_json(report, path):
    """The report as JSON at `path`, by files.write_atomically's rule."""
    files.write_text(path, json.dumps(report, indent=1, default=float) + "\n",
                     "the bench report")

