"""Kernel sources: found from the installed package, twins parallel, CUDA compiles."""
import re
import shutil
import subprocess

import pytest

from portanet.backends import gpu, sources


def kernel_names(text):
    return re.findall(r"KERNEL (?:GROUP_SIZE\([^)]*\)\s*)?void (\w+)\(", text)


def test_every_family_has_twins_with_the_same_kernels():
    cl, cu = sources.folder("cl"), sources.folder("cu")
    assert sorted(p.stem for p in cl.glob("*.cl")) == sorted(
        p.stem for p in cu.glob("*.cu") if p.stem not in sources.CUDA_ONLY)
    for path in cl.glob("*.cl"):
        cl_text = path.read_text()
        cu_text = (cu / f"{path.stem}.cu").read_text()
        assert kernel_names(cl_text) == kernel_names(cu_text)
        # the bodies are the same text; only the file name in the first comment differs
        assert cl_text.replace(".cl:", ".cu:", 1) == cu_text, f"{path.stem} twins differ"
    # the headers but the prelude (the words that differ) are the same text
    for header in sources.HEADERS[1:]:
        assert (cl / header).read_text() == (cu / header).read_text(), f"{header} differs"


def test_backends_know_every_kernel():
    for family, names in gpu.FAMILIES.items():
        _, text = sources.load(family, "cl")
        assert set(names) <= set(kernel_names(text))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("family", sorted(p.stem for p in sources.folder("cu").glob("*.cu")))
@pytest.mark.parametrize("real", ["float", "double"])
def test_cuda_kernels_compile(family, real, tmp_path):
    path = sources.folder("cu") / f"{family}.cu"
    variants = [["-DTRANS_A=0", "-DTRANS_B=0"], ["-DTRANS_A=1", "-DTRANS_B=1"],
                ["-DTSM=128", "-DTSN=128", "-DTSK=8", "-DWPTM=8", "-DWPTN=8", "-DMICRO=2",
                 "-DPAD=4", "-DVW=4", "-DDB=1", "-DSPLIT_K=1"],
                ["-DSPLIT_K=2", "-DBIAS_ACT=1", "-DTRANS_B=1"],
                ["-DSPLIT_K=2", "-DCONV=1", "-DCONV_K=3", "-DCONV_S=1", "-DCONV_P=1",
                 "-DBIAS_ACT=1", "-DVW=4"]] \
        if family == "gemm" else [[]]
    if real == "float":                 # tf32, bf16, fp16 backends' builds: inputs rounded
        variants += [gpu.operand_options(p) for p in ("tf32", "bf16", "fp16")]
        # and bf16's and fp16's 16-bit storage: the families' STORED arrays, gemm's operands
        # (and a convolution's gathers from 16-bit images and deltas)
        conv = ["-DCONV_K=3", "-DCONV_S=2", "-DCONV_P=1", "-DVW=4"]
        stored = (["-DA_HALF=1", "-DB_HALF=1", "-DVW=4"], ["-DA_HALF=1", "-DTRANS_B=1"],
                  ["-DB_HALF=1", "-DTRANS_A=1", "-DVW=1"], ["-DB_HALF=1", "-DCONV=1", *conv],
                  ["-DB_HALF=1", "-DCONV=2", *conv],
                  ["-DA_HALF=1", "-DB_HALF=1", "-DCONV=3", "-DTRANS_B=1", *conv]) \
            if family == "gemm" else (["-DSTORED_HALF=1"],)
        variants += [gpu.operand_options(p) + list(v) for p in ("bf16", "fp16") for v in stored]
    if family == "mma":                 # TF32: float only
        if real == "double":
            pytest.skip("mma.cu computes float32 products in TF32")
        variants = [[f"-DTRANS_A={ta}", f"-DTRANS_B={tb}", f"-DVEC={vec}",
                     f"-DMIN_BLOCKS={1 + vec}", f"-arch=sm_{arch}"]
                    for ta in (0, 1) for tb in (0, 1) for vec in (0, 1) for arch in (80, 90)]
    if family == "wgmma":               # bf16 and fp16 inputs, Hopper's own instructions
        if real == "double":
            pytest.skip("wgmma.cu computes float32 products from 16-bit inputs")
        variants = [gpu.operand_options(p) + ["-gencode=arch=compute_90a,code=sm_90a"] + source
                    for p in ("bf16", "fp16") for source in ([], ["-DSOURCE_HALF=1"])]
    for flags in variants:
        arch = [] if any(f.startswith(("-arch", "-gencode")) for f in flags) else ["-arch=sm_80"]
        # device code only, as pycuda builds it (--cubin): no host compile, a third the time
        cmd = ["nvcc", "--cubin", "-o", str(tmp_path / "k.cubin"), *arch, f"-DREAL={real}",
               f"-DREAL_IS_DOUBLE={int(real == 'double')}", *flags,
               "-I", str(path.parent), str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_host_sizes_launches_as_the_kernels_step():
    """gpu.py sizes bias_activation's and momentum_updates' launches by the elements a
    work-item of elementwise.cl takes; a kernel written for another count would leave
    elements out."""
    for lang in ("cl", "cu"):
        assert f"#define STEPS {gpu.STEPS}\n" in sources.load("elementwise", lang)[1]


def test_installed_package_carries_its_kernels():
    import portanet
    from pathlib import Path
    package = Path(portanet.__file__).resolve().parent
    if "site-packages" not in str(package):
        pytest.skip("portanet is imported from a checkout, not an installed wheel")
    assert sources.folder("cl").parent == package
    assert sources.folder("cu").parent == package


def test_build_errors_show_the_file_and_the_compiler_log(monkeypatch):
    from conftest import get_backend
    import portanet as pn
    bk = get_backend("opencl")
    broken = "#include \"prelude.h\"\nKERNEL void broken(GLOBAL real* x) { x[0] = undefined_name; }\n"
    real_load = sources.load
    monkeypatch.setattr(sources, "load", lambda family, lang: (
        sources.folder(lang) / "broken.cl", (sources.folder(lang) / "prelude.h").read_text()
        + broken.split("\n", 1)[1]) if family == "broken" else real_load(family, lang))
    with pytest.raises(pn.errors.KernelBuildError, match=r"(?s)broken\.cl failed to build.*undefined_name"):
        bk._program("broken")
