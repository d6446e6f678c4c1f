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

from dense_rnn import cells
from dense_rnn.dense_block import pytorch_uniform
from dense_rnn.recurrent import check_sequence, check_sizes, scan_cell

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
    """One Gated HORNN layer; ``__call__(x, lengths) -> (final_carry, (batch, time, H))``."""

    features: int
    order: int = 2

    @nn.compact
    def __call__(self, x: Array, lengths: Array | None = None) -> tuple[cells.Carry, Array]:
        """The final carry and every step's state ``(batch, time, features)``."""
        check_sequence("GatedHORNN", x, lengths)
        check_sizes("GatedHORNN", features=self.features)
        if self.order < 1:
            raise ValueError(f"GatedHORNN: order={self.order}; it must be at least 1")
        cell = hornn_cell(self.order)
        h, init = self.features, pytorch_uniform(self.features)
        params = {
            "w_ih": self.param("w_ih", init, (x.shape[-1], (self.order + 1) * h)),
            "b": self.param("b", init, ((self.order + 1) * h,)),
            "w_gate": self.param("w_gate", init, (self.order, h, h)),
            "w_hh": self.param("w_hh", init, (self.order * h, h)),
        }
        xw = cells.project(params, x)
        return scan_cell(cell, params, xw, cell.zero_carry((x.shape[0],), h, xw.dtype), lengths)
