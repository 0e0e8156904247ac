"""The route auto routing picks for the loss with its bias gradient, per step shape, with
each way's time (portanet's debug log), on one device."""
import logging, sys
import numpy as np
import portanet as pn

class Only(logging.Filter):
    def filter(self, record):
        return "bias_softmax_xent_grad" in record.getMessage()

handler = logging.StreamHandler(sys.stdout)
handler.addFilter(Only())
logging.getLogger("portanet").addHandler(handler)
logging.getLogger("portanet").setLevel(logging.DEBUG)
dev = sys.argv[1]
rng = np.random.default_rng(0)
for name, shape, batch in (("lenet", (1, 28, 28), 64), ("lenet", (1, 28, 28), 256),
                           ("mlp-small", (1000,), 1000)):
    net = (pn.lenet(device=dev) if name == "lenet" else
           pn.mlp(input_shape=shape, hidden=(500, 100), device=dev))
    x = rng.random((batch * 3, *shape), dtype=np.float32)
    y = rng.integers(0, 10, batch * 3)
    print(f"{dev} {name} batch {batch}", flush=True)
    net.fit(x, y, epochs=1, batch_size=batch)
