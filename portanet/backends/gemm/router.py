"""The GEMM router: which path runs a product of a given shape (our tiled kernel at one of
its tilings and K splits, the vendor's, the tensor-core kernel, a transposed copy first),
measured at its first call where PORTANET_GEMM=auto and kept in the routes file
(routes.py) so that another process takes the same; the tiling our kernel runs a shape
with (tiling.py's pure functions over the device's tuned tilings). The rows' way of
gemv, batch normalization and the fused loss is chosen the same way (`_row_way`).
`pinned` and `routes` are the public switch and view of it (docs/routing.md)."""
import contextlib
import dataclasses
import functools
import logging
import math
import time

import types

import numpy as np

from ... import config
from . import routes
from ..base import ACC_K
from ..pinning import check_pin
from .paths import _shape_text
from .tiling import (CONV_TILES, GEMM_DEFAULTS, SMALL_TILES, WORK_ITEMS_PER_UNIT, _halved,
                          _k_pieces, _thinned, _tiles, gemm_fits, gemm_params, gemv_parts, k_parts,
                          split_k)

log = logging.getLogger("portanet")


FINISH_PARTS = 16           # the most parts gemm.cl's last part adds up itself (SPLIT_K 2)
ROUTING_REPEATS = 3        # timed calls per path and round when auto routing meets a new
ROUTING_ROUNDS = 3         # shape; the path's time is its fastest round
ROUTING_MARGIN = 1.5       # a path this much slower than the best at its first call, and
ROUTING_CLEAR = 1e-3       # this many seconds, is not timed again
TRANSPOSED_FLOPS = 2**34   # the least product routing tries on a transposed copy of a (17 GFLOP)
SEARCH_PARTS = (1, 2, 4, 8, 16)     # the K splits routing tries with each tiling (GPUs)
SEARCH_WORKSPACE = 2**22   # split-K workspace (reals) routing may grow to for a candidate


def _key_text(key):
    """A routing key in the log: 'gemm NT 32x144x147456' or 'conv_weight_grad (...)'."""
    if isinstance(key[0], str):
        return f"{key[0]} {key[1:]}"
    return "gemm " + _shape_text(*key)


def _file_key(key, paths):
    """A routing key as the routes file keeps it: with the names of the paths there were
    to choose from (which paths exist can differ between processes and networks: a vendor
    library, a conv workspace's room), and numbers and flags as Python's own, so that its
    text is the same in every process."""
    def plain(x):
        if isinstance(x, tuple):
            return tuple(plain(v) for v in x)
        if isinstance(x, (bool, np.bool_)):
            return bool(x)
        return int(x) if isinstance(x, np.integer) else x
    return plain(key) + (tuple(sorted(paths)),)


def _steady(limits):
    """An OpenCL backend's limits without the memory sizes, which PoCL takes from the
    memory free when it starts (they moved between two processes on the H100's host, and
    the routes file then held none for the second); None elsewhere."""
    if limits is None:
        return None
    return {k: v for k, v in dataclasses.asdict(limits).items()
            if k not in ("memory", "max_alloc")}


class GemmRouting:
    """KernelBackend's GEMM routing and tiling choice (see the module's docstring)."""

    @property
    def routes(self):
        """What routing chose so far, read-only and live: {product's key: path}. A GEMM's
        key is (m, n, k, trans_a, trans_b), its path "own" (the rules' tiling), "own
        TSMxTSN [split-K p] [summed]" (another tiling), "vendor", "vendor_t" or "tensor";
        other products' keys start with their name ("dense", "conv", "conv_input_grad",
        "conv_weight_grad", "gemv", ...), a convolution's ending in the paths it was
        chosen from."""
        return types.MappingProxyType(self._routes)

    @property
    def gemm_paths(self):
        """The GEMM paths `pinned` takes here: "auto" (routed), "own" (our kernel; the
        tensor-core one where the backend has it), with a vendor GEMM "vendor" and, where
        its inputs are the arrays themselves (not 16-bit copies), "vendor_t" (on a
        transposed copy of a: routing's `_transposes` alike), with a tensor-core GEMM
        "tensor"."""
        vendor = ("vendor",) + (("vendor_t",) if self.half_operands is None else ())
        return (("auto", "own") + (vendor if self.vendor_gemm else ())
                + (("tensor",) if self.tensor_gemm else ()))

    @contextlib.contextmanager
    def pinned(self, gemm=None, conv=None, routes=None):
        """Within the block, every GEMM takes path `gemm` and every convolution path
        `conv` (None: as they are; PORTANET_GEMM and PORTANET_CONV set them for the
        process), and routing starts afresh, as in a new process: no routes in memory
        (or `routes`, {key: path} as `routes` shows them, as if measured), the routes
        file read under the pinned paths' scope. Afterwards the backend's paths and
        routes are what they were; what the block measured is forgotten (but kept in
        PORTANET_ROUTES' file). A path this backend lacks is a PortanetError naming
        those it has (gemm_paths, conv_paths). The pin is the backend's, for
        every thread that uses it. Steps a network recorded before (or inside) the block
        are recorded again after the change of paths."""
        check_pin("GEMM", gemm, self.gemm_paths)
        check_pin("convolution", conv, self.conv_paths)
        fresh = dict(routes or {})
        with self._lock:                # not in the middle of another thread's operation
            saved = (self.gemm_path, self.conv_path, self._routes, self._route_tilings,
                     self._route_file)
            if gemm is not None:
                self.gemm_path = gemm
            if conv is not None:
                self.conv_path = conv
            self._routes, self._route_tilings, self._route_file = fresh, {}, None
            self.generation += 1        # steps recorded with other paths: record them again
        try:
            yield self
        finally:
            with self._lock:
                (self.gemm_path, self.conv_path, self._routes, self._route_tilings,
                 self._route_file) = saved
                self.generation += 1

    def _route(self, a, b, beta, c, trans_a, trans_b, m, n, k):
        """The faster path for this shape, measured now on the real operands (`_fastest`)
        and remembered for the life of the backend. Neither library wins everywhere:
        CLBlast has no split K, so a conv layer's weight gradient (32 x 144, K = 147456) ran
        17 times slower there than our split-K kernel on an H100, while it wins the large
        square products."""
        def own(tiling=None):
            self._gemm_own(1.0, a, b, beta, c, trans_a, trans_b, m, n, k, tiling=tiling)

        def vendor():
            self._gemm_vendor_pieces(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)

        def vendor_t():
            self._gemm_vendor_t(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)

        def tensor():
            self._gemm_tensor_pieces(1.0, a, b, beta, c, trans_a, trans_b, m, n, k)
        return self._fastest_tiling((m, n, k, trans_a, trans_b), m, n, k, own, vendor, tensor,
                                    restore=[c] if beta != 0 else [], vendor_t=vendor_t)

    def _fastest_tiling(self, key, m, n, k, own, vendor, tensor, restore=(), vendor_t=None):
        """The fastest of the vendor's call, own(tiling) on each of `_candidates`, where
        the product is large (`_transposes`) vendor_t(): the vendor's on a transposed copy
        of a, and where the backend has one (`tensor_gemm`), tensor(): our tensor-core
        GEMM, measured (`_fastest`) and remembered: the path's name in _routes[key], its
        tiling in _route_tilings[key]."""
        tilings = self._candidates(m, n, k)
        paths = {name: functools.partial(own, t) for name, t in tilings.items()}
        ws = max(t[1] * m * n for t in tilings.values())
        if ws > m * n:
            self._split_workspace(ws)      # grown first: the trials' replays all point at it
        if self.vendor_gemm:
            paths["vendor"] = vendor
        if vendor_t is not None and self._transposes(2 * m * n * k):
            self._transposed_workspace(m * k)                   # likewise
            paths["vendor_t"] = vendor_t
        if self.tensor_gemm and any(self._tensor_takes(kp) for _, kp in _k_pieces(k)):
            paths["tensor"] = tensor
        best = self._fastest(key, paths, restore)
        if best in tilings:
            self._route_tilings[key] = tilings[best]
        return best

    def _kept_route(self, key, paths):
        """The path PORTANET_ROUTES' file keeps for key among `paths` under this backend's
        scope (see routes.py), or None."""
        path = config.routes_file()
        if path is None:
            self._route_file = None
            return None
        if self._route_file is None or self._route_file.path != path:
            self._route_file = routes.RouteFile(path, routes.scope(
                self._sources_id(), routes.code_id(), str(self.dtype), self.precision,
                self.gemm_path, self.conv_path, self.gemm_params,
                sorted(self.gemm_sizes.items()), self.vendor_k, config.graphs(),
                self.gemv_threads, self.compute_units, getattr(self, "gemm_limits", None),
                _steady(getattr(self, "limits", None)), bool(self.vendor_gemm),
                routes.versions("pyclblast", "nvmath-python")))
        return self._route_file.get(_file_key(key, paths))

    def _fastest(self, key, paths, restore=()):
        """The fastest of `paths` ({name: call}), each timed now on the real operands as a
        recorded training step runs it, where the backend records steps: replayed, without
        the Python around each launch (on NVIDIA's OpenCL an mlp-small step took 0.43 ms on
        the paths eager timing chose, CLBlast, and 0.27 on ours). Remembered in _routes[key]
        for the life of the backend, each path's time its fastest of ROUTING_ROUNDS. The
        trials write into the outputs themselves, so routing allocates nothing (but the
        split-K workspace, grown to the largest trial's first: _fastest_tiling); the arrays
        in `restore` (outputs the call also reads) are put back afterwards."""
        if len(paths) == 1:                 # nothing to choose between
            self._routes[key] = best = next(iter(paths))
            return best
        stored = self._kept_route(key, paths)
        if stored in paths:                 # measured by an earlier process (PORTANET_ROUTES)
            self._routes[key] = stored
            return stored
        kept = set(self._fresh)         # each trial copies what the step's call would copy
        if self.dry:                # foreseen (foresight.py): every path's builds, none timed
            for call in paths.values():
                self._with_fresh(kept, call)
            self._fresh = kept
            self._routes[key] = best = next(iter(paths))
            return best
        saved = [(x, self.download(x)) for x in restore]
        paths = {name: functools.partial(self._with_fresh, kept, call)
                 for name, call in paths.items()}
        try:
            self.prebuild(*paths.values())
            runs, seconds = {}, {}
            for name, call in paths.items():
                call()                                          # builds, warms up
                self.synchronize()
                replay = self.capture(call) if config.graphs() and self.trace is None else None
                runs[name] = replay or call
                seconds[name] = self._timed(runs[name], 1)
            # a simulator's times say nothing of a device: each path is timed once, so that
            # routing there runs every path under the simulator's checks at little cost. On a
            # device, a path whose one call took ROUTING_MARGIN times the best's, and a
            # millisecond more, is out at once (a CPU's slow way to a large conv takes seconds);
            # the rest are timed in ROUTING_ROUNDS rounds, of ROUTING_REPEATS calls each where
            # a call is short enough for the launch's own time to blur it
            best = min(seconds.values())
            close = [name for name, t in seconds.items()
                     if t <= ROUTING_MARGIN * best or t - best < ROUTING_CLEAR]
            if not self.simulator and len(close) > 1:
                repeats = ROUTING_REPEATS if best < ROUTING_CLEAR else 1
                for _ in range(ROUTING_ROUNDS):     # rounds in turn: a clock that ramps up, or a
                    for name in close:              # neighbour's burst, reaches every path alike
                        run = runs[name]
                        if not getattr(run, "current", True):   # a later path freed its memory
                            runs[name] = run = self.capture(paths[name])
                        seconds[name] = min(seconds[name], self._timed(run, repeats))
        finally:
            for x, host in saved:
                self.write(x, host)
            self._fresh = kept
        best = min(seconds, key=seconds.get)
        if self._route_file is not None:    # another process's, where it was first
            first = self._route_file.put(_file_key(key, paths), best)
            best = first if first in paths else best
        self._routes[key] = best
        log.debug("%s on %s: %s -> %s", _key_text(key), self.name,
                  ", ".join(f"{name} {1e6 * t:.0f} us"
                            for name, t in seconds.items()), best)
        return best

    def _with_fresh(self, fresh, call):
        self._fresh = set(fresh)
        call()

    def _timed(self, run, repeats):
        """Seconds a call of run takes, the mean of `repeats` calls in a row."""
        self.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        self.synchronize()
        return (time.perf_counter() - start) / repeats

    def _row_way(self, name, rows, cols, run, restore, **others):
        """The call that a kernel of gemv's row groups, run(parts), makes on a rows x cols
        matrix: one group per row where the rows fill the device or routing is not auto;
        else the fastest of one group per row, the gemv_parts pieces of each (then a split
        sum) and the calls in `others`, measured per shape (_fastest) and remembered."""
        parts = gemv_parts(rows, cols, self.gemv_threads, self.compute_units)
        whole = functools.partial(run, 1)
        if parts == 1 or self.gemm_path != "auto":
            return whole
        ways = {"whole": whole, "split": functools.partial(run, parts), **others}
        key = (name, rows, cols)
        return ways[self._routes.get(key) or self._fastest(key, ways, restore)]

    def _tiling(self, m, n, k, conv=None):
        """(params, parts, k_chunk): the tiling of our GEMM for an m x n x k product, the
        parts its K is split in and the terms of each. In order (docs/gemm.md has
        the reasons behind each step):
          - the tuned size class nearest the output (`_size_class`), or the device's one
            tiling; run as tuned (one group per tile, K unsplit) where the output fills as
            many of its tiles as the class's own product;
          - thinner tiles where the output fills at most half of a tile's rows or columns
            (`_thin`: a conv layer's 16 x 6760000 forward output);
          - else, where the tiles leave compute units idle, down a ladder of smaller tilings
            (`_halved`) until they fill the device, or SMALL_TILES for an output smaller
            than one tile (a conv weight gradient: 16 x 9, K = 173056);
          - then K split in parts until the groups hold WORK_ITEMS_PER_UNIT work-items per
            compute unit, no part longer than ACC_K."""
        thin, as_tuned = self._tuned_for(m, n, conv)
        rungs = self._tilings(thin)
        p = rungs[0][0]
        small = (not as_tuned and _tiles(p, m, n) < self.compute_units
                 and (m < p["TSM"] or n < p["TSN"]) and p["TSM"] * p["TSN"] > 256)
        if small:
            p = SMALL_TILES
        elif not as_tuned:
            for p, _ in rungs:              # down to the first whose tiles fill the device
                if _tiles(p, m, n) >= self.compute_units:
                    break
        if as_tuned:
            return p, 1, k
        groups = self.compute_units * max(
            2, WORK_ITEMS_PER_UNIT // ((p["TSM"] // p["WPTM"]) * (p["TSN"] // p["WPTN"])))
        parts, k_chunk = split_k(_tiles(p, m, n), k, p["TSK"], groups)
        if parts > 1 and k_chunk > ACC_K:           # no part sums more than ACC_K terms
            parts, k_chunk = -(-k // ACC_K), ACC_K
        return p, parts, k_chunk

    def _tuned_for(self, m, n, conv=None):
        """(params, as_tuned): the tuned tiling of the size class nearest an m x n output
        (the device's one tiling where untuned; CONV_TILES for a convolution on a GPU),
        thinned to it (`_thin`), and whether it runs as tuned: a tiling tuned for a size
        class runs as it was measured (alone, unsplit) wherever the output fills as many
        of its tiles as at that size."""
        size = None if conv else self._size_class(m, n)
        tuned = self.gemm_sizes.get(size, self.gemm_params)
        if conv and self.is_gpu and self.gemm_fits(CONV_TILES):
            tuned = CONV_TILES
        thin = self._thin(tuned, m, n)
        return thin, (size is not None and thin is tuned
                      and _tiles(tuned, m, n) >= _tiles(tuned, size, size))

    def _candidates(self, m, n, k):
        """{name: tiling} that auto routing times for an m x n x k product: "own", what
        `_tiling` chooses, and where the backend searches_tilings (GPUs) and that is not a
        tuned tiling run as tuned, each rung of each tuned tiling's ladder (thinned to the
        output) and SMALL_TILES, with K whole and in SEARCH_PARTS parts (each at least 4
        slabs, at most 16 groups per compute unit in all), one of each tile shape and
        split: the nearest size class's first. Where the rules split K in more parts than
        SEARCH_PARTS (a weight gradient's K of the batch's pixels) they are kept. The rules
        missed by up to 8 us a product on the H100's mlp-small step (docs/routing.md).
        Where the last part may add a split up (finishes_splits),
        each split is tried that way and summed after as well ("... summed")."""
        chosen = self._tiling(m, n, k)
        found = {"own": chosen}
        if (not self.searches_tilings or self._tuned_for(m, n)[1]
                or chosen[1] > SEARCH_PARTS[-1]):
            return self._with_summed(found)     # tuned as it runs, or K long for its output
        seen = {(chosen[0]["TSM"], chosen[0]["TSN"], chosen[1])}
        room = max(chosen[1] * m * n, SEARCH_WORKSPACE)
        nearest = self.gemm_sizes.get(self._size_class(m, n), self.gemm_params)
        roots = [nearest, self.gemm_params, *self.gemm_sizes.values()]
        tilings = [r for root in roots for r, _ in self._tilings(self._thin(root, m, n))]
        for p in tilings + ([SMALL_TILES] if self.gemm_fits(SMALL_TILES) else []):
            for parts in SEARCH_PARTS:
                if parts > 1 and (k < 4 * p["TSK"] * parts or parts * m * n > room
                                  or _tiles(p, m, n) * parts > 16 * self.compute_units):
                    continue
                count, k_chunk = k_parts(k, parts, p["TSK"])
                shape = (p["TSM"], p["TSN"], count)     # the nearest class's of a shape
                if shape not in seen and k_chunk <= ACC_K:
                    seen.add(shape)
                    found[f"own {p['TSM']}x{p['TSN']}" + (
                        f" split-K {count}" if count > 1 else "")] = (p, count, k_chunk)
        return self._with_summed(found)

    def _with_summed(self, found):
        """found ({name: tiling}) and, beside each split that its last part would add up
        (`_finishes`), the same split summed by gemm_split_sum, as name + " summed"."""
        return {**found, **{name + " summed": (*t, False) for name, t in found.items()
                            if t[1] > 1 and self._finishes(t[1])}}

    def _finishes(self, parts):
        """Whether a split K of `parts` parts is added up by its last part (gemm.cl's
        SPLIT_K 2) here, rather than by gemm_split_sum."""
        return parts <= FINISH_PARTS and self.finishes_splits

    def _thin(self, params, m, n):
        """params, or where the output fills at most half of its tile's rows (columns),
        params with the tile that many times shorter (`_thinned`): a 16 x 6760000 x 9
        product (a conv layer's forward pass on 10000 images) spent 7/8 of its 128-row tiles
        on padding. Made once per tiling and shape of tile, not per product."""
        want = {}
        for side, length in (("M", m), ("N", n)):
            ts = params["TS" + side]
            while ts // 2 >= max(length, 16):
                ts //= 2
            want[side] = ts
        if want["M"] == params["TSM"] and want["N"] == params["TSN"]:
            return params

        def thinned():
            thin = params
            for side in ("M", "N"):
                thin = _thinned(thin, side, want[side], self.gemm_fits)
            return thin
        return self._per_tiling(params, ("thin", want["M"], want["N"]), thinned)

    def _size_class(self, m, n):
        """The size n' of the tuned tilings (gemm_sizes) nearest an m x n output, m n
        against n'^2 on a log scale (the larger of two as near), or None where there are
        none (untuned: gemm_params for every product)."""
        if not self.gemm_sizes:
            return None
        return min(self.gemm_sizes, key=lambda s: (abs(math.log(m * n / (s * s))), -s))

    def _tilings(self, params):
        """The ladder of tilings _gemm_own steps down from `params` (the device's, or one
        of its size classes'): params, then each `_halved` from it while they fit here, with
        the frozen items that key their kernels. Made once per tiling, not per product."""
        def ladder():
            rungs, p = [], params
            while p is not None and (not rungs or self.gemm_fits(p)):
                rungs.append((p, tuple(sorted(p.items()))))
                p = _halved(p)
            return rungs
        return self._per_tiling(params, ("ladder",), ladder)

    def _per_tiling(self, params, use, make):
        """make(), made once for the tiling `params` (by identity) and `use`, kept until
        set_gemm_params; each entry holds params, so no other tiling takes its id."""
        if self._derived is None:
            self._derived = {}
        key = (id(params), *use)
        if key not in self._derived:
            self._derived[key] = (params, make())
        return self._derived[key][1]

    def _register_cap(self, params):
        """Build options that hold our GEMM kernel to registers for MIN_GROUPS work-groups
        per compute unit where the device compiler takes such a cap beyond the kernel's own
        (CUDA's __launch_bounds__ does it in gemm.cl, under CUDA's prelude)."""
        return []

    def _split_workspace(self, size):
        """A view of `size` elements of the split-K workspace, grown when too small."""
        ws, _ = self._workspace("_split_ws", size, "split-K workspace")
        if self.finishes_splits:
            self._split_counts(0)               # made with the first workspace
        return self.view(ws, (size,))

    def _split_counts(self, tiles):
        """A view of `tiles` counts of split K's parts done (gemm.cl's SPLIT_K 2), zeros;
        made for 16 tiles per compute unit (a split's tiles are fewer than its groups),
        grown where a product has more. The last part of each tile puts its count back to
        0, so one set serves every product, launch after launch on the backend's queue."""
        counts, made = self._workspace("_split_done", max(tiles, 16 * self.compute_units),
                                       "split-K counts", np.int32)
        if made:
            self.write(counts, np.zeros(counts.size, np.int32))
        return self.view(counts, (tiles,))

    def set_gemm_params(self, params, sizes=None):
        """Use other tile sizes for our GEMM kernel: `params` for every product, or, with
        sizes {n: tiling} (what `portanet tune` measured fastest on n x n x n products),
        the tiling of the size class nearest each output (_size_class), params where there
        is none. Tilings that do not fit here (gemm_fits) are the caller's to leave out."""
        self.gemm_params = {**GEMM_DEFAULTS, **params}
        self.gemm_sizes = {int(n): {**GEMM_DEFAULTS, **p} for n, p in (sizes or {}).items()}
        self._derived = {}
        self._routes, self._route_tilings = {}, {}      # measured with the old tiling
        self._route_file = None                         # another scope (_kept_route)
        self.generation += 1                # recorded steps launch the old kernels
        for key in [k for k in self._kernels if isinstance(k, tuple) and k[0] == "gemm"]:
            del self._kernels[key]

    @property
    def gemm_default(self):
        """The tiling this device's limits give (gemm_params), tuned or not: what
        `portanet tune` compares against."""
        return gemm_params(self.is_gpu, *self.gemm_limits)

    def gemm_fits(self, params):
        """Whether our GEMM kernel builds and runs with these parameters here (GEMM_SPACE)."""
        return gemm_fits(params, *self.gemm_limits)

    def _transposes(self, flops):
        """Whether routing tries the vendor's GEMM on a transposed copy of a (_gemm_vendor_t)
        for a product of `flops`: float32 operands (16-bit ones are copied anyway), and at
        least TRANSPOSED_FLOPS, where the copy is cheap beside the product; only where
        products are routed and the vendor's GEMM is there."""
        return (self.gemm_path == "auto" and self.vendor_gemm and self.half_operands is None
                and flops >= TRANSPOSED_FLOPS)

    def _transposed_workspace(self, size):
        return self._workspace("_transposed_ws", size, "transposed-operand workspace")[0]
