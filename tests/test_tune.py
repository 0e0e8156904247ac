"""`portanet tune` (portanet/tuning.py) and its database (portanet/backends/gemm/tuned.py): the
search on PoCL with a tiny budget on a product no tile divides, the database (round trip,
merge, which file wins, corrupt files, keys), apply(), the command, and the devices it
refuses. The database is a file in tmp_path throughout: no test reads or writes the
user's. Timings are measured, never asserted on."""
import json
import logging
import os

import pytest
from click.testing import CliRunner

import portanet as pn
from portanet import tuning
from portanet.backends import opencl, sources
from portanet.backends.gemm import tiling as gemm_tiling
from portanet.backends.gemm import tuned as database
from portanet.cli import main
from portanet.errors import DeviceError, PortanetError

SIZE, BUDGET = 67, 3            # PoCL builds each tiling in about four seconds


@pytest.fixture(autouse=True)
def databases(tmp_path, monkeypatch):
    """The user's and the shipped database, both in tmp_path (neither there yet)."""
    user, shipped = tmp_path / "user" / "tuning.json", tmp_path / "shipped.json"
    monkeypatch.setattr(database, "user_path", lambda: user)
    monkeypatch.setattr(database, "SHIPPED", shipped)
    database.forget()
    yield user, shipped
    database.forget()


@pytest.fixture(scope="module")
def pocl():
    """A PoCL backend of this module's own: the tilings and vendor_k these tests set on it
    reach no other test's backend."""
    try:
        p, d = map(int, pn.device("opencl:pocl").name.split(":")[1:])
    except DeviceError as e:
        pytest.skip(f"opencl:pocl unavailable here: {e}")
    return opencl.OpenCLBackend(p, d)


@pytest.fixture(scope="module")
def tuned(pocl):
    """(result, the backend's tiling, path and vendor_k before tuning). The backend runs
    another tiling than its default, as after apply(): the search measures the default
    first, then starts from the tiling in use."""
    pocl.set_gemm_params(pocl.gemm_default)         # as untuned, whatever the database says
    pocl.set_gemm_params(other_tiling(pocl))
    before = (dict(pocl.gemm_params), pocl.gemm_path, getattr(pocl, "vendor_k", "absent"))
    lines = []
    result = tuning.tune(pocl, budget=BUDGET, size=SIZE, quick=True, progress=lines.append)
    result["lines"] = lines
    return result, before


@pytest.fixture
def restored(pocl):
    """Puts the backend's tiling and vendor_k back after a test that applies an entry."""
    params = dict(pocl.gemm_params)
    had, k = hasattr(pocl, "vendor_k"), getattr(pocl, "vendor_k", None)
    yield pocl
    pocl.set_gemm_params(params)
    if had:
        pocl.vendor_k = k
    elif hasattr(pocl, "vendor_k"):
        del pocl.vendor_k


def unfit_tiling(bk):
    """A tiling a tuning may give that does not fit bk's limits (a larger device's: more
    work-items per group, or more local memory)."""
    import itertools
    values = database.tuned_values()
    names = ("TSM", "TSN", "TSK", "WPTM", "WPTN")
    for chosen in itertools.product(*(values[k] for k in names)):
        p = dict(gemm_tiling.GEMM_DEFAULTS, **dict(zip(names, chosen)), DB=1, PAD=4)
        if database._params_problem(p) is None and not bk.gemm_fits(p):
            return p
    pytest.fail(f"every tiling fits {bk}")


def other_tiling(bk):
    """A tiling that fits bk and is not its current one."""
    current = {**gemm_tiling.GEMM_DEFAULTS, **bk.gemm_params}
    for name, values in gemm_tiling.GEMM_SPACE.items():
        for v in values:
            p = {**current, name: v}
            if v != current[name] and bk.gemm_fits(p):
                return p
    pytest.fail(f"no other tiling fits {bk}")


def test_winner_fits_is_right_and_no_slower_than_the_default(pocl, tuned):
    result, before = tuned
    rows = result["candidates"]
    assert 1 <= len(rows) <= BUDGET and result["size"] == SIZE
    assert pocl.gemm_fits(result["params"])
    by_params = {tuple(sorted(r["params"].items())): r for r in rows}
    winner = by_params[tuple(sorted(result["params"].items()))]
    default = by_params[tuple(sorted(result["default"].items()))]
    assert winner["status"] == default["status"] == "ok"
    assert rows[0] is default and rows[1]["params"] == before[0] == result["start"]
    # the best is kept as the fastest measured: at least the default's own figure
    assert winner["gflops"] >= default["gflops"] == result["gflops"]["default"]
    assert result["gflops"]["tuned"] == winner["gflops"]
    for r in rows + result["checks"]:
        assert r["status"] != "ok" or r["error"] <= tuning.ERROR_BOUND, r
    for trans in ("NT", "TN"):
        assert result["gflops"][trans] > 0 and result["errors"][trans] <= tuning.ERROR_BOUND
    # a header, then one line per candidate
    assert len(result["lines"]) == 1 + len(rows) and "(default)" in result["lines"][1]
    assert "tuned" in tuning.summary(result) and "(default)" in tuning.table(result)
    # the backend is left as it was
    assert (dict(pocl.gemm_params), pocl.gemm_path,
            getattr(pocl, "vendor_k", "absent")) == ({**gemm_tiling.GEMM_DEFAULTS, **before[0]},
                                                     *before[1:])


class _Limits:
    """What _search asks of a backend: a name and gemm_fits, here for 1024 work-items."""
    name = "a device of 1024 work-items"

    @staticmethod
    def gemm_fits(p):
        return gemm_tiling.gemm_fits(p, 1024, 65536)


def test_the_search_keeps_the_fastest_within_the_budget():
    start = {**gemm_tiling.GEMM_DEFAULTS, **gemm_tiling.CPU_TILES}
    measured = []

    def evaluate(p):            # larger tiles are faster; TSK 32 fails to build
        rec = {"params": p, "status": "ok", "seconds": 1.0 / (p["TSM"] * p["TSN"])}
        if p["TSK"] == 32:
            rec.update(status="build failed: TSK 32", seconds=None)
        measured.append(rec)
        return rec
    best, exhausted = tuning._search(_Limits, evaluate, start, start, 5)
    assert exhausted and len(measured) == 5
    assert best["seconds"] == min(r["seconds"] for r in measured if r["status"] == "ok")
    measured.clear()
    best, exhausted = tuning._search(_Limits, evaluate, start, start, 100)
    assert not exhausted
    tried = [tuple(sorted(r["params"].items())) for r in measured]
    assert len(tried) == len(set(tried))                          # none measured twice
    area = [r["params"]["TSM"] * r["params"]["TSN"] for r in measured if r["status"] == "ok"]
    assert best["params"]["TSM"] * best["params"]["TSN"] == max(area) >= 128 * 128
    assert all(_Limits.gemm_fits(r["params"]) for r in measured)

    def broken(p):
        return {"params": p, "status": "rejected: error 1e+00 > 1e-05", "seconds": None}
    with pytest.raises(PortanetError, match="rejected"):
        tuning._search(_Limits, broken, start, start, 5)


def test_a_move_that_does_not_fit_alone_is_tried_with_one_repair():
    def fits(p):
        return gemm_tiling.gemm_fits(p, 1024, 65536)
    start = {**gemm_tiling.GEMM_DEFAULTS, **gemm_tiling.CPU_TILES}            # PAD 1: no MICRO 1 alone
    moved = {**start, "MICRO": 1}
    assert fits(start) and not fits(moved)
    repaired = tuning._fitting(moved, "MICRO", fits)
    assert fits(repaired) and repaired["MICRO"] == 1
    assert len([k for k in start if start[k] != repaired[k]]) == 2
    assert tuning._fitting(start, "TSM", fits) == start
    # 64 x 64 work-items where 256 fit: no one change brings them under
    assert tuning._fitting({**start, "TSM": 128, "WPTM": 2, "TSN": 128, "WPTN": 2}, "TSM",
                           lambda p: gemm_tiling.gemm_fits(p, 256, 65536)) is None


def test_vendor_k_is_the_longest_accurate_k(pocl, tuned):
    result, _ = tuned
    if not pocl.vendor_gemm:
        assert result["vendor_k"] is None
        pytest.skip("no CLBlast here (pip install pyclblast): no vendor GEMM to measure")
    errors = {int(k): e for k, e in result["vendor_errors"].items()}
    assert sorted(errors) == list(tuning.VENDOR_KS[:len(errors)])   # up to the first over
    k = result["vendor_k"]
    assert k in tuning.VENDOR_KS
    assert all(e <= tuning.VENDOR_BOUND for kk, e in errors.items()
               if tuning.VENDOR_KS[0] < kk <= k)
    longer = [kk for kk in tuning.VENDOR_KS if kk > k]
    assert not longer or errors[longer[0]] > tuning.VENDOR_BOUND
    assert result["vendor"]["gflops"] > 0


def test_entries_round_trip_and_merge(pocl, tuned, databases):
    result, _ = tuned
    user, _ = databases
    other = dict(result, key="opencl | another device | x | 1 | gemm 000000000000")
    tuning.save(other)
    assert database.lookup(pocl) is None
    assert tuning.save(result) == user
    assert database.lookup(pocl) == tuning.entry(result)
    entries = json.loads(user.read_text())["entries"]
    assert set(entries) == {other["key"], result["key"]}          # the other device's kept
    assert entries[result["key"]]["params"] == result["params"]
    assert [p.name for p in user.parent.iterdir()] == ["tuning.json"]   # no temp left
    database.forget()                                               # a new process, as it were
    assert database.lookup(pocl)["vendor_k"] == result["vendor_k"]


def test_a_search_per_size_each_applied_to_its_outputs(restored, databases):
    """Several sizes: a search each, largest first, the smaller starting from the larger's
    winner and the ladder under it; the entry keeps each size's tiling and apply() gives
    them to the backend by size class."""
    bk = restored
    bk.set_gemm_params(bk.gemm_default)
    result = tuning.tune(bk, budget=2, size=(SIZE - 30, SIZE), quick=True)
    large, small = result["sizes"]
    assert (large["size"], small["size"], result["size"]) == (SIZE, SIZE - 30, SIZE)
    assert result["params"] == large["params"] and small["start"] == large["params"]
    assert 1 <= small["evaluated"] <= 2 and small["gflops"]["tuned"] > 0
    assert bk.gemm_sizes == {} and "tuned tiling at 37^3" in tuning.summary(result)
    tuning.save(result)
    sizes = database.lookup(bk)["sizes"]
    assert {n: e["params"] for n, e in sizes.items()} == {
        str(SIZE): large["params"], str(SIZE - 30): small["params"]}
    assert database.apply(bk) is True
    assert bk.gemm_sizes == {SIZE: large["params"], SIZE - 30: small["params"]}
    assert bk.gemm_params == large["params"]


@pytest.mark.parametrize("sizes,why", [
    ([], "sizes is not an object"), ({"x": {"params": {"TSM": 32}}}, "sizes is not an object"),
    ({"64": {}}, "sizes is not an object"), ({"64": {"params": {"TSM": 1.5}}}, "TSM=1.5"),
    ({"64": {"params": {"WPTM": 0}}}, "sizes['64']: params WPTM=0")])
def test_an_entry_with_bad_sizes_is_ignored(pocl, databases, caplog, sizes, why):
    user, _ = databases
    user.parent.mkdir()
    user.write_text(json.dumps({"version": 1, "entries": {
        database.device_key(pocl): {"params": dict(gemm_tiling.CPU_TILES), "sizes": sizes}}}))
    with caplog.at_level(logging.WARNING, logger="portanet"):
        assert database.lookup(pocl) is None
    assert why in caplog.text


# what a hand-edited or damaged entry may hold: a value the kernel divides by that is zero,
# one no tuning gives (a negative tile built no kernel), a name that is not a parameter
# (names and values become the kernel's build options), a tiling inconsistent on every
# device (MICRO reads 4-wide runs of the local rows, which PAD 1 leaves unaligned)
BAD_PARAMS = [({"WPTM": 0}, "WPTM=0"), ({"TSM": -64}, "TSM=-64"), ({"TSM": 48}, "TSM=48"),
              ({"TSM -DTSK=3 -DX": 64}, "'TSM -DTSK=3 -DX', which is not a parameter"),
              ({"TSM": True}, "TSM=True is not a whole number"),
              ({"MICRO": 1, "PAD": 1}, "not a tiling the GEMM kernel builds")]


@pytest.mark.parametrize("params,why", BAD_PARAMS)
def test_a_bad_tiling_is_skipped_with_a_warning_naming_file_entry_and_reason(
        restored, databases, caplog, params, why):
    """Such entries made the device unusable (ZeroDivisionError as it was made, a
    KernelBuildError at its first GEMM, options passed to the compiler as written). The
    entry is skipped, said with the file, the entry and the reason; the file's other
    entries are used."""
    bk = restored
    user, _ = databases
    user.parent.mkdir()
    key, other = database.device_key(bk), "opencl | another device | x | 1 | gemm 000000000000"
    user.write_text(json.dumps({"version": 1, "entries": {
        key: {"params": dict(gemm_tiling.CPU_TILES, **params), "vendor_k": 4096},
        other: {"params": dict(gemm_tiling.CPU_TILES), "vendor_k": 2048}}}))
    default = dict(bk.gemm_params)
    with caplog.at_level(logging.WARNING, logger="portanet"):
        assert database.apply(bk) is False
    assert bk.gemm_params == default and getattr(bk, "vendor_k", None) != 4096
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and str(user) in said[0] and repr(key) in said[0], said
    assert why in said[0], said
    assert set(database._entries(user)) == {other}


def test_a_bad_tiling_does_not_keep_a_device_from_being_made(pocl, databases, caplog):
    user, _ = databases
    user.parent.mkdir()
    user.write_text(json.dumps({"version": 1, "entries": {
        database.device_key(pocl): {"params": dict(gemm_tiling.CPU_TILES, WPTM=0)}}}))
    p, d = map(int, pocl.name.split(":")[1:])
    with caplog.at_level(logging.WARNING, logger="portanet"):
        made = opencl.OpenCLBackend(p, d)
    assert made.gemm_params == made.gemm_default and "WPTM=0" in caplog.text


def test_every_tiling_the_search_can_give_is_a_valid_entry():
    """The tilings an entry may hold are the ones the search measures: the defaults of
    every class of device and the ladder below them as far as it fits (_tilings)."""
    for p in [gemm_tiling.GEMM_DEFAULTS, gemm_tiling.CPU_TILES, gemm_tiling.SMALL_TILES,
              gemm_tiling.gemm_params(True, 1024, 48 * 1024, 4), gemm_tiling.gemm_params(False, 64, 1152, 4)]:
        while p is not None and gemm_tiling.gemm_fits(p, 1 << 20, 1 << 30):
            assert database._params_problem(p) is None, p
            p = gemm_tiling._halved(p)


def test_user_path_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.undo()          # the real user_path, under a cache folder of the test's
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert database.user_path() == tmp_path / "portanet" / "tuning.json"


def test_the_users_entry_wins_over_the_shipped_one(pocl, tuned, databases):
    result, _ = tuned
    user, shipped = databases
    tuning.save(dict(result, vendor_k=2048), shipped)
    tuning.save(dict(result, vendor_k=4096))
    assert database.lookup(pocl)["vendor_k"] == 4096
    os.remove(user)
    database.forget()
    assert database.lookup(pocl)["vendor_k"] == 2048


@pytest.mark.parametrize("text", ["{not json", '{"version": 1}', '{"version": 99, "entries": {}}',
                                  "\xff\xfe"])
def test_a_corrupt_user_file_is_ignored_with_a_warning(pocl, tuned, databases, caplog, text):
    result, _ = tuned
    user, shipped = databases
    tuning.save(result, shipped)
    user.parent.mkdir()
    user.write_bytes(text.encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="portanet"):
        assert database.lookup(pocl) == tuning.entry(result)        # the shipped one
    assert "ignoring the GEMM tuning database" in caplog.text and str(user) in caplog.text


def test_a_bad_entry_is_ignored_and_a_corrupt_file_refused_when_saving(pocl, tuned, databases,
                                                                        caplog):
    result, _ = tuned
    user, _ = databases
    user.parent.mkdir()
    user.write_text(json.dumps({"version": 1, "entries": {
        result["key"]: {"params": {"TSM": "big"}}}}))
    with caplog.at_level(logging.WARNING, logger="portanet"):
        assert database.lookup(pocl) is None
        assert database.apply(pocl) is False
    assert "ignoring the entry" in caplog.text
    user.write_text("{not json")
    with pytest.raises(PortanetError, match="not valid JSON"):
        tuning.save(result)
    assert user.read_text() == "{not json" and database.lookup(pocl) is None
    user.unlink()
    assert tuning.save(result) == user and database.lookup(pocl) == tuning.entry(result)


def test_keys_change_with_the_kernel_source_and_the_driver(pocl, monkeypatch):
    key = database.device_key(pocl)
    info = pocl.info()
    assert key.startswith("opencl | ") and info["name"] in key and info["driver"] in key
    assert database.kernel_hash("cl") in key
    # the digest is of the source: an edited kernel hashes differently, and keys with it
    load = sources.load
    with monkeypatch.context() as m:
        m.setattr(sources, "load", lambda family, lang: (
            load(family, lang)[0], load(family, lang)[1] + "\n/* edited */\n"))
        edited = database.kernel_hash.__wrapped__("cl")
    digest = database.kernel_hash("cl")
    assert edited != digest
    with monkeypatch.context() as m:
        m.setattr(database, "kernel_hash", lambda lang: edited)
        assert database.device_key(pocl) == key.replace(digest, edited)
    with monkeypatch.context() as m:
        m.setattr(pocl, "info", lambda: dict(info, driver=info["driver"] + ".1"))
        assert database.device_key(pocl) != key
    assert database.device_key(pocl) == key


def test_apply_sets_the_tiling_and_vendor_k(restored, tuned, databases):
    bk = restored
    result, _ = tuned
    params = other_tiling(bk)
    tuning.save(dict(result, params=params, vendor_k=8192))
    assert database.apply(bk) is True
    assert bk.gemm_params == params and bk.vendor_k == 8192
    # a tiling of another device, which this one cannot run, is not used; vendor_k still is
    tuning.save(dict(result, params=unfit_tiling(bk), vendor_k=2048))
    assert database.apply(bk) is True
    assert bk.gemm_params == params and bk.vendor_k == 2048


def test_portanet_tuning_off_keeps_the_tiling_of_the_limits(restored, tuned, databases,
                                                            monkeypatch):
    bk = restored
    result, _ = tuned
    tuning.save(dict(result, params=other_tiling(bk)))
    params = dict(bk.gemm_params)
    monkeypatch.setenv("PORTANET_TUNING", "off")
    assert database.apply(bk) is False and bk.gemm_params == params
    monkeypatch.setenv("PORTANET_TUNING", "of")
    with pytest.raises(PortanetError, match="PORTANET_TUNING='of' is not understood"):
        database.apply(bk)
    monkeypatch.setenv("PORTANET_TUNING", "on")
    assert database.apply(bk) is True and bk.gemm_params != params


def test_apply_says_once_per_device_that_a_gpu_is_untuned(restored, monkeypatch, caplog):
    bk = restored
    with caplog.at_level(logging.INFO, logger="portanet"):
        assert database.apply(bk) is False
    assert "no tuned GEMM parameters" not in caplog.text      # a CPU: its limits suffice
    monkeypatch.setattr(bk, "is_gpu", True)
    with caplog.at_level(logging.INFO, logger="portanet"):
        assert database.apply(bk) is False
        assert database.apply(bk) is False
    said = [r.getMessage() for r in caplog.records if "no tuned GEMM" in r.getMessage()]
    assert len(said) == 1 and f"portanet tune --device {bk.name}" in said[0]


@pytest.mark.parametrize("spec,why", [("cpu", "NumPy reference"),
                                      ("opencl:oclgrind", "simulator")])
def test_the_cpu_and_the_simulator_are_refused(spec, why):
    try:
        bk = pn.device(spec)
    except DeviceError as e:
        pytest.skip(f"{spec} unavailable here: {e}")
    with pytest.raises(DeviceError, match=why):
        tuning.tune(bk)
    assert database.apply(bk) is False
    result = CliRunner().invoke(main, ["tune", "--device", spec])
    assert result.exit_code == 1 and why in result.output


def test_a_device_held_to_other_limits_is_neither_tuned_nor_tuned_for(pocl, tuned):
    result, _ = tuned
    p, d = map(int, pocl.name.split(":")[1:])
    mobile = opencl.OpenCLBackend(p, d, limits="mobile")      # a stand-in for a mobile GPU
    tuning.save(dict(result, params=other_tiling(mobile)))
    params = dict(mobile.gemm_params)
    assert database.apply(mobile) is False and mobile.gemm_params == params
    with pytest.raises(DeviceError, match="PORTANET_CL_LIMITS"):
        tuning.tune(mobile)


def test_the_command_quick(pocl, tmp_path, databases):
    out, measurements = tmp_path / "db.json", tmp_path / "tune.json"
    result = CliRunner().invoke(main, ["tune", "--device", "opencl:pocl", "--quick",
                                       "--output", str(out), "--json", str(measurements)])
    assert result.exit_code == 0, result.output
    assert "(default)" in result.output and f"saved to {out}" in result.output
    key = database.device_key(pn.device("opencl:pocl"))
    entries = json.loads(out.read_text())["entries"]
    assert list(entries) == [key] and entries[key]["size"] == tuning.QUICK_SIZE
    report = json.loads(measurements.read_text())
    assert report["devices"]["opencl:pocl"]["candidates"]
    assert not databases[0].exists()
    # without --output a quick search is shown, not kept
    result = CliRunner().invoke(main, ["tune", "--device", "opencl:pocl", "--quick",
                                       "--budget", "1"])
    assert result.exit_code == 0, result.output
    assert "not saved" in result.output and not databases[0].exists()


def test_the_shipped_database_is_one(monkeypatch):
    monkeypatch.undo()
    data = json.loads(database.SHIPPED.read_text())
    assert data["version"] == database.VERSION and isinstance(data["entries"], dict)
    for key, entry in data["entries"].items():
        assert database._entry_problem(entry) is None, key
    assert all(e["vendor_k"] is None or e["vendor_k"] >= tuning.VENDOR_KS[0]
               for e in data["entries"].values())


def test_the_shipped_entries_are_for_these_kernels(monkeypatch):
    """Every shipped entry is keyed by the kernel digest of this tree: an edit of gemm.cl or
    a prelude untunes every device (an H100's LeNet step went from 0.28 to
    0.34 ms when a prelude macro was added): tune again, or re-key where
    bench/gemm_same_tokens.py finds the GEMM unchanged."""
    monkeypatch.undo()
    data = json.loads(database.SHIPPED.read_text())
    digests = {"cuda": database.kernel_hash("cu"), "opencl": database.kernel_hash("cl")}
    for key in data["entries"]:
        assert key.endswith(f"gemm {digests[key.split(' | ')[0]]}"), key


NOT_A_DATABASE = [("[" * 2000 + "]" * 2000, "nested 2000 levels deep"),
                  ('{"version": 99, "entries": {}}', "version 99"),
                  ('{"name": "my settings"}', "not a portanet tuning database"),
                  ("{not json", "not valid JSON")]


@pytest.mark.parametrize("text,why", NOT_A_DATABASE)
def test_tune_refuses_an_output_that_is_not_a_database_before_the_search(
        tmp_path, monkeypatch, text, why):
    """Such a file was refused (or a RecursionError raised) only after the whole search,
    whose result was lost; it is refused before, and left as it was."""
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: pytest.fail("searched first"))
    out = tmp_path / "db.json"
    out.write_text(text)
    result = CliRunner().invoke(main, ["tune", "--device", "cpu", "--quick", "--output",
                                       str(out)])
    assert result.exit_code == 1 and why in result.output and str(out) in result.output, \
        result.output
    assert "Traceback" not in result.output and out.read_text() == text
    with pytest.raises(PortanetError, match=why):
        tuning.save({"key": "opencl | a device | x | 1 | gemm 000000000000"}, out)
    assert out.read_text() == text and [p.name for p in tmp_path.iterdir()] == ["db.json"]


def test_tune_checks_where_it_writes_before_the_search(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: pytest.fail("searched first"))
    os.mkfifo(tmp_path / "fifo")
    for args, why in [(["--output", str(tmp_path / "fifo")], "FIFO"),
                      (["--json", str(tmp_path / "no" / "t.json")], "does not exist")]:
        result = CliRunner().invoke(main, ["tune", "--device", "cpu", "--quick", *args])
        assert result.exit_code == 1 and why in result.output, result.output


def test_a_database_that_is_not_a_regular_file_is_ignored(databases, caplog):
    """A FIFO as the user's database blocked every device's making on its reading."""
    import threading
    user, _ = databases
    user.parent.mkdir()
    os.mkfifo(user)
    read = []
    reader = threading.Thread(target=lambda: read.append(database._entries(user)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="portanet"):
        reader.start()
        reader.join(10)
    if reader.is_alive():
        with open(user, "w"):           # lets the blocked reader go
            pass
        pytest.fail("reading the tuning database blocked on a FIFO")
    assert read == [{}] and "not a regular file" in caplog.text and str(user) in caplog.text
