"""Dropout whose masks are ``jax.random.bernoulli``'s, bit for bit, drawn in one fused pass.

On CPU, JAX lowers the Threefry hash behind ``jax.random`` as a loop over its five rounds
(to keep compile times short), so every mask is written and copied once per round: at
``zaremba_medium``'s shape the three masks of a step cost ~5 ms this way and ~1.2 ms as one
elementwise pass. :func:`bernoulli` evaluates the same hash (Threefry-2x32, 20 rounds) on
the same counters that ``jax.random`` uses, unrolled, so XLA fuses it into one kernel; on
GPU and TPU, where JAX already unrolls it, the two are the same computation. Keys of another
PRNG implementation (``rbg``), ``jax_threefry_partitionable=False`` and float64 ``p`` take
``jax.random.bernoulli`` itself.
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 block cipher, 20 rounds (Salmon et al. 2011), as in ``jax.random``:
    key words ``(k0, k1)``, counter words ``(x0, x1)`` (uint32, any shape)."""
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r)))
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _key_words(key: Array) -> Array | None:
    """The uint32[2] Threefry key behind ``key``, or ``None`` if ``jax.random`` would draw
    from it differently."""
    if not jax.config.jax_threefry_partitionable:
        return None
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != "threefry2x32":
            return None
        key = jax.random.key_data(key)
    elif jax.config.jax_default_prng_impl != "threefry2x32":
        return None
    return key if key.shape == (2,) else None


def bernoulli(key: Array, p: float, shape: Sequence[int]) -> Array:
    """``jax.random.bernoulli(key, p, shape)`` (the same booleans), as one fused pass."""
    words = _key_words(key)
    size = int(np.prod(shape))
    if words is None or lax.dtype(p) != jnp.float32 or size >= 2**32:
        return jax.random.bernoulli(key, p, shape)
    # jax.random's counters are each element's row-major index, split into (hi, lo) words;
    # its 32 random bits are the XOR of the two output words.
    y0, y1 = threefry2x32(words[0], words[1], jnp.zeros(shape, jnp.uint32),
                          lax.iota(jnp.uint32, size).reshape(shape))
    mantissa = ((y0 ^ y1) >> np.uint32(9)) | np.uint32(0x3F800000)  # a float in [1, 2)
    return lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0 < p


class Dropout(nn.Dropout):
    """``flax.linen.Dropout`` with masks drawn by :func:`bernoulli`: the same outputs for
    the same key (and, named ``Dropout``, the same automatic name and ``make_rng`` key)."""

    @nn.compact
    def __call__(self, inputs: Array, deterministic: bool | None = None,
                 rng: Array | None = None) -> Array:
        """``inputs`` masked and scaled by ``1 / (1 - rate)`` unless ``deterministic``."""
        deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        keep = 1.0 - self.rate
        if rng is None:
            rng = self.make_rng(self.rng_collection)
        shape = list(inputs.shape)
        for dim in self.broadcast_dims:
            shape[dim] = 1
        mask = jnp.broadcast_to(bernoulli(rng, keep, shape), inputs.shape)
        return lax.select(mask, inputs / keep, jnp.zeros_like(inputs))
