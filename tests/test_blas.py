"""The BLAS product (``dense_rnn/blas.py``) against float64 NumPy, its gradients, and which
of ``precision``'s products take it."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import blas, precision
from dense_rnn.errors import UserError
from tests.conftest import lm_step_off_and_on

TRANS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.fixture
def blas_on(monkeypatch):
    """The handler on whatever the CPU, for every product (skipped where it cannot build)."""
    monkeypatch.setenv("DENSE_RNN_BLAS", "on")
    monkeypatch.setattr(blas, "MIN_MACS", 0)
    if not blas.available():
        pytest.skip("the BLAS handler cannot be built or loaded here")


def operands(m, k, n, trans_a, trans_b, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    return a, b


def op(x, trans):
    return x.T if trans else x


def uses_blas(fn, *args):
    """Whether ``fn`` traced now (a fresh function: no cached trace) calls the handler."""
    return blas.TARGET in jax.jit(lambda *a: fn(*a)).lower(*args).as_text()


@pytest.mark.parametrize("trans_a, trans_b", TRANS)
@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (130, 37, 90), (40, 33, 260), (3, 0, 7),
                                     (0, 5, 7)])
def test_gemm_matches_float64_numpy(blas_on, m, k, n, trans_a, trans_b):
    """Unsplit (m, n < 32) and split by rows or by columns, every transpose; empty
    operands (a product over no terms is zeros)."""
    a, b = operands(m, k, n, trans_a, trans_b)
    want = op(a, trans_a).astype(np.float64) @ op(b, trans_b)
    got = jax.jit(blas.gemm, static_argnums=(2, 3))(a, b, trans_a, trans_b)
    assert got.shape == (m, n) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(initial=1))


@pytest.mark.parametrize("trans_a, trans_b", TRANS)
def test_gemm_gradients_match_float64_numpy(blas_on, trans_a, trans_b):
    a, b = operands(70, 40, 50, trans_a, trans_b)
    g = np.random.default_rng(1).standard_normal((70, 50)).astype(np.float32)
    da, db = jax.grad(lambda a, b: (blas.gemm(a, b, trans_a, trans_b) * g).sum(), (0, 1))(a, b)
    a64, b64, g64 = (x.astype(np.float64) for x in (a, b, g))
    dop_a, dop_b = g64 @ op(b64, trans_b).T, op(a64, trans_a).T @ g64
    np.testing.assert_allclose(da, op(dop_a, trans_a), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(db, op(dop_b, trans_b), rtol=1e-5, atol=1e-4)
    assert uses_blas(jax.grad(lambda a, b: (blas.gemm(a, b, trans_a, trans_b) * g).sum()), a, b)


def test_gemm_under_vmap(blas_on):
    a = np.random.default_rng(0).standard_normal((3, 20, 30)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((3, 30, 40)).astype(np.float32)
    got = jax.jit(jax.vmap(blas.gemm))(a, b)
    np.testing.assert_allclose(got, np.einsum("bmk,bkn->bmn", a, b), rtol=1e-5, atol=1e-4)


def test_precision_routes_large_float32_products(blas_on, monkeypatch):
    """``matmul`` (any leading shape), ``matmul_nt``, ``matmul_tn`` and ``linear``'s both
    passes take the handler in float32; bfloat16 operands, batched ``matmul_nt`` and
    products under ``MIN_MACS`` stay XLA's."""
    x, w = jnp.ones((4, 6, 8)), jnp.ones((8, 10))
    a, b = jnp.ones((6, 8)), jnp.ones((5, 8))
    assert uses_blas(precision.matmul, x, w)
    assert uses_blas(precision.matmul_nt, a, b)
    assert uses_blas(precision.matmul_tn, a, jnp.ones((6, 3)))
    assert uses_blas(jax.grad(lambda x, w: precision.linear(x, w).sum(), (0, 1)), x, w)
    assert not uses_blas(precision.matmul, x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    assert not uses_blas(precision.matmul_nt, jnp.ones((2, 6, 8)), jnp.ones((2, 5, 8)))
    monkeypatch.setattr(blas, "MIN_MACS", 6 * 8 * 5 + 1)
    assert not uses_blas(precision.matmul_nt, a, b)
    np.testing.assert_allclose(precision.matmul(x, w), np.full((4, 6, 10), 8.0))


def test_lm_training_step_same_with_blas(monkeypatch):
    """A dense LM's training step, every float32 product through the handler, against XLA's
    products: the same loss and update within float32 rounding."""
    monkeypatch.setattr(blas, "MIN_MACS", 0)
    (nll_off, new_off), (nll_on, new_on) = lm_step_off_and_on(
        monkeypatch, "DENSE_RNN_BLAS", blas.TARGET, blas.available)
    np.testing.assert_allclose(nll_on, nll_off, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(new_on), jax.tree.leaves(new_off), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mode(monkeypatch):
    monkeypatch.setenv("DENSE_RNN_BLAS", "off")
    assert not blas.available()
    assert not uses_blas(precision.matmul, jnp.ones((6, 8)), jnp.ones((8, 10)))
    monkeypatch.setenv("DENSE_RNN_BLAS", "maybe")
    with pytest.raises(UserError, match="DENSE_RNN_BLAS=maybe: use one of auto, on, off"):
        blas.mode()


@pytest.mark.parametrize("a, b", [((4, 5), (6, 3)), ((4, 5), (5,)), ((4, 5, 1), (5, 3))])
def test_gemm_refuses_operands_that_do_not_fit(blas_on, a, b):
    with pytest.raises(TypeError, match="contracted sizes agree"):
        blas.gemm(jnp.ones(a), jnp.ones(b))
    with pytest.raises(TypeError, match="contracted sizes agree"):
        blas.gemm(jnp.ones(a, jnp.int32), jnp.ones(a[::-1], jnp.int32))
