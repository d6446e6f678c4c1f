"""Float64 NumPy references for the HM-DenseRNN tests, written step by step from the
equations of Zhao et al. 2019 (eq. 2-3, 5-6, 7-8), one sequence at a time."""

from __future__ import annotations

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cell_update(cell, p, x, rec, h_prev, c_prev, w2):
    """One update ``f(W1 x + W2 x~ + b)`` of ``cell``; returns ``(h, c)``."""
    hidden = h_prev.shape[0]
    a = x @ p["w_ih"] + p["b"]
    if cell == "rnn":
        return np.tanh(a + rec @ w2), c_prev
    if cell == "gru":  # eq. 8, reset gate on every state of x~
        r = sigmoid(a[:hidden] + rec @ w2[:, :hidden])
        z = sigmoid(a[hidden : 2 * hidden] + rec @ w2[:, hidden : 2 * hidden])
        cand = np.tanh(a[2 * hidden :] + (np.tile(r, len(rec) // hidden) * rec)
                       @ w2[:, 2 * hidden :])
        return (1 - z) * h_prev + z * cand, c_prev
    i, f, g, o = np.split(a + rec @ w2, 4)
    c = sigmoid(f) * c_prev + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def dense_layer(cell, p, xs, k):
    """Eq. 2-3 over one sequence ``xs`` (T, d): states ``(T, H)``."""
    hidden = p["w_hh_1"].shape[0]
    h, c, hs = np.zeros(hidden), np.zeros(hidden), []
    for t in range(1, len(xs) + 1):
        m, n = divmod(t - 1, k)
        n += 1
        rec = h if n == 1 else np.concatenate([hs[m * k + j - 1] for j in range(1, n)])
        h, c = cell_update(cell, p, xs[t - 1], rec, h, c, p[f"w_hh_{n}"])
        hs.append(h)
    return np.array(hs).reshape(len(xs), hidden)


def hm_stack(cell, layer_params, xs, depths, multiscale=True, dense=True):
    """Eq. 4-6 literally over input time ``t = 1..T``; returns per-layer ``[(t, h)]`` of
    updates and the final ``h`` of every layer.

    Layer ``l`` updates at step ``t`` iff ``l = 1``, ``t ≡ 0 (mod k^(l-1))`` or ``t = T`` (the
    sequence's last token; always without ``multiscale``); ``x~_t`` is the layer's state
    before the block (first update of the block) or its states at the block's previous
    updates (copies between updates dropped);
    the recurrent weight belongs to the update's position in the block (``dense=False``:
    always ``h_{t-1}`` and one weight).
    """
    num_layers = len(depths)
    hidden = layer_params[0]["w_hh_1"].shape[0]
    h = [np.zeros(hidden) for _ in range(num_layers)]
    c = [np.zeros(hidden) for _ in range(num_layers)]
    block_states = [[] for _ in range(num_layers)]
    updates = [[] for _ in range(num_layers)]
    for t in range(1, len(xs) + 1):
        below = xs[t - 1]
        for li in range(num_layers):
            k = depths[li]
            if (t - 1) % k == 0:
                block_states[li] = []  # a new block of layer li starts at step t
            if li and multiscale and t % depths[li - 1] and t != len(xs):
                continue  # eq. 6, otherwise-branch: copy h^l_{t-1}
            prev = block_states[li] if dense else []
            rec = h[li] if not prev else np.concatenate(prev)
            w2 = layer_params[li][f"w_hh_{len(prev) + 1}"]
            h[li], c[li] = cell_update(cell, layer_params[li], below, rec, h[li], c[li], w2)
            block_states[li].append(h[li])
            updates[li].append((t, h[li]))
            below = h[li]
    return updates, h
