"""CUDA binaries of kernel sources, for one architecture, kept on disk by content.

A build is NVRTC's, in this process (cuda-bindings, which nvmath-python brings): no
process to start, no host compiler, and several at once in threads. Where NVRTC is not
here, does not know the GPU's architecture, or is of a newer CUDA than the driver (whose
loader may refuse its binaries), nvcc's (pycuda's `compile`, a process each). Either way
the binary is kept in `folder` under a digest of the source, the options, the architecture
and the compiler, and read from there by any later process: a kept binary costs one file
read, where pycuda's own cache ran nvcc's preprocessor on every source naming an #include
to key it (0.12 s a build, each run)."""
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...errors import KernelBuildError


def _umask():
    """The process's umask, read once here (reading it sets it: build_many keeps binaries
    from several threads, which must not see it changed)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()          # the kept binaries' mode: readable as the process makes files

def cubin(text, options, arch, folder, name="kernel.cu", driver=None):
    """The cubin of CUDA source `text` built with `options` for `arch` (sm_90, sm_90a):
    from `folder` where an earlier build kept it, else built and kept there (written
    whole, so that concurrent processes read a complete file or none). driver: the CUDA
    driver's version (12080 for 12.8), which NVRTC's CUDA must not be newer than. A failed
    build is a KernelBuildError with the compiler's log, `name` naming the source in it."""
    which, build = compiler(arch, driver)
    key = hashlib.sha256("\0".join([which, arch, *options, text]).encode()).hexdigest()[:32]
    path = Path(folder) / f"{key}.cubin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    binary = build(text, list(options), arch, name)
    _keep(path, binary)
    return binary


def _keep(path, binary):
    """binary written to path whole (a temporary file renamed over it), readable as the
    umask lets files be; nothing where the folder cannot be written (built again next
    time)."""
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".cubin-")
        with os.fdopen(handle, "wb") as f:
            f.write(binary)
        os.chmod(temp, 0o666 & ~_UMASK)
        os.replace(temp, path)
    except OSError:
        if temp is not None:
            try:
                os.unlink(temp)
            except OSError:
                pass


def compiler(arch, driver=None):
    """(what identifies the compiler, its build(text, options, arch, name) -> cubin) for
    `arch`: NVRTC where cuda-bindings has it, it builds for arch and its CUDA is not newer
    than the driver's; else nvcc."""
    nvrtc = _nvrtc()
    if nvrtc is not None:
        which, build, archs, major = nvrtc
        number = int("".join(c for c in arch.split("_")[-1] if c.isdigit()))
        if number in archs and (driver is None or major <= driver // 1000):
            return which, build
    return _nvcc()


@functools.lru_cache(maxsize=None)
def _nvrtc():
    """(identity, build, the architectures it builds for, its CUDA major version), or None
    where NVRTC is not here."""
    try:
        from cuda.bindings import nvrtc
        ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, major, minor = nvrtc.nvrtcVersion()
        if err != ok:
            return None
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        if err != ok:
            return None
    except Exception:                   # not installed, or its library not found
        return None

    def check(result, what, name):
        err, *rest = result
        if err != ok:
            raise KernelBuildError(f"NVRTC {major}.{minor} failed to {what} {name}: {err}")
        return rest[0] if rest else None

    def build(text, options, arch, name):
        program = check(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []),
                        "take", name)
        try:
            flags = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
            err, = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
            if err != ok:
                log = bytearray(check(nvrtc.nvrtcGetProgramLogSize(program), "log", name))
                check(nvrtc.nvrtcGetProgramLog(program, log), "log", name)
                text = log.decode(errors="replace").strip(chr(0)).strip()
                raise KernelBuildError(f"{name} failed to compile for {arch} with {options} "
                                       f"(NVRTC {major}.{minor}: {err}):\n{text}")
            binary = bytearray(check(nvrtc.nvrtcGetCUBINSize(program), "size the binary of",
                                     name))
            check(nvrtc.nvrtcGetCUBIN(program, binary), "copy the binary of", name)
            if not binary:
                raise KernelBuildError(f"NVRTC {major}.{minor} made no binary of {name}")
            return bytes(binary)
        finally:
            nvrtc.nvrtcDestroyProgram(program)
    return f"nvrtc {major}.{minor}", build, set(archs), major


@functools.lru_cache(maxsize=None)
def _nvcc():
    """(identity: nvcc's --version and the variables that add to its flags, build)."""
    found = shutil.which("nvcc")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout if found else ""
    except (OSError, subprocess.SubprocessError):
        version = ""
    which = " ".join(["nvcc", *version.split(), os.environ.get("NVCC_APPEND_FLAGS", ""),
                      os.environ.get("NVCC_PREPEND_FLAGS", ""),
                      os.environ.get("CUDA_DEBUGGING", "")])

    def build(text, options, arch, name):
        import pycuda.driver as drv
        from pycuda.compiler import compile as nvcc_compile
        try:
            return nvcc_compile(text, options=options, arch=arch, no_extern_c=True,
                                cache_dir=False)
        except drv.CompileError as e:
            raise KernelBuildError(f"{name} failed to compile for {arch} with "
                                   f"{options}:\n{e}") from e
    return which, build
