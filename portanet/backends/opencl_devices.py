"""OpenCL devices before a backend is made: the platforms found (through the ICD loader,
icd.py) and the words that name them (opencl:pocl), the default device, the Oclgrind
simulator's checks and report, and a device's limits (`Limits`), which PORTANET_CL_LIMITS
can cap to those of a class of device we cannot test on; every kernel parameter derives
from them."""
import dataclasses
import os
import re
import tempfile

import numpy as np

from ..errors import DeviceError
from . import icd
from .gemm.tiling import gemm_params

try:
    import pyopencl as cl
except ImportError:          # the extra is not installed: say which one
    cl = None

# platform name -> the word that names it in device strings (opencl:pocl); others are
# named by the first word of their name
PLATFORM_WORDS = {"portable computing language": "pocl", "nvidia cuda": "nvidia",
                  "amd accelerated parallel processing": "amd", "intel(r) opencl": "intel",
                  "intel(r) opencl graphics": "intel-gpu", "intel(r) opencl hd graphics":
                  "intel-gpu", "oclgrind": "oclgrind", "rusticl": "rusticl", "clover": "clover"}
SIMULATORS = ("oclgrind",)  # checked only when named: never `opencl`'s default device


def _platforms():
    if cl is None:
        raise DeviceError("the OpenCL backend needs pyopencl: pip install 'portanet[opencl]' "
                          "(or 'portanet[pocl]' for a CPU OpenCL driver as well)")
    icd.prepare()
    try:
        return cl.get_platforms()
    except cl.Error:          # PLATFORM_NOT_FOUND_KHR from the ICD loader
        return []


def simulator_checks():
    """Turn Oclgrind's checks on (data races, uninitialised reads; out-of-bounds accesses
    always), unless the user set them, and return the file it reports to. Oclgrind reads
    them when it makes a context, so call this before opening it; no other device reads
    them. `portanet devices --check` and the tests do."""
    os.environ.setdefault("OCLGRIND_DATA_RACES", "1")
    os.environ.setdefault("OCLGRIND_UNINITIALIZED", "1")
    return os.environ.setdefault("OCLGRIND_LOG", os.path.join(
        tempfile.gettempdir(), f"portanet-oclgrind-{os.getpid()}.log"))


# what Oclgrind reads when a context is made: its checks (on where "1") and its log
SIMULATOR_VARIABLES = ("OCLGRIND_DATA_RACES", "OCLGRIND_UNINITIALIZED", "OCLGRIND_LOG")


def simulator_settings():
    """{variable: value or None} of SIMULATOR_VARIABLES now: what a simulator device opened
    now checks, and where it reports. A simulator backend keeps those it was opened with."""
    return {name: os.environ.get(name) for name in SIMULATOR_VARIABLES}


class SimulatorReport:
    """What the simulator writes to its log from now on: `SimulatorReport(log).read()`."""

    def __init__(self, log):
        self.log = log
        self.start = os.path.getsize(log) if os.path.exists(log) else 0

    def read(self):
        """The text appended since this report began, stripped ('' if none)."""
        if not os.path.exists(self.log):
            return ""
        with open(self.log, errors="replace") as f:
            f.seek(self.start)
            return f.read().strip()


def platform_words(platforms):
    """The word of each platform, made unique by a number where two share one (intel-2)."""
    words = []
    for platform in platforms:
        name = platform.name.strip().lower()
        word = PLATFORM_WORDS.get(name) or re.sub(r"[^a-z0-9]+", "-", name.split()[0]).strip("-")
        if not word or word.isdigit():
            word = f"platform{len(words)}"
        base, n = word, 2
        while word in words:
            word, n = f"{base}-{n}", n + 1
        words.append(word)
    return words


def _devices():
    """[(p, d, platform, device)] in `portanet devices` order."""
    platforms = _platforms()
    if not platforms:
        raise DeviceError("pyopencl found no OpenCL platform: install a driver (pip install "
                          "'portanet[pocl]' for the CPU, or your GPU vendor's), and "
                          "if it lives outside the default places point OCL_ICD_VENDORS at "
                          "its .icd folder")
    found = []
    for p, platform in enumerate(platforms):
        try:
            devices = platform.get_devices()
        except cl.Error:
            devices = []
        found += [(p, d, platform, dev) for d, dev in enumerate(devices)]
    return found


def enumerate_devices():
    words = platform_words(_platforms())
    listed = []
    for p, d, platform, dev in _devices():
        what = ("a simulator that checks kernels, never the default" if words[p] in SIMULATORS
                else f"{dev.max_compute_units} compute units, {dev.global_mem_size / 2**30:.1f} GiB")
        listed.append((f"opencl:{p}:{d}", f"{dev.name.strip()} (opencl:{words[p]}:{d}; "
                                          f"{platform.name.strip()}, {what}; precisions "
                                          f"{', '.join(device_precisions(dev))})"))
    return listed


def device_precisions(dev, dtype=np.float32):
    """What an OpenCL device computes in (portanet/precision.py): fp32, and fp16 where the
    device has half arithmetic (cl_khr_fp16); fp64 for float64 networks, where it has
    doubles. fp16's products go to portanet's own kernels, which round each input to half
    and sum in float32 as CUDA's fp16 does: CLBlast's HGEMM sums in half, another precision."""
    if np.dtype(dtype) == np.float64:
        return ("fp64",)
    return ("fp32",) + (("fp16",) if "cl_khr_fp16" in dev.extensions.split() else ())


def platform_number(word):
    """The number of the platform `word` names (opencl:pocl, opencl:intel, ...)."""
    words = platform_words(_platforms())
    if word in words:
        return words.index(word)
    raise DeviceError(f"no OpenCL platform is called {word!r} here; the platforms are "
                      + (", ".join(f"opencl:{w} (opencl:{p})" for p, w in enumerate(words))
                         or "none")
                      + (f"; opencl:{word} comes with {PLATFORM_INSTALLS[word]}"
                         if word in PLATFORM_INSTALLS else ""))


# what installs each OpenCL platform portanet names, for the message of a missing one
PLATFORM_INSTALLS = {"pocl": "pip install 'portanet[pocl]'",
                     "intel": "pip install 'portanet[intel-cpu]'",
                     "oclgrind": "pip install 'portanet[oclgrind]'",
                     "nvidia": "NVIDIA's driver", "amd": "AMD's driver (ROCm)"}


def default_device(platform=None):
    """(platform, device) of the first GPU, else of the first device; of all platforms but
    the simulators, or of `platform` alone (the device string opencl:P)."""
    found = _devices()
    if platform is not None:
        found = [f for f in found if f[0] == platform]
        if not found:
            raise DeviceError(f"there is no OpenCL platform {platform} with a device here")
    else:
        words = platform_words(_platforms())
        real = [f for f in found if words[f[0]] not in SIMULATORS]
        if not real:
            raise DeviceError("the only OpenCL platform here is a simulator ("
                              + ", ".join(sorted({words[f[0]] for f in found}))
                              + "): name it (opencl:oclgrind) to use it, or install a driver")
        found = real
    for p, d, _, dev in found:
        if dev.type & cl.device_type.GPU:
            return p, d
    return found[0][0], found[0][1]


@dataclasses.dataclass(frozen=True)
class Limits:
    """What the backend believes about its device, and so what every kernel parameter is
    derived from: the device's own values, or lower ones where PORTANET_CL_LIMITS caps them
    to a class of device (PROFILES), so that the parameters such a device would get run
    and are checked here (every launch is held to them: _check_launch)."""
    work_group: int             # work-items per group
    work_items: tuple           # work-items per group along each dimension
    local_bytes: int            # local memory per group
    fp64: bool
    max_alloc: int              # bytes in one buffer
    memory: int                 # bytes in all
    vector_width: int           # preferred float vector width
    gpu: bool                   # pick the tilings of a GPU
    profile: str = "device"

    @classmethod
    def of(cls, dev, caps=None, simulator=False):
        own = cls(work_group=dev.max_work_group_size,
                  work_items=tuple(dev.max_work_item_sizes), local_bytes=dev.local_mem_size,
                  fp64=bool(dev.double_fp_config), max_alloc=dev.max_mem_alloc_size,
                  memory=dev.global_mem_size, vector_width=dev.preferred_vector_width_float,
                  gpu=bool(dev.type & cl.device_type.GPU) and not simulator)
        return own.capped(caps) if caps else own

    def capped(self, spec):
        """These limits lowered by a PORTANET_CL_LIMITS string: profile names and
        key=value items, comma-separated ('mobile', 'amd,local=16k', 'work_group=64')."""
        caps, names = {}, []
        for item in (i.strip().lower() for i in spec.split(",") if i.strip()):
            if "=" in item:
                key, _, value = item.partition("=")
                caps[key.strip()] = _limit_value(key.strip(), value.strip(), spec)
            elif item in PROFILES:
                caps.update(PROFILES[item])
                names.append(item)
            else:
                raise DeviceError(f"PORTANET_CL_LIMITS={spec!r}: {item!r} is neither a "
                                  f"profile ({', '.join(PROFILES)}) nor key=value with a key "
                                  f"of {', '.join(LIMIT_KEYS)}")
        max_alloc = self.max_alloc
        if "max_alloc" in caps:
            cap = caps["max_alloc"]
            max_alloc = min(max_alloc, int(cap * self.memory) if isinstance(cap, float) else cap)
        group = min(self.work_group, caps.get("work_group", self.work_group))
        capped = dataclasses.replace(
            self, work_group=group, work_items=tuple(min(w, group) for w in self.work_items),
            local_bytes=min(self.local_bytes, caps.get("local", self.local_bytes)),
            fp64=self.fp64 and caps.get("fp64", True), max_alloc=max_alloc,
            vector_width=min(self.vector_width, caps.get("vector", self.vector_width)),
            gpu=caps.get("gpu", self.gpu), profile=",".join(names) or spec)
        capped._check_gemm(self, spec)
        return capped

    def _check_gemm(self, own, spec):
        """Refuse caps under which no tiling of our GEMM kernel fits (gemm_params finds
        none) for the reals the device keeps: float64 where it has them, whose slabs take
        twice float32's local memory. Every product, so every network, would fail. The
        DeviceError names the smallest work_group and local that work, found by bisection
        over gemm_params itself, within the device's own limits."""
        itemsize = 8 if self.fp64 else 4
        if _gemm_tiling(self.gpu, self.work_group, self.local_bytes, itemsize) or \
                not _gemm_tiling(self.gpu, own.work_group, own.local_bytes, itemsize):
            return              # it fits, or the device's own limits do not: not the caps'
        ways = " or ".join(self._smallest_caps(own, itemsize))
        if self.fp64 and _gemm_tiling(self.gpu, self.work_group, self.local_bytes, 4):
            what, also = "in float64, so no float64 network", ", or fp64=no for float32 alone"
        else:
            alone = " or ".join(self._smallest_caps(own, 4))
            what = "at all, so no network"
            also = "" if alone == ways else f" ({alone} with fp64=no, for float32 alone)"
        raise DeviceError(
            f"PORTANET_CL_LIMITS={spec!r}: with {self.work_group} work-items per group and "
            f"{self.local_bytes} bytes of local memory no tiling of portanet's GEMM kernel "
            f"fits {what} could run; the smallest values that work: {ways}{also}")

    def _smallest_caps(self, own, itemsize):
        """The caps that make a GEMM tiling fit with the least change to these limits:
        local alone, work_group alone, else both, each the smallest that works."""
        def fits(group, local):
            return _gemm_tiling(self.gpu, group, local, itemsize)
        ways = []
        if fits(self.work_group, own.local_bytes):
            local = _smallest(lambda v: fits(self.work_group, v), 1, own.local_bytes)
            ways.append(f"local={local}")
        if fits(own.work_group, self.local_bytes):
            group = _smallest(lambda v: fits(v, self.local_bytes), 1, own.work_group)
            ways.append(f"work_group={group}")
        if not ways:
            group = _smallest(lambda v: fits(v, own.local_bytes), 1, own.work_group)
            local = _smallest(lambda v: fits(group, v), 1, own.local_bytes)
            ways.append(f"work_group={group},local={local}")
        return ways


# device classes we cannot test on, as the limits their kernels must live within
PROFILES = {"amd": {"work_group": 256, "local": 64 * 1024, "gpu": True},
            "intel-gpu": {"work_group": 256, "local": 64 * 1024, "fp64": False, "gpu": True},
            "mobile": {"work_group": 256, "local": 32 * 1024, "fp64": False,
                       "max_alloc": 0.25, "gpu": True}}
LIMIT_KEYS = {"work_group": "work-items per group", "local": "local memory bytes (16k)",
              "fp64": "yes or no", "max_alloc": "bytes (512m) or a share of memory (25%)",
              "vector": "float vector width", "gpu": "yes or no: GPU tilings"}
_SIZE = re.compile(r"^(\d+)\s*([kmg]?)(?:i?b)?$")


def _limit_value(key, value, spec):
    if key not in LIMIT_KEYS:
        raise DeviceError(f"PORTANET_CL_LIMITS={spec!r}: unknown key {key!r}; the keys are "
                          + ", ".join(f"{k} ({v})" for k, v in LIMIT_KEYS.items()))
    if key in ("fp64", "gpu"):
        if value in ("yes", "1", "true", "on", "no", "0", "false", "off"):
            return value in ("yes", "1", "true", "on")
    elif key == "max_alloc" and value.endswith("%") and value[:-1].isdigit():
        return int(value[:-1]) / 100
    else:
        match = _SIZE.match(value)
        if match and int(match.group(1)) > 0:
            return int(match.group(1)) * 1024 ** " kmg".index(match.group(2) or " ")
    raise DeviceError(f"PORTANET_CL_LIMITS={spec!r}: {key}={value!r} is not "
                      f"{LIMIT_KEYS[key]}")


def _gemm_tiling(is_gpu, work_group, local, itemsize):
    """Whether some tiling of our GEMM kernel fits these limits (gemm_params finds one)."""
    try:
        gemm_params(is_gpu, work_group, local, itemsize)
    except RuntimeError:
        return False
    return True


def _smallest(works, low, high):
    """The smallest value in [low, high] for which works(value), which holds for high and
    for every value above one for which it holds."""
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if works(middle) else (middle + 1, high)
    return high
