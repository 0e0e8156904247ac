"""NVRTC's calls as cuda-bindings makes them, over the pycuda stand-in's compiler: a source
checked and counted as `pycuda.compiler.compile` counts it (compiler.COMPILED), its
"cubin" the source itself, which the stand-in's driver.module_from_buffer reads. With
STANDIN_NVRTC=0 in the environment NVRTC is missing (nvrtcVersion fails), as where
cuda-bindings has no libnvrtc: portanet then builds through nvcc (the same stand-in)."""
import enum
import os

from pycuda import compiler, driver


class nvrtcResult(enum.IntEnum):
    NVRTC_SUCCESS = 0
    NVRTC_ERROR_INVALID_INPUT = 3
    NVRTC_ERROR_COMPILATION = 6
    NVRTC_ERROR_BUILTIN_OPERATION_FAILURE = 7


class _Program:
    def __init__(self, source, name):
        self.source, self.name = source.decode(), name.decode()
        self.binary = self.log = b""


def nvrtcVersion():
    if os.environ.get("STANDIN_NVRTC") == "0":
        return nvrtcResult.NVRTC_ERROR_BUILTIN_OPERATION_FAILURE, 0, 0
    return nvrtcResult.NVRTC_SUCCESS, 13, 0


def nvrtcGetSupportedArchs():
    return nvrtcResult.NVRTC_SUCCESS, [75, 80, 86, 87, 89, 90, 100, 120]


def nvrtcCreateProgram(source, name, headers, contents, names):
    return nvrtcResult.NVRTC_SUCCESS, _Program(source, name)


def nvrtcCompileProgram(program, count, options):
    options = [o.decode() for o in options[:count]]
    arch = [o.split("=", 1)[1] for o in options if o.startswith("--gpu-architecture=")]
    rest = [o for o in options if not o.startswith("--gpu-architecture=")]
    try:
        program.binary = compiler.compile(program.source, options=rest,
                                          arch=arch[0] if arch else None, no_extern_c=True)
    except driver.CompileError as e:
        program.log = str(e).encode()
        return (nvrtcResult.NVRTC_ERROR_COMPILATION,)
    return (nvrtcResult.NVRTC_SUCCESS,)


def _fill(buffer, data):
    """Into the buffer the caller sized (a bytearray), as the real binding writes it."""
    if len(buffer) < len(data):
        return (nvrtcResult.NVRTC_ERROR_INVALID_INPUT,)
    buffer[:len(data)] = data
    return (nvrtcResult.NVRTC_SUCCESS,)


def nvrtcGetProgramLogSize(program):
    return nvrtcResult.NVRTC_SUCCESS, len(program.log)


def nvrtcGetProgramLog(program, buffer):
    return _fill(buffer, program.log)


def nvrtcGetCUBINSize(program):
    return nvrtcResult.NVRTC_SUCCESS, len(program.binary)


def nvrtcGetCUBIN(program, buffer):
    return _fill(buffer, program.binary)


def nvrtcDestroyProgram(program):
    return (nvrtcResult.NVRTC_SUCCESS,)
