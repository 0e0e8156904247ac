"""Each convolution path's time for LeNet's two conv layers on a device, per product and
batch, the path auto routing takes, and PyTorch's cuDNN (TF32 off) beside them on cuda.

Usage: python bench/conv_paths.py [--devices cuda,opencl:0:0] [--batches 64,256,734,10000]
"""
import argparse
import statistics
import time

import numpy as np

import portanet as pn
from portanet.backends import conv as paths
from portanet.backends.base import CONV_WORKSPACE_BYTES, conv_out

LAYERS = [(1, 28, 28, 16, 3), (16, 26, 26, 32, 3)]        # (C, H, W, filters, k)
PATHS = ("implicit", "direct", "im2col")


def timed(call, sync, repeats=5):
    call()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def products(bk, C, H, W, F, k, N, rng):
    Ho, Wo = conv_out(H, k, 1, 0), conv_out(W, k, 1, 0)
    x, dx = bk.upload(rng.random((C, H, W, N), np.float32)), bk.empty((C, H, W, N))
    w, b = bk.upload(rng.random((F, C * k * k), np.float32)), bk.upload(np.zeros(F, np.float32))
    z, a = bk.empty((F, Ho, Wo, N)), bk.empty((F, Ho, Wo, N))
    dz, gw = bk.upload(rng.random((F, Ho, Wo, N), np.float32)), bk.empty((F, C * k * k))
    ws = bk.empty((min(C * k * k * Ho * Wo * N, CONV_WORKSPACE_BYTES // 4),))
    return {"forward": lambda: bk.conv("relu", w, x, b, z, a, k, 1, 0, ws),
            "weight grad": lambda: bk.conv_weight_grad(-0.01, dz, x, 0.9, gw, k, 1, 0, ws),
            "input grad": lambda: bk.conv_input_grad(dx, w, dz, k, 1, 0, ws)}


def torch_products(C, H, W, F, k, N):
    import torch
    torch.backends.cudnn.allow_tf32 = False
    x = torch.rand(N, C, H, W, device="cuda", requires_grad=True)
    w = torch.rand(F, C, k, k, device="cuda", requires_grad=True)
    y = torch.nn.functional.conv2d(x, w)
    dy = torch.rand_like(y)
    return {"forward": lambda: torch.relu(torch.nn.functional.conv2d(x, w)),
            "backward (both)": lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", default="cuda,opencl:0:0")
    parser.add_argument("--batches", default="64,256,734,10000")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batches = list(map(int, args.batches.split(",")))
    for spec in args.devices.split(","):
        bk = pn.device(spec)
        for fixed in (True, False):
            bk.conv_fixed = fixed           # image sizes compiled into the implicit kernels
            print(f"\n{spec}: implicit kernels with the image sizes "
                  f"{'compiled in' if fixed else 'as arguments'}")
            table(bk, spec, batches, rng)
        bk.conv_fixed = bk.is_gpu
        if bk.kind == "cuda":
            import torch
            for N in batches:
                for C, H, W, F, k in LAYERS:
                    for name, call in torch_products(C, H, W, F, k, N).items():
                        print(f"{'torch cudnn':12s} {f'{C}->{F} {H}x{W}':14s} {N:6d} "
                              f"{name:15s} {timed(call, torch.cuda.synchronize):9.3f}",
                              flush=True)


# the name each product's routes go by (Backend.routes)
PRODUCTS = {"forward": "conv", "weight grad": "conv_weight_grad",
            "input grad": "conv_input_grad"}


def table(bk, spec, batches, rng):
    """Each path's ms per layer, batch and product on bk, and the route auto takes."""
    print(f"{'device':12s} {'layer':14s} {'batch':>6s} {'product':12s} "
          + " ".join(f"{p:>9s}" for p in PATHS) + "  auto")
    for N in batches:
        for C, H, W, F, k in LAYERS:
            for name, call in products(bk, C, H, W, F, k, N, rng).items():
                ms = {}
                for path in PATHS:
                    if ((path != "direct" or name == "forward" and C * k * k <= paths.DIRECT_ROWS)
                            and (path != "im2col" or bk.vendor_gemm)):
                        with bk.pinned(conv=path):
                            ms[path] = timed(call, bk.synchronize)
                with bk.pinned(conv="auto"):    # routes afresh: this product's alone
                    call()
                    chosen = [path for key, path in bk.routes.items()
                              if key[0] == PRODUCTS[name]]
                route = chosen[0] if chosen else "-"
                print(f"{spec:12s} {f'{C}->{F} {H}x{W}':14s} {N:6d} {name:12s} "
                      + " ".join(f"{ms[p]:9.3f}" if p in ms else f"{'-':>9s}" for p in PATHS)
                      + f"  {route}", flush=True)


if __name__ == "__main__":
    main()
