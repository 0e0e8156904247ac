"""portanet against PyTorch (float32 eager, TF32 off) on one GPU, in one run:

  gemm       SGEMM n^3, n = 1024, 2048, 4096, NN, NT and TN: our CUDA and OpenCL kernels,
             cuBLAS, CLBlast, torch.mm (our rates also as shares of cuBLAS's)
  mlp-big    the series' big step: batch 10000, 10000 -> 5000 tanh -> 1000 sigmoid -> 10
             sigmoid (BCE), one forward + backward + momentum update
  mlp-small  batch 1000, 1000 -> 500 relu -> 100 relu -> 10 softmax cross-entropy
  tensor     bf16 and fp16 products n^3, n = 4096, 8192 (Hopper): our tensor-core GEMM
             (wgmma.cu) and cuBLAS's gemm_ex on the same 16-bit K-major operands, float32 c;
             the two library paths with their 16-bit copies; torch.mm in the 16-bit type

Usage: python bench/gemm_paths.py [--json out.json] [--only gemm,mlp-big,mlp-small,tensor]
                                 [--variants] [--opencl opencl:nvidia]
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
from portanet import training                            # noqa: E402
from portanet.bench import measure                       # noqa: E402


def gemm_portanet(spec, path, n=4096, trans=(False, False)):
    bk = pn.device(spec)
    saved = bk.gemm_path
    bk.gemm_path = path
    rng = np.random.default_rng(0)
    a, b = (bk.upload(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
    c = bk.empty((n, n))
    bk.gemm(1.0, a, b, 0.0, c, *trans)      # builds the kernel outside the timing (measure
    bk.synchronize()                        # takes a first call over 1 s for a slow one)
    t = measure(lambda: bk.gemm(1.0, a, b, 0.0, c, *trans), bk.synchronize, repeats=10,
                inner=5)
    ha, hb = (bk.download(x).astype(np.float64) for x in (a, b))
    op_a, op_b = (ha.T if trans[0] else ha), (hb.T if trans[1] else hb)
    ref = op_a[:64] @ op_b                           # the result checked on 64 rows
    err = np.linalg.norm(bk.download(c)[:64] - ref) / np.linalg.norm(ref)
    for x in (a, b, c):
        bk.free(x)
    bk.gemm_path = saved
    return {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12, "rel_err": err}


# tilings --variants times at 4096^3 (each over the device's GEMM_DEFAULTS)
GEMM_VARIANTS = [
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=1, PAD=4),          # cuda's before
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=0, PAD=1),          # OpenCL's before
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=2, PAD=4),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, DB=1),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, DB=1, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, DB=1),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, DB=1, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, MICRO=1, PAD=4, VW=4, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, MICRO=0, PAD=1, VW=4, DB=1, MIN_GROUPS=2),
    dict(TSM=128, TSN=64, TSK=16, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4, MIN_GROUPS=2),
    dict(TSM=128, TSN=128, TSK=32, WPTM=8, WPTN=8, MICRO=2, PAD=4, VW=4),
]


def resource_report(spec, params):
    """Registers, local-memory spills and shared memory of our NN kernel with params."""
    bk = pn.device(spec)
    from portanet.backends import sources
    from portanet.backends.gemm import tiling as gemm_tiling
    options = gemm_tiling.gemm_options(False, False, {**gemm_tiling.GEMM_DEFAULTS, **params})
    if spec.startswith("cuda"):
        f = bk._kernel("gemm", "gemm", options)
        return f"{f.num_regs} registers, {f.local_size_bytes} local bytes, " \
               f"{f.shared_size_bytes} shared bytes"
    import pyopencl as cl
    if "NVIDIA" not in bk.platform.name:
        return ""
    _, text = sources.load("gemm", "cl")
    prg = cl.Program(bk.ctx, text).build(options=bk.options + options + ["-cl-nv-verbose"])
    log = prg.get_build_info(bk.device, cl.program_build_info.LOG)
    return " | ".join(line.strip() for line in log.splitlines()
                      if "registers" in line or "spill" in line)


def gemm_variants(spec):
    """Our kernel with each tiling in GEMM_VARIANTS at 4096^3: {params: TFLOP/s}."""
    bk = pn.device(spec)
    saved = bk.gemm_params
    out = {}
    for p in GEMM_VARIANTS:
        try:
            bk.set_gemm_params(p)
            r = gemm_portanet(spec, "own")
            out[str(p)] = {"tflops": r["tflops"], "rel_err": r["rel_err"],
                           "resources": resource_report(spec, p)}
        except Exception as e:
            out[str(p)] = {"error": f"{type(e).__name__}: {e}"[:300]}
        print("variant", spec, p, out[str(p)], flush=True)
    bk.set_gemm_params(saved)
    return out


def gemm_torch(n=4096, trans=(False, False)):
    import torch
    a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
    op_a, op_b = (a.t() if trans[0] else a), (b.t() if trans[1] else b)
    c = torch.empty(n, n, device="cuda")
    t = measure(lambda: torch.mm(op_a, op_b, out=c), torch.cuda.synchronize, repeats=10,
                inner=5)
    return {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12}


GEMM_CASES = [(n, trans) for n in (1024, 2048, 4096)
              for trans in ((False, False), (False, True), (True, False))]


def gemm_table(opencl):
    """Every GEMM_CASES product on our kernel and the vendor's, CUDA and OpenCL, and
    torch.mm: {case: {impl: result}}, printed as one table with our rates as shares of
    cuBLAS's."""
    impls = [("cuda", "own"), ("cuda", "vendor"), (opencl, "own"), (opencl, "vendor")]
    table = {}
    for n, trans in GEMM_CASES:
        case = f"{'T' if trans[0] else 'N'}{'T' if trans[1] else 'N'} {n}"
        row = table[case] = {}
        for spec, path in impls:
            try:
                row[f"{spec}/{path}"] = gemm_portanet(spec, path, n, trans)
            except Exception as e:
                row[f"{spec}/{path}"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        row["torch"] = gemm_torch(n, trans)
        cublas = row["cuda/vendor"].get("tflops", float("nan"))
        rates = "  ".join(f"{k} {r.get('tflops', float('nan')):6.2f}" for k, r in row.items())
        print(f"gemm {case:10s} {rates}  own/cuBLAS: cuda "
              f"{row['cuda/own'].get('tflops', 0) / cublas:.0%}, opencl "
              f"{row[f'{opencl}/own'].get('tflops', 0) / cublas:.0%}", flush=True)
    return table


def tensor_table(sizes=(4096, 8192)):
    """Our tensor-core GEMM from 16-bit inputs against cuBLAS's on the same operands (op(a)
    and op(b)^T K-major, as _kmajor16 copies them; c float32), in bf16 and fp16: {case:
    {impl: result}}, printed with each rate as a share of cuBLAS's."""
    from portanet.timing import cuda_events
    import torch
    table = {}
    for precision in ("bf16", "fp16"):
        bk = pn.device("cuda", precision=precision)
        if not bk.tensor_gemm:
            print(f"tensor {precision}: no tensor-core GEMM of ours on this GPU")
            continue
        events, rng = cuda_events(bk), np.random.default_rng(0)
        for n in sizes:
            a, b = (bk.upload(rng.standard_normal((n, n), dtype=np.float32)) for _ in range(2))
            c = bk.empty((n, n))
            a16, b16 = bk._kmajor16(a, b, False, False, n, n, n)
            calls = {
                "wgmma.cu": lambda: bk._wgmma(1.0, a16, b16, 0.0, c),
                "cuBLAS gemm_ex": lambda: bk._gemm_vendor(1.0, a16, b16, 0.0, c, False, True,
                                                          n, n, n, n),
                "path tensor (copies, ACC_K pieces)": lambda: bk._gemm_tensor_pieces(
                    1.0, a, b, 0.0, c, False, False, n, n, n),
                "path vendor (copies, vendor_k pieces)": lambda: bk._gemm_vendor_pieces(
                    1.0, a, b, 0.0, c, False, False, n, n, n)}
            row = table[f"{precision} {n}"] = {}
            for name, call in calls.items():
                t = measure(call, bk.synchronize, repeats=10, inner=5, events=events)
                row[name] = {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12}
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            x, y = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
            t = measure(lambda: torch.mm(x, y), torch.cuda.synchronize, repeats=10, inner=5)
            row[f"torch.mm ({precision} c)"] = {**t, "tflops": 2 * n ** 3 / t["median_s"] / 1e12}
            bk._wgmma(1.0, a16, b16, 0.0, c)
            ref = (bk.download(a16)[:64].astype(np.float32) if precision == "fp16" else
                   _bf16(bk.download(a16)[:64])).astype(np.float64)
            ref = ref @ (bk.download(b16).astype(np.float32) if precision == "fp16" else
                         _bf16(bk.download(b16))).astype(np.float64).T
            row["wgmma.cu"]["rel_err"] = float(np.linalg.norm(bk.download(c)[:64] - ref)
                                               / np.linalg.norm(ref))
            cublas = row["cuBLAS gemm_ex"]["tflops"]
            for name, r in row.items():
                print(f"tensor {precision} {n}^3 {name:40s} {r['tflops']:7.1f} TFLOP/s "
                      f"{r['median_s'] * 1e3:8.3f} ms {r['tflops'] / cublas:6.1%}", flush=True)
            print(f"tensor {precision} {n}^3 wgmma.cu against the float64 product of its "
                  f"inputs (64 rows): {row['wgmma.cu']['rel_err']:.1e}", flush=True)
            for z in (a, b, c):
                bk.free(z)
    return table


def _bf16(bits):
    """bfloat16 bits (uint16) as float32."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


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
    t = measure(lambda: training.train_step(net, opt), bk.synchronize, repeats=10, inner=3)
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
    parser.add_argument("--variants", action="store_true",
                        help="also time our GEMM kernel with each tiling of GEMM_VARIANTS")
    args = parser.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
               "portanet": pn.__version__, "workloads": {}}
    devices = [("cuda", "own"), ("cuda", "vendor"), (args.opencl, "own"), (args.opencl, "vendor")]
    if args.variants:
        results["gemm_variants"] = {spec: gemm_variants(spec) for spec in ("cuda", args.opencl)}
    for name in args.only.split(","):
        if name == "gemm":
            results["gemm"] = gemm_table(args.opencl)
            continue
        if name == "tensor":
            results["tensor"] = tensor_table()
            continue
        rows = {}
        for spec, path in devices:
            try:
                bk = pn.device(spec)
                if path == "vendor" and not bk.vendor_gemm:
                    continue
                rows[f"{spec}/{path}"] = mlp_portanet(spec, MLPS[name], path)
            except Exception as e:       # a failing device is reported, not dropped
                rows[f"{spec}/{path}"] = {"error": f"{type(e).__name__}: {e}"}
            print(name, f"{spec}/{path}", _short(rows[f"{spec}/{path}"]), flush=True)
        rows["torch"] = mlp_torch(MLPS[name])
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
