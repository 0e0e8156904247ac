"""The op families (backends/ops): each module's NumPy reference and kernel launches
implement its interface's ops and nothing beside them, the composed backends take each op
from its family (no other part shadows it), and no family reaches a runtime."""
import ast
import inspect
from pathlib import Path

import pytest

from portanet.backends import gpu
from portanet.backends.numpy import NumpyBackend
from portanet.backends.ops import activations, blas, loss, norm, optim, pool

FAMILIES = [(blas, "Blas"), (activations, "Activation"), (loss, "Loss"), (pool, "Pool"),
            (norm, "Norm"), (optim, "Update")]
RUNTIMES = ("pyopencl", "pycuda", "portanet.backends.opencl", "portanet.backends.cuda",
            "portanet.backends.gpu", "portanet.backends.runtime")


def ops(cls):
    """The public methods `cls` itself defines."""
    return {name for name, f in vars(cls).items()
            if inspect.isfunction(f) and not name.startswith("_")}


def abstract(cls):
    return {name for name in ops(cls)
            if "raise NotImplementedError" in inspect.getsource(vars(cls)[name])}


@pytest.mark.parametrize("module,name", FAMILIES, ids=[n for _, n in FAMILIES])
def test_a_family_implements_its_interface(module, name):
    interface, reference, kernels = (getattr(module, name + part)
                                     for part in ("Ops", "Reference", "Kernels"))
    assert abstract(interface), f"{name}Ops declares no op"
    for implementation in (reference, kernels):
        assert issubclass(implementation, interface)
        assert abstract(interface) <= ops(implementation), implementation.__name__
        assert ops(implementation) <= ops(interface), implementation.__name__


@pytest.mark.parametrize("module,name", FAMILIES, ids=[n for _, n in FAMILIES])
def test_the_backends_take_each_op_from_its_family(module, name):
    interface = getattr(module, name + "Ops")
    for backend, part in ((NumpyBackend, "Reference"), (gpu.KernelBackend, "Kernels")):
        implementation = getattr(module, name + part)
        for op in ops(interface):
            found = getattr(backend, op)
            if getattr(found, "serialised", False):     # Backend.serialised's lock around it
                found = found.__wrapped__
            assert found is vars(implementation).get(op, vars(interface)[op]), \
                f"{backend.__name__}.{op} is not {implementation.__name__}'s"


@pytest.mark.parametrize("path", sorted(Path(blas.__file__).parent.glob("*.py")),
                         ids=lambda p: p.name)
def test_no_family_imports_a_runtime(path):
    packages = {1: "portanet.backends.ops.", 2: "portanet.backends.", 3: "portanet."}
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [packages.get(node.level, "") + (node.module or "")]
    assert [n for n in names if n.startswith(RUNTIMES)] == []
