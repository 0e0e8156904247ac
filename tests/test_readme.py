"""The README's library example runs as written."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

# what an example may import that the test extra does not install: it is then not run
OPTIONAL = ("torch",)


def test_readme_example_runs(tmp_path, monkeypatch):
    if not README.exists():
        pytest.skip("README.md is not next to the tests")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no python example"
    monkeypatch.chdir(tmp_path)
    import portanet as pn
    for code in blocks:
        try:
            exec(compile(code, str(README), "exec"), {})
        except pn.DataError as e:          # the Fashion-MNIST example needs the dataset
            pytest.skip(f"an example needs data this machine lacks: {e}")
        except ModuleNotFoundError as e:   # the PyTorch example runs where torch is
            if e.name not in OPTIONAL:
                raise
    assert (tmp_path / "coordinates.safetensors").exists()
