"""Routes kept in a file (PORTANET_ROUTES, portanet/backends/gemm/routes.py): what routing
measured is written there and read back instead of measured again, under each backend's
own scope, so that later processes compute as the first one did."""
import json
import subprocess
import sys

import numpy as np
import pytest

import portanet as pn
from portanet.errors import PortanetError

M, N, K = 37, 67, 257                   # a product with several paths to time


def routed(backend):
    """A block in which the backend routes with no routes in memory, as in a new process
    (the cpu reference does not route: skipped)."""
    if backend.kind == "cpu":
        pytest.skip("the NumPy reference has no routing")
    return backend.pinned(gemm="auto")


def product(bk, rng, m=M):
    a, b = rng.standard_normal((m, K)), rng.standard_normal((K, N))
    c = bk.empty((m, N))
    bk.gemm(1.0, bk.upload(a), bk.upload(b), 0.0, c)
    assert np.allclose(bk.download(c), a @ b, rtol=1e-4, atol=1e-3)


def scopes(path):
    """The file's {scope: {key: path}}, checked to be marked as a routes file."""
    kept = json.loads(path.read_text())
    assert kept["format"] == "portanet-routes-1" and set(kept) == {"format", "scopes"}
    return kept["scopes"]


def only_entry(path, key):
    """The file's one scope, its routes, and the file's key of `key` (with its paths)."""
    (scope, kept), = scopes(path).items()
    (entry,) = [k for k in kept if k.startswith(repr(key)[:-1] + ", (")]
    return scope, kept, entry


def test_pinned_paths_route_afresh_and_are_put_back(backend, rng):
    """`pinned` sets the GEMM and convolution paths for a block whose routing starts with
    no routes (or those given); `routes` shows what it chose, read-only; afterwards the
    paths and routes are what they were, an error inside the block included. A path the
    backend lacks is refused, naming those it has. On the reference, "reference" is the
    one path and nothing is routed."""
    if backend.kind == "cpu":
        with backend.pinned(gemm="reference", conv="reference"), backend.pinned():
            product(backend, rng)
        assert dict(backend.routes) == {} and backend.gemm_paths == ("reference",)
        with pytest.raises(PortanetError, match="'reference'"):
            with backend.pinned(gemm="own"):
                pass
        return
    paths, routes = (backend.gemm_path, backend.conv_path), backend.routes
    known = dict(routes)
    with backend.pinned(gemm="auto", conv="implicit"):
        assert (backend.gemm_path, backend.conv_path) == ("auto", "implicit")
        assert dict(backend.routes) == {}
        product(backend, rng)
        key = (M, N, K, False, False)
        chosen = backend.routes[key]
        with pytest.raises(TypeError):
            backend.routes[key] = "own"                 # a view: routing writes it
        with backend.pinned(routes={key: "own"}):       # as if measured
            assert backend.gemm_path == "auto" and backend.routes[key] == "own"
            product(backend, rng)
        assert backend.routes[key] == chosen
    assert (backend.gemm_path, backend.conv_path) == paths and dict(routes) == known
    with pytest.raises(RuntimeError, match="inside"):
        with backend.pinned(gemm="own", conv="direct"):
            raise RuntimeError("inside")
    assert (backend.gemm_path, backend.conv_path) == paths and dict(backend.routes) == known
    for wrong, named in ((dict(gemm="fast"), "'own'"), (dict(conv="winograd"), "'im2col'"),
                         (dict(gemm="reference"), "'auto'")):
        with pytest.raises(PortanetError, match=named):
            with backend.pinned(**wrong):
                pass
    assert set(backend.gemm_paths) >= {"auto", "own"}
    assert ("vendor" in backend.gemm_paths) == bool(backend.vendor_gemm)
    # the vendor's GEMM on a transposed copy of a: where its inputs are the arrays themselves
    assert ("vendor_t" in backend.gemm_paths) == bool(backend.vendor_gemm
                                                      and backend.half_operands is None)


def test_routes_are_kept_and_read_back(backend, rng, monkeypatch, tmp_path):
    """A measured route goes into the file with the paths it was chosen from; another
    process's backend (here: the same with its routes forgotten) takes the file's path, and
    its tiling, without timing anything, whichever of the shape's paths the file names; a
    name that is not among the paths is timed again and left as it was."""
    bk = backend
    path = tmp_path / "routes.json"
    monkeypatch.setenv("PORTANET_ROUTES", str(path))
    key = (M, N, K, False, False)
    with routed(bk):
        product(bk, rng)
        scope, kept, entry = only_entry(path, key)
        assert kept[entry] == bk.routes[key]
        tilings = bk._candidates(M, N, K)
    paths = [p for p in eval(entry)[-1] if p != kept[entry]]
    if not paths:
        pytest.skip("one path only for this product here")
    other = next((p for p in paths if p in tilings and tilings[p] is not None), paths[0])
    path.write_text(json.dumps({scope: {**kept, entry: other}}))      # the earlier layout
    real = bk._timed

    def timed(*args):
        raise AssertionError("a route the file holds was timed again")
    monkeypatch.setattr(bk, "_timed", timed)
    with routed(bk):
        product(bk, rng)
        assert bk.routes[key] == other
        if other in tilings:
            assert bk._route_tilings[key] == tilings[other]
    path.write_text(json.dumps({"format": "portanet-routes-1",
                                "scopes": {scope: {**kept, entry: "no such path"}}}))
    monkeypatch.setattr(bk, "_timed", real)
    with routed(bk):
        product(bk, rng)
        assert bk.routes[key] in eval(entry)[-1]
    assert only_entry(path, key)[1][entry] == "no such path"      # the first one stays


def test_each_backend_keeps_its_own_scope(backend, monkeypatch, tmp_path):
    """A backend of another dtype or precision on the same device reads none of this
    one's routes: its paths and tilings are other ones."""
    monkeypatch.setenv("PORTANET_ROUTES", str(tmp_path / "routes.json"))
    with routed(backend):
        backend._kept_route(("probe",), {})
        scopes = [backend._route_file.scope]
    for dtype, precision in (("float64", None), ("float32", "fp16")):
        try:
            other = pn.device(backend.name, dtype, precision)
        except pn.DeviceError:
            continue
        with routed(other):
            other._kept_route(("probe",), {})
            scopes.append(other._route_file.scope)
    if len(scopes) == 1:
        pytest.skip("no other dtype or precision on this device")
    assert len(set(scopes)) == len(scopes)


def test_a_bad_routes_file_is_named(backend, rng, monkeypatch, tmp_path):
    bk = backend
    path = tmp_path / "routes.json"
    path.write_text("[1, 2")
    monkeypatch.setenv("PORTANET_ROUTES", str(path))
    with routed(bk):
        with pytest.raises(PortanetError, match=r"PORTANET_ROUTES=.*routes.json' is not a "
                                                r"routes file.*delete it"):
            product(bk, rng)
        path.write_text("[]")
        with pytest.raises(PortanetError, match="is not a routes file"):
            product(bk, rng)
    path.write_text("")                                 # made empty: nothing kept yet
    with routed(bk):
        product(bk, rng)
    assert json.loads(path.read_text())


def test_a_file_that_cannot_be_written_is_warned_of_once(backend, rng, monkeypatch, tmp_path):
    """Routes are an optimisation: where the file cannot be written (here its folder is a
    file), routing goes on in memory after one warning."""
    bk = backend
    (tmp_path / "folder").write_text("a file")
    monkeypatch.setenv("PORTANET_ROUTES", str(tmp_path / "folder" / "routes.json"))
    import warnings
    with routed(bk):
        with pytest.warns(RuntimeWarning, match="cannot be (read|written).*stay in this "
                                                "process only"):
            product(bk, rng)
        assert bk.routes
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            product(bk, rng, M + 1)                     # another shape, routed anew


def test_writers_at_once_lose_no_route(tmp_path):
    """Processes and threads that add routes to one file at once keep every one of them,
    and the first written for an entry stays."""
    from portanet.backends.gemm.routes import RouteFile
    path = tmp_path / "routes.json"
    script = (f"from portanet.backends.gemm.routes import RouteFile\n"
              f"import sys\n"
              f"f = RouteFile({str(path)!r}, 'scope')\n"
              f"for i in range(60):\n"
              f"    f.put((int(sys.argv[1]), i), 'p' + sys.argv[1])\n"
              f"    f.put(('shared', i), 'p' + sys.argv[1])\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)]) for r in range(3)]
    import threading
    threads = [threading.Thread(target=lambda r=r: [RouteFile(path, "scope").put((r, i), "t")
                                                    for i in range(60)])
               for r in (10, 11)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(p.wait(timeout=120) == 0 for p in procs)
    kept = scopes(path)["scope"]
    assert len(kept) == 5 * 60 + 60
    assert all(kept[repr((r, i))] == f"p{r}" for r in range(3) for i in range(60))
    firsts = [kept[repr(("shared", i))] for i in range(60)]
    assert set(firsts) <= {"p0", "p1", "p2"}
    f = RouteFile(path, "scope")
    assert all(f.put(("shared", i), "late") == firsts[i] for i in range(60))


TRAIN = """
import sys
import numpy as np
import portanet as pn
from portanet.backends import gpu
timed = []
real = gpu.KernelBackend._timed
gpu.KernelBackend._timed = lambda self, *a: timed.append(1) or real(self, *a)
rng = np.random.default_rng(0)
x, y = rng.standard_normal((96, 20)).astype(np.float32), rng.integers(0, 4, 96)
net = pn.Sequential([pn.Dense(24, "relu"), pn.Dense(4, "softmax")], 20, device=sys.argv[1])
net.fit(x, y, epochs=2, batch_size=32)
np.save(sys.argv[2], np.concatenate([w.ravel() for w in net.get_weights().values()]))
print(len(timed))
"""


def test_a_second_process_trains_as_the_first(device_name, monkeypatch, tmp_path):
    """Two processes with the same routes file and seed: the second times nothing and
    ends with the first's weights, bit for bit."""
    if device_name == "cpu":
        pytest.skip("the NumPy reference has no routing")
    try:
        pn.device(device_name)
    except pn.DeviceError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("PORTANET_ROUTES", str(tmp_path / "routes.json"))
    runs = []
    for i in range(2):
        out = tmp_path / f"w{i}.npy"
        done = subprocess.run([sys.executable, "-c", TRAIN, device_name, str(out)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        runs.append((int(done.stdout.split()[-1]), np.load(out)))
    kept = scopes(tmp_path / "routes.json")
    assert runs[0][0] > 0 and runs[1][0] == 0, \
        f"timed {runs[0][0]}, then {runs[1][0]}; scopes in the file: {len(kept)}"
    assert np.array_equal(runs[0][1], runs[1][1])



def test_a_step_recorded_before_a_pin_is_recorded_again_under_it(backend, rng):
    """A recorded step replays the paths it was recorded with: `pinned` (on entry and on
    exit) makes the network record its step again, so that the block's steps take the
    block's paths (here: routing afresh, which a replay would skip)."""
    if backend.kind == "cpu":
        pytest.skip("the NumPy reference records no steps")
    net = pn.mlp(input_shape=(12,), hidden=(16,), classes=3, device=backend.name, seed=0)
    x, y = rng.standard_normal((64, 12)).astype(np.float32), rng.integers(0, 3, 64)
    net.fit(x, y, epochs=2, batch_size=16, verbose=0)        # recorded, then replayed
    with backend.pinned(gemm="auto"):
        net.fit(x, y, epochs=1, batch_size=16, verbose=0)
        assert backend.routes                                 # its products were routed
    net.free()
