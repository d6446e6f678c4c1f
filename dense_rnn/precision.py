"""Mixed precision: float32 parameters, optimizer state and loss; computation in
``compute_dtype`` (bfloat16 on TPUs and recent GPUs).

Inside a step the float32 parameters are cast to the compute dtype before the forward
pass (so gradients flow back to float32 through the cast), and logits are cast to float32
before the softmax cross-entropy.
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
