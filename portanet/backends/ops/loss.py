"""The losses at a network's output: each writes the delta and adds each sample's loss and
hit, fused with the output layer's bias and softmax where it can (loss.cl)."""
import functools

import numpy as np

from ...errors import ShapeError
from .reference import quiet

FUSED_LOSS_SAMPLES = 1      # the most samples a work-item of the fused loss and bias
                            # gradient takes (bias_softmax_xent_grad) for it to be tried: at
                            # 4 (mlp-small) one group lost to the two launches by 6-16 us on
                            # an H100 and PoCL, and routing's few trials can misjudge it


class LossOps:
    """The family's interface: what each op does, whatever runs it."""

    # The losses write the delta and ADD each sample's loss and hit (1 if classified right)
    # to loss[j] and hit[j]: the epoch's sums, so that no launch is spent adding them up.

    def softmax_xent(self, delta, loss, hit, a, labels):
        """delta <- a - onehot(labels); loss[j] += -log a[labels[j], j];
        hit[j] += 1 if argmax a[:, j] == labels[j]. labels: int32 (batch,)."""
        raise NotImplementedError

    def bias_softmax_xent(self, z, b, a, loss, hit, labels):
        """The output layer's bias and softmax, then softmax_xent with the delta into z: a
        training step's z <- z + b 1^T; a <- softmax(z); z <- a - onehot(labels), with the
        loss and hits added. Here the two calls; kernel backends make them one launch."""
        self.bias_activation("softmax", z, b, a)
        self.softmax_xent(z, loss, hit, a, labels)

    def bias_softmax_xent_grad(self, z, b, a, loss, hit, labels, alpha, beta, gb, ones):
        """bias_softmax_xent, then the output layer's bias gradient from the delta it left
        in z, gb <- alpha z ones + beta gb, as activation_bias_grad forms a hidden layer's.
        Here the two calls; kernel backends make them one launch where that is faster."""
        self.bias_softmax_xent(z, b, a, loss, hit, labels)
        self.gemv(alpha, z, ones, beta, gb)

    def sigmoid_bce(self, delta, loss, hit, a, y):
        """delta <- a - y; loss[j] += sum_i BCE(a_ij, y_ij); hit[j] += all (a_ij > 1/2) == y_ij."""
        raise NotImplementedError

    def mse(self, delta, loss, hit, a, y):
        """delta <- 2 (a - y) / n; loss[j] += mean_i (a_ij - y_ij)^2; hit[j] += argmax match
        (n > 1) or |a - y| < 1/2 (n == 1)."""
        raise NotImplementedError

    def argmax(self, out, a):
        """out[j] <- argmax_i a[i, j], int32."""
        raise NotImplementedError


class LossReference(LossOps):
    """NumPy's: device arrays are NumPy arrays."""

    @quiet
    def softmax_xent(self, delta, loss, hit, a, labels):
        m = a.shape[1]
        cols = np.arange(m)
        loss -= np.log(np.maximum(a[labels, cols], np.finfo(a.dtype).tiny))
        hit += np.argmax(a, axis=0) == labels
        delta[...] = a                      # delta may alias a: read a first
        delta[labels, cols] -= 1

    @quiet
    def sigmoid_bce(self, delta, loss, hit, a, y):
        tiny = np.finfo(a.dtype).tiny
        loss -= np.sum(y * np.log(np.maximum(a, tiny))
                       + (1 - y) * np.log(np.maximum(1 - a, tiny)), axis=0)
        hit += np.all((a > 0.5) == (y > 0.5), axis=0)
        delta[...] = a - y                  # delta may alias a (BatchNorm's): read a first

    @quiet
    def mse(self, delta, loss, hit, a, y):
        n = a.shape[0]                       # delta may alias a: read a first
        loss += np.mean((a - y) ** 2, axis=0)
        if n > 1:
            hit += np.argmax(a, axis=0) == np.argmax(y, axis=0)
        else:
            hit += np.abs(a - y)[0] < 0.5
        delta[...] = (2.0 / n) * (a - y)

    def argmax(self, out, a):
        out[...] = np.argmax(a, axis=0)


class LossKernels(LossOps):
    """KernelBackend's: launches of loss.cl's kernels."""

    def softmax_xent(self, delta, loss, hit, a, labels):
        self._run("softmax_xent", (a.shape[1],), delta, loss, hit, a, labels, *a.shape)

    def bias_softmax_xent(self, z, b, a, loss, hit, labels):
        self._run("bias_softmax_xent", (a.shape[1],), loss, hit, a, z, b, labels, *a.shape)

    def bias_softmax_xent_grad(self, z, b, a, loss, hit, labels, alpha, beta, gb, ones):
        """bias_softmax_xent and the bias gradient's gemv in one launch of one work-group
        (loss.cl) where auto routing measures it faster than the two apart, per shape: a
        batch of few samples, where the launch saved outweighs the parallelism one group
        gives up. More than FUSED_LOSS_SAMPLES samples a work-item, or a routing other than
        auto, go apart untried."""
        rows, cols = a.shape
        if gb.size != rows or ones.size != cols:
            raise ShapeError(f"bias_softmax_xent_grad: a {a.shape}, gb {gb.shape}, ones "
                             f"{ones.shape}")
        apart = functools.partial(super().bias_softmax_xent_grad, z, b, a, loss, hit, labels,
                                  alpha, beta, gb, ones)
        threads = self.gemv_threads
        if self.gemm_path != "auto" or not 0 < cols <= FUSED_LOSS_SAMPLES * threads:
            apart()
            return
        fused = functools.partial(self._run, "bias_softmax_xent_grad", (threads,), loss, hit,
                                  a, z, b, labels, gb, float(alpha), float(beta), rows, cols,
                                  local=(threads,))
        ways, key = {"fused": fused, "apart": apart}, ("bias_softmax_xent_grad", rows, cols)
        ways[self._routes.get(key) or self._fastest(key, ways, [z, a, loss, hit, gb])]()

    def sigmoid_bce(self, delta, loss, hit, a, y):
        self._run("sigmoid_bce", (a.shape[1],), delta, loss, hit, a, y, *a.shape)

    def mse(self, delta, loss, hit, a, y):
        self._run("mse", (a.shape[1],), delta, loss, hit, a, y, *a.shape)

    def argmax(self, out, a):
        self._run("argmax", (a.shape[1],), out, a, *a.shape)
