"""Kernel sources, each shared body written once.

kernels_cl/ holds every family both languages build (<family>.cl) and the headers they
include: prelude.h (the dialect's words in OpenCL C), groups.h (group sums), copies.h
(the 16-bit storage type) and random.h (dropout's hash). kernels_cu/ holds only what CUDA alone says: its own prelude.h
and the tensor-core families (CUDA_ONLY, <family>.cu). Both folders come from the
installed package (setup.cfg maps the two top-level folders into it) or, in a checkout,
from the repo."""
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent
FOLDERS = {"cl": "kernels_cl", "cu": "kernels_cu"}
# families CUDA alone builds: tensor-core kernels and sums over peer GPUs, which OpenCL C
# has no way to write
CUDA_ONLY = ("mma", "wgmma", "peer")
PRELUDE = "prelude.h"                       # the dialect's words: one per language
SHARED_HEADERS = ("groups.h", "copies.h", "random.h")  # one text for both languages, in kernels_cl/
HEADERS = (PRELUDE, *SHARED_HEADERS)        # what kernel sources #include, inlined


def folder(lang):
    name = FOLDERS[lang]
    for base in (_PACKAGE, _PACKAGE.parent):      # installed wheel, then checkout
        if (base / name / PRELUDE).is_file():
            return base / name
    raise FileNotFoundError(f"portanet's {name}/ kernel sources are not installed next to "
                            f"{_PACKAGE}; reinstall portanet (pip install portanet)")


def body(family, lang):
    """The file a family's body is read from: kernels_cu/<family>.cu for CUDA's
    tensor-core families, else kernels_cl/<family>.cl, for both languages."""
    if lang == "cu" and family in CUDA_ONLY:
        return folder("cu") / f"{family}.cu"
    return folder("cl") / f"{family}.cl"


def load(family, lang):
    """(path, source) of one kernel family as `lang` ("cl", "cu") builds it: its body
    (`body`) with the headers it includes inlined, the language's own prelude.h and
    kernels_cl/'s groups.h (for the families that sum over a group) and copies.h (for
    those that write an array's 16-bit copy), so that the compiled-program caches key on
    the whole text."""
    path = body(family, lang)
    text = path.read_text()
    for header in HEADERS:
        d = folder(lang) if header == PRELUDE else folder("cl")
        text = text.replace(f'#include "{header}"', (d / header).read_text(), 1)
    return path, text
