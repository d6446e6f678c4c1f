"""Mixed precision: float32 parameters, optimizer state and loss; computation in
``compute_dtype`` (bfloat16 on TPUs and recent GPUs).

Inside a step the float32 parameters are cast to the compute dtype before the forward
pass (so gradients flow back to float32 through the cast). The softmax layer's products
take compute-dtype operands and accumulate in float32 (``matmul``), so the logits and the
cross-entropy are float32.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dense_rnn.errors import UserError

COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def compute_dtype(name: str) -> Any:
    if name not in COMPUTE_DTYPES:
        raise UserError(f"--compute_dtype={name}: use one of {', '.join(COMPUTE_DTYPES)}")
    return COMPUTE_DTYPES[name]


def cast_floating(tree: Any, dtype: Any) -> Any:
    """``tree`` with its floating-point leaves cast to ``dtype`` (others untouched)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _accumulator(a: jax.Array) -> jnp.dtype:
    return jnp.promote_types(a.dtype, jnp.float32)


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` accumulated and returned in at least float32. With bfloat16 operands this
    is the product CPUs with AVX512_BF16 (and GPUs, TPUs) run at twice the float32 rate;
    a bfloat16 result would take XLA's CPU path at the float32 rate."""
    return jnp.matmul(a, b, preferred_element_type=_accumulator(a))


def matmul_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b.T`` for 2-D ``a`` (m, k) and ``b`` (n, k), as ``matmul``: one product
    contracting both last axes, with no transpose for XLA to fold."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=_accumulator(a))


def matmul_tn(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a.T @ b`` for 2-D ``a`` (k, m) and ``b`` (k, n), as ``matmul``.

    ``a.T`` is materialised row-major first. XLA's CPU backend runs bfloat16 products at
    the bfloat16 rate only through YNNPACK, which takes a row-major left operand; any
    other form is upcast to float32. The (m, 1, k) reshape gives the transposed copy a
    row-major HLO layout (a 2-D transpose carries a permuted one), and the barrier keeps
    XLA from folding the transpose back into the product.
    """
    k, m = a.shape
    a_t = lax.optimization_barrier(a.T.reshape(m, 1, k))
    out = lax.dot_general(a_t, b, (((2,), (0,)), ((), ())), preferred_element_type=_accumulator(a))
    return out.reshape(m, b.shape[1])
