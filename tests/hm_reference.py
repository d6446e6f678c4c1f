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


def dense_layer(cell, p, xs, k, block_start=False, h0=None, c0=None):
    """Eq. 2-3 over one sequence ``xs`` (T, d) from the state ``h0`` (and LSTM cell ``c0``;
    default zeros): states ``(T, H)`` and the final cell state. ``block_start``: x~ is the
    state before the block followed by the block's states so far (eq. 5 on a layer updating
    every s > 1 steps, its copies dropped)."""
    hidden = p["w_hh_1"].shape[0]
    h = h_start = np.zeros(hidden) if h0 is None else h0
    c = np.zeros(hidden) if c0 is None else c0
    hs = []
    for t in range(1, len(xs) + 1):
        m, n = divmod(t - 1, k)
        n += 1
        block = [hs[m * k + j - 1] for j in range(1, n)]
        if block_start:
            rec = np.concatenate([hs[m * k - 1] if m else h_start, *block])
        else:
            rec = h if n == 1 else np.concatenate(block)
        h, c = cell_update(cell, p, xs[t - 1], rec, h, c, p[f"w_hh_{n}"])
        hs.append(h)
    return np.array(hs).reshape(len(xs), hidden), c


def hm_stack(cell, layer_params, xs, depths, multiscale=True, dense=True, h0=None, c0=None,
             final_update=True):
    """Eq. 4-6 literally over input time ``t = 1..T`` from each layer's state ``h0[l]`` (and
    LSTM cell ``c0[l]``; default zeros); returns per-layer ``[(t, h)]`` of updates and the
    final ``h`` of every layer.

    Layer ``l`` updates at step ``t`` iff ``l = 1``, ``t ≡ 0 (mod k^(l-1))`` or, with
    ``final_update``, ``t = T`` (the sequence's last token; always without ``multiscale``),
    and otherwise copies
    ``h^l_{t-1}`` (eq. 6). At ``t = mk + n`` (``k = k^(l)``), ``x~_t`` is ``h^l_{t-1}`` if
    ``n = 1``, else ``[h_{mk+1}, ..., h_{mk+n-1}]`` (eq. 5) with each copy of a state in it
    dropped (the block's first step is kept: it holds the previous block's state). The
    recurrent weight belongs to the update's rank among the block's updates. A layer that
    updates every step with ``k = 2`` is a regular RNN (Sec. 4.1: one weight). ``dense=False``:
    always ``h_{t-1}`` and one weight.
    """
    num_layers = len(depths)
    hidden = layer_params[0]["w_hh_1"].shape[0]
    h = [np.zeros(hidden) for _ in range(num_layers)] if h0 is None else list(h0)
    c = [np.zeros(hidden) for _ in range(num_layers)] if c0 is None else list(c0)
    history = [[] for _ in range(num_layers)]  # per step t: (h_t, whether t was an update)
    updates = [[] for _ in range(num_layers)]
    for t in range(1, len(xs) + 1):
        below = xs[t - 1]
        for li in range(num_layers):
            k = depths[li]
            m, n = divmod(t - 1, k)
            n += 1
            every_step = li == 0 or not multiscale or depths[li - 1] == 1
            if not every_step and t % depths[li - 1] and (t != len(xs) or not final_update):
                history[li].append((h[li], False))  # eq. 6, otherwise-branch: copy
                continue
            block = [(s, history[li][s - 1]) for s in range(m * k + 1, t)]
            kept = [hs for s, (hs, updated) in block if updated or s == m * k + 1]
            rank = sum(updated for _, (_, updated) in block) + 1
            if not dense or (every_step and k == 2):
                kept, rank = [], 1
            rec = h[li] if n == 1 or not kept else np.concatenate(kept)
            w2 = layer_params[li][f"w_hh_{rank}"]
            h[li], c[li] = cell_update(cell, layer_params[li], below, rec, h[li], c[li], w2)
            history[li].append((h[li], True))
            updates[li].append((t, h[li]))
            below = h[li]
    return updates, h
