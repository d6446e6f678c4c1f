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


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` accumulated and returned in at least float32. With bfloat16 operands this
    is the product CPUs with AVX512_BF16 (and GPUs, TPUs) run at twice the float32 rate;
    a bfloat16 result would take XLA's CPU path at the float32 rate."""
    return jnp.matmul(a, b, preferred_element_type=jnp.promote_types(a.dtype, jnp.float32))
