"""Recurrent layers: a cell's step scanned over time with ``jax.lax.scan``.

The input projection of every time step is one matrix product outside the scan
(``cells.project``); only the recurrent product ``h @ w_hh`` runs inside it. Inputs and
outputs are batch-major ``(batch, time, features)``; the scan itself runs time-major.

Padding is first-class: given ``lengths``, steps at ``t >= length`` leave the carry
untouched and output zeros, and a reversed layer starts each sequence at its own last
real token, so outputs at real positions do not depend on the padding that follows.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from dense_rnn import cells

Array = jax.Array
Initializer = Callable[..., Array]


def uniform_init(scale: float) -> Initializer:
    """Uniform in ``[-scale, scale]`` (Zaremba et al., Godin et al.)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


def length_mask(lengths: Array, max_len: int) -> Array:
    """``(batch, time)`` boolean mask, true at real (non-padding) positions."""
    return jnp.arange(max_len)[None, :] < lengths[:, None]


def reverse_padded(x: Array, lengths: Array | None) -> Array:
    """Reverses each sequence of ``x`` (batch, time, ...) within its own length.

    Padding positions stay where they are; the map is its own inverse.
    """
    if lengths is None:
        return jnp.flip(x, axis=1)
    t = jnp.arange(x.shape[1])[None, :]
    idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def scan_cell(
    cell: cells.Cell,
    params: cells.Params,
    xw: Array,
    carry: cells.Carry,
    lengths: Array | None = None,
    reverse: bool = False,
    unroll: int = 1,
    recurrent_mask: Array | None = None,
) -> tuple[cells.Carry, Array]:
    """Runs ``cell.step`` over a pre-projected sequence ``xw`` (batch, time, gates).

    Args:
      cell: the cell whose step to scan.
      params: the cell's parameters (``w_hh`` is the one used here).
      xw: input projections of every step, ``cells.project(params, x)``.
      carry: initial carry, batch-major.
      lengths: optional ``(batch,)`` real lengths; steps past them are padding.
      reverse: run from each sequence's last real token back to its first.
      unroll: ``lax.scan`` unroll factor.
      recurrent_mask: optional ``(batch, hidden)`` dropout mask (already scaled) applied
        to ``h_{t-1}`` in the recurrent product, the same at every step (Gal & Ghahramani
        2016). LSTM only: there ``h_{t-1}`` enters the step through that product alone.

    Returns:
      ``(final_carry, outputs)``; outputs are ``(batch, time, hidden)``, zero at padding.
      With ``lengths``, the final carry is the carry after each sequence's last real step.
    """
    if recurrent_mask is not None and cell.name != "lstm":
        raise ValueError("recurrent (variational) dropout is implemented for the LSTM only")
    if reverse:
        xw = reverse_padded(xw, lengths)
    xs = jnp.swapaxes(xw, 0, 1)
    mask = None if lengths is None else jnp.swapaxes(length_mask(lengths, xw.shape[1]), 0, 1)

    def body(carry, inputs):
        xw_t, m_t = inputs
        step_carry = carry
        if recurrent_mask is not None:
            step_carry = (carry[0], carry[1] * recurrent_mask)
        new_carry, y = cell.step(params, step_carry, xw_t)
        if m_t is not None:
            keep = m_t[:, None]
            new_carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_carry, carry)
            y = jnp.where(keep, y, 0.0)
        return new_carry, y

    carry, ys = jax.lax.scan(body, carry, (xs, mask), unroll=unroll)
    ys = jnp.swapaxes(ys, 0, 1)
    if reverse:
        ys = reverse_padded(ys, lengths)
    return carry, ys


class Recurrent(nn.Module):
    """One recurrent layer over a whole sequence.

    Attributes:
      cell: ``"lstm"``, ``"gru"`` or ``"rnn"`` (see ``cells.CELLS``).
      features: hidden size.
      reverse: process each sequence from its last real token to its first.
      unroll: ``lax.scan`` unroll factor.
      kernel_init / bias_init: initializers of ``w_ih``, ``w_hh`` and ``b``.
    """

    cell: str
    features: int
    reverse: bool = False
    unroll: int = 1
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()

    def cell_params(self, input_features: int) -> cells.Params:
        spec = cells.get_cell(self.cell)
        g = spec.gates * self.features
        return {
            "w_ih": self.param("w_ih", self.kernel_init, (input_features, g)),
            "w_hh": self.param("w_hh", self.recurrent_init, (self.features, g)),
            "b": self.param("b", self.bias_init, (g,)),
        }

    def zero_carry(self, batch: int, dtype=jnp.float32) -> cells.Carry:
        return cells.get_cell(self.cell).zero_carry((batch,), self.features, dtype)

    @nn.compact
    def __call__(
        self,
        x: Array,
        carry: cells.Carry | None = None,
        lengths: Array | None = None,
        recurrent_mask: Array | None = None,
    ) -> tuple[cells.Carry, Array]:
        """``x``: (batch, time, in_features) -> ``(final_carry, (batch, time, features))``."""
        params = self.cell_params(x.shape[-1])
        if carry is None:
            carry = self.zero_carry(x.shape[0], x.dtype)
        xw = cells.project(params, x)  # every time step in one matrix product
        return scan_cell(
            cells.get_cell(self.cell), params, xw, carry, lengths, self.reverse, self.unroll,
            recurrent_mask,
        )


class Bidirectional(nn.Module):
    """A forward and a backward ``Recurrent`` layer; outputs concatenated ``[fwd; bwd]``.

    The backward layer starts at each sequence's last real token, so with ``lengths``
    the outputs at real positions are independent of padding.
    """

    cell: str
    features: int
    unroll: int = 1
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(
        self, x: Array, carry=None, lengths: Array | None = None, recurrent_mask=None
    ) -> tuple[tuple[cells.Carry, cells.Carry], Array]:
        kw = dict(
            cell=self.cell, features=self.features, unroll=self.unroll,
            kernel_init=self.kernel_init, recurrent_init=self.recurrent_init,
            bias_init=self.bias_init,
        )
        carry = (None, None) if carry is None else carry
        rmask = (None, None) if recurrent_mask is None else recurrent_mask
        cf, yf = Recurrent(**kw, name="fwd")(x, carry[0], lengths, rmask[0])
        cb, yb = Recurrent(**kw, reverse=True, name="bwd")(x, carry[1], lengths, rmask[1])
        return (cf, cb), jnp.concatenate([yf, yb], axis=-1)
