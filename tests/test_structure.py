"""The shape of the code, held: every import among portanet's modules points down (no
cycle, imports inside functions included), no module grows past MAX_MODULE_LINES nor class
past MAX_CLASS_LINES, and each kernel body is written once (kernels_cu/ holds only what CUDA
alone says)."""
import ast
from pathlib import Path

import portanet
from portanet.backends import sources

PACKAGE = Path(portanet.__file__).resolve().parent
MAX_MODULE_LINES = 800      # past this a module holds more than one responsibility
MAX_CLASS_LINES = 500       # past this a class is several waiting to be named


def _script():
    """bench/structure.py, which prints these figures for any checkout: its import graph
    and cycle finder are the ones held here."""
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "bench" / "structure.py"
    spec = importlib.util.spec_from_file_location("portanet_structure", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STRUCTURE = _script()
cycles = STRUCTURE.cycles


def modules():
    """portanet's modules by dotted name -> path, in the checkout."""
    return STRUCTURE.modules(Path(__file__).resolve().parents[1])


def imports(name, path, found):
    """The portanet modules `name` imports, anywhere in its text (bench/structure.py)."""
    return STRUCTURE.imports(name, ast.parse(path.read_text()), found)


def test_every_import_points_down():
    found = modules()
    edges = {name: imports(name, path, found) for name, path in found.items()}
    assert cycles(edges) == []


LEAVES = {f"portanet.{name}" for name in ("config", "errors", "precision", "files", "rng",
                                          "progress")}


def test_the_backends_import_only_the_leaves():
    """backends/ is the bottom of the picture (docs/README.md): above the leaves alone,
    which import only each other."""
    found = modules()
    for name, path in found.items():
        if name.startswith("portanet.backends") or name in LEAVES:
            above = {m for m in imports(name, path, found)
                     if not m.startswith("portanet.backends") and m not in LEAVES}
            assert not above, f"{name} imports {sorted(above)}"
            if name in LEAVES:
                assert not any(m.startswith("portanet.backends")
                               for m in imports(name, path, found)), name


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_holds_more_than_one_responsibility_by_size():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_class_holds_more_than_one_responsibility_by_size():
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert long == {}


def test_each_kernel_body_is_written_once():
    cl, cu = sources.folder("cl"), sources.folder("cu")
    assert {p.stem for p in cl.glob("*.cl")} & {p.stem for p in cu.glob("*.cu")} == set()
    assert {p.name for p in cl.glob("*.h")} & {p.name for p in cu.glob("*.h")} == {"prelude.h"}


def test_every_package_is_installed():
    """setup.cfg names packages one by one: a new subpackage missing there works from the
    checkout and is absent from the wheel."""
    import configparser
    root = Path(__file__).resolve().parents[1]
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    folders = {".".join(p.parent.relative_to(root).parts)
               for p in (root / "portanet").rglob("__init__.py")}
    assert folders - listed == set()
