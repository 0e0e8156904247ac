"""Every environment variable portanet reads, in one place (documented in the README).

PORTANET_DEVICE  default device string: cpu, opencl, opencl:P, opencl:P:D, cuda, cuda:N
                 (unset or empty: cpu); in a distributed job one per local rank
                 (cuda:{local_rank}, or a comma list), and distributed.init() sets each
                 process's own here
PORTANET_DIST    the engine of a distributed job: auto (the default: nccl where every rank
                 is a CUDA device, else the host staging of mpi or tcp), nccl, mpi or tcp
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT  torchrun's numbers of a distributed
                 job's process and its rendezvous (SLURM_PROCID, SLURM_NTASKS and
                 SLURM_LOCALID stand for the first three under srun); portanet's rendezvous
                 listens on MASTER_PORT + 1, or PORTANET_PORT (launch.py); TORCHELASTIC_RUN_ID
                 or SLURM_JOB_ID and SLURM_STEP_ID name the job to it; under mpiexec
                 (PMI_RANK, OMPI_COMM_WORLD_RANK) SLURM's variables are not read
PORTANET_GEMM    GEMM path on GPU backends: auto (the default: each shape to the path
                 measured fastest on the device; likewise whether gemv splits few long
                 rows into pieces), vendor (CLBlast / cuBLAS) or own (portanet's tiled
                 kernels, on a tf32 CUDA backend its tensor-core GEMM, mma.cu; gemv one
                 work-group per row)
PORTANET_CONV    convolution path on GPU backends: auto (the default: each shape to the
                 path measured fastest), implicit (our GEMM gathering patches), direct
                 (short patches only) or im2col (patch matrices and the vendor's GEMM, where
                 it has one); a path that does not apply to a layer leaves it to auto
PORTANET_PRECISION  the precision networks and benchmarks compute in where none is given:
                 fp32 (the default), tf32, bf16 or fp16 (portanet/precision.py)
PORTANET_ROUTES  a file (JSON) of the paths auto routing measured on each device: a backend
                 takes a shape's path from it instead of timing it again, and adds the
                 ones it times, so that every process computes as the first did and a seed
                 trains alike (backends/gemm/routes.py); unset: each process measures anew
PORTANET_GRAPHS  on (default) or off: record a training step once (a CUDA graph; on OpenCL
                 its bound launches) and replay it
PORTANET_TUNING  on (default) or off: use the GEMM tilings `portanet tune` measured for
                 the device (off: the ones its limits give, as on an untuned device); an
                 entry that is not a tiling the search could give is skipped, warned
PORTANET_DATA    first folder searched for dataset files
PORTANET_CL_LIMITS  caps on what the OpenCL backend believes of its device: a profile
                 (amd, intel-gpu, mobile) and/or key=value items (work_group=128,
                 local=32k, fp64=no, max_alloc=25%, vector=1, gpu=yes), comma-separated;
                 caps under which no GEMM tiling fits are refused, naming the smallest
                 that work
XDG_CACHE_HOME   the cache folder (default ~/.cache): portanet/ holds compiled kernels
"""
import os
from pathlib import Path


def device_string():
    return device_variable() or "cpu"


def device_variable():
    """PORTANET_DEVICE as set, or None where it is unset or blank."""
    value = os.environ.get("PORTANET_DEVICE", "")
    return value if value.strip() else None


def set_device_variable(spec):
    """This process's PORTANET_DEVICE (distributed.init: each rank its own device)."""
    os.environ["PORTANET_DEVICE"] = spec


def dist_engine():
    return os.environ.get("PORTANET_DIST", "").strip().lower() or "auto"


def gemm_path():
    value = os.environ.get("PORTANET_GEMM", "").strip().lower() or "auto"
    if value not in ("auto", "vendor", "own"):
        from .errors import PortanetError
        raise PortanetError(f"PORTANET_GEMM={value!r} is not understood: use 'auto', "
                            f"'vendor' or 'own'")
    return value


def conv_path():
    value = os.environ.get("PORTANET_CONV", "").strip().lower() or "auto"
    if value not in CONV_PATHS:
        from .errors import PortanetError
        raise PortanetError(f"PORTANET_CONV={value!r} is not understood: use one of "
                            f"{', '.join(CONV_PATHS)}")
    return value


CONV_PATHS = ("auto", "implicit", "direct", "im2col")


def precision():
    """PORTANET_PRECISION as set (checked where it is used: precision.resolve), or None."""
    value = os.environ.get("PORTANET_PRECISION", "").strip().lower()
    return value or None


def routes_file():
    """PORTANET_ROUTES as a Path, or None where unset or empty."""
    value = os.environ.get("PORTANET_ROUTES", "").strip()
    return Path(value).expanduser() if value else None


def graphs():
    """PORTANET_GRAPHS=off keeps training steps eager on devices that could record them."""
    return _on_off("PORTANET_GRAPHS")


def _on_off(name):
    value = os.environ.get(name, "").strip().lower() or "on"
    if value not in ("on", "off"):
        from .errors import PortanetError
        raise PortanetError(f"{name}={value!r} is not understood: use 'on' or 'off'")
    return value == "on"


def tuning():
    """PORTANET_TUNING=off leaves devices on the GEMM tilings their limits give."""
    return _on_off("PORTANET_TUNING")


def cl_limits():
    """PORTANET_CL_LIMITS as set, or None (parsed by backends.opencl.Limits)."""
    value = os.environ.get("PORTANET_CL_LIMITS", "").strip()
    return value or None


def cache_dir():
    """portanet's cache folder: $XDG_CACHE_HOME/portanet, else ~/.cache/portanet."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "portanet"


def data_dirs():
    dirs = []
    if os.environ.get("PORTANET_DATA"):
        dirs.append(Path(os.environ["PORTANET_DATA"]))
    dirs.append(Path.home() / ".cache" / "portanet")
    dirs.append(Path("/usr/share/datasets"))
    return dirs
