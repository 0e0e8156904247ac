"""The optimizers' fused updates and the loss scale's kernels (elementwise.cl): SGD with
momentum (several layers in one launch on GPUs), Adam, RMSprop, and the checks and
scalars mixed precision's dynamic loss scaling keeps on the device."""
import numpy as np

from .checks import (check_adam, check_found, check_loss_scale, check_skip, check_update,
                     log_beta)


STEPS = 4                  # elements a work-item of bias_activation and momentum_updates takes
                           # (elementwise.cl's STEPS; test_kernel_sources holds them equal)
UPDATE_LAYERS = 4          # the layers one momentum_updates launch takes (elementwise.cl)


class Updates:
    """KernelBackend's parameter updates (see the module's docstring)."""

    def _skip(self, op, skip):
        """An update's skip flag; None: one of the backend's own that stays 0, made at the
        first update that needs it (training always gives its own: see OptimizerState)."""
        check_skip(op, skip)
        if skip is None:
            if self._never is None:
                self._never = self.empty((1,), np.int32, "never skip")
                self.write(self._never, np.zeros(1, np.int32))
            skip = self._never
        return skip

    def momentum_update(self, w, v, decay, n_decay, skip=None):
        self.momentum_updates([(w, v, n_decay)], decay, skip)

    def momentum_updates(self, layers, decay, skip=None):
        """momentum_updates' kernel on UPDATE_LAYERS layers a launch, or where updates are
        not fused (CPUs) momentum_update's a layer at a time."""
        for w, v, n_decay in layers:
            check_update("momentum_update", n_decay, w, v)
        skip = self._skip("momentum_update", skip)
        if not self.fused_updates:
            for w, v, n_decay in layers:
                self._run("momentum_update", (w.size,), skip, float(decay), w, v, w.size,
                          n_decay)
            return
        for first in range(0, len(layers), UPDATE_LAYERS):
            group = layers[first:first + UPDATE_LAYERS]
            args = [a for w, v, n_decay in group for a in (w, v, w.size, n_decay)]
            w, v = group[0][:2]             # stand-ins for the layers not given (n_p = 0)
            args += [w, v, 0, 0] * (UPDATE_LAYERS - len(group))
            work_items = sum(-(-w.size // STEPS) for w, _, _ in group)
            self._run("momentum_updates", (work_items,), skip, float(decay), *args)

    def sgd_update(self, w, g, v, lr, momentum, weight_decay, n_decay, nesterov, skip=None):
        check_update("sgd_update", n_decay, w, g, v)
        self._run("sgd_update", (w.size,), self._skip("sgd_update", skip), w, v, g,
                  float(lr), float(momentum), float(weight_decay), bool(nesterov), n_decay,
                  w.size)

    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, shrink, n_decay,
                    skip=None):
        check_adam(scalars, n_decay, w, g, m, v)
        # 1 - beta and 1 - shrink in double, as PyTorch and the reference form them
        beta1, beta2, shrink = float(beta1), float(beta2), float(shrink)
        self._run("adam_update", (w.size,), self._skip("adam_update", skip), w, m, v, g,
                  scalars, beta1, 1.0 - beta1, beta2, 1.0 - beta2, float(eps), float(l2),
                  1.0 - shrink, n_decay, w.size)

    def rmsprop_update(self, w, g, v, buf, gavg, lr, alpha, eps, l2, momentum, n_decay,
                       skip=None):
        check_update("rmsprop_update", n_decay, w, g, v, buf, gavg)
        # an absent buf or gavg is w, never touched: its flag is off
        alpha = float(alpha)
        self._run("rmsprop_update", (w.size,), self._skip("rmsprop_update", skip), w, v,
                  w if buf is None else buf, w if gavg is None else gavg, g, float(lr), alpha,
                  1.0 - alpha, float(eps), float(l2), float(momentum), buf is not None,
                  gavg is not None, n_decay, w.size)

    def scale_by(self, x, s):
        check_loss_scale("scale_by", s)
        self._run("scale_by", (x.size,), x, s, x.size)

    def unscale_check(self, g, s, found):
        check_loss_scale("unscale_check", s)
        check_found("unscale_check", found)
        self._run("unscale_check", (g.size,), g, s, found, g.size)

    def adam_scalars(self, s, t, found, lr, beta1, beta2):
        check_found("adam_scalars", found)
        self._run("adam_scalars", (1,), s, t, found, float(lr), log_beta(float(beta1)),
                  log_beta(float(beta2)))

    def update_loss_scale(self, s, found, growth_interval, low, high):
        check_loss_scale("update_loss_scale", s)
        check_found("update_loss_scale", found)
        self._run("update_loss_scale", (1,), s, found, int(growth_interval), float(low),
                  float(high))
