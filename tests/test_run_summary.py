"""The end of a test run (conftest.py): the time of each device, the tests without one in
a named row, and the skips grouped by cause, most first."""
import types

import conftest


class Reporter:
    def __init__(self, skipped):
        self.stats = {"skipped": skipped}
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def skipped(reason):
    return types.SimpleNamespace(longrepr=("tests/x.py", 1, f"Skipped: {reason}"))


def test_skips_are_grouped_by_cause_most_first(monkeypatch):
    monkeypatch.setattr(conftest, "_parts", {conftest.NO_DEVICE: [1.0, {"passed": 3}]})
    reporter = Reporter(
        [skipped("cuda unavailable here: device 'cuda' is not available: no NVIDIA GPU. "
                 "Available devices: cpu")] * 3
        + [skipped(f"{n} operations a call is beyond what the simulator runs quickly "
                   f"(100000); the real devices run this shape") for n in (200000, 300000)]
        + [skipped("no mpiexec here (pip install 'portanet[mpi]')")])
    conftest.pytest_terminal_summary(reporter)
    at = reporter.lines.index("== skipped, by cause (most first; -rs lists each test)")
    assert reporter.lines[at + 1:] == [
        "     3  cuda unavailable here: no NVIDIA GPU",
        "     2  N operations a call is beyond what the simulator runs quickly (N): the real "
        "devices run this shape",
        "     1  no mpiexec here (pip install 'portanet[mpi]')"]
    assert reporter.lines[1].startswith("(no device) ")       # the row has a name
