"""The test suite's own machinery: what makes a failure reproducible."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_print_rng_draw(rng):
    """Helper of the test below: writes its first draw where PORTANET_TEST_DRAW says."""
    target = os.environ.get("PORTANET_TEST_DRAW")
    if not target:
        pytest.skip("run by test_rng_fixture_is_the_same_in_every_process")
    Path(target).write_text(repr(rng.integers(0, 2**62)))


def test_rng_fixture_is_the_same_in_every_process(tmp_path):
    """The rng fixture used hash(nodeid), which Python salts per process: a failure seen
    once could not be reproduced. Two processes with different hash seeds must agree."""
    draws = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"draw{hash_seed}"
        env = dict(os.environ, PYTHONHASHSEED=hash_seed, PORTANET_TEST_DRAW=str(out))
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"{HERE / 'test_meta.py'}::test_print_rng_draw"],
                       cwd=HERE, env=env, check=True, capture_output=True)
        draws.append(out.read_text())
    assert draws[0] == draws[1]
