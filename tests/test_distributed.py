"""Data-parallel training on this machine's CPU: 2 and 3 MPI ranks (mpiexec,
oversubscribed on two cores) train a Fashion-MNIST subset two epochs, and every rank's
weights equal a one-process run over the same global batches within 1e-5 (relative, per
tensor), for the MLP and a LeNet, with SGD and Adam, with uneven shares (a short last
batch, balance), and in a mixed job of a cpu rank and a PoCL rank. The same without MPI:
processes started as torchrun and srun start them (their variables and a rendezvous),
also as two groups, as two hosts would be."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portanet as pn
from portanet import distributed, launch
from portanet.errors import InputError

WORKER = Path(__file__).with_name("distributed_worker.py")
TOLERANCE = 1e-5


def _fashion_mnist():
    """Skip where Fashion-MNIST, which the worker trains on, is not installed."""
    try:
        pn.load_dataset("fashion-mnist")
    except pn.DataError as e:
        pytest.skip(f"Fashion-MNIST is not installed here: {e}")


def _mpiexec():
    pytest.importorskip("mpi4py")
    found = shutil.which("mpiexec") or shutil.which("mpiexec", path=os.path.dirname(
        sys.executable))
    if not found:
        pytest.skip("no mpiexec here (pip install 'portanet[mpi]')")
    _fashion_mnist()
    return found


def mpi_job(ranks, args, devices="cpu", engine="mpi"):
    """`mpiexec -n ranks python args...` with PORTANET_DEVICE=devices, checked."""
    job = subprocess.run([_mpiexec(), "-n", str(ranks), sys.executable, *map(str, args)],
                         env=dict(os.environ, PORTANET_DEVICE=devices, PORTANET_DIST=engine),
                         capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout + job.stderr
    return job


def run(tmp_path, model, ranks, devices="cpu", samples=600, batch=50, optimizer="sgd",
        balanced=False, seed_by_rank=False, engine="mpi"):
    """Every rank's {name: array} after the job, and the one-process run's over the same
    global batches (batch x ranks)."""
    common = [model, "--samples", str(samples), "--optimizer", optimizer]
    mpi_job(ranks, [WORKER, *common, tmp_path, "--batch", batch]
            + (["--balanced"] if balanced else [])
            + (["--seed-by-rank"] if seed_by_rank else []), devices, engine)
    return ([dict(np.load(tmp_path / f"{r}.npz")) for r in range(ranks)],
            alone_run(tmp_path, model, samples, batch * ranks, optimizer))


def alone_run(tmp_path, model, samples, batch, optimizer):
    """The one-process run's {name: array}: the worker --alone on cpu at `batch`."""
    alone = tmp_path / "alone"
    alone.mkdir()
    single = subprocess.run([sys.executable, str(WORKER), model, "--samples", str(samples),
                             "--optimizer", optimizer, str(alone), "--alone", "--batch",
                             str(batch)],
                            env=dict(os.environ, PORTANET_DEVICE="cpu"), capture_output=True,
                            text=True, timeout=600)
    assert single.returncode == 0, single.stdout + single.stderr
    return dict(np.load(alone / "0.npz"))


def assert_same(ranks, alone):
    names = [k for k in alone if k not in ("device", "loss", "engine", "peer_sum")]
    for r, got in enumerate(ranks):
        for name in names:
            err = np.linalg.norm(got[name] - alone[name]) / max(np.linalg.norm(alone[name]),
                                                                 1e-30)
            assert err <= TOLERANCE, f"rank {r}, {name}: relative error {err:.2e}"
        assert np.allclose(got["loss"], alone["loss"], rtol=1e-5)


@pytest.mark.parametrize("model, ranks, optimizer", [
    ("mlp", 2, "sgd"), ("mlp", 3, "adam"), ("lenet", 2, "sgd"), ("lenet", 3, "sgd")])
def test_ranks_train_as_one_process_over_the_global_batch(tmp_path, model, ranks, optimizer):
    # 600 samples in global batches of 100 (2 ranks) or 150 (3)
    got, alone = run(tmp_path, model, ranks, optimizer=optimizer)
    assert_same(got, alone)
    # and training did something that a wrong average would not give
    start = pn.mlp((784,), hidden=(64,), seed=3, device="cpu").get_weights() \
        if model == "mlp" else None
    if start:
        assert np.linalg.norm(got[0]["0.w"] - start["0.w"]) > 100 * TOLERANCE * \
            np.linalg.norm(start["0.w"])


def test_a_short_last_batch_and_empty_shares(tmp_path):
    # 3 ranks, batches of 3 x 40 = 120: 250 samples end with 10 (shares 4, 3, 3), and
    # 241 with 1 (shares 1, 0, 0: two ranks take the step on no samples)
    for samples in (250, 241):
        folder = tmp_path / str(samples)
        folder.mkdir()
        got, alone = run(folder, "mlp", 3, samples=samples, batch=40)
        assert_same(got, alone)


def test_balanced_shares_give_the_same_step(tmp_path):
    # rates 1, 2, 3: shares of a global batch of 150 are 25, 50 and 75
    got, alone = run(tmp_path, "mlp", 3, balanced=True)
    assert_same(got, alone)


def _opencl_cpu():
    """A CPU OpenCL device here (PoCL, else Intel's), or a skip. A device whose compiler
    builds nothing is unavailable already (pn.device refuses it)."""
    reasons = []
    for spec in ("opencl:pocl", "opencl:intel"):
        try:
            pn.device(spec)
            return spec
        except pn.DeviceError as e:
            reasons.append(f"{spec}: {e}")
    pytest.skip("no CPU OpenCL device here: " + "; ".join(reasons))


def test_a_mixed_job_of_cpu_and_opencl(tmp_path):
    # the OpenCL rank's buckets are staged through pinned memory by the averaging's worker
    spec = _opencl_cpu()
    got, alone = run(tmp_path, "lenet", 2, f"cpu,{spec}")
    assert str(got[0]["device"]) == "cpu" and str(got[1]["device"]).startswith("opencl:")
    assert_same(got, alone)
    (tmp_path / "adam").mkdir()
    got, alone = run(tmp_path / "adam", "mlp", 2, f"{spec},{spec}", optimizer="adam")
    assert_same(got, alone)


def test_shares_add_up_and_follow_the_rates():
    group = distributed.Group(None, 0, 3, 0, ["cpu"] * 3, "mpi", [1.0, 1.0, 1.0])
    assert group.shares(10) == [4, 3, 3] and group.shares(2) == [1, 1, 0]
    fast = distributed.Group(None, 1, 2, 1, ["cpu"] * 2, "mpi", [3.0, 1.0])
    assert fast.shares(100) == [75, 25]
    idx, weight = fast.part(np.arange(100), [75, 25])
    assert list(idx) == list(range(75, 100)) and weight == 0.25


def test_devices_per_local_rank():
    assert distributed.device_for(1, "cuda:{local_rank}") == "cuda:1"
    assert distributed.device_for(1, "cuda:0, opencl:0:0") == "opencl:0:0"
    assert distributed.device_for(0, None) is None
    with pytest.raises(InputError, match="local rank 2 has none"):
        distributed.device_for(2, "cuda:0,opencl:0:0")
    with pytest.raises(InputError, match="local_rank"):
        distributed.device_for(0, "cuda:{rank}")


def test_the_train_command_over_two_ranks(tmp_path):
    save = tmp_path / "net.safetensors"
    job = mpi_job(2, ["-m", "portanet.cli", "train", "--distributed", "--balance", "--limit",
                      400, "--test-limit", 200, "--epochs", 1, "--batch-size", 32, "--save",
                      save, "--json"])
    lines = job.stdout.splitlines()
    assert sum(line.startswith("epoch 1/1") for line in lines) == 1     # rank 0 alone
    assert sum(line.startswith("test loss") for line in lines) == 1
    result = json.loads(lines[-1])
    assert result["distributed"]["ranks"] == 2 and len(result["distributed"]["rates"]) == 2
    assert "2 ranks over mpi" in job.stderr and save.exists()
    assert pn.load(save).predict(np.zeros((1, 1, 28, 28), np.float32)).shape == (1, 10)


def test_the_distributed_bench(tmp_path):
    # cpu and OpenCL: OpenCL records steps, and the distributed step must average all the same
    spec = _opencl_cpu()
    out = tmp_path / "bench.json"
    job = mpi_job(2, ["-m", "portanet.cli", "bench", "--distributed", "--workload",
                      "mlp-small", "--json", out], f"cpu,{spec}")
    report = json.loads(out.read_text())
    assert report["distributed"]["ranks"] == 2 and report["distributed"]["engine"] == "mpi"
    rows = report["results"]
    assert sorted(r["rank"] for r in rows) == [0, 1]
    for r in rows:
        # the three layers' 2.2 MB: one bucket, which the first bucket's 1 MiB does not end
        assert r["averages_per_step"] == 1
        assert r["throughput"] == pytest.approx(2 * 1000 / r["median_s"])
        assert r["scaling_efficiency"] == pytest.approx(r["alone"]["median_s"] / r["median_s"])
    lines = job.stdout.splitlines()         # rank 0's rows as they come, then every rank's
    assert sum("efficiency" in line for line in lines[lines.index("every rank:"):]) == 2
    assert "DDP unavailable: DDP is timed on jobs of CUDA ranks" in lines[-1]


TRAIN_BATCH = """
import sys, numpy as np, portanet as pn
group = pn.distributed.init()
rng = np.random.default_rng(7)
x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 3, 30)
sizes = [10, 20]        # rank r trains on its own batch: x[:10] and x[10:30]
net = pn.mlp((6,), classes=3, hidden=(8,), device="cpu")
if group.rank == 0:
    net.train_batch(x[:10], y[:10], pn.SGD(0.1, 0.9))
else:
    net.train_batch(x[10:], y[10:], pn.SGD(0.1, 0.9))
np.savez(sys.argv[1] + f"/{group.rank}.npz", **net.get_weights())
"""


def test_train_batch_of_each_rank_is_one_step_over_all(tmp_path):
    mpi_job(2, ["-c", TRAIN_BATCH, tmp_path])
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 3, 30)
    alone = pn.mlp((6,), classes=3, hidden=(8,), device="cpu")
    alone.train_batch(x, y, pn.SGD(0.1, 0.9))
    assert_same([dict(np.load(tmp_path / f"{r}.npz"), loss=0) for r in range(2)],
                dict(alone.get_weights(), loss=0))


PLAN = """
import sys, portanet as pn
group = pn.distributed.init()
with open(f"{sys.argv[1]}/{group.rank}.txt", "w") as f:    # not stdout: lines may interleave
    f.write(str(pn.mlp((784,), hidden=(64,)).memory_plan(32)))
"""


def test_the_memory_plan_says_the_job(tmp_path):
    mpi_job(2, ["-c", PLAN, tmp_path], "cpu,cpu")
    assert "rank 0 of 2 over mpi, devices cpu, cpu" in (tmp_path / "0.txt").read_text()
    assert "rank 1 of 2" in (tmp_path / "1.txt").read_text()


BALANCE = """
import time, sys, numpy as np, portanet as pn
group = pn.distributed.init()
probe = pn.mlp((6,), classes=3, hidden=(8,))
if group.rank == 1:                 # a slower device
    step = probe.train_batch
    probe.train_batch = lambda *a: (time.sleep(0.02), step(*a))
x = np.zeros((64, 6), np.float32)
group.balance(pn.distributed.step_rate(probe, x, np.zeros(64, np.int64), pn.SGD(0.1)))
if group.rank == 0:                 # one line: two ranks' prints may interleave
    print(group.shares(100), flush=True)
"""


def test_balance_measures_each_rank_alone(tmp_path):
    job = mpi_job(2, ["-c", BALANCE])
    shares = json.loads(job.stdout.strip())
    assert shares[0] > 75 and sum(shares) == 100    # rank 1 sleeps 20 ms a step; equal: 50


def test_ranks_start_from_rank_0s_weights(tmp_path):
    got, alone = run(tmp_path, "mlp", 2, seed_by_rank=True)
    assert_same(got, alone)


def test_a_rank_that_trains_something_else_ends_the_job(tmp_path):
    mpiexec = _mpiexec()
    job = subprocess.run([mpiexec, "-n", "2", sys.executable, str(WORKER), "mlp", str(tmp_path),
                          "--samples-by-rank"], env=dict(os.environ, PORTANET_DEVICE="cpu"),
                         capture_output=True, text=True, timeout=300)
    assert job.returncode != 0
    assert "rank 1 is not training what rank 0 is (samples: 599 here, 600 on rank 0" in \
        job.stderr


@pytest.mark.parametrize("model, engine", [("mlp", "nccl"), ("lenet", "nccl"),
                                           ("lenet", "mpi")])
def test_two_gpus(tmp_path, model, engine):
    """NCCL (nccl4py) between two CUDA GPUs, and MPI's host staging (pinned pieces, the
    worker) from them: as ever, the one-process run."""
    if engine == "nccl":
        pytest.importorskip("nccl.core")
    try:
        pn.device("cuda:1")
    except pn.DeviceError as e:
        pytest.skip(f"this test needs two CUDA GPUs: {e}")
    got, alone = run(tmp_path, model, 2, "cuda:{local_rank}", engine=engine)
    assert [str(g["device"]) for g in got] == ["cuda:0", "cuda:1"]
    assert all(str(g["engine"]) == engine for g in got)
    assert len({bool(g["peer_sum"]) for g in got}) == 1     # every rank decides alike
    assert engine == "nccl" or not got[0]["peer_sum"]
    assert_same(got, alone)


def test_engines_that_cannot_serve_say_so():
    pytest.importorskip("mpi4py")
    for engine, words in (("gloo", "'gloo' is not an engine portanet has: auto, nccl, mpi, tcp"),
                          ("nccl", "nccl")):
        job = subprocess.run([sys.executable, "-c", "import portanet as pn; "
                              f"pn.distributed.init(engine={engine!r})"],
                             env=dict(os.environ, PORTANET_DEVICE="cpu"), capture_output=True,
                             text=True, timeout=120)
        assert job.returncode != 0 and "InputError" in job.stderr and words in job.stderr
        if engine == "nccl":        # nccl4py missing, or a cpu rank: each names the fix
            assert "portanet[nccl]" in job.stderr or "CUDA devices only" in job.stderr
    job = subprocess.run([sys.executable, "-c", "import portanet as pn; "
                          "pn.distributed.init(engine='tcp')"],
                         env=dict(os.environ, PORTANET_DEVICE="cpu"), capture_output=True,
                         text=True, timeout=120)
    assert job.returncode != 0 and "PORTANET_DIST=tcp needs portanet's rendezvous" in job.stderr


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_an_empty_share_averages_in_backwards_order(monkeypatch, precision):
    """A rank with no samples (null_step) averages each layer's target where the others'
    backward does, layer for layer: a Residual block's projection comes before its layers
    in float32 and after them in 16 bits. Recorded by a group that notes each target's
    size, in one process."""
    net = pn.Sequential([pn.Conv2D(4, 3, padding=1), pn.BatchNorm("relu"),
                         pn.Residual([pn.Conv2D(6, 3, stride=2, padding=1), pn.BatchNorm()],
                                     activation="relu"),
                         pn.Flatten(), pn.Dense(3, "softmax")], input_shape=(1, 6, 6),
                        device="cpu", precision=precision, seed=0)
    sizes = []

    class Recorder:                             # one rank alone, noting the averagings
        records = False

        def averaging(self, bk):
            return self

        def add(self, target, share):
            sizes.append(target.size)

        def end(self, share):
            pass

        def sum(self, values):
            return list(values)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 1, 6, 6)).astype(np.float32), np.arange(4) % 3
    net.train_batch(x, y)                       # the optimizer's state made alone
    recorder = Recorder()
    recorder.group = recorder                   # its own averaging (Buckets.group)
    monkeypatch.setattr(distributed, "current", lambda: recorder)
    net.train_batch(x, y)
    stepped, sizes[:] = list(sizes), []
    net.plan.state.others_update()
    assert sizes == stepped and len(stepped) == 6


# -- launched as torchrun and srun launch: no MPI ------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launched_job(args, local_ranks, devices="cpu", slurm=False, check=True):
    """The processes of a job started as torchrun starts them (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT; with slurm, srun's SLURM_* names instead), one per
    entry of local_ranks: [(returncode, stdout, stderr)] in rank order."""
    port = _free_port()
    jobs = []
    for rank, local in enumerate(local_ranks):
        names = (("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID") if slurm
                 else ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PORTANET_PORT")
               and not k.startswith(("SLURM_", "OMPI_", "PMI"))}
        env.update(zip(names, map(str, (rank, len(local_ranks), local))),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1),    # ours: + 1
                   PORTANET_DEVICE=devices)
        jobs.append(subprocess.Popen([sys.executable, *map(str, args)], env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for job in jobs:
        try:
            stdout, stderr = job.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for j in jobs:
                j.kill()
            raise
        out.append((job.returncode, stdout, stderr))
    if check:
        for rank, (code, stdout, stderr) in enumerate(out):
            assert code == 0, f"rank {rank}: {stdout}{stderr}"
    return out


@pytest.mark.parametrize("model, optimizer, local_ranks, slurm", [
    ("mlp", "adam", (0, 1), False),
    ("lenet", "sgd", (0, 1), True),
    ("mlp", "sgd", (0, 1, 0, 1), False)])       # two groups, as on two hosts
def test_a_job_without_mpi_trains_as_one_process(tmp_path, model, optimizer, local_ranks,
                                                 slurm):
    _fashion_mnist()
    ranks = len(local_ranks)
    launched_job([WORKER, model, "--samples", 600, "--optimizer", optimizer, tmp_path,
                  "--batch", 200 // ranks], local_ranks, devices="cpu,cpu", slurm=slurm)
    got = [dict(np.load(tmp_path / f"{r}.npz")) for r in range(ranks)]
    assert all(str(g["engine"]) == "tcp" for g in got)      # auto, on cpu ranks
    assert_same(got, alone_run(tmp_path, model, 600, 200, optimizer))


def test_a_failing_rank_ends_a_job_without_mpi(tmp_path):
    _fashion_mnist()
    (code0, _, err0), (code1, _, err1) = launched_job(
        [WORKER, "mlp", tmp_path, "--samples-by-rank"], (0, 1), check=False)
    assert code1 != 0 and "rank 1 is not training what rank 0 is (samples: 599 here" in err1
    assert code0 != 0 and "rank 1 left the job without finishing" in err0


def test_launch_reads_torchrun_and_slurm():
    assert launch.numbers({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)
    assert launch.numbers({"SLURM_PROCID": "2", "SLURM_NTASKS": "3",
                           "SLURM_LOCALID": "0"}) == (2, 3, 0)
    assert launch.numbers({"LOCAL_RANK": "1"}) == (None, None, 1)      # an mpiexec's
    assert launch.numbers({}) is None
    with pytest.raises(InputError, match="RANK=4 but WORLD_SIZE=4"):
        launch.numbers({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(InputError, match="WORLD_SIZE='two' must be a whole number"):
        launch.numbers({"RANK": "0", "WORLD_SIZE": "two"})
    assert launch.rendezvous({"MASTER_ADDR": "node7", "MASTER_PORT": "29500"}) == \
        ("node7", 29501)
    assert launch.rendezvous({"MASTER_ADDR": "node7", "MASTER_PORT": "29500",
                              "PORTANET_PORT": "4000"}) == ("node7", 4000)
    assert launch.rendezvous({"MASTER_PORT": "29500"}) is None


def test_mpiexec_inside_a_slurm_job_is_not_slurm_s_rank():
    # an sbatch script's variables, then mpiexec's ranks
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
           "PMI_RANK": "1", "MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
    assert launch.numbers(env) is None
    assert launch.numbers(dict(env, OMPI_COMM_WORLD_RANK="1", PMI_RANK="")) is None
    assert launch.numbers(dict(env, PMI_RANK="")) == (0, 1, 0)      # srun's own task


def _rank_0(port, size=2, token="job-a"):
    """A TcpChannel of rank 0 set up in a thread: (thread, {"channel" or "error": ...})."""
    import threading
    out = {}

    def listen():
        try:
            out["channel"] = launch.TcpChannel(0, size, "127.0.0.1", port, connect_s=20,
                                               token=token)
        except Exception as e:
            out["error"] = e
    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    return thread, out


def test_the_rendezvous_drops_what_is_not_a_rank_of_its_job():
    import time
    port = _free_port()
    thread, out = _rank_0(port)
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", port)):
        pass                                            # connects and leaves
    stray = socket.create_connection(("127.0.0.1", port))
    stray.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)      # not a rank's words
    other_job = launch.TcpChannel.__new__(launch.TcpChannel)
    other_job.rank, other_job.size, other_job.address, other_job.port = 1, 2, "127.0.0.1", port
    other_job.token = b"job-b".ljust(16, b"\0")
    other_job._connect(5, b"t").close()                 # another job on the port
    rank_1 = launch.TcpChannel(1, 2, "127.0.0.1", port, connect_s=20, token="job-a")
    thread.join(20)
    stray.close()
    assert "channel" in out, out
    ch = out["channel"]
    import threading
    got = {}
    peer = threading.Thread(target=lambda: got.update(one=rank_1.allgather("one")))
    peer.start()
    assert ch.allgather("zero") == ["zero", "one"]
    peer.join(10)
    assert got["one"] == ["zero", "one"]
    rank_1.close()                  # both leave whole: no watch line ends this process
    ch.close()


def test_ranks_that_disagree_on_the_size_are_refused():
    import time
    port = _free_port()
    thread, out = _rank_0(port, size=2)
    time.sleep(0.3)
    # rank 1 in a process of its own: rank 0's refusal ends it (its watch line closes, or
    # rank 0 stopped listening before rank 1's second line)
    rank_1 = subprocess.run([sys.executable, "-c", "import time; from portanet import launch; "
                             f"launch.TcpChannel(1, 3, '127.0.0.1', {port}, connect_s=5, "
                             "token='job-a'); time.sleep(30)"],
                            capture_output=True, text=True, timeout=60)
    thread.join(20)
    assert "rank 1 says the job has 3 ranks, rank 0 2" in str(out.get("error"))
    assert rank_1.returncode != 0 and ("rank 0 left the job without finishing" in rank_1.stderr
                                       or "could not reach rank 0" in rank_1.stderr)


def test_a_rank_that_cannot_reach_rank_0_says_so():
    ch = None
    with pytest.raises(InputError, match="rank 1 could not reach rank 0 at 127.0.0.1:"):
        ch = launch.TcpChannel(1, 2, "127.0.0.1", _free_port(), connect_s=0.5)
    assert ch is None


@pytest.mark.parametrize("model, optimizer", [("mlp", "adam"), ("lenet", "sgd")])
def test_nccl_without_mpi(tmp_path, model, optimizer):
    """Two CUDA GPUs started as torchrun starts them: engine auto is NCCL, its rendezvous
    portanet's own, its steps recorded; as ever, the one-process run."""
    pytest.importorskip("nccl.core")
    try:
        pn.device("cuda:1")
        pn.load_dataset("fashion-mnist")
    except (pn.DeviceError, pn.DataError) as e:
        pytest.skip(f"NCCL's test needs two CUDA GPUs and Fashion-MNIST: {e}")
    launched_job([WORKER, model, "--samples", 600, "--optimizer", optimizer, tmp_path,
                  "--batch", 100], (0, 1), devices="cuda:{local_rank}")
    got = [dict(np.load(tmp_path / f"{r}.npz")) for r in range(2)]
    assert [str(g["device"]) for g in got] == ["cuda:0", "cuda:1"]
    assert all(str(g["engine"]) == "nccl" for g in got)
    assert_same(got, alone_run(tmp_path, model, 600, 200, optimizer))


@pytest.mark.parametrize("threads", [True, False])
def test_host_staging_in_pieces(monkeypatch, threads):
    """A bucket of two targets on a CPU OpenCL device, in pieces of 1000 bytes: each
    scaled, summed (by a channel of two ranks that hold the same) and written back, on the
    worker thread or, where the channel takes no threads, at once."""
    bk = pn.device(_opencl_cpu())
    monkeypatch.setattr(distributed, "CHUNK_BYTES", 1000)

    class Twice:                    # two ranks holding the same values
        kind = "tcp"

        def __init__(self):
            self.sizes = []

        def sum(self, array):
            self.sizes.append(array.size)
            array *= 2
    channel = Twice()
    channel.threads = threads
    engine = distributed._Host(type("Group", (), {"channel": channel})())
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(n).astype(np.float32) for n in (1001, 77)]
    targets = [bk.upload(v) for v in values]
    for step in range(2):           # the pinned vectors kept are used again
        engine.reduce(bk, targets, 0.25)
        engine.join(bk)
        values = [v * np.float32(0.25) * 2 for v in values]
        for x, v in zip(targets, values):
            np.testing.assert_allclose(bk.download(x), v, rtol=1e-6)
    # a cpu rank sums the same pieces, which the ranks' sums must pair
    device_sizes, channel.sizes = channel.sizes, []
    engine.reduce(pn.device("cpu"), [v.copy() for v in values], 0.25)
    engine.join(None)
    assert device_sizes == 2 * channel.sizes == 2 * [250, 250, 250, 250, 1, 77]


def test_joining_a_job_keeps_sgd_s_state_and_makes_adam_s_workspace_whole(monkeypatch):
    from portanet import training
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)).astype(np.float32), np.arange(8) % 3
    net = pn.mlp((6,), classes=3, hidden=(8,), device="cpu")
    sgd, adam = pn.SGD(0.1, 0.9), pn.Adam(0.01)
    net.train_batch(x, y, sgd)
    alone = net.plan.state
    monkeypatch.setattr(distributed, "current", lambda: object())      # in a job
    assert training.prepare(net, sgd) is alone and alone.t == 1       # momentum goes on
    training.prepare(net, adam)
    whole = net.plan.state
    assert whole.whole and whole.workspace.size == sum(
        training.flat_size(layer) for _, layer in training.trainable(net.plan.layers))
    monkeypatch.setattr(distributed, "current", lambda: None)         # alone again
    assert training.prepare(net, adam) is whole                       # it serves alone


def test_an_uncaught_error_on_a_rank_ends_a_job_without_mpi():
    # rank 1 fails outside any collective: no goodbye, so rank 0's watch ends it
    script = ("import time, portanet as pn\n"
              "group = pn.distributed.init()\n"
              "if group.rank == 1:\n"
              "    raise ValueError('rank 1 broke')\n"
              "time.sleep(60)\n")
    (code0, _, err0), (code1, _, err1) = launched_job(["-c", script], (0, 1), check=False)
    assert code1 != 0 and "rank 1 broke" in err1
    assert code0 != 0 and "rank 1 left the job without finishing" in err0


BUCKETS = """
import os, sys, numpy as np, portanet as pn
rank = int(os.environ["RANK"])
group = pn.distributed.init(bucket_mb=0 if rank == 0 or sys.argv[2] == "same" else 1,
                            first_bucket_mb=0)
rng = np.random.default_rng(7)
x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 3, 30)
net = pn.mlp((6,), classes=3, hidden=(8,), device="cpu")
net.train_batch(*((x[:10], y[:10]) if group.rank == 0 else (x[10:], y[10:])), pn.SGD(0.1, 0.9))
np.savez(sys.argv[1] + f"/{group.rank}.npz", averages=group.averages, **net.get_weights())
"""


def test_buckets_of_one_layer_each(tmp_path):
    """bucket_mb=0: every layer's gradient alone (two all-reduces a step here), the same
    step; ranks that give other sizes are refused."""
    out = []
    for how in ("same", "different"):
        out.append(launched_job(["-c", BUCKETS, tmp_path, how], (0, 1), check=False))
        if how == "same":
            got = [dict(np.load(tmp_path / f"{r}.npz")) for r in range(2)]
            assert [int(g.pop("averages")) for g in got] == [2, 2]
            rng = np.random.default_rng(7)
            x, y = rng.standard_normal((30, 6)).astype(np.float32), rng.integers(0, 3, 30)
            alone = pn.mlp((6,), classes=3, hidden=(8,), device="cpu")
            alone.train_batch(x, y, pn.SGD(0.1, 0.9))
            assert_same([dict(g, loss=0) for g in got], dict(alone.get_weights(), loss=0))
    assert all(code == 0 for code, _, _ in out[0]), out[0]
    assert all(code != 0 and "different bucket sizes" in err for code, _, err in out[1]), \
        out[1]


def test_the_train_command_as_torchrun_starts_it(tmp_path):
    # `torchrun --nproc_per_node 2 -m portanet.cli train --distributed` on cpu ranks: no MPI
    _fashion_mnist()
    save = tmp_path / "net.safetensors"
    (c0, out0, err0), (c1, out1, _) = launched_job(
        ["-m", "portanet.cli", "train", "--distributed", "--limit", 400, "--test-limit", 200,
         "--epochs", 1, "--batch-size", 32, "--save", save, "--json", "--bucket-mb", 0.5,
         "--first-bucket-mb", 0], (0, 1))
    assert "2 ranks over tcp" in err0 and out1 == ""          # rank 0 alone prints
    result = json.loads(out0.splitlines()[-1])
    assert result["distributed"]["launch"] == "tcp" and save.exists()
    assert result["distributed"]["bucket_bytes"] == [0, 2**19]


class _Recording:
    """An engine that notes what each all-reduce would sum (sizes) and each join."""

    def __init__(self):
        self.log = []

    def reduce(self, backend, targets, weight):
        self.log.append(("reduce", [x.size for x in targets], weight))

    def join(self, backend):
        self.log.append(("join",))


def test_buckets_go_at_their_sizes():
    # first bucket at 400 bytes (100 floats), then 4000 (1000 floats); the rest at end
    engine = _Recording()
    group = type("Group", (), {"size": 2, "engine_": engine, "averages": 0,
                               "bucket_bytes": (400, 4000)})()
    buckets = distributed.Buckets(group, None)
    for n in (30, 80, 500, 600, 10, 2000, 7):
        buckets.add(np.zeros(n, np.float32), 0.5)
    buckets.end(0.5)
    assert engine.log == [("reduce", [30, 80], 0.5), ("reduce", [500, 600], 0.5),
                          ("reduce", [10, 2000], 0.5), ("reduce", [7], 0.5), ("join",)]
    assert group.averages == 4
    engine.log.clear()                          # the next step starts with a first bucket
    buckets.add(np.zeros(120, np.float32), 0.25)
    buckets.end(0.25)
    assert engine.log == [("reduce", [120], 0.25), ("join",)]
    alone = type("Group", (), {"size": 1, "engine_": engine, "averages": 0,
                               "bucket_bytes": (0, 0)})()
    engine.log.clear()
    one = distributed.Buckets(alone, None)      # one rank averages nothing
    one.add(np.zeros(5, np.float32), 1.0)
    one.end(1.0)
    assert engine.log == []


def test_the_first_bucket_is_small_where_peer_sums_take_the_small_buckets():
    """A step's first bucket where init is not given one: 128 KiB where the engine sums
    small buckets by peer reads (LeNet's dense gradient then goes alone, overlapped with
    the backward below), DDP's 1 MiB where it cannot."""
    assert distributed.first_bucket(object()) == distributed.FIRST_BUCKET_BYTES == 2**20
    peer = type("Engine", (), {"peer": object()})()
    assert distributed.first_bucket(peer) == distributed.PEER_FIRST_BUCKET_BYTES == 2**17
    assert distributed.first_bucket(type("Engine", (), {"peer": None})()) == 2**20


def test_nccl_s_bucket_is_a_group_on_its_lane():
    """_Nccl's calls in order, against stand-ins for NCCL and a CUDA backend: the lane
    takes over where backward wrote the bucket, one NCCL group of in-place all-reduces with
    a PreMulSum of the rank's weight (made once a weight), the lane hands back at join."""
    import contextlib
    log = []

    class Nccl:
        def group_start(self):
            log.append("group_start")

        def group_end(self):
            log.append("group_end")

    class Comm:
        def create_pre_mul_sum(self, weight, dtype):
            log.append(("op", weight, dtype))
            return ("premul", weight)

        def allreduce(self, send, receive, op, stream):
            assert send is receive
            log.append(("allreduce", send.size, op, stream))

    class Runtime:
        def hand_over(self, source, target, event):
            log.append(("hand_over", source, target))

    class Lane:
        handle = 7

    backend = type("Backend", (), {"_lock": contextlib.nullcontext(), "runtime": Runtime(),
                                   "stream": "stream", "dlpack_view": lambda self, x: x})()
    engine = distributed._Nccl.__new__(distributed._Nccl)
    engine.nccl, engine.comm, engine.stream, engine.event = Nccl(), Comm(), Lane(), "event"
    engine.types, engine.ops, engine.peer = {np.dtype(np.float32): "f32"}, {}, None
    lane = engine.stream
    from portanet.backends.arrays import DeviceArray
    joined, other = object(), object()          # two device buffers
    # backward's order: a layer's part, the part before it in the same buffer (one span
    # with it), a part of another buffer, then one that is not next to the last
    a, b = DeviceArray(joined, 3, (4,), np.float32), DeviceArray(joined, 0, (3,), np.float32)
    c, d = DeviceArray(other, 0, (2,), np.float32), DeviceArray(joined, 9, (5,), np.float32)
    engine.reduce(backend, [a, b, c, d], 0.5)
    engine.reduce(backend, [d], 0.5)
    engine.join(backend)
    assert log == [("hand_over", "stream", lane), "group_start", ("op", 0.5, "f32"),
                   ("allreduce", 7, ("premul", 0.5), 7), ("allreduce", 2, ("premul", 0.5), 7),
                   ("allreduce", 5, ("premul", 0.5), 7),
                   "group_end", ("hand_over", "stream", lane), "group_start",
                   ("allreduce", 5, ("premul", 0.5), 7), "group_end",
                   ("hand_over", lane, "stream")]
    # on one host a small bucket is summed by peer reads: a launch a span on the lane, no
    # NCCL; a larger one still goes to NCCL

    class Peer:
        def takes(self, spans):
            return sum(x.size for x in spans) <= 8

        def sum(self, x, weight, stream):
            log.append(("peer", x.offset, x.size, weight, stream))
    log.clear()
    engine.peer = Peer()
    engine.reduce(backend, [a, b], 0.25)
    engine.reduce(backend, [a, b, c], 0.25)
    assert log == [("hand_over", "stream", lane), ("peer", 0, 7, 0.25, lane),
                   ("hand_over", "stream", lane), "group_start", ("op", 0.25, "f32"),
                   ("allreduce", 7, ("premul", 0.25), 7), ("allreduce", 2, ("premul", 0.25), 7),
                   "group_end"]
