"""A training step's routes on NVIDIA's OpenCL, chosen two ways: as routing chooses them
(each path timed alone, `_fastest`), and the fastest of the paths that launch least
(a split K summed by gemm_split_sum, the loss and bias gradient apart, a row way in pieces,
the vendor's product with its bias kernel: two launches; every other path one), where that
is within 4x of the fastest alone. Prints each decision with its times, then the step's
host time (issuing one replay behind a busy device) and its time a step (back to back)."""
import logging, re, sys, time
import numpy as np
from portanet import backends, bench
from portanet.backends import gpu

policy, workload, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
decisions = []


class Catch(logging.Handler):
    def emit(self, record):
        if " -> " in record.getMessage():
            decisions.append(record.getMessage())


logging.getLogger("portanet").addHandler(Catch())
logging.getLogger("portanet").setLevel(logging.DEBUG)


def launches(name, key):
    two = name.endswith(" summed") or name in ("apart", "split") or (
        name.startswith("vendor") and key[0] not in ("bias_softmax_xent_grad",))
    return 2 if two else 1


original = gpu.KernelBackend._fastest


def fewest(self, key, paths, restore=()):
    best = original(self, key, paths, restore)
    text = decisions[-1]
    times = dict((m.group(1).strip(), float(m.group(2)))
                 for m in re.finditer(r"([^,:]+?) (\d+) us(?:,|$| ->)", text.split(": ", 1)[1]))
    if not times:
        return best
    least = min(launches(n, key) for n in times)
    pick = min((n for n in times if launches(n, key) == least), key=times.get)
    if times[pick] <= 4 * min(times.values()) and pick != best:
        decisions[-1] += f"  [policy: {pick}]"
        self._routes[key] = pick
        return pick
    return best


if policy == "fewest":
    gpu.KernelBackend._fastest = fewest

bk = backends.device(sys.argv[4] if len(sys.argv) > 4 else "opencl:0:0")
net, step = bench.training_step(workload, bk, batch, np.random.default_rng(0))
for _ in range(30):
    step()
bk.synchronize()
for d in decisions:
    print("  " + d)
walls, issues = [], []
for _ in range(20):
    t = time.perf_counter()
    for _ in range(50):
        step()
    bk.synchronize()
    walls.append((time.perf_counter() - t) / 50)
    step(); step()                  # the device busy, then the issue time of one step
    t = time.perf_counter()
    step()
    issues.append(time.perf_counter() - t)
    bk.synchronize()
print(f"{policy:7s} {workload} {batch}: step {1e6 * np.median(walls):6.1f} us (min "
      f"{1e6 * min(walls):6.1f}); issuing one {1e6 * np.median(issues):6.1f} us", flush=True)
