"""What auto routing picks for each product of the mlp-big and mlp-small training steps in
bf16 and fp16 on cuda, with each path's time (portanet's debug log): where wgmma.cu
("tensor") wins."""
import logging
import sys
import numpy as np
import portanet as pn

handler = logging.StreamHandler(sys.stdout)
handler.addFilter(lambda r: " -> " in r.getMessage())
logging.getLogger("portanet").addHandler(handler)
logging.getLogger("portanet").setLevel(logging.DEBUG)
rng = np.random.default_rng(0)
for precision in ("bf16", "fp16"):
    for sizes, batch in (((10000, 5000, 1000, 10), 10000), ((1000, 500, 100, 10), 1000)):
        print(f"== {precision} {sizes} batch {batch}", flush=True)
        net = pn.mlp(input_shape=(sizes[0],), hidden=sizes[1:-1], classes=sizes[-1],
                     device="cuda", precision=precision)
        x = rng.random((batch, sizes[0]), dtype=np.float32)
        y = rng.integers(0, sizes[-1], batch)
        net.fit(x, y, epochs=1, batch_size=batch)
