"""SourceModule over the source text: its kernels found by name, checked at launch; a
compile's "binary" is the source, which driver.module_from_buffer reads alike."""
import re

import numpy as np

from . import driver

KERNEL = re.compile(r"KERNEL\b(?:\s+\w+\s*\([^()]*\))*\s*(?:void\s+)?(?:\w+\s*\([^()]*\)\s*)?"
                    r"(?:void\s+)?(\w+)\s*\(")
CODES = {"P": np.uintp, "i": np.int32, "f": np.float32, "d": np.float64}
launches = []                       # (kernel name, grid, block) of every launch


class Function:
    def __init__(self, name):
        self.name = name
        self.codes = None
        self.attributes = {}

    def set_attribute(self, attribute, value):
        self.attributes[attribute] = value

    def prepare(self, codes):
        if any(c not in CODES for c in codes):
            raise driver.LogicError(f"{self.name}: unknown argument codes {codes!r}")
        self.codes = codes
        return self

    def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
        what = f"launch of {self.name}"
        if self.codes is None:
            raise driver.LogicError(f"{what}: not prepared")
        if len(args) != len(self.codes):
            raise driver.LogicError(f"{what}: {len(args)} arguments for {len(self.codes)}")
        for i, (code, arg) in enumerate(zip(self.codes, args)):
            if not isinstance(arg, CODES[code]):
                raise driver.LogicError(f"{what}: argument {i} is {type(arg).__name__}, "
                                        f"prepared as {code!r}")
            if code == "P":
                driver.Memory.check(int(arg), 1, f"{what}, argument {i}")
        if not isinstance(stream, driver.Stream):
            raise driver.LogicError(f"{what}: no stream")
        for sizes, lengths in ((grid, (2, 3)), (block, (3,))):
            if len(sizes) not in lengths or not all(isinstance(s, int) and s >= 1
                                                    for s in sizes):
                raise driver.LogicError(f"{what}: sizes {grid} x {block}")
        if block[0] * block[1] * block[2] > driver.ATTRIBUTES["max_threads"]:
            raise driver.LogicError(f"{what}: block {block} over the device's threads")
        if shared_size > self.attributes.get(driver.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                             driver.ATTRIBUTES["shared"]):
            raise driver.LogicError(f"{what}: {shared_size} bytes of shared memory not allowed")
        launches.append((self.name, grid, block))


COMPILED = []       # (first kernel, options, arch) of each compile nvcc would run


def compile(source, nvcc="nvcc", options=None, keep=False, no_extern_c=False, arch=None,
            code=None, cache_dir=None, include_dirs=()):
    """pycuda.compiler.compile: the source checked, each compile counted (portanet keeps
    its own binaries: a compile here is one it could not find there); the "binary" is the
    source."""
    names = _names(source, no_extern_c, arch)
    COMPILED.append((min(names), list(options or ()), arch))
    return source.encode()


def _names(source, no_extern_c, arch):
    if not no_extern_c:
        raise driver.CompileError("portanet's sources declare extern \"C\" themselves")
    if not (arch or "").startswith("sm_"):
        raise driver.CompileError(f"no architecture: {arch!r}")
    names = set(KERNEL.findall(source))
    if not names:
        raise driver.CompileError("no kernels in the source")
    return names


class SourceModule:
    def __init__(self, source, options=None, arch=None, no_extern_c=False):
        compile(source, options=options, no_extern_c=no_extern_c, arch=arch)
        self.names = _names(source, no_extern_c, arch)

    @classmethod
    def from_binary(cls, binary):
        """driver.module_from_buffer: the module of a binary `compile` made."""
        module = cls.__new__(cls)
        module.names = _names(bytes(binary).decode(), True, "sm_")
        return module

    def get_function(self, name):
        if name not in self.names:
            raise driver.LogicError(f"cuModuleGetFunction failed: named symbol not found "
                                    f"({name}; the source has {sorted(self.names)})")
        return Function(name)
