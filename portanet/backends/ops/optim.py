"""The optimizers' updates and dynamic loss scaling's checks and scalars, kept on the device:
SGD with momentum (several layers in one launch on GPUs), Adam, RMSprop (elementwise.cl)."""
import numpy as np

from ..arrays import STEPS
from ..checks import (check_adam, check_clip, check_found, check_loss_scale, check_skip,
                      check_update, log_beta)
from .reference import quiet

UPDATE_LAYERS = 4          # the layers one momentum_updates launch takes (elementwise.cl)
CLIP_EPS = 1e-6            # clip_grad_norm_'s: the norm's guard against 0 (elementwise.cl too)


class UpdateOps:
    """The family's interface: what each op does, whatever runs it."""

    # The updates take `skip`: a device int32 (1,) that a loss-scaled step's unscale_check
    # sets where its gradients overflowed; the update then changes nothing (no host wait,
    # so a recorded step stays valid). None: never skipped.

    def momentum_update(self, w, v, decay, n_decay, skip=None):
        """SGD with momentum, after the layer's gemm wrote mu v - lr g into v:
        v[i] <- v[i] - decay w[i] for i < n_decay (decay = lr weight_decay); then
        w <- w + v. v is -lr times torch.optim.SGD's momentum buffer."""
        raise NotImplementedError

    def momentum_updates(self, layers, decay, skip=None):
        """momentum_update on each (w, v, n_decay) of `layers` (several layers' flat
        vectors), in as few launches as the backend takes them."""
        for w, v, n_decay in layers:
            self.momentum_update(w, v, decay, n_decay, skip)

    def sgd_update(self, w, g, v, lr, momentum, weight_decay, n_decay, nesterov, skip=None):
        """SGD with momentum from the gradient g: d = g + weight_decay w (i < n_decay, else
        d = g); v <- momentum v - lr d; then w <- w + momentum v - lr d with the new v
        (Nesterov), else w <- w + v. v is -lr times torch.optim.SGD's momentum buffer."""
        raise NotImplementedError

    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, n_decay, skip=None):
        """Adam and AdamW (torch.optim.Adam, AdamW): for i < n_decay, w <- w scalars[2]
        (AdamW's decoupled decay, scalars[2] = 1 - lr wd) and d = g + l2 w_old (Adam's L2,
        l2 = wd; AdamW's l2 is 0, Adam's scalars[2] 1); else d = g. Then m <- beta1 m +
        (1 - beta1) d; v <- beta2 v + (1 - beta2) d^2; w <- w - scalars[0] m / (sqrt(v) /
        scalars[1] + eps). scalars: a device array (4,) = [lr / (1 - beta1^t),
        sqrt(1 - beta2^t), 1 - lr wd, lr] at step t = 1, 2, ... (optim.Adam.step_scalars),
        written by the host each step, so that a recorded step (a CUDA graph) stays valid
        as t and the rate move on."""
        raise NotImplementedError

    def rmsprop_update(self, w, g, v, buf, gavg, lr, alpha, eps, l2, momentum, n_decay,
                       skip=None):
        """RMSprop (torch.optim.RMSprop): d = g + l2 w (i < n_decay, else d = g);
        v <- alpha v + (1 - alpha) d^2; centered (gavg not None): gavg <- alpha gavg +
        (1 - alpha) d and den = sqrt(v - gavg^2) + eps, else den = sqrt(v) + eps; with
        momentum (buf not None): buf <- momentum buf + d / den, w <- w - lr buf, else
        w <- w - lr d / den. buf and gavg may each be None."""
        raise NotImplementedError

    # -- dynamic loss scaling (optim.LossScale): s = [scale, 1 / scale, clean steps in a
    # row, steps skipped] on the device, found an int32 (1,) ------------------------------

    def scale_by(self, x, s):
        """x <- s[0] x (the loss's delta times the loss scale)."""
        raise NotImplementedError

    def unscale_check(self, g, s, found):
        """g <- g s[1] (divided by the scale, exactly: it is a power of two); found[0] <- -1
        where any element of the result is inf or NaN, else left as it is."""
        raise NotImplementedError

    def clip_norm(self, g, squares, max_norm, unit=1.0):
        """Global-norm clipping (torch.nn.utils.clip_grad_norm_) of the gradient that g holds
        times `unit` (plain SGD's workspace holds -lr times it): squares[0] <- g . g; then
        g <- g min(1, max_norm / (sqrt(squares[0]) / |unit| + 1e-6)), all on the device."""
        raise NotImplementedError

    def adam_scalars(self, s, t, found, beta1, beta2):
        """Adam's step numbers counted on the device (a loss-scaled step: a skipped one is no
        step): where found[0] is 0, t[0] <- t[0] + 1 and s[0], s[1] <- lr / (1 - beta1^t),
        sqrt(1 - beta2^t) (adam_update's scalars, lr = s[3], which the host writes), else
        nothing."""
        raise NotImplementedError

    def update_loss_scale(self, s, found, growth_interval, low, high):
        """After a scaled step: where found[0] is not 0, s[0] halves (not below low, s[1]
        doubles with it), s[2] <- 0 and s[3] (steps skipped) grows by one; else s[2] grows
        by one and at growth_interval goes back to 0, doubling s[0] (not above high).
        found[0] <- 0."""
        raise NotImplementedError


class UpdateReference(UpdateOps):
    """NumPy's: device arrays are NumPy arrays."""

    @quiet
    def momentum_update(self, w, v, decay, n_decay, skip=None):
        check_update("momentum_update", n_decay, w, v)
        if _skipped("momentum_update", skip):
            return
        if decay != 0:
            v[:n_decay] -= decay * w[:n_decay]
        w += v

    @quiet
    def sgd_update(self, w, g, v, lr, momentum, weight_decay, n_decay, nesterov, skip=None):
        check_update("sgd_update", n_decay, w, g, v)
        if _skipped("sgd_update", skip):
            return
        d = _decayed(g, weight_decay, w, n_decay)
        v[...] = momentum * v - lr * d
        w += momentum * v - lr * d if nesterov else v

    @quiet
    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, n_decay, skip=None):
        check_adam(scalars, n_decay, w, g, m, v)
        if _skipped("adam_update", skip):
            return
        d = _decayed(g, l2, w, n_decay)
        beta1, beta2 = float(beta1), float(beta2)
        w[:n_decay] *= scalars[2]
        m[...] = beta1 * m + (1 - beta1) * d
        v[...] = beta2 * v + (1 - beta2) * (d * d)
        w -= scalars[0] * (m / (np.sqrt(v) / scalars[1] + eps))

    @quiet
    def rmsprop_update(self, w, g, v, buf, gavg, lr, alpha, eps, l2, momentum, n_decay,
                       skip=None):
        check_update("rmsprop_update", n_decay, w, g, v, buf, gavg)
        if _skipped("rmsprop_update", skip):
            return
        d = _decayed(g, l2, w, n_decay)
        alpha = float(alpha)
        v[...] = alpha * v + (1 - alpha) * (d * d)
        if gavg is None:
            den = np.sqrt(v) + eps
        else:
            gavg[...] = alpha * gavg + (1 - alpha) * d
            den = np.sqrt(v - gavg * gavg) + eps
        if buf is None:
            w -= lr * (d / den)
        else:
            buf[...] = momentum * buf + d / den
            w -= lr * buf

    # -- dynamic loss scaling -----------------------------------------------------------

    @quiet
    def scale_by(self, x, s):
        check_loss_scale("scale_by", s)
        x *= s[0]

    @quiet
    def unscale_check(self, g, s, found):
        check_loss_scale("unscale_check", s)
        check_found("unscale_check", found)
        g *= s[1]
        if not np.isfinite(g).all():
            found[0] = -1

    @quiet
    def clip_norm(self, g, squares, max_norm, unit=1.0):
        check_clip(g, squares, max_norm, unit)
        squares[0] = g @ g
        coef = max_norm / (np.sqrt(squares[0]) / abs(unit) + CLIP_EPS)
        if coef < 1:
            g *= g.dtype.type(coef)

    @quiet
    def adam_scalars(self, s, t, found, beta1, beta2):
        check_found("adam_scalars", found)
        if found[0] != 0:
            return
        real = s.dtype.type
        t[0] += 1
        s[0] = s[3] / -np.expm1(t[0] * real(log_beta(beta1)))
        s[1] = np.sqrt(-np.expm1(t[0] * real(log_beta(beta2))))

    def update_loss_scale(self, s, found, growth_interval, low, high):
        check_loss_scale("update_loss_scale", s)
        check_found("update_loss_scale", found)
        if found[0] != 0:
            found[0] = 0
            s[2] = 0
            s[3] += 1
            if s[0] > low:
                s[0] *= 0.5
                s[1] *= 2
        else:
            s[2] += 1
            if s[2] >= growth_interval:
                s[2] = 0
                if s[0] < high:
                    s[0] *= 2
                    s[1] *= 0.5


class UpdateKernels(UpdateOps):
    """KernelBackend's: launches of elementwise.cl's update kernels."""

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

    def adam_update(self, w, g, m, v, scalars, beta1, beta2, eps, l2, n_decay, skip=None):
        check_adam(scalars, n_decay, w, g, m, v)
        # 1 - beta in double, as PyTorch and the reference form it
        beta1, beta2 = float(beta1), float(beta2)
        self._run("adam_update", (w.size,), self._skip("adam_update", skip), w, m, v, g,
                  scalars, beta1, 1.0 - beta1, beta2, 1.0 - beta2, float(eps), float(l2),
                  n_decay, w.size)

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

    def clip_norm(self, g, squares, max_norm, unit=1.0):
        check_clip(g, squares, max_norm, unit)
        self.gemv(1.0, self.view(g, (1, g.size)), g, 0.0, squares)
        self._run("clip_scale", (g.size,), g, squares, float(max_norm), float(1 / abs(unit)),
                  g.size)

    def adam_scalars(self, s, t, found, beta1, beta2):
        check_found("adam_scalars", found)
        self._run("adam_scalars", (1,), s, t, found, log_beta(float(beta1)),
                  log_beta(float(beta2)))

    def update_loss_scale(self, s, found, growth_interval, low, high):
        check_loss_scale("update_loss_scale", s)
        check_found("update_loss_scale", found)
        self._run("update_loss_scale", (1,), s, found, int(growth_interval), float(low),
                  float(high))


def _skipped(op, skip):
    """Whether an update's skip flag (checked) says to change nothing (a loss-scaled step
    whose gradients overflowed)."""
    check_skip(op, skip)
    return skip is not None and skip[0] != 0


def _decayed(g, decay, w, n_decay):
    """d = g + decay w on the first n_decay elements (the weights), g on the rest; a decay
    of 0 is no term at all, as in PyTorch (0 w would make an infinite weight's d NaN)."""
    d = g.copy()
    if decay != 0:
        d[:n_decay] += decay * w[:n_decay]
    return d
