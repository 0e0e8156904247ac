"""Who this process is in a job, and how the job's processes talk on the host.

A launcher starts the ranks and says who each is:

- torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT;
- SLURM's srun: SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, with MASTER_ADDR and
  MASTER_PORT exported by the batch script (as for PyTorch);
- mpiexec / mpirun: MPI itself.

`channel()` returns the host channel of the job, which carries what is not a gradient: the
engines' setup (NCCL's unique id), fit's agreement on its settings, the epoch's sums, rank
0's state at the start. Where the launcher gave MASTER_ADDR and MASTER_PORT, that is
portanet's own rendezvous (`TcpChannel`: rank 0 listens, the others connect), and no MPI is
needed; else MPI's communicator (`MpiChannel`). Both have the same verbs: gather, bcast,
allgather, sum (of a NumPy array, in place) and abort.
"""
import atexit
import os
import pickle
import selectors
import socket
import struct
import sys
import threading
import time

import numpy as np

from .errors import InputError

CONNECT_S = 300         # how long a rank keeps trying to reach rank 0 (they start apart)
HELLO_S = 10            # how long rank 0 waits for a new connection to say who it is
BYE = b"bye"            # what a rank sends on its watch line as it leaves the job whole
MAGIC = b"portanet-rendezvous-1"
# a connection's first words: MAGIC, the job's token (16 bytes), the line (t or w), the
# rank and the job's size; anything else is not one of the job's ranks and is dropped
HELLO = struct.Struct(f"<{len(MAGIC)}s16sc2q")


# what mpiexec (Hydra, Open MPI) sets in each rank: then SLURM's variables, where present,
# are the batch script's or a proxy's, not the rank's
MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def numbers(environ=None):
    """(rank, size, local rank) as torchrun or SLURM gave them, or None where neither did
    (MPI's launchers then: MpiChannel asks MPI). LOCAL_RANK without RANK (as some mpiexec
    wrappers set it) names the local rank alone: (None, None, local). Under mpiexec SLURM's
    variables are not the rank's and are not read."""
    env = os.environ if environ is None else environ
    names = [("RANK", "WORLD_SIZE", "LOCAL_RANK")]
    if not any(env.get(v, "").strip() for v in MPI_RANK_VARIABLES):
        names.append(("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
    for rank, size, local in names:
        if env.get(rank, "").strip() and env.get(size, "").strip():
            r, n = _count(env, rank), _count(env, size)
            if r >= n:
                raise InputError(f"{rank}={r} but {size}={n}: a rank is below the size")
            loc = _count(env, local) if env.get(local, "").strip() else None
            return r, n, loc
    if env.get("LOCAL_RANK", "").strip():
        return None, None, _count(env, "LOCAL_RANK")
    return None


def rendezvous(environ=None):
    """(address, port) of portanet's rendezvous, or None where the launcher gave no
    MASTER_ADDR and MASTER_PORT. The port is MASTER_PORT + 1 (torchrun's own store listens
    on MASTER_PORT), or PORTANET_PORT where set."""
    env = os.environ if environ is None else environ
    address, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if not address or not port:
        return None
    if env.get("PORTANET_PORT", "").strip():
        return address, _count(env, "PORTANET_PORT")
    return address, _count(env, "MASTER_PORT") + 1


def channel(use_mpi=False, environ=None):
    """(the job's host channel, this rank's local rank or None where the launcher did not
    say it). use_mpi: MPI's even where a rendezvous is given (PORTANET_DIST=mpi)."""
    said = numbers(environ)
    meet = rendezvous(environ)
    if not use_mpi and said is not None and said[0] is not None and meet is not None:
        rank, size, local = said
        return TcpChannel(rank, size, *meet), local
    ch = MpiChannel(rendezvous_given=meet is not None)
    if said is not None and said[1] is not None and said[1] != ch.size:
        raise InputError(f"the launcher says {said[1]} ranks but MPI sees {ch.size} "
                         f"process(es): launch with mpiexec -n {said[1]}, or give "
                         f"MASTER_ADDR and MASTER_PORT for portanet's own rendezvous "
                         f"(torchrun sets them)")
    return ch, (said[2] if said is not None else None)


class MpiChannel:
    """The host channel over MPI's COMM_WORLD (mpi4py)."""

    kind = "mpi"

    def __init__(self, rendezvous_given=False):
        try:
            from mpi4py import MPI
        except ImportError as e:
            if rendezvous_given:
                raise InputError("PORTANET_DIST=mpi needs mpi4py and an MPI: pip install "
                                 "'portanet[mpi]', or leave PORTANET_DIST unset to meet at "
                                 "MASTER_ADDR without MPI") from e
            raise InputError("this job has no rendezvous (MASTER_ADDR and MASTER_PORT, as "
                             "torchrun sets them) and MPI is not here: launch with torchrun "
                             "or srun and those variables, or pip install 'portanet[mpi]' "
                             "(mpi4py and MPICH) and launch with mpiexec -n N") from e
        self.MPI, self.comm = MPI, MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def local_rank(self):
        return self.comm.Split_type(self.MPI.COMM_TYPE_SHARED).Get_rank()

    @property
    def threads(self):
        """Whether a thread other than the main one may call it (one at a time)."""
        return self.MPI.Query_thread() >= self.MPI.THREAD_SERIALIZED

    def gather(self, obj):
        return self.comm.gather(obj, root=0)

    def bcast(self, obj):
        return self.comm.bcast(obj, root=0)

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def sum(self, array):
        """array <- the sum over ranks of array, in place."""
        self.comm.Allreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)

    def broadcast(self, array):
        """array <- rank 0's array, in place."""
        self.comm.Bcast(array, root=0)

    def abort(self, code):
        self.comm.Abort(code)

    def close(self):
        """MPI itself ends with the process."""


class TcpChannel:
    """The host channel over TCP: rank 0 listens at the rendezvous, every other rank
    connects to it twice, once to talk (the collectives, rank 0 in the middle: it gathers,
    reduces in rank order and sends back) and once to watch, each line opening with HELLO
    (anything else is dropped: a stray connection, another job on the port). A watch line
    that closes without a goodbye means its process died: rank 0 then ends the job, which
    closes its lines, which ends every other rank (a rank waiting in an all-reduce on its GPU would
    wait for ever, as MPI's Abort prevents). The collectives wait as long as the job needs:
    a rank may be saving a checkpoint while the others wait for the epoch's sums."""

    kind = "tcp"
    threads = True              # any thread may call it, one at a time

    def __init__(self, rank, size, address, port, connect_s=CONNECT_S, token=None):
        self.rank, self.size, self.address, self.port = rank, size, address, port
        self.token = (job_token() if token is None else token).encode()[:16].ljust(16, b"\0")
        self._talk, self._watch, self._leaving, self._failed = {}, {}, False, False
        if size == 1:
            return
        if rank == 0:
            self._listen(connect_s)
        else:
            self._talk[0] = self._connect(connect_s, b"t")
            self._watch[0] = self._connect(connect_s, b"w")
        atexit.register(self._leave)
        hook = sys.excepthook

        def failing(*args):             # an uncaught error: no goodbye at exit (_leave)
            self._failed = True
            hook(*args)
        sys.excepthook = failing
        threading.Thread(target=self._watching, daemon=True,
                         name="portanet-watch").start()

    def local_rank(self):
        return None

    # -- the collectives: rank 0 in the middle ----------------------------------------------

    def gather(self, obj):
        if self.size == 1:
            return [obj]
        if self.rank:
            _send(self._talk[0], obj)
            return None
        return [obj] + [_receive(self._talk[r], r) for r in range(1, self.size)]

    def bcast(self, obj):
        if self.size == 1:
            return obj
        if self.rank:
            return _receive(self._talk[0], 0)
        for r in range(1, self.size):
            _send(self._talk[r], obj)
        return obj

    def allgather(self, obj):
        return self.bcast(self.gather(obj))

    def sum(self, array):
        parts = self.gather(np.asarray(array))
        total = None
        if self.rank == 0:
            total = parts[0].copy()
            for part in parts[1:]:
                total += part
        array[...] = self.bcast(total)

    def broadcast(self, array):
        array[...] = self.bcast(np.asarray(array) if self.rank == 0 else None)

    def abort(self, code):
        os._exit(code)      # the watch lines close without a goodbye: the job ends

    # -- setting up and leaving -----------------------------------------------------------

    def _listen(self, connect_s):
        try:
            server = socket.create_server(("", self.port), backlog=2 * self.size)
        except OSError as e:
            raise InputError(f"rank 0 cannot listen on port {self.port} for portanet's "
                             f"rendezvous ({e}): set PORTANET_PORT (or MASTER_PORT) to a "
                             f"free port") from e
        deadline = time.monotonic() + connect_s
        try:
            while len(self._talk) + len(self._watch) < 2 * (self.size - 1):
                server.settimeout(max(deadline - time.monotonic(), 0.01))
                try:
                    conn, _ = server.accept()
                except socket.timeout as e:
                    missing = sorted(r for r in range(1, self.size)
                                     if r not in self._talk or r not in self._watch)
                    raise InputError(f"rank 0 waited {connect_s} s at port {self.port} for "
                                     f"rank(s) {missing} of {self.size}: start every rank "
                                     f"with the same MASTER_ADDR, MASTER_PORT and "
                                     f"WORLD_SIZE") from e
                self._admit(conn)
        finally:
            server.close()

    def _admit(self, conn):
        """Keep conn as a rank's line if it says it is one of this job's; else drop it (a
        stray connection, another job on the port) and go on waiting. A rank of this job
        that gives another size is an error: the job was started two ways."""
        try:
            conn.settimeout(HELLO_S)
            magic, token, line, rank, size = HELLO.unpack(_exactly(conn, HELLO.size, "?"))
        except (OSError, ConnectionError, struct.error):
            conn.close()
            return
        lines = {b"t": self._talk, b"w": self._watch}
        if magic != MAGIC or token != self.token or line not in lines:
            conn.close()
            return
        if size != self.size:
            raise InputError(f"rank {rank} says the job has {size} ranks, rank 0 "
                             f"{self.size}: start every rank with the same WORLD_SIZE")
        if not 0 < rank < self.size or rank in lines[line]:
            conn.close()
            return
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines[line][rank] = conn

    def _connect(self, connect_s, line):
        deadline = time.monotonic() + connect_s
        while True:
            try:
                conn = socket.create_connection((self.address, self.port), timeout=10)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise InputError(f"rank {self.rank} could not reach rank 0 at "
                                     f"{self.address}:{self.port} in {connect_s} s ({e}): "
                                     f"start rank 0 with the same MASTER_ADDR and "
                                     f"MASTER_PORT") from e
                time.sleep(0.2)
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(HELLO.pack(MAGIC, self.token, line, self.rank, self.size))
        return conn

    def close(self):
        """Leave the job whole (a goodbye on every watch line) and close the lines."""
        self._leave()
        for conn in list(self._talk.values()) + list(self._watch.values()):
            conn.close()
        self._talk, self._watch = {}, {}

    def _leave(self):
        """At a normal exit: a goodbye on every watch line, so that ranks still finishing
        go on. After an uncaught error none: the line closes, and the job ends."""
        if self._failed:
            return
        self._leaving = True
        for conn in self._watch.values():
            try:
                conn.sendall(BYE)
            except OSError:
                pass

    def _watching(self):
        """Ends this process when a watch line closes without a goodbye."""
        selector = selectors.DefaultSelector()
        heard = {}
        for rank, conn in self._watch.items():
            selector.register(conn, selectors.EVENT_READ, rank)
            heard[rank] = b""
        while selector.get_map():
            try:
                ready = selector.select()
            except (OSError, ValueError):   # closed here (close)
                return
            for key, _ in ready:
                try:
                    data = key.fileobj.recv(16)
                except OSError:             # reset: closed, as far as the job goes
                    data = b""
                heard[key.data] += data
                if heard[key.data].startswith(BYE):
                    selector.unregister(key.fileobj)
                elif not data:
                    if self._leaving:
                        return
                    who = "rank 0" if self.rank else f"rank {key.data}"
                    os.write(sys.stderr.fileno(),
                             f"portanet: {who} left the job without finishing; rank "
                             f"{self.rank} ends too\n".encode())
                    os._exit(1)


def job_token(environ=None):
    """What names this job among others that may meet on the same port: torchrun's run id
    or SLURM's job and step, else nothing."""
    env = os.environ if environ is None else environ
    return (env.get("TORCHELASTIC_RUN_ID") or
            ".".join(env.get(v, "") for v in ("SLURM_JOB_ID", "SLURM_STEP_ID")).strip("."))


def _send(conn, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(struct.pack("<Q", len(data)) + data)


def _receive(conn, source):
    (n,) = struct.unpack("<Q", _exactly(conn, 8, source))
    return pickle.loads(_exactly(conn, n, source))


def _exactly(conn, n, source):
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError(f"{source if isinstance(source, str) else 'rank %d' % source}"
                                  f" closed its connection in the middle of the job")
        got += k
    return bytes(out)


def _count(env, name):
    value = env.get(name, "").strip()
    if not value.isdigit():
        raise InputError(f"{name}={value!r} must be a whole number >= 0, as a launcher sets it")
    return int(value)
