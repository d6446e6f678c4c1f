"""Gated higher-order RNN (Soltani & Jiang 2016), the Gated HORNN baseline of Zhao et al.

Order ``N`` (default 2): the unit reads the ``N`` preceding states, each through its own
sigmoid gate computed from the input and that state::

    r^n_t = sigmoid(W_n x_t + G_n h_{t-n} + b_n)                      n = 1..N
    h_t   = tanh(W x_t + sum_n U_n (r^n_t . h_{t-n}) + b)

Parameters: ``w_ih`` (d, (N+1)H) = ``[W_1 .. W_N, W]``, ``b`` ((N+1)H), ``w_gate`` (N, H, H) =
``G_n``, ``w_hh`` (N*H, H) = ``[U_1; ..; U_N]``. For N = 2: ``3dH + 4H^2 + 3H`` weights, which
reproduces Table 2's 74k / 181k (H = 64 / 128, d = 300). The carry is the tuple
``(h_{t-N}, ..., h_{t-1})`` (latest last, so ``cells.carry_output`` finds ``h_{t-1}``).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from dense_rnn import cells
from dense_rnn.dense_block import pytorch_uniform
from dense_rnn.recurrent import (
    Initializer,
    check_sequence,
    check_sizes,
    initial_carry,
    layer_param,
    scan_cell,
)

Array = jax.Array


def hornn_step(params: cells.Params, carry: tuple[Array, ...],
               xw: Array) -> tuple[tuple[Array, ...], Array]:
    """One Gated HORNN step; ``xw = x_t @ w_ih + b``, ``carry = (h_{t-N}, ..., h_{t-1})``."""
    order = len(carry)
    past = carry[::-1]  # h_{t-1}, ..., h_{t-N}
    xs = jnp.split(xw, order + 1, axis=-1)
    gated = [
        jax.nn.sigmoid(xs[n] + cells.recurrent_product(past[n], params["w_gate"][n])) * past[n]
        for n in range(order)
    ]
    h = jnp.tanh(xs[order] + cells.recurrent_product(jnp.concatenate(gated, axis=-1),
                                                       params["w_hh"]))
    return (*carry[1:], h), h


def hornn_cell(order: int) -> cells.Cell:
    """The Gated HORNN of ``order`` as a ``cells.Cell`` (scannable by ``scan_cell``)."""
    return cells.Cell(
        "hornn", order + 1, hornn_step,
        lambda b, n, d: tuple(jnp.zeros((*b, n), d) for _ in range(order)),
    )


class GatedHORNN(nn.Module):
    """One Gated HORNN layer.

    Attributes:
      features: hidden size.
      order: ``N``, how many preceding states the unit reads.
      kernel_init / recurrent_init / bias_init: initializers of ``w_ih``, of ``w_gate`` and
        ``w_hh``, and of ``b`` (None: ``pytorch_uniform(features)``, as Zhao et al.'s
        framework).
      param_dtype: the parameters' dtype.
      unroll: ``lax.scan`` unroll factor.
    """

    features: int
    order: int = 2
    kernel_init: Initializer | None = None
    recurrent_init: Initializer | None = None
    bias_init: Initializer | None = None
    param_dtype: DTypeLike = jnp.float32
    unroll: int = 1

    def zero_carry(self, batch: int, dtype: DTypeLike | None = None) -> tuple[Array, ...]:
        """The zero carry ``(h_{t-N}, ..., h_{t-1})`` of ``batch`` sequences, in ``dtype``
        (default: the parameters')."""
        return hornn_cell(self.order).zero_carry(batch, self.features, dtype or self.param_dtype)

    @nn.compact
    def __call__(self, x: Array, carry: tuple[Array, ...] | None = None,
                 lengths: Array | None = None) -> tuple[tuple[Array, ...], Array]:
        """``x``: (batch, time, in_features) -> ``(final_carry, (batch, time, features))``;
        ``carry``: the ``N`` states before the first step, shaped like ``zero_carry``
        (default zeros); ``lengths``: optional ``(batch,)`` real lengths, clamped to the
        padded length."""
        check_sequence("GatedHORNN", x, lengths)
        check_sizes("GatedHORNN", features=self.features)
        if self.order < 1:
            raise ValueError(f"GatedHORNN: order={self.order}; it must be at least 1")
        cell = hornn_cell(self.order)
        h, default = self.features, pytorch_uniform(self.features)
        kernel, rec = self.kernel_init or default, self.recurrent_init or default
        params = {
            "w_ih": layer_param(self, "w_ih", kernel, (x.shape[-1], (self.order + 1) * h)),
            "b": layer_param(self, "b", self.bias_init or default, ((self.order + 1) * h,)),
            "w_gate": layer_param(self, "w_gate", rec, (self.order, h, h)),
            "w_hh": layer_param(self, "w_hh", rec, (self.order * h, h)),
        }
        xw = cells.project(params, x)
        carry = initial_carry("GatedHORNN", cell, carry, x.shape[0], h, xw.dtype)
        return scan_cell(cell, params, xw, carry, lengths, unroll=self.unroll)
