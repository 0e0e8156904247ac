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


def modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("portanet", *path.relative_to(PACKAGE).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name, path, found):
    """The portanet modules `name` imports, anywhere in its text; a package's own
    submodules importing the package are not an edge up."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".")
            if node.level:
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in found else prefix
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target in found and target != name and not (
                    name.startswith(target + ".") and found[target].name == "__init__.py"):
                out.add(target)
    return out


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_import_points_down():
    found = modules()
    edges = {name: imports(name, path, found) for name, path in found.items()}
    assert cycles(edges) == []


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
