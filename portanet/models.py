"""Ready-made networks, built from the layer classes like any user's own."""
from .layers import Dense
from .network import Sequential


def mlp(input_shape=(784,), classes=10, hidden=(512, 256), activation="relu",
        device=None, dtype="float32", seed=0):
    """Multi-layer perceptron: Dense hidden layers, then softmax (or sigmoid for 2-class
    problems given as classes=1) with its fused cross-entropy."""
    layers = [Dense(n, activation) for n in hidden]
    if classes == 1:
        layers.append(Dense(1, "sigmoid"))
        loss = "binary_cross_entropy"
    else:
        layers.append(Dense(classes, "softmax"))
        loss = "softmax_cross_entropy"
    return Sequential(layers, input_shape, loss, device, dtype, seed)


MODELS = {"mlp": mlp}
