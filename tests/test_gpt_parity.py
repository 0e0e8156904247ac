"""Parity with PyTorch for a GPT: pn.gpt and the same network in torch (nanoGPT's block:
pre-norm, causal scaled_dot_product_attention, a gelu MLP; torch's starting from
portanet's initial weights) train 20 AdamW steps with dropout off on the same batches of
token windows, the loss the mean cross-entropy over every token, the gradients' global norm
clipped as nanoGPT clips it (torch.nn.utils.clip_grad_norm_; CLIP below the norm of some
steps, not all); then every parameter, the mean loss and the predictions are compared. The oracle is torch on the CPU in float64, as
in test_torch_parity (whose docstring says why); float64 is held to 1e-9 relative per
tensor, float32 to 1e-4 (with AdamW's eps 1e-4 there, for the reason given there), and
torch's training must move every parameter by more than twice that. Weight decay applies
to the embeddings and the products' weights, not to biases or LayerNorm (nanoGPT's
groups)."""
import numpy as np
import pytest

import portanet as pn
from conftest import get_backend

torch = pytest.importorskip("torch", reason="PyTorch (the oracle of these tests) is not "
                                            "installed: pip install torch")
F = torch.nn.functional

STEPS, BATCH = 20, 16
VOCAB, CONTEXT, LAYERS, HEADS, DIM = 11, 8, 2, 2, 16
TOL = {"float64": 1e-9, "float32": 1e-4}
EPS = {"float64": 1e-8, "float32": 1e-4}
CLIP = 0.3             # between the norms of these steps: some are clipped, some not


def torch_gpt(weights):
    """nanoGPT's forward over portanet's weights (float64 leaf tensors): a function of ids
    (B, T) to logits (B, T, vocab), and the parameters in two groups (decayed, not)."""
    w = {name: torch.tensor(np.asarray(value, np.float64), requires_grad=True)
         for name, value in weights.items()}

    def norm(x, at):
        return F.layer_norm(x, (DIM,), w[f"{at}.gamma"], w[f"{at}.beta"], 1e-5)

    def forward(ids):
        b, t = ids.shape
        x = w["0.table"][ids] + w["0.pos"][:t]
        for i in range(LAYERS):
            att, mlp = 1 + 2 * i, 2 + 2 * i
            h = norm(x, f"{att}.0")
            q, k, v = F.linear(h, w[f"{att}.1.w_qkv"], w[f"{att}.1.b_qkv"]).split(DIM, dim=2)
            q, k, v = (z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(b, t, DIM)
            x = x + F.linear(y, w[f"{att}.1.w_o"], w[f"{att}.1.b_o"])
            h = F.gelu(F.linear(norm(x, f"{mlp}.0"), w[f"{mlp}.1.w"], w[f"{mlp}.1.b"]))
            x = x + F.linear(h, w[f"{mlp}.2.w"], w[f"{mlp}.2.b"])
        last = 1 + 2 * LAYERS
        return F.linear(norm(x, str(last)), w[f"{last + 1}.w"], w[f"{last + 1}.b"])

    decayed = [v for name, v in w.items()
               if name.rsplit(".", 1)[1] in ("table", "pos", "w", "w_qkv", "w_o")]
    others = [v for name, v in w.items() if not any(v is d for d in decayed)]
    return forward, w, decayed, others


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_gpt_trains_as_torch(device_name, dtype, rng):
    get_backend(device_name, np.dtype(dtype))
    net = pn.gpt(VOCAB, CONTEXT, layers=LAYERS, heads=HEADS, dim=DIM, dropout=0.0,
                 device=device_name, dtype=dtype, seed=3)
    start = {name: value.copy() for name, value in net.get_weights().items()}
    for name, value in start.items():       # biases and norms away from 0 and 1
        if name.endswith(("b", "b_qkv", "b_o", "beta", "gamma")):
            value += 0.2 * rng.standard_normal(value.shape)
    net.set_weights(start)
    ids = rng.integers(0, VOCAB, (STEPS * BATCH + 1) * CONTEXT)
    x = ids[:-CONTEXT].reshape(-1, CONTEXT)[:STEPS * BATCH]
    y = ids[1:len(x) * CONTEXT + 1].reshape(-1, CONTEXT)
    opt = dict(lr=3e-3, betas=(0.9, 0.95), eps=EPS[dtype], weight_decay=0.1)
    history = net.fit(x, y, epochs=1, batch_size=BATCH, optimizer=pn.AdamW(**opt),
                      shuffle=False, verbose=0, clip_norm=CLIP)

    forward, w, decayed, others = torch_gpt(start)
    adamw = torch.optim.AdamW([{"params": decayed, "weight_decay": opt["weight_decay"]},
                               {"params": others, "weight_decay": 0.0}],
                              lr=opt["lr"], betas=opt["betas"], eps=opt["eps"])
    losses, norms = [], []
    for step in range(STEPS):
        xb = torch.tensor(x[step * BATCH:(step + 1) * BATCH])
        yb = torch.tensor(y[step * BATCH:(step + 1) * BATCH])
        loss = F.cross_entropy(forward(xb).reshape(-1, VOCAB), yb.reshape(-1))
        adamw.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(decayed + others, CLIP)))
        adamw.step()
        losses.append(loss.item())

    assert min(norms) < CLIP < max(norms), norms
    ours = net.get_weights()
    for name, value in w.items():
        want = value.detach().numpy()
        moved = np.linalg.norm(want - start[name]) / np.linalg.norm(want)
        assert moved > 2 * TOL[dtype], name
        err = np.linalg.norm(ours[name] - want) / np.linalg.norm(want)
        assert err < TOL[dtype], (name, err)
    assert history["loss"][0] == pytest.approx(np.mean(losses), rel=TOL[dtype])
    test = rng.integers(0, VOCAB, (5, CONTEXT))
    with torch.no_grad():
        want = F.softmax(forward(torch.tensor(test)), dim=-1).numpy()
    assert np.linalg.norm(net.predict(test) - want) / np.linalg.norm(want) < TOL[dtype]
