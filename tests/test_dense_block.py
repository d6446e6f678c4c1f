"""Dense recurrent block (eq. 2-3, 7-8) against a step-by-step float64 NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import cells, dense_block
from dense_rnn.dense_block import DenseRecurrent, rec_rows
from dense_rnn.recurrent import scan_cell
from tests import hm_reference as ref
from tests.conftest import grid

B, T, D, H = 3, 11, 5, 4
LENGTHS = np.array([11, 7, 1], np.int32)


def _init(cell, k, seed=0, block_start=False):
    x = jax.random.normal(jax.random.key(seed), (B, T, D))
    layer = DenseRecurrent(cell, H, k, block_start)
    params = layer.init(jax.random.key(seed + 1), x)["params"]
    return layer, params, x


@pytest.mark.parametrize(
    "cell,k,block_start",
    [("rnn", 4, False), ("gru", 1, False), ("gru", 3, False), ("lstm", 4, False),
     ("gru", 3, True), ("lstm", 2, True)])
def test_dense_block_matches_reference(cell, k, block_start):
    layer, params, x = _init(cell, k, block_start=block_start)
    carry, ys = jax.jit(lambda p, x, n: layer.apply({"params": p}, x, lengths=n))(
        params, x, jnp.asarray(LENGTHS))
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    for b, n in enumerate(LENGTHS):
        want, _ = ref.dense_layer(cell, p64, np.asarray(x[b, :n], np.float64), k, block_start)
        np.testing.assert_allclose(ys[b, :n], want, atol=2e-5)
        np.testing.assert_array_equal(ys[b, n:], 0.0)
        np.testing.assert_allclose(cells.carry_output(carry)[b], want[-1], atol=2e-5)


def random_carry(rng, cell, batch, hidden):
    """A random float64 carry: ``(c, h)`` for an LSTM, else ``h``."""
    c, h = rng.normal(size=(2, batch, hidden))
    return (c, h) if cell == "lstm" else h


@pytest.mark.parametrize(
    "cell,k,block_start",
    [("rnn", 4, False), ("gru", 3, False), ("lstm", 4, False), ("gru", 3, True),
     ("lstm", 2, True), ("rnn", 3, True)])
def test_dense_block_from_a_carry_matches_float64_reference(x64, cell, k, block_start):
    """The XLA scan in float64 (the C++ kernel takes float32 only), from a random carry,
    with a length-0 row (its carry passes through) and lengths that end inside a block."""
    rng = np.random.default_rng(4)
    x, lengths = rng.normal(size=(B, T, D)), np.array([11, 6, 0], np.int32)
    layer = DenseRecurrent(cell, H, k, block_start, param_dtype=jnp.float64)
    params = jax.tree.map(lambda a: rng.normal(size=a.shape) * 0.5,
                          layer.init(jax.random.key(1), jnp.asarray(x))["params"])
    carry = random_carry(rng, cell, B, H)
    final, ys = layer.apply({"params": params}, jnp.asarray(x), carry, jnp.asarray(lengths))
    h0, c0 = (carry[1], carry[0]) if cell == "lstm" else (carry, np.zeros((B, H)))
    for b, n in enumerate(lengths):
        want, c = ref.dense_layer(cell, params, x[b, :n], k, block_start, h0[b], c0[b])
        np.testing.assert_allclose(ys[b, :n], want, rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(ys[b, n:], 0.0)
        np.testing.assert_allclose(cells.carry_output(final)[b], want[-1] if n else h0[b],
                                   rtol=1e-10, atol=1e-12)
        if cell == "lstm":
            np.testing.assert_allclose(final[0][b], c, rtol=1e-10, atol=1e-12)


def test_weights_owned_by_position():
    _, params, _ = _init("gru", 4)
    assert {k: v.shape for k, v in params.items() if k.startswith("w_hh")} == {
        f"w_hh_{n}": (rec_rows(n) * H, 3 * H) for n in range(1, 5)
    }
    assert params["w_ih"].shape == (D, 3 * H)


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_depth_one_is_the_plain_cell(cell):
    layer, params, x = _init(cell, 1)
    _, ys = layer.apply({"params": params}, x, lengths=jnp.asarray(LENGTHS))
    plain = {"w_ih": params["w_ih"], "w_hh": params["w_hh_1"], "b": params["b"]}
    spec = cells.get_cell(cell)
    _, want = scan_cell(spec, plain, cells.project(plain, x), spec.zero_carry((B,), H, x.dtype),
                        jnp.asarray(LENGTHS))
    np.testing.assert_allclose(ys, want, atol=1e-6)


def test_padding_does_not_change_outputs():
    layer, params, x = _init("lstm", 4)
    x2 = x.at[2, 1:].set(100.0)  # garbage after length 1
    a = layer.apply({"params": params}, x, lengths=jnp.asarray(LENGTHS))
    b = layer.apply({"params": params}, x2, lengths=jnp.asarray(LENGTHS))
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-6), a, b)


def test_gradients_reach_every_position_weight():
    layer, params, x = _init("rnn", 3)

    def loss(p):
        return jnp.sum(layer.apply({"params": p}, x)[1] ** 2)

    grads = jax.grad(loss)(params)
    for name, g in grads.items():
        assert np.all(np.isfinite(g)) and np.abs(g).sum() > 0, name


def _autodiff_scan(cell, w_hh, xw, carry, lengths, block_start):
    """``dense_scan`` as JAX differentiates it: the weight gradient accumulated per step."""
    return dense_block._scan(cell, block_start, tuple(w_hh), xw, carry, lengths)[0]


F64, F32 = (jnp.float64, 1e-12), (jnp.float32, 2e-5)


@pytest.mark.parametrize("cell,k,block_start,dtype,tol,use_lengths", grid(
    [("rnn", 3, False), ("gru", 4, False), ("gru", 1, False), ("lstm", 2, False),
     ("gru", 2, True), ("lstm", 3, True)], [F64, F32], [False, True],
    default=[("rnn", 3, False, *F64, False), ("gru", 4, False, *F32, True),
             ("gru", 1, False, *F64, True), ("lstm", 2, False, *F32, False),
             ("gru", 2, True, *F64, False), ("lstm", 3, True, *F32, True)]))
def test_weight_gradient_by_position_matches_autodiff(x64, dtype, tol, cell, k, block_start,
                                                      use_lengths):
    keys = jax.random.split(jax.random.key(3), k + 4)
    g = cells.get_cell(cell).gates * H
    w_hh = [0.5 * jax.random.normal(keys[n], (rec_rows(n + 1, block_start) * H, g), dtype)
            for n in range(k)]
    xw = jax.random.normal(keys[k], (B, T, g), dtype)  # T = 11: not a multiple of k
    h0 = jax.random.normal(keys[k + 1], (B, H), dtype)
    carry = (jax.random.normal(keys[k + 2], (B, H), dtype), h0) if cell == "lstm" else h0
    ct = jax.random.normal(keys[k + 3], (B, T, H), dtype)
    lengths = jnp.asarray(LENGTHS) if use_lengths else None

    def loss(scan, w, xw, carry):
        final, ys = scan(cell, w, xw, carry, lengths, block_start)
        return jnp.sum(ys * ct) + jnp.sum(cells.carry_output(final) ** 2)

    want = jax.grad(functools.partial(loss, _autodiff_scan), argnums=(0, 1, 2))(w_hh, xw, carry)
    got = jax.jit(jax.grad(functools.partial(loss, dense_block.dense_scan), argnums=(0, 1, 2)))(
        w_hh, xw, carry)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol, atol=tol), got, want)
    assert all(a.dtype == dtype for a in jax.tree.leaves(got))
