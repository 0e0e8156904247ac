"""How GEMM and the row reductions are cut into work, as pure functions of shapes and a
device's limits: our GEMM kernel's tilings (defaults per device class, what `portanet
tune` searches, whether a tiling fits a device, the ladder of smaller ones), K split into
parts or pieces, and the pieces of gemv, batch normalization and split sums. No device
is touched here; the router (router.py) chooses among what these allow."""
from ..base import ACC_K

# split-K makes parts until the work-groups hold this many work-items per compute unit (two
# groups of 256, eight of SMALL_TILES' 64): 10 x 10000 x 4608 took 589 us on an H100's
# OpenCL in 157 unsplit groups of 64 (two warps per unit), 178 in 7 parts of K
WORK_ITEMS_PER_UNIT = 512
MAX_PARTS = 512
NORM_GROUPS_PER_UNIT = 8   # batch normalization's groups of gemv_threads per compute unit
SPLIT_RUN = 8              # parts one lane of gemm_split_sum adds in a row, where lanes allow

# our GEMM kernel's tilings (gemm.cl's parameters): every device class's default
GEMM_DEFAULTS = {"TSM": 64, "TSN": 64, "TSK": 16, "WPTM": 8, "WPTN": 8, "MICRO": 0, "PAD": 1,
                 "VW": 1, "DB": 0, "SUBGROUP": 0, "MIN_GROUPS": 1, "SWIZZLE": 1}
# few outputs, long K (weight gradients): 16 x 16 tiles of 2 x 2 per work-item, split in
# parts so that about 8 work-groups of 64 work-items run per compute unit
SMALL_TILES = dict(GEMM_DEFAULTS, TSM=16, TSN=16, TSK=16, WPTM=2, WPTN=2)
# the implicit-GEMM convolution's tiling on GPUs, before _thin fits it to few filters: the
# gathers hold registers of their own, and a thinned 128 x 256 GEMM tiling (8 x 16 per
# work-item) took all 255 of CUDA's and spilled (conv2 of LeNet at 4.5 TFLOP/s)
CONV_TILES = dict(GEMM_DEFAULTS, TSM=64, TSN=128, TSK=16, WPTM=4, WPTN=8, MICRO=2, PAD=4, VW=4)
# CPUs (PoCL, Intel's runtime): 32 x 32 tiles, 8 deep, of 4 x 4 per work-item. PoCL compiles
# a kernel per work-group size at its first launch, and the unrolled 8 x 8 x 16 body of the
# defaults took it 20 s per variant (of four: the transposes) against 4 s for this one,
# which also ran the MLP's products 1.3-1.9x faster (set_gemm_params, 2-core EPYC)
CPU_TILES = dict(GEMM_DEFAULTS, TSM=32, TSN=32, TSK=8, WPTM=4, WPTN=4)


def _tiles(p, m, n):
    """The tiles of tiling p over an m x n output."""
    return -(-m // p["TSM"]) * -(-n // p["TSN"])


def _halved(p):
    """The next rung down the ladder of tilings from p: the longer side of the tile and the
    work per item along it halved (the work-items stay as many), registers capped for two
    work-groups per compute unit; None at the bottom (tiles of 16 or 2 per work-item)."""
    side = "N" if p["TSN"] >= p["TSM"] else "M"
    if p["TS" + side] <= 16 or p["WPT" + side] <= 2:
        return None
    return dict(p, **{"TS" + side: p["TS" + side] // 2, "WPT" + side: p["WPT" + side] // 2},
                MIN_GROUPS=max(2, p.get("MIN_GROUPS", 1)))


def _thinned(p, side, length, fits):
    """p with its tile's side "M" or "N" halved down to `length`: the work per item halved
    (keeping a multiple of 4 where MICRO reads 4-wide runs, as `fits` checks), else the
    work-items along it, never under 64 of them in a group; as far as such halvings fit."""
    wpt, ts = "WPT" + side, "TS" + side
    while p[ts] > length:
        for q in (dict(p, **{ts: p[ts] // 2, wpt: p[wpt] // 2}), dict(p, **{ts: p[ts] // 2})):
            if q[wpt] and fits(q) and (q["TSM"] // q["WPTM"]) * (q["TSN"] // q["WPTN"]) >= 64:
                p = q
                break
        else:
            return p
    return p

def _k_pieces(k, longest=ACC_K):
    """(k0, k_p) for each piece of a product's K of at most `longest` terms, in equal pieces
    of whole 16s (so 4-wide loads stay aligned)."""
    count = max(1, -(-k // longest))
    step = -(-k // count)
    step = min(longest, -(-step // 16) * 16) if count > 1 else k
    return [(k0, min(step, k - k0)) for k0 in range(0, max(k, 1), max(step, 1))]

def gemm_params(is_gpu, max_threads, local_bytes, itemsize=8):
    """Tile sizes for our GEMM from a device's limits, for a device `portanet tune` has not
    measured. On GPUs with room for them, 128 x 256 tiles, 16 deep, of 8 x 16 per
    work-item, read as 4-wide runs (MICRO 2), operands loaded 4 wide: the fastest measured
    on an H100 (45.7 TFLOP/s on CUDA, 45.4 on NVIDIA's OpenCL at 4096^3; 128 x 128 tiles of
    8 x 8 with registers for two groups per unit, 43.4 on both; the previous defaults 28.7
    and 30.0). Failing that (float64's slabs need twice the local memory) 128 x 128;
    smaller ones on CPUs and small devices."""
    wide = dict(GEMM_DEFAULTS, TSM=128, TSN=256, TSK=16, WPTN=16, MICRO=2, PAD=4, VW=4)
    big = dict(GEMM_DEFAULTS, TSM=128, TSN=128, TSK=16, MICRO=2, PAD=4, VW=4, MIN_GROUPS=2)
    for p in ([wide, big, GEMM_DEFAULTS] if is_gpu else [CPU_TILES]) + [
            dict(GEMM_DEFAULTS, TSM=16, TSN=16, TSK=8, WPTM=2, WPTN=2)]:
        if gemm_fits(p, max_threads, local_bytes, itemsize):
            return dict(p)
    raise RuntimeError(f"no GEMM tiling fits a device with {max_threads} work-items per "
                       f"group and {local_bytes} bytes of local memory")


# what `portanet tune` searches: each parameter of gemm.cl and its candidates
GEMM_SPACE = {"TSM": (32, 64, 128, 256), "TSN": (32, 64, 128, 256), "TSK": (8, 16, 32),
              "WPTM": (2, 4, 8, 16), "WPTN": (2, 4, 8, 16), "MICRO": (0, 1, 2), "PAD": (0, 1, 4),
              "VW": (1, 4), "DB": (0, 1), "SUBGROUP": (0, 32), "MIN_GROUPS": (1, 2),
              "SWIZZLE": (1, 4, 8, 16)}


# local memory a compiler may keep for itself beside the slabs: NVIDIA's OpenCL built
# slabs of exactly 48 KiB into a kernel of 49168 bytes, over the device's 49152
LOCAL_RESERVED = 64


def gemm_fits(p, max_threads, local_bytes, itemsize=8):
    """Whether tiling p is one gemm.cl can build and a device with these limits can run
    on reals of itemsize bytes: whole work-per-item blocks, loads that divide among the
    work-items, 4-aligned local rows where the micro-tile is read as 4-wide vectors
    (MICRO 1, 2), the slabs in local memory."""
    p = {**GEMM_DEFAULTS, **p}
    rtsm, rtsn = p["TSM"] // p["WPTM"], p["TSN"] // p["WPTN"]
    threads = rtsm * rtsn
    if p["TSM"] % p["WPTM"] or p["TSN"] % p["WPTN"] or threads > max_threads:
        return False
    vw = p.get("VW", 1)
    if (p["TSM"] * p["TSK"]) % (threads * vw) or (p["TSN"] * p["TSK"]) % (threads * vw):
        return False
    if p["MICRO"] and (p["WPTM"] % 4 or p["WPTN"] % 4 or p["PAD"] % 4):
        return False
    sub = p["SUBGROUP"]
    if sub and (threads % sub or rtsn % 8 or rtsm % (sub // 8)):
        return False
    if ACC_K % p["TSK"]:                    # split-K parts of ACC_K are whole slabs
        return False
    stages = 2 if p.get("DB") else 1
    slabs = stages * p["TSK"] * (p["TSM"] + p["TSN"] + 2 * p["PAD"]) * itemsize
    return slabs <= local_bytes - LOCAL_RESERVED


def split_k(tiles, k, tsk, groups):
    """(parts, k_chunk): split the K sum when the output tiles are fewer than the work-groups
    wanted (two per compute unit of big tiles, more of small ones); each part at least 8
    slabs deep, at most MAX_PARTS of them."""
    if 2 * tiles >= groups or k < 16 * tsk:
        return 1, k
    return k_parts(k, min(-(-groups // tiles), k // (8 * tsk), MAX_PARTS), tsk)


def k_parts(k, parts, tsk):
    """(parts, k_chunk): K in about `parts` parts of whole slabs of tsk terms (rounding up
    the part may leave fewer parts)."""
    k_chunk = -(-(-(-k // parts)) // tsk) * tsk
    return -(-k // k_chunk), k_chunk

def split_lanes(parts, threads):
    """The lanes of a gemm_split_sum work-group of `threads` that share each output's parts
    (blas.cl): enough that none adds more than SPLIT_RUN parts in a row, but at most
    threads / 8, so that a group's outputs are at least 8 neighbours (32 bytes of floats);
    where that cap binds a lane adds more (338 parts in 32 lanes of 256: runs of 11)."""
    lanes = 1
    while lanes * SPLIT_RUN < parts and lanes * 16 <= threads:
        lanes *= 2
    return lanes


def gemv_parts(rows, cols, threads, units):
    """The pieces gemv may split each row's columns into: enough that the row groups fill
    the device as split K fills it (WORK_ITEMS_PER_UNIT), none shorter than SPLIT_RUN
    columns per work-item; 1 where the rows alone fill it. Whether the split (two launches)
    beats one group per row is measured (auto GEMM routing)."""
    groups = units * max(2, WORK_ITEMS_PER_UNIT // threads)
    return 1 if 2 * rows >= groups else row_pieces(rows, cols, threads, groups)


def norm_parts(rows, n, threads, units):
    """The pieces batchnorm_train and batchnorm_grad split each row into: enough that the
    groups fill the device with NORM_GROUPS_PER_UNIT each, none shorter than SPLIT_RUN
    columns per work-item; 1 where the rows alone fill it. Streams over a row that one
    group per compute unit cannot keep in flight: a ResNet's BatchNorm on an H100, 32 to
    128 channels of 28 x 28 x 512 values, took 0.4 ms a call whole (docs/benchmarks-h100.md)."""
    return row_pieces(rows, n, threads, units * NORM_GROUPS_PER_UNIT)


def row_pieces(rows, cols, threads, groups):
    """The pieces each of `rows` rows of `cols` columns splits into so that the work-groups
    of `threads` make `groups`: none shorter than SPLIT_RUN columns per work-item, at most
    MAX_PARTS; 1 where the rows alone make them."""
    return max(1, min(-(-groups // rows), cols // (threads * SPLIT_RUN), MAX_PARTS))

def gemm_options(trans_a, trans_b, params):
    """-D definitions that specialise gemm.cl."""
    return [f"-DTRANS_A={int(trans_a)}", f"-DTRANS_B={int(trans_b)}",
            *(f"-D{k}={v}" for k, v in params.items())]
