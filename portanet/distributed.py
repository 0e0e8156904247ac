"""Data-parallel training over ranks (processes), each on a device of its own.

All ranks hold the same weights and optimizer state before a step. fit splits each
shuffled global batch of `ranks x batch_size` samples so that rank r trains on the r-th
share, and each layer's gradient target is averaged across ranks before the optimizer's
update (`Group.average`, called by training.OptimizerState.update). With SGD the target
is the velocity itself: every rank computes v_r = mu v - eta / m_r g_r from its m_r
samples, and sum_r (m_r / M) v_r = mu v - eta / M sum_r g_r, the full batch's step. Adam and
RMSprop average their gradient workspace alike. Weighting by m_r / M keeps the step exact
for uneven shares (the last batch of an epoch, `balance`). So every rank's weights stay
identical and equal, to rounding, a one-process run over the same global batches.

Engines: MPI (mpi4py over MPICH or Open MPI) for any mix of backends, each rank's target
staged through host memory; NCCL (nccl4py) between CUDA devices, on device memory and the
backend's stream (PORTANET_DIST=nccl; MPI still starts the job). The launcher (mpiexec /
mpirun) gives the ranks; LOCAL_RANK, where set, names the rank among this machine's, and
WORLD_SIZE must agree with MPI's.

Devices: PORTANET_DEVICE may name one per local rank: "cuda:{local_rank}" or a comma list
("cuda:0,opencl:0:0": local rank i takes the i-th). init() sets this process's
PORTANET_DEVICE to its own, so every network built afterwards without a device is there.
"""
import contextlib

import numpy as np

from . import config
from .errors import InputError

ENGINES = ("mpi", "nccl")

_group = None


def init(engine=None, balance=None):
    """Join the job the launcher started; returns its Group (rank, size, local rank,
    device, engine). engine: "mpi" (the default; PORTANET_DIST sets it). balance: this
    rank's relative step rate, to give it that share of each global batch (None: equal
    shares). Calling it again returns the group already joined."""
    global _group
    if _group is not None:
        return _group
    engine = (engine or config.dist_engine()).strip().lower()
    if engine not in ENGINES:
        raise InputError(f"PORTANET_DIST / engine {engine!r} is not an engine portanet has: "
                         f"{', '.join(ENGINES)}")
    rate = _rate(1.0 if balance is None else balance)
    comm = _mpi_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    local, said = config.launcher_numbers()
    if said is not None and said != size:
        raise InputError(f"WORLD_SIZE={said} but MPI sees {size} process(es): the MPI engine "
                         f"takes its ranks from MPI; launch with mpiexec -n {said}")
    if local is None:
        from mpi4py import MPI
        local = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
    device = device_for(local, config.device_variable())
    if device is not None:
        config.set_device_variable(device)
    rates = comm.allgather(rate)
    devices = comm.allgather(device or "cpu")
    group = Group(comm, rank, size, local, devices, engine, rates)
    if engine == "nccl":
        group.nccl = _Nccl(group)
    _group = group
    return _group


def current():
    """The Group this process has joined, or None."""
    return _group


def leader():
    """Whether this process prints, evaluates and saves: rank 0, or not distributed."""
    return _group is None or _group.rank == 0


@contextlib.contextmanager
def paused():
    """Train alone within the block (the group kept for after it): what one rank's step
    costs without the averaging, as `portanet bench --distributed` compares."""
    global _group
    group, _group = _group, None
    try:
        yield
    finally:
        _group = group


def shutdown():
    """Leave the group (fit trains alone again); MPI itself ends with the process."""
    global _group
    _group = None


def device_for(local_rank, spec):
    """This local rank's device string from PORTANET_DEVICE's: formatted with
    {local_rank}, or the local_rank-th of a comma list; None where it is unset."""
    if spec is None or not spec.strip():
        return None
    try:
        spec = spec.format(local_rank=local_rank)
    except (KeyError, IndexError, ValueError) as e:
        raise InputError(f"PORTANET_DEVICE={spec!r}: {{local_rank}} is the only field it may "
                         f"name ({e})") from e
    choices = [s.strip() for s in spec.split(",")]
    if len(choices) == 1:
        return choices[0]
    if local_rank >= len(choices):
        raise InputError(f"PORTANET_DEVICE={spec!r} names {len(choices)} devices, for local "
                         f"ranks 0 to {len(choices) - 1}; local rank {local_rank} has none: "
                         f"name one per rank this machine runs")
    return choices[local_rank]


class Group:
    """The job's ranks as this process sees them. shares(batch_size): each rank's samples
    of a global batch; average(backend, x, weight): x <- sum over ranks of weight_r x_r."""

    def __init__(self, comm, rank, size, local_rank, devices, engine, rates):
        self.comm, self.rank, self.size, self.local_rank = comm, rank, size, local_rank
        self.devices, self.engine, self.rates = devices, engine, rates
        self.averages = 0                   # calls of average so far (the bench counts them)
        self.nccl = None                    # the NCCL engine's communicator (_Nccl)

    def balance(self, rate):
        """Shares of each global batch in proportion to each rank's step rate (samples a
        second, as step_rate measures); every rank gives its own."""
        self.rates = self.comm.allgather(_rate(rate))

    @property
    def device(self):
        return self.devices[self.rank]

    def shares(self, n):
        """Each rank's part of n samples: proportional to its rate (equal by default),
        whole numbers that add up to n, the remainders to the largest fractions first."""
        exact = np.asarray(self.rates, np.float64) * n / sum(self.rates)
        out = np.floor(exact).astype(np.int64)
        for r in np.argsort(-(exact - out), kind="stable")[:n - int(out.sum())]:
            out[r] += 1
        return [int(k) for k in out]

    def part(self, indices, shares):
        """(this rank's indices of a global batch, split as `shares` says, and its weight
        m_r / M)."""
        start = sum(shares[:self.rank])
        mine = indices[start:start + shares[self.rank]]
        return mine, len(mine) / len(indices)

    def average(self, backend, x, weight):
        """x <- sum_r weight_r x_r over the ranks, in place (host staging where x is on a
        device)."""
        self.averages += 1
        if self.nccl is not None:
            self.nccl.average(backend, x, weight)
            return
        from mpi4py import MPI

        def average(host):
            host *= host.dtype.type(weight)
            self.comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
        _on_host(backend, x, average)

    def broadcast(self, backend, x):
        """x <- rank 0's x, in place."""
        _on_host(backend, x, lambda host: self.comm.Bcast(host, root=0))

    def broadcast_state(self, net):
        """Rank 0's parameters, saved buffers and optimizer state on every rank."""
        arrays = [x for _, layer in net.walk() for x in layer.params().values()]
        if net.optimizer_state is not None:
            arrays += list(net.optimizer_state.tensors().values())
        for x in arrays:
            self.broadcast(net.backend, x)

    def agree(self, settings):
        """An InputError naming what differs where this rank's settings (of fit) are not
        rank 0's: different data or batches would hang a job or train it wrong."""
        theirs = self.comm.bcast(settings, root=0)
        differ = [f"{k}: {settings.get(k)!r} here, {v!r} on rank 0" for k, v in theirs.items()
                  if settings.get(k) != v]
        if differ:
            raise InputError(f"rank {self.rank} is not training what rank 0 is ("
                             f"{'; '.join(differ)}): give every rank the same data, network "
                             f"and fit arguments")

    def sum(self, values):
        """The sum over ranks of a few numbers (float64)."""
        from mpi4py import MPI
        values = np.array(values, np.float64)
        self.comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        return values

    def describe(self):
        return {"ranks": self.size, "engine": self.engine, "devices": self.devices,
                "rates": self.rates}

    def __repr__(self):
        return (f"Group(rank {self.rank} of {self.size}, local {self.local_rank}, "
                f"{self.device}, {self.engine})")


def step_rate(net, x, y, optimizer, steps=5):
    """Samples a second that `net` trains at on batches like x, y (the rate --balance
    shares the global batch by): two steps to build and record, then `steps` timed. It
    trains net: give it a probe, not the network to train. Measured alone (paused): in the
    job every step would wait for the slowest rank."""
    import time
    with paused():
        for _ in range(2):
            net.train_batch(x, y, optimizer)
        net.backend.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            net.train_batch(x, y, optimizer)
        net.backend.synchronize()
        return steps * len(x) / (time.perf_counter() - start)


@contextlib.contextmanager
def collective():
    """Within the block, an error on one rank of a job of several ends the job (MPI's
    Abort, after the error is printed): the other ranks would wait for it in their next
    average for ever."""
    try:
        yield
    except BaseException as e:
        group = _group
        if group is None or group.size == 1:
            raise
        import os
        import sys
        import time
        import traceback
        # The error first and the whole text in one write: Abort ends the launcher's
        # forwarding of stderr, and a traceback printed line by line was cut after a line.
        text = (f"portanet: rank {group.rank} of {group.size} failed "
                f"({type(e).__name__}: {e}); ending the job\n"
                + "".join(traceback.format_exception(e)))
        sys.stderr.flush()
        os.write(sys.stderr.fileno(), text.encode(errors="replace"))
        time.sleep(0.5)                 # time for the launcher to forward it
        group.comm.Abort(1)
        raise


class _Nccl:
    """The NCCL engine (nccl4py): every rank a CUDA device, x averaged where it is, on the
    backend's stream, in order with its kernels (scal, then an in-place all-reduce of a
    DLPack view of x), with no host copy and no wait. MPI still starts the job, passes
    NCCL's unique id and sums the epoch's few numbers. Written against nccl4py 0.6; its
    scaling on two GPUs: bench/gpu_distributed.sh, docs/benchmarks-multi-gpu.md."""

    def __init__(self, group):
        try:
            import nccl.core as nccl
        except ImportError as e:
            raise InputError("PORTANET_DIST=nccl needs nccl4py and NCCL: pip install "
                             "'portanet[nccl]'") from e
        from . import backends
        backend = backends.device()
        if backend.kind != "cuda":
            raise InputError(f"PORTANET_DIST=nccl takes CUDA devices only; rank {group.rank} "
                             f"is on {backend.name}: use PORTANET_DIST=mpi for a job of "
                             f"other devices")
        # bytes(UniqueId): nccl4py's documented form (as_bytes is a property there)
        uid = group.comm.bcast(bytes(nccl.get_unique_id()) if group.rank == 0 else None,
                               root=0)
        with backend._lock:                 # the backend's context current
            self.comm = nccl.Communicator.init(group.size, group.rank,
                                               nccl.UniqueId.from_bytes(uid))
        self.sum = nccl.SUM

    def average(self, backend, x, weight):
        backend.scal(weight, x)
        view = backend.dlpack_view(x)
        with backend._lock:
            self.comm.allreduce(view, view, self.sum, stream=int(backend.stream.handle))


def _on_host(backend, x, work):
    """work(host array of x), in place: x itself on cpu, else a copy written back."""
    host = x if isinstance(x, np.ndarray) else backend.download(x)
    work(host)
    if host is not x:
        backend.write(x, host)


def _rate(rate):
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise InputError(f"a rank's step rate (balance) must be a positive number, got "
                         f"{rate!r}")
    return float(rate)


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise InputError("distributed training needs mpi4py and an MPI: pip install "
                         "'portanet[mpi]' (mpi4py and MPICH), then launch with "
                         "mpiexec -n N") from e
    return MPI.COMM_WORLD


