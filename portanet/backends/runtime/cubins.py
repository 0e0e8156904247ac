"""CUDA binaries of kernel sources, for one architecture, kept on disk by content.

A build is NVRTC's, in this process (cuda-bindings, which nvmath-python brings): no
process to start, no host compiler, and several at once in threads. Where NVRTC is not
here, nvcc's (pycuda's `compile`, a process each). Either way the binary is kept in
`folder` under a digest of the source, the options, the architecture and the compiler,
and read from there by any later process: a kept binary costs one file read, where
pycuda's own cache ran nvcc's preprocessor on every source naming an #include to key it
(0.12 s a build, each run)."""
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

from ...errors import KernelBuildError

_compiler = None                        # (name, build function), chosen once a process
_lock = threading.Lock()


def cubin(text, options, arch, folder, name="kernel.cu"):
    """The cubin of CUDA source `text` built with `options` for `arch` (sm_90, sm_90a):
    from `folder` where an earlier build kept it, else built and kept there (written
    whole, so that concurrent processes read a complete file or none). A failed build is a
    KernelBuildError with the compiler's log, `name` naming the source in it."""
    which, build = compiler()
    key = hashlib.sha256("\0".join([which, arch, *options, text]).encode()).hexdigest()[:32]
    path = Path(folder) / f"{key}.cubin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    binary = build(text, list(options), arch, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".cubin-")
        with os.fdopen(handle, "wb") as f:
            f.write(binary)
        os.replace(temp, path)
    except OSError:
        pass                            # a read-only cache: built again next time
    return binary


def compiler():
    """(what identifies the compiler, its build(text, options, arch, name) -> cubin):
    NVRTC where cuda-bindings has it, else nvcc."""
    global _compiler
    with _lock:
        if _compiler is None:
            _compiler = _nvrtc() or _nvcc()
        return _compiler


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
        ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:                   # not installed, or its library not found
        return None
    if err != ok:
        return None

    def build(text, options, arch, name):
        err, program = nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], [])
        if err != ok:
            raise KernelBuildError(f"NVRTC could not take {name}: {err}")
        try:
            flags = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
            err, = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
            if err != ok:
                _, size = nvrtc.nvrtcGetProgramLogSize(program)
                log = b" " * size
                nvrtc.nvrtcGetProgramLog(program, log)
                raise KernelBuildError(f"{name} failed to compile for {arch} with "
                                       f"{options} (NVRTC {major}.{minor}):\n"
                                       f"{log.decode(errors='replace').strip()}")
            _, size = nvrtc.nvrtcGetCUBINSize(program)
            binary = b" " * size
            nvrtc.nvrtcGetCUBIN(program, binary)
            return binary
        finally:
            nvrtc.nvrtcDestroyProgram(program)
    return f"nvrtc {major}.{minor}", build


def _nvcc():
    found = shutil.which("nvcc")
    stat = os.stat(found) if found else None
    which = f"nvcc {found} {stat.st_size} {stat.st_mtime_ns}" if stat else "nvcc"

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
