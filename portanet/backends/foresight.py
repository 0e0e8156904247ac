"""Builds made before they are needed, several at once: a KernelBackend runs a piece of work
dry (`prebuild`), which notes every kernel build of ours the work would make, routing's
trials included, without launching anything; the noted builds are then made together by
the runtime's build_many (threads, each with a compile) rather than one after another as
the work meets them. A first training step on a GPU needs some fifty builds, most of them
routing's tilings and K splits of each product, which the trials would meet a few at a
time (docs/routing.md; docs/benchmarks.md, "First use")."""
import contextlib
import logging
import time

log = logging.getLogger("portanet")


class _Unlaunched:
    """What a dry run's `_kernel` gives for any kernel: a stand-in whose calls (a launch's
    preparation, an attribute set) do nothing."""

    def __getattr__(self, name):
        return _nothing


def _nothing(*args, **kwargs):
    return None


UNLAUNCHED = _Unlaunched()


class Foresight:
    """KernelBackend's dry runs (see the module's docstring)."""

    dry = False         # within `_dry_run`: launches, vendor GEMMs, all-reduces and clears skipped

    def prebuild(self, *works):
        """Make every kernel build that the calls `works` will need before they run, several
        at once: each is called dry (`_dry_run`), then the builds noted are made together
        (the runtime's build_many). The calls may be a whole training step: routing's
        trials in it are each followed dry, every path it would time, nested routing
        included. Where the backend `prebuilds` (GPUs; a CPU runtime compiles one at a
        time) and not already dry. A call that raises in its dry run stops there: what it
        noted is built, and the real call builds the rest as it meets it (and raises what
        it raises). Returns the number of builds made."""
        if not self.prebuilds or self.dry:
            return 0
        wanted = set()
        try:
            with self._dry_run(wanted):
                for work in works:
                    work()
        except Exception as e:      # the real call meets it again, or builds as it goes
            log.debug("%s: a dry run stopped at %r", self.name, e)
        if not wanted:
            return 0
        start = time.perf_counter()
        self._announce()
        builds = sorted(wanted, key=lambda b: (b[0], b[1], b[2] or ""))
        self.runtime.build_many([(family, list(options), arch)
                                 for family, options, arch in builds])
        log.debug("%s: %d builds made together in %.2f s", self.name, len(builds),
                  time.perf_counter() - start)
        return len(builds)

    @contextlib.contextmanager
    def _dry_run(self, wanted):
        """Within the block nothing reaches the device and nothing the backend keeps
        changes: `_run` and the tensor-core launches return before launching, the vendor
        GEMMs and a distributed step's all-reduces are skipped; `_kernel` gives UNLAUNCHED
        for every kernel, adding (family, options, arch) to the set `wanted` for each not
        built yet; routing (`_fastest`) calls every path it would time, times none and
        takes the first (or the routes file's). The kernels, routes, tilings and 16-bit
        copies' states noted inside are forgotten afterwards. Workspaces grow as the work
        asks (they would for the real call), and what describes them for the device is
        made (CUDA's tensor maps); `clear` and the 16-bit `fill` write nothing. What a
        backend decides once by building (OpenCL's `finish_options`, by a trial build where
        the device does not say) is decided before the dry run, by a real build."""
        self.finish_options         # noqa: B018 - decided now, not from a noted build
        saved = (self._kernel, self._kernels, self._routes, self._route_tilings,
                 self._fresh, self._keeping, self.trace)
        built = self.runtime.built

        def noted(family, name, options=(), arch=None):
            if not built(family, options, arch):
                wanted.add((family, tuple(options), arch))
            return UNLAUNCHED
        try:
            self._kernel, self.trace, self.dry = noted, None, True
            self._kernels, self._routes = dict(self._kernels), dict(self._routes)
            self._route_tilings = dict(self._route_tilings)
            self._fresh, self._keeping = set(self._fresh), set(self._keeping)
            yield
        finally:
            (self._kernel, self._kernels, self._routes, self._route_tilings, self._fresh,
             self._keeping, self.trace) = saved
            self.dry = False
