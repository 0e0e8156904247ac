"""OpenCL runtimes installed with pip, made visible to the ICD loader before its first call.

The ICD loader (libOpenCL) finds drivers through .icd files, each naming a library: in
/etc/OpenCL/vendors, or in the folder OCL_ICD_VENDORS names instead. pyopencl's wheel
brings its own loader, which also reads the .icd files next to it (PoCL's and Oclgrind's
wheels put theirs there, so those two need nothing). Intel's CPU runtime (extra
`intel-cpu`: intel-opencl-rt) installs libintelocl.so into the environment's lib/, but its
.icd file names the path of the machine it was built on. So, once per process and before
the loader first looks, `prepare` writes a vendors folder holding the .icd files the
loader would have read plus one naming the installed libintelocl.so, and points
OCL_ICD_VENDORS at it. (libintelocl.so finds its own libraries, libimf, libsvml, libtbb,
through its RUNPATH $ORIGIN: no loader path to set.)
"""
import hashlib
import logging
import os
import tempfile
import threading
from importlib import metadata
from pathlib import Path

from .. import config

SYSTEM_VENDORS = "/etc/OpenCL/vendors"
log = logging.getLogger("portanet")
_done = False
_lock = threading.Lock()


def prepare():
    """Make the pip-installed runtimes visible; idempotent. Must run before the process's
    first clGetPlatformIDs (opencl_devices.py calls it before listing platforms)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
        extra = {f"{name}.icd": str(lib) for name, lib in _pip_runtimes().items()}
        if not extra:
            return
        current = os.environ.get("OCL_ICD_VENDORS") or SYSTEM_VENDORS
        try:
            entries = {**_icd_entries(current), **extra}
            try:
                folder = _write_folder(entries, config.cache_dir())
            except OSError:             # no writable cache: a folder of this process's own
                folder = _write_folder(entries, Path(tempfile.mkdtemp(prefix="portanet-")))
        except OSError as e:            # the runtime stays invisible; the others still work
            log.warning("cannot make the pip-installed OpenCL runtimes visible (%s): %s",
                        ", ".join(extra), e)
            return
        os.environ["OCL_ICD_VENDORS"] = str(folder)


def _pip_runtimes():
    """{icd name: library path} of the runtimes whose own .icd files are wrong."""
    found = {}
    try:
        files = metadata.distribution("intel-opencl-rt").files or []
    except metadata.PackageNotFoundError:
        return found
    for f in files:
        if f.name == "libintelocl.so":
            path = Path(f.locate()).resolve()
            if path.is_file():
                found["portanet-intel-cpu"] = path
    return found


def _icd_entries(source):
    """{file name: contents} of what the loader reads at `source`: a folder of .icd files,
    one .icd file, or a library (ocl-icd accepts all three in OCL_ICD_VENDORS)."""
    path = Path(source)
    if path.is_dir():
        return {p.name: p.read_text().strip() for p in sorted(path.glob("*.icd"))
                if p.is_file()}
    if path.suffix == ".icd" and path.is_file():
        return {path.name: path.read_text().strip()}
    if path.exists():
        return {f"{path.name}.icd": str(path)}
    return {}


def _write_folder(entries, base):
    """A vendors folder holding `entries`, in `base`, named by its contents so that
    processes started together share it; written whole, then renamed into place."""
    text = "\n".join(f"{name}={entries[name]}" for name in sorted(entries))
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = base / f"opencl-vendors-{digest}"
    if folder.is_dir():
        return folder
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".opencl-vendors-{digest}-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    for name, contents in entries.items():
        (tmp / name).write_text(contents + "\n")
    try:
        tmp.rename(folder)
    except OSError:                 # another process put the same folder there first
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return folder
