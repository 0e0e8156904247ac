"""The structure figures of a portanet checkout, one line each (or one JSON object with
--json): import cycles among portanet's modules, the largest modules and classes, kernel
text stored twice, the Backend interface, tests that reach internals, the longest docs
pages, bench/results' share of the files, and words of how the work was organised.

    python bench/structure.py [ROOT] [--json]

It reads the files with `ast` and imports nothing from portanet, so it measures a tree
that does not import. Files are git's tracked files, or those on disk outside a git
checkout.
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# the words counted as history (the figure's definition), and a wider set reported beside it
HISTORY = re.compile(r"\bsessions?\b|\bissue \d+|\bcall \d+\b|\bsession-20\d\d", re.I)
WIDER = re.compile(r"\bcall\d+|\bround \d+|gpu_(?:issue)", re.I)
TEXT = (".py", ".md", ".cl", ".cu", ".h", ".sh", ".cfg", ".toml", ".txt")
HAND_PATCHED = ("_routes", "gemm_path", "conv_path")


def files(root):
    """Tracked files (git ls-files), else every file on disk but git's and caches."""
    if (root / ".git").exists():
        git = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True)
        if git.returncode == 0:
            return sorted(f for f in git.stdout.splitlines() if (root / f).is_file())
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                  and not {".git", "__pycache__"} & set(p.relative_to(root).parts))


def modules(root):
    """portanet's modules by dotted name (a package by its own name) -> path."""
    found = {}
    for path in (root / "portanet").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def resolve(name, node, found):
    """The module each name of an import statement in module `name` comes from."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    prefix = node.module or ""
    if node.level:
        base = name.split(".")
        base = base[:len(base) - node.level + (found[name].name == "__init__.py")]
        prefix = ".".join(base + ([node.module] if node.module else []))
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in found else prefix for a in node.names]


def imports(name, tree, found):
    """The portanet modules `name` imports anywhere in its text (functions included); a
    package's own submodules importing the package are not an edge up."""
    return {t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for t in resolve(name, node, found) if t in found and t != name
            and not (name.startswith(t + ".") and found[t].name == "__init__.py")}


def cycles(edges):
    """Strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on, stack, found = {}, {}, set(), [], []

    def enter(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        return v, iter(sorted(edges[v]))

    for start in edges:
        work = [] if start in index else [enter(start)]
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    work.append(enter(w))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = [stack.pop()]
                    while component[-1] != v:
                        component.append(stack.pop())
                    on.difference_update(component)
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def methods(cls):
    return [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def left_open(fn):
    """How a method leaves its work to subclasses: "abstract" (@abstractmethod, or it only
    raises NotImplementedError), "empty" (a hook: a docstring or `pass`), else None."""
    body = [n for n in fn.body if not isinstance(n, ast.Pass)
            and not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if any(ast.unparse(d).endswith("abstractmethod") for d in fn.decorator_list) or (
            len(body) == 1 and isinstance(body[0], ast.Raise)
            and "NotImplementedError" in ast.unparse(body[0])):
        return "abstract"
    return None if body else "empty"


def interface(trees, found):
    """Backend and the classes it is composed of (its bases, followed through imports);
    the functions beside it; the runtime contract and the op families, where they exist."""
    classes = {(m, n.name): n for m, t in trees.items() for n in ast.walk(t)
               if isinstance(n, ast.ClassDef)}
    origin = {(m, a.asname or a.name): source for m, t in trees.items() for node in ast.walk(t)
              if isinstance(node, ast.ImportFrom)
              for a, source in zip(node.names, resolve(m, node, found))}
    todo, seen = [("portanet.backends.base", "Backend")], []
    while todo:
        key = todo.pop()
        if key in classes and key not in seen:
            seen.append(key)
            for base in classes[key].bases:            # Name, or module.Name
                parts = ast.unparse(base).split(".")
                todo.append((origin.get((key[0], parts[0]), key[0]), parts[-1]))
    fns = [left_open(f) for key in seen for f in methods(classes[key])]
    beside = [n.name for m in ("portanet.backends.base", "portanet.backends.checks") if m in trees
              for n in trees[m].body if isinstance(n, ast.FunctionDef)]
    out = {"classes": [n for _, n in seen], "methods": len(fns), "abstract": fns.count("abstract"),
           "empty": fns.count("empty"), "functions": len(beside),
           "check_functions": sum(n.startswith("check_") for n in beside)}
    contracts = [n for n in trees.get("portanet.backends.runtime", ast.Module([], [])).body
                 if isinstance(n, ast.ClassDef)]
    if contracts:          # the class of most methods: the contract the runtimes implement
        best = max(contracts, key=lambda c: len(methods(c)))
        out["runtime"] = [best.name, [f.name for f in methods(best) if f.name[0] != "_"]]
    out["op_families"] = {   # family -> [its public methods (by name), module functions]
        m.rsplit(".", 1)[1]: [len({f.name for c in ast.walk(t) if isinstance(c, ast.ClassDef)
                                   for f in methods(c) if f.name[0] != "_"}),
                              sum(isinstance(n, ast.FunctionDef) for n in t.body)]
        for m, t in sorted(trees.items()) if m.startswith("portanet.backends.ops.")}
    return out


def twins(root):
    """Kernel files in both kernels_cl/ and kernels_cu/: by name (the shared prelude.h
    aside), and by text: a .cl of over 20 lines, over 80% of whose lines are in a .cu,
    whatever its name."""
    cl, cu = root / "kernels_cl", root / "kernels_cu"
    if not (cl.is_dir() and cu.is_dir()):
        return {"by_name": [], "by_text": [], "lines": 0}
    names = ({p.stem for p in cl.glob("*.cl")} & {p.stem for p in cu.glob("*.cu")}) | (
        {p.name for p in cl.glob("*.h")} & {p.name for p in cu.glob("*.h")} - {"prelude.h"})
    cus = [set(p.read_text().splitlines()) for p in sorted(cu.glob("*.cu"))]
    text = {}
    for p in sorted(cl.glob("*.cl")):
        lines = p.read_text().splitlines()
        if len(lines) > 20 and any(sum(x in b for x in lines) > 0.8 * len(lines) for b in cus):
            text[p.stem] = len(lines)
    return {"by_name": sorted(names), "by_text": sorted(text), "lines": sum(text.values())}


def headings(text):
    """The count of markdown headings outside code fences, and of those carrying a date."""
    found, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.lstrip().startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            found.append(line)
    return len(found), sum(bool(DATE.search(h)) for h in found)


def hand_patches(tree):
    """Assignments to, and setattr calls on, the attributes tests pin by hand."""
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            n += sum(isinstance(t, ast.Attribute) and t.attr in HAND_PATCHED for t in targets)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("setattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
            n += node.args[1].value in HAND_PATCHED
    return n


def figures(root):
    found = modules(root)
    trees = {m: ast.parse(p.read_text()) for m, p in found.items()}
    tracked = files(root)
    tests = [(root / f).read_text() for f in tracked
             if f.startswith("tests/") and f.endswith(".py")]
    docs = [f for f in tracked if f in ("README.md", "bench/README.md")
            or (f.startswith("docs/") and f.endswith(".md"))]
    pages = sorted(((len(t.splitlines()), f, *headings(t))
                    for f in docs for t in [(root / f).read_text()]), reverse=True)
    words, wider = {}, 0
    for f in tracked:
        if f.startswith("bench/results/") or not f.endswith(TEXT):
            continue
        text = (root / f).read_text(errors="replace")
        n = sum("InferenceSession" not in text[max(0, m.start() - 9):m.end() + 1]
                for m in HISTORY.finditer(text))
        wider += len(WIDER.findall(text)) + len(WIDER.findall(f))
        if n:
            words[f] = n
    results = sum(f.startswith("bench/results/") for f in tracked)
    return {
        "import_cycles": cycles({m: imports(m, t, found) for m, t in trees.items()}),
        "largest_modules": sorted(((len(p.read_text().splitlines()), str(p.relative_to(root)))
                                   for p in found.values()), reverse=True)[:4],
        "largest_classes": sorted(((n.end_lineno - n.lineno + 1, f"{m}.{n.name}", len(methods(n)))
                                   for m, t in trees.items() for n in ast.walk(t)
                                   if isinstance(n, ast.ClassDef)), reverse=True)[:4],
        "kernel_twins": twins(root),
        "backend_interface": interface(trees, found),
        "monkeypatch": sum(t.count("monkeypatch") for t in tests),
        "hand_patches": sum(hand_patches(ast.parse(t)) for t in tests),
        "largest_docs": pages[:4], "docs_pages": len(pages),
        "docs_over_300": sum(p[0] > 300 for p in pages),
        "bench_readme": next(([n, h, d] for n, f, h, d in pages if f == "bench/README.md"), None),
        "bench_results_files": results, "files": len(tracked),
        "history_words": sum(words.values()),
        "history_words_by_file": dict(sorted(words.items(), key=lambda kv: -kv[1])[:4]),
        "history_words_wider": wider,
    }


def report(d):
    tw, bi = d["kernel_twins"], d["backend_interface"]
    rows = [
        ("import cycles", "; ".join(f"{len(c)} modules: " + ", ".join(
            m.removeprefix("portanet.") for m in c) for c in d["import_cycles"]) or "none"),
        ("largest modules (lines)", ", ".join(
            f"{f.removeprefix('portanet/')} {n}" for n, f in d["largest_modules"][:3])),
        ("largest classes (lines)", ", ".join(
            f"{c.rsplit('.', 1)[1]} {n} ({k} methods)" for n, c, k in d["largest_classes"][:3])),
        ("kernel text twice", f"{len(tw['by_text'])} families, {tw['lines']} lines by text "
         f"({', '.join(tw['by_text']) or '-'}); same name: {', '.join(tw['by_name']) or 'none'}"),
        ("Backend interface", f"{bi['methods']} methods ({bi['abstract']} abstract, {bi['empty']} "
         f"empty hooks) in {', '.join(bi['classes'])}; {bi['functions']} functions beside it "
         f"({bi['check_functions']} check_*)"),
    ]
    if "runtime" in bi:
        name, verbs = bi["runtime"]
        rows.append(("runtime contract", f"{name}: {len(verbs)} verbs ({', '.join(verbs)})"))
    rows += [(f"  ops/{name}", f"{n} methods, {k} functions")
             for name, (n, k) in bi["op_families"].items()]
    readme = d["bench_readme"]
    rows += [
        ("tests reach internals", f"{d['monkeypatch']} monkeypatch, {d['hand_patches']} hand "
         f"patches of {'/'.join(HAND_PATCHED)}"),
        ("docs pages", f"{d['docs_pages']}, {d['docs_over_300']} over 300 lines; longest "
         + ", ".join(f"{f} {n} ({h} headings, {t} dated)" for n, f, h, t in d["largest_docs"][:2])),
        ("bench/README.md", "{} lines, {} headings ({} dated)".format(*readme) if readme else "-"),
        ("bench/results files", f"{d['bench_results_files']} of {d['files']} "
         f"({100 * d['bench_results_files'] / max(d['files'], 1):.0f}%)"),
        ("history words", f"{d['history_words']} " + "".join(
            f"[{f} {n}] " for f, n in d["history_words_by_file"].items())
         + f"+ {d['history_words_wider']} wider (callN, round N, gpu scripts by number)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--json"]
    root = Path(args[0] if args else Path(__file__).resolve().parents[1]).resolve()
    d = figures(root)
    print(json.dumps(d) if "--json" in sys.argv else report(d))
