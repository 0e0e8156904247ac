"""portanet against PyTorch (float32 eager, TF32 off) on one GPU, in one run:

  gemm       SGEMM 4096^3: our CUDA and OpenCL kernels, cuBLAS, CLBlast, torch.mm
  mlp-big    the series' big step: batch 10000, 10000 -> 5000 tanh -> 1000 sigmoid -> 10
             sigmoid (BCE), one forward + backward + momentum update
  mlp-small  batch 1000, 1000 -> 500 relu -> 100 relu -> 10 softmax cross-entropy

Usage: python bench/gpu_compare.py [--json out.json] [--only gemm,mlp-big,mlp-small]
Inputs live on the device for both libraries; times are medians of repeated samples.
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import portanet as pn                                   # noqa: E402
from portanet.bench import measure                       # noqa: E402


def gemm_portanet(spec, path, n=4096):
    bk = pn.device(spec)
    saved = bk.gemm_path
    bk.gemm_path = path
    rng = np.random.default_rng(0)
    a, b = (bk.upload(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
    c = bk.empty((n, n))
    t = measure(lambda: bk.gemm(1.0, a, b, 0.0, c), bk.synchronize, repeats=10, inner=5)
    ref = None
    if n <= 4096:   # check the result on a slice against float64
        ha, hb = bk.download(a).astype(np.float64), bk.download(b).astype(np.float64)
        ref = np.linalg.norm(bk.download(c)[:64] - ha[:64] @ hb) / np.linalg.norm(ha[:64] @ hb)
    for x in (a, b, c):
        bk.free(x)
    bk.gemm_path = saved
    return {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12, "rel_err": ref}


GEMM_VARIANTS = [dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=0, PAD=1),
                 dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=0, PAD=1),
                 dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=1, PAD=4),
                 dict(TSM=128, TSN=64, TSK=16, WPTM=8, WPTN=4, MICRO=0, PAD=1),
                 dict(TSM=128, TSN=64, TSK=8, WPTM=8, WPTN=4, MICRO=1, PAD=4),
                 dict(TSM=64, TSN=128, TSK=8, WPTM=4, WPTN=8, MICRO=1, PAD=4),
                 dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=1, PAD=8)]


def opencl_resource_report(spec, params):
    """NVIDIA's OpenCL compiler's register and spill report for one tiling."""
    import pyopencl as cl
    from portanet.backends import gpu, sources
    bk = pn.device(spec)
    if "NVIDIA" not in bk.platform.name:
        return ""
    _, text = sources.load("gemm", "cl")
    options = bk.options + gpu.gemm_options(False, False, {**gpu.GEMM_DEFAULTS, **params})
    prg = cl.Program(bk.ctx, text).build(options=options + ["-cl-nv-verbose"])
    log = prg.get_build_info(bk.device, cl.program_build_info.LOG)
    return " | ".join(line.strip() for line in log.splitlines()
                      if "registers" in line or "spill" in line)


def gemm_tuning(spec):
    """Our kernel with each tiling in GEMM_VARIANTS: {params: TFLOP/s}."""
    bk = pn.device(spec)
    saved = bk.gemm_params
    out = {}
    for p in GEMM_VARIANTS:
        bk.set_gemm_params(p)
        try:
            r = gemm_portanet(spec, "own")
            out[str(p)] = {"tflops": r["tflops"], "rel_err": r["rel_err"]}
        except Exception as e:
            out[str(p)] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print("tuning", spec, p, out[str(p)], flush=True)
        if spec.startswith("opencl"):
            try:
                print("   ", opencl_resource_report(spec, p), flush=True)
            except Exception as e:
                print("    no resource report:", e)
    bk.set_gemm_params(saved)
    return out


def gemm_torch(n=4096):
    import torch
    a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
    c = torch.empty(n, n, device="cuda")
    t = measure(lambda: torch.mm(a, b, out=c), torch.cuda.synchronize, repeats=10, inner=5)
    return {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12}


MLPS = {
    "mlp-big": dict(batch=10000, sizes=[10000, 5000, 1000, 10],
                    acts=["tanh", "sigmoid", "sigmoid"], loss="binary_cross_entropy"),
    "mlp-small": dict(batch=1000, sizes=[1000, 500, 100, 10], acts=["relu", "relu", "softmax"],
                      loss="softmax_cross_entropy"),
}


def mlp_portanet(spec, cfg, path=None):
    bk = pn.device(spec)
    saved = bk.gemm_path
    if path:
        bk.gemm_path = path
    rng = np.random.default_rng(0)
    s, m = cfg["sizes"], cfg["batch"]
    net = pn.Sequential([pn.Dense(n, a) for n, a in zip(s[1:], cfg["acts"])], s[0], cfg["loss"],
                        device=spec)
    x = rng.standard_normal((m, s[0]), dtype=np.float32)
    y = (rng.integers(0, s[-1], m) if cfg["loss"] == "softmax_cross_entropy"
         else (rng.random((m, s[-1])) > 0.5).astype(np.float32))
    opt = pn.SGD(0.01, 0.9)
    net.train_batch(x, y, opt)                   # sizes the buffers; data stays on the device
    before = bk.allocations
    t = measure(lambda: net._step(opt), bk.synchronize, repeats=10, inner=3)
    assert bk.allocations == before
    peak = bk.peak_bytes
    net._free_batch_buffers()
    bk.gemm_path = saved
    return {**t, "peak_bytes": peak}


def mlp_torch(cfg):
    import torch
    s, m = cfg["sizes"], cfg["batch"]
    layers = []
    acts = {"tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid, "relu": torch.nn.ReLU}
    for i, a in enumerate(cfg["acts"]):
        layers.append(torch.nn.Linear(s[i], s[i + 1]))
        if i < len(cfg["acts"]) - 1:
            layers.append(acts[a]())
    model = torch.nn.Sequential(*layers).cuda()
    x = torch.randn(m, s[0], device="cuda")
    if cfg["loss"] == "softmax_cross_entropy":
        y = torch.randint(0, s[-1], (m,), device="cuda")
        loss_fn = torch.nn.CrossEntropyLoss()
    else:          # sigmoid output fused with BCE, as portanet does
        y = (torch.rand(m, s[-1], device="cuda") > 0.5).float()
        loss_fn = torch.nn.BCEWithLogitsLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()
    torch.cuda.reset_peak_memory_stats()
    t = measure(step, torch.cuda.synchronize, repeats=10, inner=3)
    return {**t, "peak_bytes": torch.cuda.max_memory_allocated()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--only", default="gemm,mlp-big,mlp-small")
    parser.add_argument("--opencl", default="opencl", help="OpenCL device string")
    parser.add_argument("--tune", action="store_true", help="also try GEMM tilings")
    args = parser.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
               "portanet": pn.__version__, "workloads": {}}
    devices = [("cuda", "own"), ("cuda", "vendor"), (args.opencl, "own"), (args.opencl, "vendor")]
    if args.tune:
        results["gemm_tuning"] = {spec: gemm_tuning(spec) for spec in ("cuda", args.opencl)}
    for name in args.only.split(","):
        rows = {}
        for spec, path in devices:
            try:
                bk = pn.device(spec)
                if path == "vendor" and bk.gemm_path != "vendor" and \
                        pn.config.gemm_path() != "vendor":
                    continue
                key = f"{spec}/{path}"
                rows[key] = gemm_portanet(spec, path) if name == "gemm" else \
                    mlp_portanet(spec, MLPS[name], path)
            except Exception as e:       # a failing device is reported, not dropped
                rows[f"{spec}/{path}"] = {"error": f"{type(e).__name__}: {e}"}
            print(name, f"{spec}/{path}", _short(rows[f"{spec}/{path}"]), flush=True)
        rows["torch"] = gemm_torch() if name == "gemm" else mlp_torch(MLPS[name])
        print(name, "torch", _short(rows["torch"]), flush=True)
        results["workloads"][name] = rows
    print()
    print(f"{'workload':10s} {'impl':22s} {'median ms':>10s} {'min':>8s} {'max':>8s} "
          f"{'TFLOP/s':>8s} {'vs torch':>9s}")
    for name, rows in results["workloads"].items():
        ref = rows["torch"]["median_s"]
        for impl, r in rows.items():
            if "error" in r:
                print(f"{name:10s} {impl:22s} FAILED {r['error'][:60]}")
                continue
            ratio = r["median_s"] / ref
            print(f"{name:10s} {impl:22s} {r['median_s'] * 1e3:10.3f} {r['min_s'] * 1e3:8.3f} "
                  f"{r['max_s'] * 1e3:8.3f} {r.get('tflops', float('nan')):8.2f} "
                  f"{ratio:8.3f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _short(r):
    if "error" in r:
        return r["error"]
    return f"{r['median_s'] * 1e3:.3f} ms" + (f" {r['tflops']:.1f} TFLOP/s" if "tflops" in r else "")


if __name__ == "__main__":
    main()
