"""Mixed precision: float32 parameters, optimizer state and loss; computation in
``compute_dtype`` (bfloat16 on TPUs and recent GPUs).

Inside a step the float32 parameters are cast to the compute dtype before the forward
pass (so gradients flow back to float32 through the cast). Every matrix product, forward
and backward, takes compute-dtype operands and accumulates in float32 (``matmul``,
``matmul_nt``, ``matmul_tn``, ``matmul_tn_colsum``, ``linear``): the softmax layer's logits
and cross-entropy stay float32, the recurrent layers' products are rounded back to the
compute dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dense_rnn import blas
from dense_rnn.errors import UserError

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(name: str) -> Any:
    """The dtype named ``name`` in ``COMPUTE_DTYPES``; an unknown name raises ``UserError``."""
    if name not in COMPUTE_DTYPES:
        raise UserError(f"--compute_dtype={name}: use one of {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating-point leaves cast to ``dtype`` (others untouched; a Python
    float becomes an array)."""
    return jax.tree.map(
        lambda x: jnp.asarray(x, dtype)
        if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree)


def _accumulator(a: jax.Array) -> jnp.dtype:
    return jnp.promote_types(a.dtype, jnp.float32)


def matmul(a: jax.Array, b: jax.Array, *, use_blas: bool = True) -> jax.Array:
    """``a @ b`` accumulated and returned in at least float32. With bfloat16 operands this
    is the product CPUs with AVX512_BF16 (and GPUs, TPUs) run at twice the float32 rate;
    a bfloat16 result would take XLA's CPU path at the float32 rate. Large float32 products
    with a 2-D ``b`` go through ``blas.gemm`` where it applies (Intel CPUs) unless
    ``use_blas=False`` (a scan's per-step product, where the call only adds overhead)."""
    if use_blas and b.ndim == 2 and a.ndim >= 2:
        a2 = a.reshape(-1, a.shape[-1])
        if blas.applies(a2, b, a2.shape[0] * a2.shape[1] * b.shape[1]):
            return blas.gemm(a2, b).reshape(*a.shape[:-1], b.shape[1])
    return jnp.matmul(a, b, preferred_element_type=_accumulator(a))


def _narrow(a: jax.Array) -> bool:
    """Whether ``a``'s dtype is narrower than its float32 (or wider) accumulator."""
    return a.dtype != _accumulator(a)


def matmul_nt(a: jax.Array, b: jax.Array, *, use_blas: bool = True) -> jax.Array:
    """``a @ b^T`` for ``a`` (..., m, k) and ``b`` (..., n, k) with the same leading (batch)
    axes, as ``matmul``: one product contracting both last axes, with no transpose for XLA
    to materialise (``blas.gemm`` for large 2-D float32 ones, as ``matmul``)."""
    if use_blas and blas.applies(a, b, a.size * b.shape[0]):
        return blas.gemm(a, b, trans_b=True)
    batch = tuple(range(a.ndim - 2))
    return lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 1,)), (batch, batch)),
                           preferred_element_type=_accumulator(a))


def matmul_tn(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a.T @ b`` for 2-D ``a`` (k, m) and ``b`` (k, n), as ``matmul``.

    For narrow (bfloat16) operands ``a.T`` is materialised row-major first. XLA's CPU
    backend runs bfloat16 products at the bfloat16 rate only through YNNPACK, which takes a
    row-major left operand; any other form is upcast to float32. The (m, 1, k) reshape gives
    the transposed copy a row-major HLO layout (a 2-D transpose carries a permuted one), and
    the barrier keeps XLA from folding the transpose back into the product. Float32
    products contract the leading axes directly (the copy cost up to 13% at DC-Bi-LSTM's
    shapes).
    """
    if not _narrow(a):
        if blas.applies(a, b, a.size * b.shape[1]):
            return blas.gemm(a, b, trans_a=True)
        return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=a.dtype)
    k, m = a.shape
    a_t = lax.optimization_barrier(a.T.reshape(m, 1, k))
    out = lax.dot_general(a_t, b, (((2,), (0,)), ((), ())), preferred_element_type=_accumulator(a))
    return out.reshape(m, b.shape[1])


def matmul_tn_colsum(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``a.T @ b`` and ``b``'s column sums ``1^T b`` for 2-D ``a`` (k, m) and ``b`` (k, n), in
    the accumulator's dtype (a layer's kernel and bias gradients). For narrow operands the
    sums are one more row of the product, ``[a, 1]^T b``, so ``b`` is read only by it; in
    float32 that taller product's sliced result costs a copy, so the sum is a reduction."""
    if not _narrow(a):
        return matmul_tn(a, b), b.sum(0, dtype=a.dtype)
    out = matmul_tn(jnp.concatenate([a, jnp.ones((a.shape[0], 1), a.dtype)], axis=1), b)
    return out[:-1], out[-1]


@jax.custom_vjp
def linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for ``x`` (..., k) and ``w`` (k, n), accumulated in at least float32 and
    returned in ``x``'s dtype. Its backward products, ``dx = g w^T`` and ``dw = x^T g``,
    take the same dtype's operands (``matmul_nt``, ``matmul_tn``), where autodiff would
    take the float32 cotangent: in bfloat16 all three run at the bfloat16 rate."""
    return _linear_fwd(x, w)[0]


def _linear_fwd(x: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    out = matmul(x.reshape(-1, x.shape[-1]), w).astype(x.dtype)
    return out.reshape(*x.shape[:-1], w.shape[1]), (x, w)


def _linear_bwd(
    residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, w = residuals
    x2, g = x.reshape(-1, x.shape[-1]), g.reshape(-1, w.shape[1]).astype(x.dtype)
    dx = matmul_nt(g, w).astype(x.dtype).reshape(x.shape)
    return dx, matmul_tn(x2, g).astype(w.dtype)


linear.defvjp(_linear_fwd, _linear_bwd)
