"""`portanet bench`: the same workloads on every device, timed the same way, beside
PyTorch where it is importable. The JSON it writes is documented in docs/benchmarks.md.

Timing: warm-up calls excluded (program builds, first allocations); device completion
awaited (CUDA: events on the backend's stream; elsewhere synchronize and the host clock);
repeated samples, median with min and max. Slow devices get fewer samples (at least 3).
"""
import json
import math
import platform
import statistics
import sys
import time

import numpy as np

from . import __version__, backends, files, models, training
from . import precision as precision_module
from .errors import PortanetError
from .layers import Dense
from .network import Sequential
from .optim import SGD

SCHEMA = "portanet-bench-2"          # 2: rows have a precision; peak_gflops by precision
# training steps (ours and PyTorch's) are timed in samples of at least this long (measure)
STEP_SAMPLE_S = 0.005
MAX_INNER = 200


# -- timing ------------------------------------------------------------------------------

def measure(fn, sync, repeats=10, inner=1, warmup=2, budget_s=20.0, events=None,
            sample_s=None):
    """Seconds per call of fn: up to `repeats` samples of `inner` calls. A call slower than
    budget_s / 20 gets one warm-up and samples of one call, and samples stop at 3 once the
    rest would blow budget_s. events: a CUDA event timer (see _cuda_events). sample_s: at
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


def _cuda_events(backend):
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


# -- workloads ---------------------------------------------------------------------------

def _is_slow(bk):
    """Devices that are not GPUs run the big workloads at a smaller size (see `case`)."""
    return not bk.is_gpu


MLPS = {"mlp-big": ([10000, 5000, 1000, 10], ["tanh", "sigmoid", "sigmoid"],
                    "binary_cross_entropy", 10000),
        "mlp-small": ([1000, 500, 100, 10], ["relu", "relu", "softmax"],
                      "softmax_cross_entropy", 1000)}


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
                            repeats=10, inner=3,
                            events=_cuda_events(bk) if bk.kind == "cuda" else None)
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
    else:
        raise PortanetError(f"{workload!r} has no training step: use one of "
                            f"{', '.join(sorted(STEPS))}")
    net.train_batch(x, y, opt)            # sizes the buffers; the batch stays on the device
    return net, (lambda: training.step(net, opt)) if eager else \
        (lambda: training.train_step(net, opt))


def _step_timing(bk, step, flops=None, repeats=10, inner=3):
    t = measure(step, bk.synchronize, repeats=repeats, inner=inner, sample_s=STEP_SAMPLE_S,
                events=_cuda_events(bk) if bk.kind == "cuda" else None)
    if flops:
        t["gflops"] = flops / t["median_s"] / 1e9
    return t


def step_batches(workload, bk):
    """The batch sizes a training-step workload times on bk."""
    if workload == "lenet-step":
        return 64, 256
    if workload == "resnet-step":
        return (16,) if _is_slow(bk) else (128, 512)
    batch = MLPS[workload][3]
    return (batch // 10 if _is_slow(bk) and workload == "mlp-big" else batch,)


def _products_flops(net, m):
    """The matrix products of a training step of net on m samples: each Dense's and
    Conv2D's forward and weight gradient, and its input gradient where a trained layer
    comes before it (the layers inside Residual blocks included)."""
    flops, first = 0, True
    for _, layer in net.walk():
        if isinstance(layer, Dense):            # (Conv2D is one)
            positions = math.prod(layer.out_shape[1:]) if len(layer.out_shape) == 3 else 1
            product = 2 * layer.units * layer.n_in * positions * m
            flops += product * (2 if first else 3)
        if not layer.sublayers():               # (a block's layers count, not the block)
            first = first and not layer.trainable
    return flops


def wl_step(name):
    """A training step (STEPS) at each of its batches: samples a second, and GFLOP/s of
    its products."""
    unit = "samples/s" if name in MLPS else "images/s"

    def workload(bk, rng):
        for m in step_batches(name, bk):
            def run(m=m):
                net, step = training_step(name, bk, m, rng)
                try:
                    t = _step_timing(bk, step, _products_flops(net, m))
                finally:
                    net.free()
                t["throughput"], t["throughput_unit"] = m / t["median_s"], unit
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
}
GEMM_BOUND = {"gemm", "mlp-big", "mlp-small", "lenet-step", "resnet-step"}
STEPS = {"mlp-big", "mlp-small", "lenet-step", "resnet-step"}     # the training-step workloads


# -- PyTorch as the peer -----------------------------------------------------------------

def _torch_device(bk):
    """The torch device string matching a portanet backend, or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed (pip install torch, for this column alone)"
    if bk.kind == "cpu":
        return "cpu", None
    if bk.kind == "cuda":
        if torch.cuda.is_available():
            return f"cuda:{bk.name.split(':')[1]}", None
        return None, "PyTorch has no CUDA here"
    return None, "PyTorch has no OpenCL device"


def torch_case(workload, case, device, graph=False, precision="fp32"):
    """Seconds of the same workload and case in PyTorch float32 computing as `precision`
    asks: TF32 allowed (tf32) or not, under autocast to bfloat16 or float16 (bf16, fp16;
    fp16's loss scaled by a GradScaler): eager, or with graph=True the whole training step
    captured once in a CUDA graph and replayed (the strongest peer of a small step, whose
    eager time is mostly Python and launches). On CUDA the figures hold `peak_bytes` too:
    torch.cuda.max_memory_allocated() over the warm-up and timed calls, less what was
    allocated before the case made its model and batch (as portanet's peak counts its
    own, the batch included)."""
    import torch
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    figures = _torch_figures(torch, workload, case, device, graph, precision)
    if cuda:
        torch.cuda.synchronize(device)
        figures["peak_bytes"] = torch.cuda.max_memory_allocated(device) - base
    return figures


def _torch_figures(torch, workload, case, device, graph, precision):
    """torch_case's timing (see there)."""
    import contextlib
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = ((lambda: torch.autocast(device.split(":")[0], dtype=half)) if half else
                contextlib.nullcontext)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    if workload == "gemm":
        n = int(case.split("^")[0])
        a, b = (torch.randn(n, n, device=device) for _ in range(2))
        if half:
            a, b = a.to(half), b.to(half)
        c = torch.empty(n, n, device=device, dtype=a.dtype)
        return measure(lambda: torch.mm(a, b, out=c), sync, repeats=10, inner=3)
    m = int(case.split()[1]) if case.startswith("batch") else int(case.split()[0])
    model, x, y, loss_fn = _torch_model(torch, workload, m, device)
    if workload == "lenet-infer":
        host = x.cpu().numpy()

        def infer():
            with torch.no_grad(), autocast():
                model(torch.from_numpy(host).to(device)).softmax(1).cpu()
        return measure(infer, sync, repeats=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")

    def step():
        opt.zero_grad()
        with autocast():
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    if graph:
        if precision == "fp16":
            raise PortanetError("GradScaler's step reads its overflow check on the host, "
                                "which a CUDA graph cannot capture")
        step = _torch_graph(torch, step, opt)
    return measure(step, sync, repeats=10, inner=3, sample_s=STEP_SAMPLE_S)


def _torch_model(torch, workload, m, device):
    """(model, x, y, loss function) of a step or inference workload on m samples."""
    if workload in MLPS:
        sizes, acts, loss, _ = MLPS[workload]
        layers = []
        for i, a in enumerate(acts):
            layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(acts) - 1:
                layers.append({"tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid,
                               "relu": torch.nn.ReLU}[a]())
        model = torch.nn.Sequential(*layers).to(device)
        x = torch.randn(m, sizes[0], device=device)
        if loss == "softmax_cross_entropy":
            y = torch.randint(0, sizes[-1], (m,), device=device)
            loss_fn = torch.nn.CrossEntropyLoss()
        else:
            y = (torch.rand(m, sizes[-1], device=device) > 0.5).float()
            loss_fn = torch.nn.BCEWithLogitsLoss()
        return model, x, y, loss_fn
    model = (_torch_resnet(torch) if workload == "resnet-step" else torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3),
        torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(4608, 10))).to(device)
    x = torch.rand(m, 1, 28, 28, device=device)
    return model, x, torch.randint(0, 10, (m,), device=device), torch.nn.CrossEntropyLoss()


def torch_ddp_case(workload, m, device, group):
    """PyTorch's DDP (NCCL) on the same job as portanet's distributed bench: the workload's
    float32 SGD step on m samples a rank, alone and wrapped in DistributedDataParallel
    (buckets overlapped with backward, as DDP does by default), each timed as the bench
    times ours: {"alone": figures, "distributed": figures}. torch.distributed joins once a
    process: at the launcher's MASTER_ADDR and MASTER_PORT, or under MPI at an address rank
    0 gives through the job's channel."""
    import socket

    import torch
    import torch.distributed as dist
    torch.cuda.set_device(device)
    if not dist.is_initialized() and group.channel.kind == "tcp":
        # torchrun's store (or rank 0's, under srun) at MASTER_ADDR:MASTER_PORT
        dist.init_process_group("nccl", init_method="env://", rank=group.rank,
                                world_size=group.size)
    elif not dist.is_initialized():
        where = None
        if group.rank == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                where = (socket.gethostname(), s.getsockname()[1])
        host, port = group.channel.bcast(where)
        dist.init_process_group("nccl", init_method=f"tcp://{host}:{port}", rank=group.rank,
                                world_size=group.size)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    sync = torch.cuda.synchronize
    out = {}
    for name in ("alone", "distributed"):
        model, x, y, loss_fn = _torch_model(torch, workload, m, device)
        if name == "distributed":
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        out[name] = measure(step, sync, repeats=10, inner=3, sample_s=STEP_SAMPLE_S) \
            if name == "alone" else measure(step, sync, **_in_step(group, out["alone"]))
    return out


def _torch_resnet(torch):
    """models.resnet in PyTorch: the same layers (a 1x1 convolution with bias as the
    projection where a block changes the shape), in the same order."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c_in, c, stride):
            super().__init__()
            self.inner = nn.Sequential(
                nn.Conv2d(c_in, c, 3, stride, 1), nn.BatchNorm2d(c), nn.ReLU(),
                nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c))
            self.proj = nn.Conv2d(c_in, c, 1, stride) if (c_in, stride) != (c, 1) else None

        def forward(self, x):
            return torch.relu(self.inner(x) + (self.proj(x) if self.proj else x))

    layers, c = [nn.Conv2d(1, 32, 3, 1, 1), nn.BatchNorm2d(32), nn.ReLU()], 32
    for width, stride in models.RESNET_BLOCKS:
        layers.append(Block(c, width, stride))
        c = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3),
                         nn.Linear(c, 10))


def _torch_graph(torch, step, opt):
    """step captured in a CUDA graph as PyTorch's documentation does it: warm-up on a side
    stream (the optimizer creates its momentum buffers there), then one capture with the
    gradients set to None first, so that backward allocates them from the graph's pool."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return graph.replay


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
    torch_device, torch_reason = _torch_device(bk) if peer else (None, "not asked for")
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
                        t = torch_case(w, case, torch_device, graph, bk.precision)
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
            together = measure(step, bk.synchronize, **_in_step(group, alone),
                               events=_cuda_events(bk) if bk.kind == "cuda" else None)
        finally:
            net.free()
        row = _row(w, f"batch {m} per rank", bk.name, timing=together)
        row.update(rank=group.rank, alone=alone, averages_per_step=averages,
                   throughput=group.size * m / together["median_s"],
                   throughput_unit="samples/s (all ranks)",
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
            f"{ddp['median_s'] * 1e3:8.3f} ms  {ddp['throughput']:12.1f} samples/s  "
            f"efficiency {ddp['scaling_efficiency']:.2f}"
            if ddp.get("status") == "ok" else
            f"  | DDP {ddp.get('status')}: {ddp.get('reason') or ddp.get('error')}")
    return (f"rank {r['rank']} {r['device']:12s} {r['workload']:10s} {r['case']:20s} "
            f"alone {r['alone']['median_s'] * 1e3:9.3f} ms  distributed "
            f"{r['median_s'] * 1e3:9.3f} ms  {r['throughput']:12.1f} samples/s  "
            f"efficiency {r['scaling_efficiency']:.2f}" + peer)


def _in_step(group, alone):
    """measure's arguments for a distributed step: every rank the same calls (each is a
    collective that waits for the others' matching one), as many a sample as the slowest
    rank's timing alone took, and no early end."""
    return {"repeats": 10, "inner": max(group.channel.allgather(alone["inner"])),
            "budget_s": math.inf}


def _ddp_row(workload, m, bk, group):
    """PyTorch DDP's figures of the same case (torch_ddp_case), where torch and CUDA are
    here and every rank is a CUDA device: its step alone and distributed, throughput and
    efficiency as ours; else why not."""
    torch_device, reason = _torch_device(bk)
    if not all(d.startswith("cuda") for d in group.devices):
        torch_device, reason = None, "DDP is timed on jobs of CUDA ranks"
    elif torch_device is None or not torch_device.startswith("cuda"):
        torch_device, reason = None, reason or "DDP is timed on CUDA"
    # every rank times DDP or none does: its steps are collectives
    if not all(group.channel.allgather(torch_device is not None)):
        return {"status": "unavailable", "reason": reason or "a rank cannot time DDP"}
    try:
        t, error = torch_ddp_case(workload, m, torch_device, group), None
    except Exception as e:
        t, error = None, _error(e)
    if not all(group.channel.allgather(error is None)):
        return {"status": "failed", "error": error or "DDP failed on another rank"}
    return {"status": "ok", "device": torch_device, **t["distributed"], "alone": t["alone"],
            "throughput": group.size * m / t["distributed"]["median_s"],
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

