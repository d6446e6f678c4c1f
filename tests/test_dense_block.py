"""Dense recurrent block (eq. 2-3, 7-8) against a step-by-step float64 NumPy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import cells
from dense_rnn.dense_block import DenseRecurrent, rec_rows
from dense_rnn.recurrent import scan_cell
from tests import hm_reference as ref

B, T, D, H = 3, 11, 5, 4
LENGTHS = np.array([11, 7, 1], np.int32)


def _init(cell, k, seed=0):
    x = jax.random.normal(jax.random.key(seed), (B, T, D))
    layer = DenseRecurrent(cell, H, k)
    params = layer.init(jax.random.key(seed + 1), x)["params"]
    return layer, params, x


@pytest.mark.parametrize(
    "cell,k", [("rnn", 4), ("gru", 1), ("gru", 3), ("lstm", 4)])
def test_dense_block_matches_reference(cell, k):
    layer, params, x = _init(cell, k)
    carry, ys = jax.jit(lambda p, x, n: layer.apply({"params": p}, x, n))(
        params, x, jnp.asarray(LENGTHS))
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    for b, n in enumerate(LENGTHS):
        want = ref.dense_layer(cell, p64, np.asarray(x[b, :n], np.float64), k)
        np.testing.assert_allclose(ys[b, :n], want, atol=2e-5)
        np.testing.assert_array_equal(ys[b, n:], 0.0)
        np.testing.assert_allclose(cells.carry_output(carry)[b], want[-1], atol=2e-5)


def test_weights_owned_by_position():
    _, params, _ = _init("gru", 4)
    assert {k: v.shape for k, v in params.items() if k.startswith("w_hh")} == {
        f"w_hh_{n}": (rec_rows(n) * H, 3 * H) for n in range(1, 5)
    }
    assert params["w_ih"].shape == (D, 3 * H)


@pytest.mark.parametrize("cell", ["rnn", "lstm"])
def test_depth_one_is_the_plain_cell(cell):
    layer, params, x = _init(cell, 1)
    _, ys = layer.apply({"params": params}, x, jnp.asarray(LENGTHS))
    plain = {"w_ih": params["w_ih"], "w_hh": params["w_hh_1"], "b": params["b"]}
    spec = cells.get_cell(cell)
    _, want = scan_cell(spec, plain, cells.project(plain, x), spec.zero_carry((B,), H, x.dtype),
                        jnp.asarray(LENGTHS))
    np.testing.assert_allclose(ys, want, atol=1e-6)


def test_padding_does_not_change_outputs():
    layer, params, x = _init("lstm", 4)
    x2 = x.at[2, 1:].set(100.0)  # garbage after length 1
    a = layer.apply({"params": params}, x, jnp.asarray(LENGTHS))
    b = layer.apply({"params": params}, x2, jnp.asarray(LENGTHS))
    jax.tree.map(lambda u, v: np.testing.assert_allclose(u, v, atol=1e-6), a, b)


def test_gradients_reach_every_position_weight():
    layer, params, x = _init("rnn", 3)

    def loss(p):
        return jnp.sum(layer.apply({"params": p}, x)[1] ** 2)

    grads = jax.grad(loss)(params)
    for name, g in grads.items():
        assert np.all(np.isfinite(g)) and np.abs(g).sum() > 0, name
