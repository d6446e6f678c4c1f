"""The LSTM scan's hand-written backward pass (``recurrent.lstm_scan``) against JAX's
autodiff of the plain scan of ``cells.lstm_step``: values and every gradient, with
lengths, reverse, recurrent dropout masks and unrolling, in float64 and float32."""

import jax
import jax.numpy as jnp
import pytest

from dense_rnn import cells, recurrent
from tests.conftest import grid

B, T, H = 3, 7, 5


def plain_scan(w_hh, xw, carry, lengths, reverse, unroll, rmask):
    """``scan_cell`` as it would run with JAX differentiating ``cells.lstm_step``."""
    xs = jnp.swapaxes(recurrent.reverse_padded(xw, lengths) if reverse else xw, 0, 1)
    mask = None if lengths is None else jnp.swapaxes(recurrent.length_mask(lengths, T), 0, 1)
    def step(params, carry, xw):  # the dropout mask on h_{t-1}, which only the product reads
        c, h = carry
        return cells.lstm_step(params, (c, h if rmask is None else h * rmask), xw)

    lstm = cells.get_cell("lstm")._replace(step=step)
    carry, ys = recurrent._generic_scan(lstm, {"w_hh": w_hh}, xs, carry, mask, unroll)
    ys = jnp.swapaxes(ys, 0, 1)
    return carry, recurrent.reverse_padded(ys, lengths) if reverse else ys


def custom_scan(w_hh, xw, carry, lengths, reverse, unroll, rmask):
    return recurrent.scan_cell(
        cells.get_cell("lstm"), {"w_hh": w_hh}, xw, carry, lengths, reverse, unroll, rmask)


def inputs(dtype):
    k = jax.random.split(jax.random.key(0), 6)
    return {
        "w_hh": 0.5 * jax.random.normal(k[0], (H, 4 * H), dtype),
        "xw": jax.random.normal(k[1], (B, T, 4 * H), dtype),
        "carry": (jax.random.normal(k[2], (B, H), dtype), jax.random.normal(k[3], (B, H), dtype)),
        "rmask": (jax.random.bernoulli(k[4], 0.7, (B, H)) / 0.7).astype(dtype),
        "ct": jax.random.normal(k[5], (B, T, H), dtype),
    }


def value_and_grads(scan, a, lengths, reverse, unroll, use_rmask):
    def loss(w_hh, xw, carry, rmask):
        (c, h), ys = scan(w_hh, xw, carry, lengths, reverse, unroll,
                          rmask if use_rmask else None)
        return jnp.sum(ys * a["ct"]) + jnp.sum(1.3 * c) - jnp.sum(0.7 * h)

    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(a["w_hh"], a["xw"], a["carry"],
                                                           a["rmask"])


@pytest.mark.parametrize("use_lengths,reverse,use_rmask,unroll", grid(
    [False, True], [False, True], [False, True], [1, 3],
    default=[(False, False, False, 1), (True, True, False, 3), (True, False, True, 3),
             (False, True, True, 1), (True, True, True, 1)]))
def test_custom_vjp_matches_autodiff_float64(x64, use_lengths, reverse, use_rmask, unroll):
    a = inputs(jnp.float64)
    lengths = jnp.array([T, 3, 0]) if use_lengths else None
    ref = value_and_grads(plain_scan, a, lengths, reverse, unroll, use_rmask)
    got = value_and_grads(custom_scan, a, lengths, reverse, unroll, use_rmask)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert jnp.allclose(r, g, rtol=1e-12, atol=1e-12)


def test_custom_vjp_matches_autodiff_float32():
    a = inputs(jnp.float32)
    lengths = jnp.array([T, 3, 1])
    ref = value_and_grads(plain_scan, a, lengths, True, 1, True)
    got = value_and_grads(custom_scan, a, lengths, True, 1, True)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert jnp.allclose(r, g, rtol=1e-5, atol=1e-5)


def test_forward_is_the_plain_scan_bitwise():
    a = inputs(jnp.float32)
    lengths = jnp.array([T, 3, 1])
    ref = plain_scan(a["w_hh"], a["xw"], a["carry"], lengths, False, 1, a["rmask"])
    got = custom_scan(a["w_hh"], a["xw"], a["carry"], lengths, False, 1, a["rmask"])
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert jnp.array_equal(r, g)


@pytest.mark.parametrize("use_rmask", [False, True])
def test_bidirectional_single_scan_matches_two_scans(x64, use_rmask):
    """``Bidirectional`` runs both LSTM directions in one scan; compare with one
    ``scan_cell`` per direction (autodiff of the plain scan), values and gradients, also
    those of the initial carries and the recurrent masks."""
    a = inputs(jnp.float64)
    x = a["xw"][..., :6]
    lengths = jnp.array([T, 3, 0])
    layer = recurrent.Bidirectional("lstm", H, param_dtype=jnp.float64)
    params = layer.init(jax.random.key(1), x, lengths=lengths)["params"]
    rmask = (a["rmask"], 1.5 * a["rmask"]) if use_rmask else None
    keys = jax.random.split(jax.random.key(2), 5)
    ct = jax.random.normal(keys[0], (B, T, 2 * H), jnp.float64)
    carry = tuple((jax.random.normal(keys[k], (B, H), jnp.float64),
                   jax.random.normal(keys[k + 1], (B, H), jnp.float64)) for k in (1, 3))

    def reference(p, x, carry, rmask):
        outs = []
        for name, rev, k in [("fwd", False, 0), ("bwd", True, 1)]:
            q = p[name]
            outs.append(plain_scan(q["w_hh"], cells.project(q, x), carry[k], lengths, rev, 1,
                                   None if rmask is None else rmask[k]))
        return (outs[0][0], outs[1][0]), jnp.concatenate([outs[0][1], outs[1][1]], -1)

    def loss(apply, *args):
        (cf, cb), ys = apply(*args)
        return jnp.sum(ys * ct) + jnp.sum(cf[0] * cb[1]) - jnp.sum(cf[1] + cb[0])

    def ours(p, x, carry, rmask):
        return layer.apply({"params": p}, x, carry, lengths, rmask)

    args = (params, x, carry, rmask)
    ref = jax.value_and_grad(lambda *a: loss(reference, *a), argnums=(0, 1, 2, 3))(*args)
    got = jax.value_and_grad(lambda *a: loss(ours, *a), argnums=(0, 1, 2, 3))(*args)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got), strict=True):
        assert jnp.allclose(r, g, rtol=1e-12, atol=1e-12)
