"""The C++ LSTM kernel (``dense_rnn/lstm_kernel.py``, ``csrc/lstm_scan.cc``): its forward
scan against a float64 NumPy LSTM, its backward against XLA's backward scan, gradients of
the layers through it against XLA's scans, and which scans take it."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import blas, cells, lstm_kernel, native, recurrent
from dense_rnn.errors import UserError
from tests.conftest import lm_step_off_and_on

# batch sizes and hidden sizes off the kernel's register tiles (6 or 10 rows; panels of 4
# or 8 units forward, 16 or 32 backward), lengths 1 and longer
SHAPES = [(1, 3, 7), (5, 13, 33), (9, 21, 70), (4, 2, 200)]


@pytest.fixture
def kernel_on(monkeypatch):
    """The kernel on whatever the CPU (skipped where it cannot build)."""
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "on")
    if not lstm_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")


def operands(t, b, h, seed=0, masked=False, dropped=False, directions=None):
    """One LSTM's operands (``xs`` (B, T, 4H), biases ``b`` (4H)), or with ``directions`` D
    that many, stacked on a direction axis (``w`` (D, H, 4H), ``xs`` (D, B, T, 4H), ``b``
    (D, 4H), carries (D, B, H)) with one mask (B, T)."""
    rng = np.random.default_rng(seed)
    d = () if directions is None else (directions,)
    f32 = lambda *s, scale=1.0: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    return {
        "w": f32(*d, h, 4 * h, scale=0.3), "xs": f32(*d, b, t, 4 * h), "c": f32(*d, b, h),
        "h": f32(*d, b, h), "mask": rng.random((b, t)) < 0.7 if masked else None,
        "b": f32(*d, 4 * h, scale=0.5),
        "rmask": ((rng.random((*d, b, h)) < 0.8) / 0.8).astype(np.float32) if dropped else None,
    }


def direction(a, d):
    """Direction ``d``'s operands of ``operands(..., directions=D)``."""
    pick = {"w": 0, "xs": 0, "c": 0, "h": 0, "rmask": 0, "b": 0}
    return {k: v if v is None or k not in pick else np.take(v, d, pick[k]) for k, v in a.items()}


def numpy_lstm(w, xs, c, h, mask, rmask, b):
    """The LSTM of ``cells.lstm_step`` in float64 NumPy over ``xs + b`` (B, T, 4H): outputs
    (B, T, H), final carry and, per step, the gate activations, ``c_{t-1}``, ``tanh(c_t)``
    (time-major) and ``h_{t-1}`` (batch-major), as the kernel saves them."""
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    n = w.shape[0]
    c, h = c.astype(np.float64), h.astype(np.float64)
    ys, res = [], []
    for t in range(xs.shape[1]):
        z = (xs[:, t] + b) + (h if rmask is None else h * rmask) @ w.astype(np.float64)
        i, f, o = sig(z[:, :n]), sig(z[:, n:2 * n]), sig(z[:, 3 * n:])
        g = np.tanh(z[:, 2 * n:3 * n])
        c_new = f * c + i * g
        h_new = o * np.tanh(c_new)
        res.append((np.concatenate([i, f, g, o], 1), c, np.tanh(c_new), h))
        keep = np.ones((xs.shape[0], 1), bool) if mask is None else mask[:, t, None]
        c, h = np.where(keep, c_new, c), np.where(keep, h_new, h)
        ys.append(np.where(keep, h_new, 0.0))
    acts, c_prev, tc, h_prev = (np.stack(r) for r in zip(*res, strict=True))
    return np.stack(ys, 1), (c, h), [acts, c_prev, tc, np.swapaxes(h_prev, 0, 1)]


@pytest.mark.parametrize("t, b, h", SHAPES)
@pytest.mark.parametrize("masked, dropped", [(False, False), (True, True)])
def test_forward_matches_float64_numpy(kernel_on, t, b, h, masked, dropped):
    a = operands(t, b, h, masked=masked, dropped=dropped)
    (c, hh), ys, res = jax.jit(lstm_kernel.forward, static_argnums=5)(
        a["w"], a["xs"], (a["c"], a["h"]), a["mask"], a["rmask"], True, a["b"])
    want_ys, (want_c, want_h), want_res = numpy_lstm(**a)
    for got, want in zip([ys, c, hh, *res], [want_ys, want_c, want_h, *want_res], strict=True):
        assert got.shape == want.shape and got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("t, b, h", [(5, 13, 33), (4, 21, 13)])
def test_directions_in_one_call_match_float64_numpy(kernel_on, t, b, h):
    """D = 3 LSTMs on a direction axis, one mask for all: each direction is its own LSTM."""
    a = operands(t, b, h, masked=True, dropped=True, directions=3)
    (c, hh), ys, res = jax.jit(lstm_kernel.forward, static_argnums=5)(
        a["w"], a["xs"], (a["c"], a["h"]), a["mask"], a["rmask"], True, a["b"])
    for d in range(3):
        want_ys, (want_c, want_h), want_res = numpy_lstm(**direction(a, d))
        got = [ys[d], c[d], hh[d], *(r[:, d] for r in res[:3]), res[3][d]]
        for g, w in zip(got, [want_ys, want_c, want_h, *want_res], strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_forward_of_no_steps_returns_the_carry(kernel_on):
    a = operands(0, 3, 5)
    (c, h), ys, _ = lstm_kernel.forward(a["w"], a["xs"], (a["c"], a["h"]), None, None, True)
    assert ys.shape == (3, 0, 5)
    np.testing.assert_array_equal(c, a["c"])
    np.testing.assert_array_equal(h, a["h"])


@pytest.mark.parametrize("t, b, h, directions", [(*s, None) for s in SHAPES] + [(5, 13, 33, 2)])
@pytest.mark.parametrize("masked, dropped", [(False, False), (True, False), (False, True)])
def test_backward_matches_the_xla_scan(kernel_on, t, b, h, directions, masked, dropped):
    a = operands(t, b, h, masked=masked, dropped=dropped, directions=directions)
    _, _, res = lstm_kernel.forward(a["w"], a["xs"], (a["c"], a["h"]), a["mask"], a["rmask"],
                                    True)
    rng = np.random.default_rng(1)
    dys = rng.standard_normal(a["xs"].shape[:-1] + (h,)).astype(np.float32)
    dcarry = tuple(rng.standard_normal((2, *a["c"].shape)).astype(np.float32))
    args = (a["w"], dys, dcarry, a["mask"], a["rmask"], res)
    got = jax.jit(lstm_kernel.backward)(*args)
    want = jax.jit(recurrent._xla_lstm_backward, static_argnums=6)(*args, 1)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


def scan_value_and_grads(w, xs, carry, mask, rmask, b=None):
    def loss(w, xs, carry, rmask, b):
        (c, h), ys = recurrent.lstm_scan(w, xs, carry, mask, rmask, 1, b)
        return jnp.sum(ys * jnp.cos(ys)) + jnp.sum(1.3 * c) - jnp.sum(0.7 * h)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(w, xs, carry, rmask, b)


@pytest.mark.parametrize("directions", [None, 2])
def test_lstm_scan_gradients_match_xla_scans(kernel_on, monkeypatch, directions):
    """Every gradient of ``lstm_scan`` (lengths, a recurrent dropout mask and biases; one
    direction or two) through the kernel and through XLA's scans."""
    a = operands(6, 5, 9, masked=True, dropped=True, directions=directions)
    args = (a["w"], a["xs"], (a["c"], a["h"]), jnp.asarray(a["mask"]), a["rmask"], a["b"])
    got = scan_value_and_grads(*args)
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "off")
    want = scan_value_and_grads(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [recurrent.Recurrent("lstm", 6, reverse=True),
                                   recurrent.Bidirectional("lstm", 6)])
def test_outputs_independent_of_padding(kernel_on, layer):
    """A sequence's outputs through the kernel are the same whatever padding follows it,
    read forward and in reverse."""
    x = jax.random.normal(jax.random.key(0), (2, 9, 4))
    params = layer.init(jax.random.key(1), x, lengths=jnp.array([5, 9]))
    assert uses_kernel(lambda x: layer.apply(params, x, lengths=jnp.array([5, 9]))[1], x)
    _, short = layer.apply(params, x[:, :5], lengths=jnp.array([5, 5]))
    _, long = layer.apply(params, x, lengths=jnp.array([5, 9]))
    np.testing.assert_allclose(long[0, :5], short[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(long[0, 5:], 0.0)


@pytest.mark.parametrize("layer", [
    recurrent.Recurrent("lstm", 6, bias_init=jax.nn.initializers.normal(1.0)),
    recurrent.Bidirectional("lstm", 6, bias_init=jax.nn.initializers.normal(1.0))])
def test_layers_with_biases_match_xla_scans(kernel_on, monkeypatch, layer):
    """The layers hand their biases to the kernel, which adds them as it reads the
    projection: outputs and every gradient as through XLA's scans."""
    x = jax.random.normal(jax.random.key(0), (3, 7, 4))
    lengths = jnp.array([7, 4, 1])
    params = layer.init(jax.random.key(1), x, lengths=lengths)

    def value_and_grads():
        loss = lambda p, x: jnp.sum(jnp.sin(layer.apply(p, x, lengths=lengths)[1]))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    got = value_and_grads()
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "off")
    want = value_and_grads()
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def uses_kernel(fn, *args) -> bool:
    """Whether ``fn`` traced now (a fresh function: no cached trace) calls the kernel."""
    return native.target("lstm_forward") in jax.jit(lambda *a: fn(*a)).lower(*args).as_text()


def test_which_scans_take_the_kernel(kernel_on, monkeypatch):
    a = operands(3, 2, 4)
    scan = lambda w, xs, c, h: recurrent.lstm_scan(w, xs, (c, h), None, None)[1]  # noqa: E731
    args = (a["w"], a["xs"], a["c"], a["h"])
    assert uses_kernel(scan, *args)
    assert not uses_kernel(scan, *(x.astype(jnp.bfloat16) for x in args))
    two = (jnp.stack([a["w"]] * 2), jnp.stack([a["xs"]] * 2),  # a bidirectional scan
           jnp.stack([a["c"]] * 2), jnp.stack([a["h"]] * 2))
    assert uses_kernel(scan, *two)
    gru = lambda xs, h: recurrent.scan_cell(  # noqa: E731
        cells.get_cell("gru"), {"w_hh": jnp.ones((4, 12))}, xs, h)[1]
    assert not uses_kernel(gru, jnp.ones((2, 3, 12)), jnp.ones((2, 4)))
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "off")
    assert not lstm_kernel.available() and not uses_kernel(scan, *args)


def test_lm_training_step_same_with_the_kernel(monkeypatch):
    """A dense LM's training step through the kernel against XLA's scans: the same loss and
    update within float32 rounding."""
    (nll_off, new_off), (nll_on, new_on) = lm_step_off_and_on(
        monkeypatch, "DENSE_RNN_LSTM_KERNEL", native.target("lstm_backward"), lstm_kernel.available)
    np.testing.assert_allclose(nll_on, nll_off, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(new_on), jax.tree.leaves(new_off), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mode(monkeypatch):
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "maybe")
    with pytest.raises(UserError, match="DENSE_RNN_LSTM_KERNEL=maybe: use one of auto, on, off"):
        lstm_kernel.available()


def test_independent_scans_in_one_step(kernel_on):
    """Two scans XLA may run at once, each asking the thread pool for help: the same
    results as each alone (and no wait on a task that cannot start)."""
    a, b = operands(12, 7, 40), operands(12, 7, 40, seed=1)
    scan = lambda o: recurrent.lstm_scan(o["w"], o["xs"], (o["c"], o["h"]), None, None)[1]  # noqa: E731
    both = jax.jit(lambda a, b: (scan(a), scan(b)))(a, b)
    for got, o in zip(both, (a, b), strict=True):
        np.testing.assert_array_equal(got, jax.jit(scan)(o))


def test_same_results_on_a_busy_machine(kernel_on):
    """With every core also busy in other processes, the kernel's threads claim each step's
    panels in other orders: the values and gradients are bit for bit the same."""
    a = operands(30, 7, 70, masked=True, dropped=True)
    args = (a["w"], a["xs"], (a["c"], a["h"]), jnp.asarray(a["mask"]), a["rmask"])
    grads = jax.jit(scan_value_and_grads)
    quiet = grads(*args)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 2)]
    try:
        busy = [grads(*args) for _ in range(5)]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for got in busy:
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(quiet), strict=True):
            np.testing.assert_array_equal(g, w)


def test_without_a_compiler_the_scans_stay_xlas(monkeypatch, tmp_path, caplog):
    """A failed build is reported once, as a reason, and every scan stays XLA's."""
    monkeypatch.setenv("DENSE_RNN_CACHE", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-compiler"))
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "on")
    native.library.cache_clear()
    native.loaded.cache_clear()
    try:
        assert isinstance(native.library(), str)
        assert not lstm_kernel.available()
        assert "LSTM scans stay XLA's; the C++ kernels are unavailable" in caplog.text
        a = operands(3, 2, 4)
        scan = lambda w, xs, c, h: recurrent.lstm_scan(w, xs, (c, h), None, None)[1]  # noqa: E731
        assert not uses_kernel(scan, a["w"], a["xs"], a["c"], a["h"])
    finally:
        native.library.cache_clear()
        native.loaded.cache_clear()


@pytest.mark.parametrize("vendor, flags, scans, products", [
    ("GenuineIntel", "avx2 avx512f", True, True),
    ("GenuineIntel", "avx2", False, True),
    ("AuthenticAMD", "avx2 avx512f", True, False),
    ("AuthenticAMD", "avx2", False, False),
])
def test_auto_picks_the_kernels_by_cpu(monkeypatch, vendor, flags, scans, products):
    """``auto``: the LSTM kernel on AVX-512 CPUs, the BLAS products on Intel ones (as measured,
    RESULTS.md items 39-41); ``on`` and ``off`` whatever the CPU."""
    monkeypatch.setattr(native, "cpuinfo", lambda: f"vendor_id\t: {vendor}\nflags\t\t: fpu {flags}")
    monkeypatch.setattr(native, "cpu_backend", lambda: True)
    monkeypatch.setattr(lstm_kernel, "_loaded", lambda: True)
    monkeypatch.setattr(blas, "_handler", lambda: True)
    for variable in (lstm_kernel.VARIABLE, blas.VARIABLE):
        monkeypatch.delenv(variable, raising=False)
    assert (lstm_kernel.available(), blas.available()) == (scans, products)
    for value in ("on", "off"):
        for variable in (lstm_kernel.VARIABLE, blas.VARIABLE):
            monkeypatch.setenv(variable, value)
        assert lstm_kernel.available() == blas.available() == (value == "on")


@pytest.mark.parametrize("kernel", ["on", "off"])
def test_a_gradient_of_a_gradient_needs_the_kernel_off_and_says_so(kernel, monkeypatch):
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", kernel)
    if kernel == "on" and not lstm_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")
    model = recurrent.Recurrent("lstm", 5)
    x = jax.random.normal(jax.random.key(1), (2, 4, 3))
    variables = model.init(jax.random.key(0), x)

    def penalty(x):  # a gradient penalty: the squared norm of d loss / d x
        grad = jax.grad(lambda x: jnp.sum(model.apply(variables, x)[1] ** 2))(x)
        return jnp.sum(grad ** 2)

    if kernel == "on":
        with pytest.raises(NotImplementedError, match="DENSE_RNN_LSTM_KERNEL=off"):
            jax.grad(penalty)(x)
    else:
        assert np.isfinite(np.asarray(jax.grad(penalty)(x))).all()
