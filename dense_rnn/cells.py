"""Recurrent cells as pure functions on explicit parameter pytrees.

Every cell is split in two so that scans can hoist the input projection:

* ``project(params, x)``: the input part ``x @ w_ih + b`` of every gate. It has no
  time dependence, so recurrent layers compute it for all time steps in one matrix
  product before the scan.
* ``step(params, carry, xw) -> (carry, h)``: the recurrent part, run once per step.

A ``Cell`` called as ``cell(params, carry, x) = step(params, carry, project(params, x))``
is the full paper equation; tests check it against float64 NumPy references.

Parameters of a cell with input size ``d``, hidden size ``n`` and ``g`` gates:
``{"w_ih": (d, g*n), "w_hh": (n, g*n), "b": (g*n,)}``: one bias per gate.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike

from dense_rnn import precision

Array = jax.Array
Params = dict[str, Array]
Carry = Any


def project(params: Params, x: Array, bias: bool = True) -> Array:
    """Input projection of every gate, ``x @ w_ih + b``, for any leading shape, in the
    dtype of ``x`` and ``w_ih`` promoted (an integer ``x`` in ``w_ih``'s), as ``nn.Dense``;
    without ``bias``, ``x @ w_ih`` (a scan that adds ``b`` itself, ``recurrent.scan_cell``)."""
    w = params["w_ih"]
    dtype = jnp.promote_types(x.dtype, w.dtype)
    xw = precision.linear(x.astype(dtype), w.astype(dtype))
    return xw + lax.broadcast_to_rank(params["b"], xw.ndim) if bias else xw


def recurrent_product(h: Array, w_hh: Array) -> Array:
    """``h @ w_hh``, accumulated in at least float32 and returned in ``h``'s dtype."""
    return precision.matmul(h, w_hh, use_blas=False).astype(h.dtype)


def lstm_gates(z: Array) -> Array:
    """``[sigmoid(i); sigmoid(f); tanh(g); sigmoid(o)]`` of the LSTM pre-activations ``z``
    (..., 4H), as one elementwise pass over all four gates with one ``tanh``:
    ``sigmoid(x) = 0.5 tanh(0.5 x) + 0.5``."""
    col = lax.broadcast_to_rank(jnp.arange(z.shape[-1]), z.ndim)
    n = z.shape[-1] // 4
    s = jnp.where((col >= 2 * n) & (col < 3 * n), 1.0, 0.5).astype(z.dtype)
    return s * jnp.tanh(s * z) + (1 - s)


def lstm_step(
    params: Params, carry: tuple[Array, Array], xw: Array
) -> tuple[tuple[Array, Array], Array]:
    """LSTM (Zaremba et al. 2014, eq. in Sec. 3.1; Godin et al. 2017 eq. 4).

    Gate order ``i, f, g, o``::

        i, f, o = sigmoid(.), g = tanh(.)      (. = W x_t + U h_{t-1} + b)
        c_t = f * c_{t-1} + i * g
        h_t = o * tanh(c_t)
    """
    c, h = carry
    c, _, h = lstm_update(lstm_gates(xw + recurrent_product(h, params["w_hh"])), c)
    return (c, h), h


def lstm_update(acts: Array, c: Array) -> tuple[Array, Array, Array]:
    """The LSTM's state update from its gate activations ``acts = [i; f; g; o]`` (..., 4H)::

        c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

    Returns ``(c_t, tanh(c_t), h_t)``; the scan's backward pass reuses ``tanh(c_t)``."""
    i, f, g, o = jnp.split(acts, 4, axis=-1)
    c = f * c + i * g
    tc = jnp.tanh(c)
    return c, tc, o * tc


def gru_step(params: Params, carry: Array, xw: Array) -> tuple[Array, Array]:
    """GRU (Cho et al. 2014), the form used by Zhao et al.'s DenseGRU. Gate order ``r, z, n``::

        r = sigmoid(W_r x + U_r h + b_r),  z = sigmoid(W_z x + U_z h + b_z)
        n = tanh(W_n x + U_n (r * h) + b_n)
        h_t = (1 - z) * h_{t-1} + z * n
    """
    h = carry
    n_hidden = h.shape[-1]
    w_rz, w_n = params["w_hh"][:, : 2 * n_hidden], params["w_hh"][:, 2 * n_hidden :]
    x_rz, x_n = xw[..., : 2 * n_hidden], xw[..., 2 * n_hidden :]
    r, z = jnp.split(jax.nn.sigmoid(x_rz + recurrent_product(h, w_rz)), 2, axis=-1)
    n = jnp.tanh(x_n + recurrent_product(r * h, w_n))
    h = (1.0 - z) * h + z * n
    return h, h


def rnn_step(params: Params, carry: Array, xw: Array) -> tuple[Array, Array]:
    """Vanilla (Elman) RNN: ``h_t = tanh(W x_t + U h_{t-1} + b)``."""
    h = jnp.tanh(xw + recurrent_product(carry, params["w_hh"]))
    return h, h


class Cell(NamedTuple):
    """A recurrent cell: its gate count, its step and how to build a zero carry."""

    name: str
    gates: int
    step: Callable[[Params, Carry, Array], tuple[Carry, Array]]
    zeros: Callable[[tuple[int, ...], int, Any], Carry]  # (batch_shape, features, dtype)

    def __call__(self, params: Params, carry: Carry, x: Array) -> tuple[Carry, Array]:
        """The full cell equation on a raw input: ``step(params, carry, project(params, x))``."""
        return self.step(params, carry, project(params, x))

    def zero_carry(self, batch: int | tuple[int, ...], features: int,
                   dtype: DTypeLike = jnp.float32) -> Carry:
        """The zero carry of ``batch`` rows (an integer, or a tuple of batch axes) of
        ``features`` units."""
        try:
            shape = (operator.index(batch),)
        except TypeError:
            shape = tuple(batch)
        return self.zeros(shape, features, dtype)


def _zeros(batch_shape: tuple[int, ...], n: int, dtype: DTypeLike) -> Array:
    return jnp.zeros((*batch_shape, n), dtype)


CELLS: dict[str, Cell] = {
    "lstm": Cell("lstm", 4, lstm_step, lambda b, n, d: (_zeros(b, n, d), _zeros(b, n, d))),
    "gru": Cell("gru", 3, gru_step, _zeros),
    "rnn": Cell("rnn", 1, rnn_step, _zeros),
}


def get_cell(name: str) -> Cell:
    """The cell named ``name`` in ``CELLS``; an unknown name raises ``ValueError``."""
    if name not in CELLS:
        raise ValueError(f"unknown cell {name!r}; known cells: {', '.join(CELLS)}")
    return CELLS[name]


def carry_output(carry: Carry) -> Array:
    """The hidden state ``h`` inside a carry: a tuple carry holds it last (the LSTM's
    ``(c, h)``, the Gated HORNN's ``(h_{t-N}, ..., h_{t-1})``)."""
    return carry[-1] if isinstance(carry, tuple) else carry
