"""Kernel sources: kernels_cl/*.cl and kernels_cu/*.cu, from the installed package
(setup.cfg maps the two top-level folders into it) or, in a checkout, from the repo."""
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
FOLDERS = {"cl": "kernels_cl", "cu": "kernels_cu"}
# families without a twin: tensor-core kernels, which OpenCL C has no way to
CUDA_ONLY = ("mma", "wgmma")


def folder(lang):
    name = FOLDERS[lang]
    for base in (_PACKAGE, _PACKAGE.parent):      # installed wheel, then checkout
        if (base / name / "prelude.h").is_file():
            return base / name
    raise FileNotFoundError(f"portanet's {name}/ kernel sources are not installed next to "
                            f"{_PACKAGE}; reinstall portanet (pip install portanet)")


HEADERS = ("prelude.h", "groups.h", "copies.h")    # what kernel sources #include, inlined


def load(family, lang):
    """(path, source) of one kernel family with the headers it includes inlined (prelude.h
    and, for the families that sum over a group, groups.h, and for those that write an
    array's 16-bit copy, copies.h), so that the compiled-program caches key on the whole
    text."""
    d = folder(lang)
    path = d / f"{family}.{lang}"
    text = path.read_text()
    for header in HEADERS:
        text = text.replace(f'#include "{header}"', (d / header).read_text(), 1)
    return path, text
