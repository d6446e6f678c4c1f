"""dropout: the same masks as jax.random.bernoulli and flax's Dropout, without a loop."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn.dropout import Dropout, bernoulli


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (4, 33, 17)])
@pytest.mark.parametrize("p", [0.5, 0.35, 0.9])
def test_bernoulli_is_jax_random_bernoulli(shape, p):
    for key in (jax.random.key(3), jax.random.fold_in(jax.random.key(11), 5),
                jax.random.PRNGKey(7)):
        want = jax.random.bernoulli(key, p, shape)
        np.testing.assert_array_equal(bernoulli(key, p, shape), want)
        np.testing.assert_array_equal(jax.jit(bernoulli, static_argnums=(1, 2))(key, p, shape),
                                      want)


def test_bernoulli_falls_back_where_jax_draws_differently(x64):
    rbg = jax.random.key(0, impl="rbg")
    np.testing.assert_array_equal(bernoulli(rbg, 0.5, (9, 4)),
                                  jax.random.bernoulli(rbg, 0.5, (9, 4)))
    key = jax.random.key(1)  # under x64 a Python float p draws 64-bit uniforms
    np.testing.assert_array_equal(bernoulli(key, 0.3, (9, 4)),
                                  jax.random.bernoulli(key, 0.3, (9, 4)))


def test_bernoulli_compiles_without_a_loop():
    text = jax.jit(lambda k: bernoulli(k, 0.5, (20, 35, 650))).lower(
        jax.random.key(0)).compile().as_text()
    assert "while" not in text


class _Net(nn.Module):
    dropout: type[nn.Dropout]

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        y = self.dropout(0.5)(x, deterministic)
        y = self.dropout(0.3, broadcast_dims=(1,))(nn.Dense(6)(y), deterministic)
        return self.dropout(0.0)(y, deterministic) + self.dropout(1.0)(y, deterministic)


@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_module_matches_flax(deterministic):
    x = jax.random.normal(jax.random.key(0), (3, 8, 5))
    params = _Net(nn.Dropout).init(jax.random.key(1), x, True)
    rngs = {"dropout": jax.random.key(2)}
    want = _Net(nn.Dropout).apply(params, x, deterministic, rngs=rngs)
    got = _Net(Dropout).apply(params, x, deterministic, rngs=rngs)
    np.testing.assert_array_equal(got, want)
    assert bool(jnp.any(got != 0))
