"""Whether the plain GEMM kernel (gemm.cl without CONV) preprocesses to the same
tokens at a git revision as in the working tree, for several sets of tiling definitions.

portanet/tuned.json keys each entry by a digest of the gemm source, so any edit untunes
every device. Where this script says "same" for both languages, the edit (comments, code
under #if CONV) left the compiled GEMM unchanged, and the entries may be re-keyed to the new
digest (tuning.kernel_hash) instead of tuned again. Needs a C preprocessor (cpp).

    python bench/gemm_same_tokens.py 28d6ea7
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFINES = [[], ["-DTRANS_A=1", "-DSPLIT_K=1", "-DVW=4", "-DMICRO=2", "-DPAD=4"],
           ["-DTRANS_B=1", "-DSWIZZLE=4", "-DDB=1", "-DSUBGROUP=32", "-DMIN_GROUPS=2"],
           ["-DREAL_IS_DOUBLE=1", "-DMICRO=1"]]


def tokens(text, prelude, defines):
    text = text.replace('#include "prelude.h"', prelude, 1)
    out = subprocess.run(["cpp", "-P", "-w", *defines], input=text, capture_output=True,
                         text=True, check=True).stdout
    return re.findall(r"\w+|[^\w\s]", out)


def main(revision):
    same = True
    name = "gemm.cl"                    # one body, built with each language's prelude
    for folder in ("kernels_cl", "kernels_cu"):
        old = subprocess.run(["git", "show", f"{revision}:kernels_cl/{name}"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        new = (ROOT / "kernels_cl" / name).read_text()
        prelude = (ROOT / folder / "prelude.h").read_text()
        for defines in DEFINES:
            ok = tokens(old, prelude, defines) == tokens(new, prelude, defines)
            same &= ok
            print(f"{name} with {folder}/prelude.h {' '.join(defines) or '(defaults)'}: "
                  f"{'same' if ok else 'DIFFERENT'}")
    print("same tokens: tuned entries may be re-keyed" if same else
          "the GEMM changed: tune again")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "HEAD"))
