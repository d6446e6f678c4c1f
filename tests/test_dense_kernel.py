"""The C++ dense-block kernel (``dense_rnn/dense_kernel.py``, ``csrc/dense_scan.cc``): its forward
scan against a float64 NumPy dense GRU, vanilla dense RNN and dense LSTM (eq. 2-3, 5, 7-8),
its gradients against XLA's scan in float64, and which scans take it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import cells, dense_kernel, lstm_kernel, native, recurrent
from dense_rnn.dense_block import DenseRecurrent, dense_scan, rec_rows
from dense_rnn.errors import UserError
from dense_rnn.models.hm_densernn import HMTextClassifier

# (k, block_start), then (B, T, H) off the register tiles (6 or 10 rows; panels of 8 or 16
# units for r and z, 16 or 32 for n), T off whole blocks
LAYERS = [(1, False), (2, True), (3, False), (4, True)]
CELLS = ["gru", "rnn", "lstm"]
SHAPES = [(1, 1, 5), (7, 10, 21), (12, 9, 40)]


@pytest.fixture
def kernel_on(monkeypatch):
    """The kernel on whatever the CPU (skipped where it cannot build)."""
    monkeypatch.setenv(dense_kernel.VARIABLE, "on")
    if not dense_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")


def operands(k, block_start, b, t, h, seed=0, lengths=None, cell="gru"):
    rng = np.random.default_rng(seed)
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    g = dense_kernel.GATES[cell] * h
    return {
        # the vanilla RNN's smaller weights keep its float32 rounding from growing over steps
        "w": tuple(f32(rec_rows(n, block_start) * h, g, scale=0.15 if cell == "rnn" else 0.4)
                   for n in range(1, k + 1)),
        "xw": f32(b, t, g), "carry": (f32(b, h), f32(b, h)) if cell == "lstm" else f32(b, h),
        "mask": None if lengths is None else np.arange(t)[None, :] < np.asarray(lengths)[:, None],
    }


def numpy_dense_layer(w, xw, carry, mask, block_start, cell="gru"):
    """The dense GRU, vanilla RNN or LSTM layer in float64 NumPy: outputs, final carry (``h``
    or ``(c, h)``), the saved arrays (the gates ``[r, z, n]`` or ``n``; the LSTM's ``[i, f,
    g, o]``, ``c_{t-1}``, ``tanh(c_t)``) and, per block position, the operands of its
    products (``x~``, and the GRU's ``x~ * tile(r)``)."""
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    b, t, g = xw.shape
    n_hidden, k = g // dense_kernel.GATES[cell], len(w)
    blocks = -(-t // k)
    c, h = (a.astype(np.float64) for a in (carry if cell == "lstm" else (carry, carry)))
    ys, acts = np.zeros((b, t, n_hidden)), np.zeros((b, t, g))
    c_prev, tc = np.zeros((b, t, n_hidden)), np.zeros((b, t, n_hidden))
    ops = [tuple(np.zeros((blocks, b, a.shape[0])) for _ in range(dense_kernel.OPERANDS[cell]))
           for a in w]
    for m in range(blocks):
        history = [h]  # the state carried into the block, then the block's states
        for p in range(min(k, t - m * k)):
            step = m * k + p
            reads = history[: p + 1] if block_start or p == 0 else history[1: p + 1]
            rec = np.concatenate(reads, axis=1)  # eq. 2 / 5
            c_new = c
            if cell == "rnn":  # eq. 3 with tanh
                h_new = np.tanh(xw[:, step] + rec @ w[p])
                acts[:, step], ops[p][0][m] = h_new, rec
            elif cell == "lstm":  # cells.lstm_step with U x~_t
                i, f, gg, o = np.split(xw[:, step] + rec @ w[p], 4, 1)
                i, f, gg, o = sig(i), sig(f), np.tanh(gg), sig(o)
                c_new = f * c + i * gg
                h_new = o * np.tanh(c_new)
                acts[:, step] = np.concatenate([i, f, gg, o], 1)
                c_prev[:, step], tc[:, step], ops[p][0][m] = c, np.tanh(c_new), rec
            else:  # eq. 8
                rz = sig(xw[:, step, : 2 * n_hidden] + rec @ w[p][:, : 2 * n_hidden])
                r, z = np.split(rz, 2, 1)
                gated = np.tile(r, len(reads)) * rec
                cand = np.tanh(xw[:, step, 2 * n_hidden:] + gated @ w[p][:, 2 * n_hidden:])
                h_new = (1 - z) * h + z * cand
                acts[:, step] = np.concatenate([r, z, cand], 1)
                ops[p][0][m], ops[p][1][m] = rec, gated
            keep = np.ones((b, 1), bool) if mask is None else mask[:, step, None]
            h, c = np.where(keep, h_new, h), np.where(keep, c_new, c)
            ys[:, step] = np.where(keep, h_new, 0.0)
            history.append(h_new)
    saved = (acts, c_prev, tc) if cell == "lstm" else (acts,)
    return ys, (c, h) if cell == "lstm" else h, saved, ops


@pytest.mark.parametrize("k, block_start", LAYERS)
@pytest.mark.parametrize("b, t, h", SHAPES)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("cell", CELLS)
def test_forward_matches_float64_numpy(kernel_on, k, block_start, b, t, h, masked, cell):
    lengths = np.random.default_rng(1).integers(0, t + 1, b) if masked else None
    a = operands(k, block_start, b, t, h, lengths=lengths, cell=cell)
    forward = jax.jit(dense_kernel.forward, static_argnums=(4, 5, 6))
    carry, ys, res = forward(a["w"], a["xw"], a["carry"], a["mask"], block_start, True, cell)
    reference = numpy_dense_layer(**a, block_start=block_start, cell=cell)
    for got, want in zip(jax.tree.leaves((ys, carry, res)), jax.tree.leaves(reference),
                         strict=True):
        assert got.shape == want.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    carry_only, ys_only, none = forward(a["w"], a["xw"], a["carry"], a["mask"], block_start,
                                        False, cell)
    assert none is None
    for got, want in zip(jax.tree.leaves((ys_only, carry_only)), jax.tree.leaves((ys, carry)),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def value_and_grads(w, xw, carry, lengths, block_start, cell="gru"):
    """A loss of every output of ``dense_scan``, and its gradients."""
    def loss(w, xw, carry):
        carry, ys = dense_scan(cell, list(w), xw, carry, lengths, block_start)
        return sum(jnp.sum((1.3 + i) * a) for i, a in enumerate(jax.tree.leaves(carry))) + (
            jnp.sum(jnp.sin(ys)))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))(w, xw, carry)


@pytest.mark.parametrize("k, block_start", LAYERS)
@pytest.mark.parametrize("b, t, h", SHAPES[1:])
@pytest.mark.parametrize("cell", CELLS)
def test_gradients_match_xla_in_float64(kernel_on, x64, k, block_start, b, t, h, cell):
    lengths = np.random.default_rng(2).integers(0, t + 1, b)
    a = operands(k, block_start, b, t, h, cell=cell)
    args = (a["w"], a["xw"], a["carry"], jnp.asarray(lengths))
    run = jax.jit(value_and_grads, static_argnums=(4, 5))
    got = run(*args, block_start, cell)
    assert uses_kernel(lambda *a: value_and_grads(*a, block_start, cell), *args)
    want = run(*jax.tree.map(lambda x: x.astype(jnp.float64) if x.dtype == jnp.float32 else x,
                             args), block_start, cell)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == jnp.float32 and w.dtype == jnp.float64
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("save", [False, True])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_same_results_every_run(kernel_on, save, cell):
    """Groups of rows at different block positions at once, run by whichever thread is
    free: the values and gradients are bit for bit the same every run."""
    a = operands(4, True, 31, 23, 24, cell=cell)
    lengths = jnp.asarray(np.random.default_rng(3).integers(0, 24, 31))
    if save:
        run = jax.jit(value_and_grads, static_argnums=(4, 5))
        args = (a["w"], a["xw"], a["carry"], lengths, True, cell)
    else:
        run = jax.jit(lambda w, xw, carry: dense_scan(cell, list(w), xw, carry, lengths, True))
        args = (a["w"], a["xw"], a["carry"])
    first = run(*args)
    for _ in range(30):
        for g, w in zip(jax.tree.leaves(run(*args)), jax.tree.leaves(first), strict=True):
            np.testing.assert_array_equal(g, w)


def uses_kernel(fn, *args):
    """Whether ``fn`` traced now (a fresh function: no cached trace) calls the kernel."""
    text = jax.jit(lambda *a: fn(*a)).lower(*args).as_text()
    return any(native.target(f"{name}_forward") in text for name in ("gru", "dense_lstm"))


def test_which_scans_take_the_kernel(kernel_on, monkeypatch):
    a = operands(2, True, 2, 5, 4)
    for cell, g in (("gru", 3), ("rnn", 1), ("lstm", 4)):
        w = [jnp.ones((n * 4, g * 4)) for n in (1, 2)]
        scan = lambda w, xw, h, cell=cell: dense_scan(  # noqa: E731
            cell, w, xw, (h, h) if cell == "lstm" else h, None, True)[1]
        assert uses_kernel(scan, w, jnp.ones((2, 5, g * 4)), a["carry"]), cell
    scan = lambda w, xw, h: dense_scan("gru", w, xw, h, None, True)[1]  # noqa: E731
    args = (list(a["w"]), a["xw"], a["carry"])
    assert not uses_kernel(scan, *jax.tree.map(lambda x: x.astype(jnp.bfloat16), args))
    monkeypatch.setenv(dense_kernel.VARIABLE, "off")
    assert not dense_kernel.available() and not uses_kernel(scan, *args)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("cell", ["gru", "rnn"])  # the plain LSTM's is lstm_kernel's
def test_plain_scans_take_the_kernel(monkeypatch, reverse, cell):
    """``recurrent.scan_cell`` with the GRU or vanilla RNN (the stacked and bidirectional
    baselines) runs the kernel at dense depth 1: values and gradients as XLA's scan's."""
    a = operands(1, False, 7, 12, 21, cell=cell)
    lengths = jnp.array([12, 5, 1, 0, 9, 12, 3])

    def run():
        def loss(w, xw, h0):
            h, ys = recurrent.scan_cell(cells.get_cell(cell), {"w_hh": w}, xw, h0, lengths,
                                        reverse)
            return jnp.sum(1.3 * h) + jnp.sum(jnp.sin(ys))

        args = (a["w"][0], a["xw"], a["carry"])
        return uses_kernel(loss, *args), jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(*args)

    monkeypatch.setenv(dense_kernel.VARIABLE, "off")
    used_off, off = run()
    monkeypatch.setenv(dense_kernel.VARIABLE, "on")
    if not dense_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")
    used_on, on = run()
    assert used_on and not used_off
    for got, want in zip(jax.tree.leaves(on), jax.tree.leaves(off), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_outputs_independent_of_padding(kernel_on, cell):
    """A dense layer through the kernel: a sequence's outputs and final state are the same
    whatever padding follows it."""
    layer = DenseRecurrent(cell, 20, 3, block_start=True)
    x = jax.random.normal(jax.random.key(0), (4, 17, 6))
    params = layer.init(jax.random.key(1), x)
    lengths = jnp.array([17, 9, 4, 1])
    carry, ys = jax.jit(layer.apply)(params, x, lengths=lengths)
    for b, n in enumerate(np.asarray(lengths)):
        alone_carry, alone = jax.jit(layer.apply)(params, x[b: b + 1, :n])
        np.testing.assert_allclose(ys[b, :n], alone[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(ys[b, n:], 0.0)
        for got, want in zip(jax.tree.leaves(carry), jax.tree.leaves(alone_carry), strict=True):
            np.testing.assert_allclose(got[b], want[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_hm_classifier_step_same_with_the_kernel(monkeypatch, cell):
    """An HM-DenseGRU or HM-DenseLSTM classifier's loss and gradients through the kernel
    against XLA's scans: the same within float32 rounding."""
    model = HMTextClassifier(vocab_size=30, num_classes=3, embed_size=8, net="hm",
                             features=24, cell=cell, depths=(2, 4, 8))
    tokens = jax.random.randint(jax.random.key(0), (5, 29), 0, 30)
    lengths, labels = jnp.array([29, 20, 8, 3, 1]), jnp.array([0, 1, 2, 1, 0])
    params = model.init(jax.random.key(1), tokens, lengths)

    def loss(params):
        logits = model.apply(params, tokens, lengths)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))

    def run():
        text = jax.jit(jax.grad(loss)).lower(params).as_text()
        used = native.target("dense_lstm_backward" if cell == "lstm" else "gru_backward") in text
        return used, jax.jit(jax.value_and_grad(loss))(params)

    monkeypatch.setenv(dense_kernel.VARIABLE, "off")
    used_off, (loss_off, grads_off) = run()
    monkeypatch.setenv(dense_kernel.VARIABLE, "on")
    if not dense_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")
    used_on, (loss_on, grads_on) = run()
    assert used_on and not used_off
    np.testing.assert_allclose(loss_on, loss_off, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads_on), jax.tree.leaves(grads_off), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_mode(monkeypatch):
    monkeypatch.setenv(dense_kernel.VARIABLE, "maybe")
    with pytest.raises(UserError, match="DENSE_RNN_DENSE_KERNEL=maybe: use one of auto, on, off"):
        dense_kernel.available()


@pytest.mark.parametrize("flags, on", [("avx2 avx512f", True), ("avx2", False)])
def test_auto_picks_the_kernel_by_cpu(monkeypatch, flags, on):
    """``auto``: on AVX-512 CPUs, as the LSTM kernel; ``on`` and ``off`` whatever the CPU."""
    monkeypatch.setattr(native, "cpuinfo", lambda: f"vendor_id\t: AuthenticAMD\nflags\t\t: {flags}")
    monkeypatch.setattr(native, "cpu_backend", lambda: True)
    monkeypatch.setattr(dense_kernel, "_loaded", lambda: True)
    monkeypatch.setattr(lstm_kernel, "_loaded", lambda: True)
    monkeypatch.delenv(dense_kernel.VARIABLE, raising=False)
    monkeypatch.delenv(lstm_kernel.VARIABLE, raising=False)
    assert dense_kernel.available() == lstm_kernel.available() == on
    for value in ("on", "off"):
        monkeypatch.setenv(dense_kernel.VARIABLE, value)
        assert dense_kernel.available() == (value == "on")
