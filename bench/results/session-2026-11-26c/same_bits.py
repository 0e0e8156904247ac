import numpy as np, portanet as pn, sys, hashlib
rng = np.random.default_rng(0)
x = rng.standard_normal((512, 50)).astype(np.float32); y = rng.integers(0, 4, 512)
out = []
for prec in ("bf16", "fp16"):
    for act in ("relu", "tanh"):
        net = pn.mlp((50,), 4, hidden=(40, 30), activation=act, device=sys.argv[1], precision=prec, seed=2)
        net.fit(x, y, epochs=2, batch_size=64, shuffle=False, optimizer=pn.SGD(0.05, 0.9))
        w = net.get_weights()
        h = hashlib.sha256(b"".join(np.ascontiguousarray(w[k]).tobytes() for k in sorted(w))).hexdigest()[:12]
        print(prec, act, h, float(w[sorted(w)[0]].ravel()[0]))
