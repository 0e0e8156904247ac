"""Kernel sources: each shared body written once in kernels_cl/, built for OpenCL and (with
CUDA's prelude) for CUDA by the loader; kernels_cu/ holds only what CUDA alone says; the
shipped tunings key on the loaded text."""
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import portanet
from portanet.backends import arrays, gpu, sources
from portanet.backends.runtime import cubins

SHARED = sorted(p.stem for p in sources.folder("cl").glob("*.cl"))
CUDA_FAMILIES = sorted(SHARED + list(sources.CUDA_ONLY))    # what CUDA builds
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def kernel_names(text):
    return re.findall(r"KERNEL (?:GROUP_SIZE\([^)]*\)\s*)?void (\w+)\(", text)


def loads():
    """(family, lang) of every build: the shared families in both languages, CUDA's own."""
    return [(f, lang) for f in SHARED for lang in ("cl", "cu")] + [
        (f, "cu") for f in sources.CUDA_ONLY]


def test_kernels_cu_holds_only_what_cuda_alone_says():
    cl, cu = sources.folder("cl"), sources.folder("cu")
    assert sorted(p.name for p in cu.iterdir()) == sorted(
        [sources.PRELUDE] + [f"{f}.cu" for f in sources.CUDA_ONLY])
    assert sorted(p.name for p in cl.iterdir()) == sorted(
        list(sources.HEADERS) + [f"{f}.cl" for f in SHARED])
    assert not set(SHARED) & set(sources.CUDA_ONLY)


@pytest.mark.parametrize("family, lang", loads())
def test_every_family_loads_with_its_headers_inlined(family, lang):
    path, text = sources.load(family, lang)
    assert path == sources.body(family, lang) and path.is_file()
    assert path.parent == sources.folder("cu" if family in sources.CUDA_ONLY else "cl")
    included = INCLUDE.findall(path.read_text())
    assert sources.PRELUDE in included and set(included) <= set(sources.HEADERS)
    assert not INCLUDE.findall(text), f"{family} ({lang}) keeps an #include"
    assert (sources.folder(lang) / sources.PRELUDE).read_text() in text
    for header in set(included) - {sources.PRELUDE}:    # one text for both languages
        assert (sources.folder("cl") / header).read_text() in text


def test_opencl_has_no_tensor_core_families():
    for family in sources.CUDA_ONLY:
        with pytest.raises(FileNotFoundError):
            sources.load(family, "cl")


@pytest.mark.parametrize("family", SHARED)
def test_cuda_text_of_a_shared_family_is_the_body_with_cudas_prelude(family):
    cl_path, cl_text = sources.load(family, "cl")
    cu_path, cu_text = sources.load(family, "cu")
    assert cu_path == cl_path
    preludes = [(sources.folder(lang) / sources.PRELUDE).read_text() for lang in ("cl", "cu")]
    assert preludes[0] != preludes[1]
    assert cl_text.replace(preludes[0], preludes[1], 1) == cu_text
    assert kernel_names(cl_text) == kernel_names(cu_text)


def test_backends_know_every_kernel():
    for family, names in gpu.FAMILIES.items():
        for lang in ("cl", "cu"):
            _, text = sources.load(family, lang)
            assert set(names) <= set(kernel_names(text))


def test_shipped_tunings_key_on_the_current_gemm_source():
    """tuned.json keys each entry by kernel_hash, the first 12 hex digits of the sha256 of
    the gemm text as a language loads it (gemm.cl with that language's prelude): an edit to
    either leaves the shipped tunings unapplied unless the entries are re-keyed."""
    shipped = Path(portanet.__file__).resolve().parent / "tuned.json"
    lang = {"opencl": "cl", "cuda": "cu"}
    for key in json.loads(shipped.read_text())["entries"]:
        kind, digest = key.split(" | ")[0], key.rsplit(" | gemm ", 1)[1]
        text = sources.load("gemm", lang[kind])[1]
        current = hashlib.sha256(text.encode()).hexdigest()[:12]
        assert digest == current, (
            f"portanet/tuned.json's entry {key!r} keys on gemm {digest}, but the {kind} "
            f"gemm source now hashes to {current}: kernels_cl/gemm.cl or a prelude.h changed. "
            f"If `python bench/gemm_same_tokens.py <revision before the edit>` says the "
            f"tokens are the same, re-key the entry (replace {digest} by {current} in its "
            f"key); else tune that device again (`portanet tune`) and ship its new entry.")


def _variants(family, real):
    """The build options each family is compiled with in test_cuda_kernels_compile."""
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
    return variants


@pytest.mark.parametrize("family", CUDA_FAMILIES)
@pytest.mark.parametrize("compiler, real", [("nvcc", "float"), ("nvcc", "double"),
                                            ("nvrtc", "float")])
def test_cuda_kernels_compile(family, real, compiler, tmp_path):
    """Every family CUDA builds, as the loader gives it to the compiler (headers inlined),
    by nvcc (device code only, as pycuda's compile runs it: --cubin, no host compile) and
    by NVRTC (runtime/cubins.py; in float: its dialect is what is checked), each where it
    is installed."""
    text = sources.load(family, "cu")[1]
    nvrtc = cubins._nvrtc()
    if compiler == "nvcc" and shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here")
    if compiler == "nvrtc" and nvrtc is None:
        pytest.skip("NVRTC is not installed here (cuda-bindings and its libnvrtc)")
    path = tmp_path / f"{family}.cu"
    path.write_text(text)
    for flags in _variants(family, real):
        arch = [f.split("=")[-1] for f in flags if f.startswith(("-arch", "-gencode"))]
        flags = [f for f in flags if not f.startswith(("-arch", "-gencode"))]
        reals = [f"-DREAL={real}", f"-DREAL_IS_DOUBLE={int(real == 'double')}"]
        if compiler == "nvrtc":
            nvrtc[1](text, reals + flags, arch[0] if arch else "sm_80", path.name)
            continue
        cmd = ["nvcc", "--cubin", "-o", str(tmp_path / "k.cubin"),
               f"-arch={arch[0] if arch else 'sm_80'}", *reals, *flags, str(path)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_the_host_sizes_launches_as_the_kernels_step():
    """The ops size bias_activation's and momentum_updates' launches by the elements a
    work-item of elementwise.cl takes; a kernel written for another count would leave
    elements out."""
    for lang in ("cl", "cu"):
        assert f"#define STEPS {arrays.STEPS}\n" in sources.load("elementwise", lang)[1]


def test_installed_package_carries_its_kernels():
    import portanet
    from pathlib import Path
    package = Path(portanet.__file__).resolve().parent
    if "site-packages" not in str(package):
        pytest.skip("portanet is imported from a checkout, not an installed wheel")
    assert sources.folder("cl").parent == package
    assert sources.folder("cu").parent == package
    for family, lang in loads():
        assert sources.load(family, lang)[0].parent.parent == package


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
