"""bench/structure.py, the script that prints the structure figures: on this checkout it
reports what test_structure holds (no import cycle, no module past its size), and on a
small tree it finds a planted cycle, a kernel stored twice and the Backend's abstract
methods, from a git checkout or a plain folder."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import test_structure

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "structure.py"
KERNEL = "\n".join(f"KERNEL void k{i}(GLOBAL float *x) {{ x[{i}] = {i}; }}" for i in range(30))


def figures(root=None):
    run = subprocess.run([sys.executable, str(SCRIPT), *([str(root)] if root else []), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.fixture
def tree(tmp_path):
    write(tmp_path, {
        "portanet/__init__.py": "",
        "portanet/a.py": "def f():\n    from . import b\n",             # inside a function
        "portanet/b.py": "from portanet.c import g\n",
        "portanet/c.py": "import portanet.a\ndef g():\n    pass\n",
        "portanet/d.py": "from . import a\n",                          # points down: no cycle
        "portanet/backends/__init__.py": "",
        "portanet/backends/updates.py": (
            "class UpdateOps:\n    def sgd(self):\n        raise NotImplementedError\n"),
        "portanet/backends/base.py": (
            "from .updates import UpdateOps\n\n\nclass Backend(UpdateOps):\n"
            "    def gemm(self):\n        '''c <- a b'''\n        raise NotImplementedError\n"
            "    def sync(self):\n        pass\n"
            "    def size(self):\n        return 0\n\n\ndef check_gemm():\n    pass\n"),
        "kernels_cl/gemm.cl": KERNEL + "\n// OpenCL\n",
        "kernels_cu/gemm.cu": KERNEL + "\n// CUDA\n",                  # the twin
        "kernels_cl/norm.cl": KERNEL,
        "kernels_cu/mma.cu": "// tensor cores\n",
        "tests/test_a.py": "def test(monkeypatch):\n    bk.gemm_path = 'own'\n"
                           "    monkeypatch.setattr(bk, '_routes', {})\n",
        "docs/page.md": "# Page\n\n```\n# not a heading\n```\n## 2026-11-27 a dated one\n",
        "bench/results/x/one.json": "{}",
        "README.md": "# portanet\n",
    })
    return tmp_path


def check_tree(d):
    assert d["import_cycles"] == [["portanet.a", "portanet.b", "portanet.c"]]
    assert d["kernel_twins"] == {"by_name": ["gemm"], "by_text": ["gemm", "norm"], "lines": 61}
    backend = d["backend_interface"]
    assert (backend["classes"], backend["methods"], backend["abstract"], backend["empty"]) == (
        ["Backend", "UpdateOps"], 4, 2, 1)
    assert (backend["functions"], backend["check_functions"]) == (1, 1)
    assert (d["monkeypatch"], d["hand_patches"]) == (2, 2)
    assert [p[1:] for p in d["largest_docs"]] == [["docs/page.md", 2, 1], ["README.md", 1, 0]]


def test_a_plain_folder_counts_the_files_on_disk(tree):
    d = figures(tree)
    check_tree(d)
    assert (d["bench_results_files"], d["files"]) == (1, 16)


@pytest.mark.skipif(shutil.which("git") is None, reason="no git")
def test_a_git_checkout_counts_its_tracked_files(tree):
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "portanet", "kernels_cl", "kernels_cu", "tests", "docs",
                    "README.md"], check=True)
    d = figures(tree)
    check_tree(d)
    assert (d["bench_results_files"], d["files"]) == (0, 15)


def test_this_checkout_holds_what_test_structure_holds():
    d = figures()
    found = test_structure.modules()
    edges = {name: test_structure.imports(name, path, found) for name, path in found.items()}
    assert d["import_cycles"] == test_structure.cycles(edges) == []
    longest = max(len(p.read_text().splitlines()) for p in found.values())
    assert d["largest_modules"][0][0] == longest <= test_structure.MAX_MODULE_LINES
    assert d["largest_classes"][0][0] <= test_structure.MAX_CLASS_LINES
    assert d["backend_interface"]["classes"][0] == "Backend"
