"""Our GEMM on one mid-size product, over many tilings and splits of K: how fast can the
kernel as it is run one shape (mlp-small's 500 x 1000 x 1000 products, for one, where
cuBLAS is faster than routing's best tiling on the H100: docs/benchmarks-h100.md)?

    python bench/gemm_tilings.py opencl:0:0 500 1000 1000 NN --dense --seconds 120

Times the vendor's call, routing's candidates (`_candidates`) and then random tilings of
`space` with random splits of K (--grid: GRID_TILES and their splits, in order) until the
seconds are spent; each path its fastest of ROUNDS rounds of REPEATS replays in a row.
Prints the fastest 25 and the vendor's."""
import argparse, random, time

import numpy as np

from portanet import backends
from portanet.backends.gemm import tiling as gemm_tiling

ROUNDS, REPEATS = 5, 20
# (TSM, TSN, WPTM, WPTN): cuBLAS's 64 x 64 of 8 x 4 per thread first, then its neighbours
GRID_TILES = ((64, 64, 8, 4), (64, 64, 4, 8), (64, 64, 4, 4), (32, 64, 4, 4), (64, 32, 4, 4),
              (128, 64, 8, 4), (64, 128, 4, 8), (128, 128, 8, 8))
# GEMM_SPACE narrowed to what wins on the H100 (4-wide local reads and loads), the tile
# and the work per item free
space = dict(gemm_tiling.GEMM_SPACE, MICRO=(2,), PAD=(4,), VW=(4,), WPTM=(4, 8, 16), WPTN=(4, 8, 16),
             SWIZZLE=(1,))

ap = argparse.ArgumentParser()
ap.add_argument("device")
ap.add_argument("m", type=int)
ap.add_argument("n", type=int)
ap.add_argument("k", type=int)
ap.add_argument("trans", choices=["NN", "NT", "TN"])
ap.add_argument("--dense", action="store_true",
                help="the product of a layer's dense (NN), its bias and relu added")
ap.add_argument("--seconds", type=float, default=60)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--grid", action="store_true",
                help="after the candidates, GRID_TILES x TSK x SUBGROUP x parts x finish "
                     "in order, not random tilings")
args = ap.parse_args()
if args.dense and args.trans != "NN":
    ap.error("--dense is a layer's forward product: NN")

bk = backends.device(args.device)
m, n, k = args.m, args.n, args.k
ta, tb = args.trans[0] == "T", args.trans[1] == "T"
rng = np.random.default_rng(0)
a = bk.upload(rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32))
b = bk.upload(rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32))
c, act = bk.empty((m, n)), bk.empty((m, n))
bias = bk.upload(rng.standard_normal((m, 1), dtype=np.float32))
ha, hb = bk.download(a).astype(np.float64), bk.download(b).astype(np.float64)
want = (ha.T if ta else ha) @ (hb.T if tb else hb) + (bk.download(bias) if args.dense else 0)
bk._split_workspace(16 * m * n)
bk._split_counts(4096)
# each path is set by hand as routing's choice for the shape, so that the product runs as
# a training step runs it (the layer's dense, or gemm)
bk.gemm_path = "auto"
key = ("dense", m, n, k) if args.dense else (m, n, k, ta, tb)


def product():
    if args.dense:
        bk.dense("relu", a, b, bias, c, act)
    else:
        bk.gemm(1.0, a, b, 0.0, c, ta, tb)


def timed(call):
    call()
    bk.synchronize()
    run = bk.capture(call) or call
    return min(bk._timed(run, REPEATS) for _ in range(ROUNDS))


def label(t):
    p, parts, chunk, *finish = t
    keys = ("TSM", "TSN", "TSK", "WPTM", "WPTN", "MICRO", "PAD", "VW", "DB", "SUBGROUP",
            "MIN_GROUPS")
    return (" ".join(f"{key}={p[key]}" for key in keys)
            + f" parts={parts}" + (" summed" if finish == [False] else ""))


results = []


def trial(name, path, tiling=None):
    bk._routes[key], bk._route_tilings[key] = path, tiling
    try:
        s = timed(product)
    except Exception as e:                          # a tiling the driver will not build
        print(f"  {name}: {type(e).__name__} {str(e)[:80]}", flush=True)
        return
    err = float(np.abs(bk.download(c) - want).max() / np.abs(want).max())
    results.append((s, name, err))


trial("vendor", "vendor")
for name, t in bk._candidates(m, n, k).items():
    trial(f"candidate {name}: {label(t)}", "own", t)
print(f"{len(results)} candidates timed", flush=True)


def grid():
    base = dict(gemm_tiling.GEMM_DEFAULTS, MICRO=2, PAD=4, VW=4, SWIZZLE=1)
    for tsm, tsn, wptm, wptn in GRID_TILES:
        for tsk in (16, 32):
            for sub in (32, 0):
                p = dict(base, TSM=tsm, TSN=tsn, WPTM=wptm, WPTN=wptn, TSK=tsk,
                         SUBGROUP=sub, MIN_GROUPS=2)
                for parts in (1, 2, 3, 4, 6):
                    for finish in (True, False):
                        yield p, parts, finish


def randomly():
    pick = random.Random(args.seed)
    while True:
        p = {key: pick.choice(values) for key, values in space.items()}
        yield p, pick.choice([1, 2, 3, 4, 6, 8]), pick.choice([True, False])


fits = bk.gemm_fits
end = time.time() + args.seconds
tried = set()
for p, parts, finish in grid() if args.grid else randomly():
    if time.time() > end:
        break
    if not fits(p) or (p["TSM"] // p["WPTM"]) * (p["TSN"] // p["WPTN"]) < 64:
        continue
    tiles = gemm_tiling._tiles(p, m, n)
    count, chunk = gemm_tiling.k_parts(k, parts, p["TSK"])
    if chunk < 2 * p["TSK"] or tiles * count > 16 * bk.compute_units:
        continue
    finish = finish if count > 1 and bk._finishes(count) else True
    t = (p, count, chunk) + (() if finish else (False,))
    name = label(t)
    if name in tried:
        continue
    tried.add(name)
    trial(name, "own", t)
results.sort()
print(f"{bk.name} {args.trans} {m}x{n}x{k}{' dense' if args.dense else ''}: "
      f"{len(results)} timed, fastest first")
for s, name, err in results[:25]:
    print(f"  {1e6 * s:7.1f} us  {2 * m * n * k / s / 1e12:5.1f} TFLOP/s  err {err:.1e}  {name}")
for s, name, err in results:
    if name == "vendor":
        print(f"  vendor {1e6 * s:.1f} us")
