"""Host staging's sums through shared memory (shared_sum.SharedSum) under mpiexec on this
machine's CPU: 3 ranks on one host (shares of a piece uneven, some empty) and 4 ranks
as two hosts of 2 (the host's sums then summed among the hosts' leaders). Every rank
gets the sum over all ranks, and every rank the same bits."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("shared_sum_worker.py")


@pytest.mark.parametrize("ranks, hosts, n", [(3, 1, 23), (4, 2, 30), (2, 1, 1)])
def test_every_rank_gets_the_sum_over_all(tmp_path, ranks, hosts, n):
    pytest.importorskip("mpi4py")
    mpiexec = shutil.which("mpiexec") or shutil.which(
        "mpiexec", path=os.path.dirname(sys.executable))
    if not mpiexec:
        pytest.skip("no mpiexec here (pip install 'portanet[mpi]')")
    job = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, str(WORKER),
                          str(tmp_path), str(n), str(hosts)],
                         capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout + job.stderr
    got = [np.load(tmp_path / f"{r}.npy", allow_pickle=True) for r in range(ranks)]
    want = [sum(np.random.default_rng([r, turn, size]).standard_normal(size)
                for r in range(ranks)) for size in (n, 2 * n) for turn in (0, 1, 0)]
    for sums in got:
        assert len(sums) == len(want)
        for mine, first, expected in zip(sums, got[0], want):
            np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-12)
            assert np.array_equal(mine, first)
