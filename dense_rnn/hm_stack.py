"""Hierarchical multiscale stack of dense recurrent layers (Zhao et al. 2019, eq. 4-6).

``depths = (k^(1), ..., k^(L))`` are the dense depths in input time steps (eq. 4: doubling,
``k^(l) = 2^(l-1) k^(1)``). Layer ``l > 1`` updates only when ``t ≡ 0 (mod k^(l-1))``, i.e. at
the block ends of the layer below, reading ``h^{l-1}_t``; at every other step it copies
``h^l_{t-1}`` (eq. 6). Its dense blocks span ``k^(l)`` input steps (eq. 5), i.e.
``k^(l) / k^(l-1)`` of its own updates. The block's first ``k^(l-1) - 1`` steps copy the
state carried from the previous block, and every later copy repeats an update of the block,
so ``x~_t`` at the block's ``n``-th update holds that carried state and the ``n - 1``
updates so far (each distinct state once: ``DenseRecurrent(block_start=True)``).

A first layer of dense depth 2 is the plain cell: both positions read ``h_{t-1}``, and
Sec. 4.1 says "when dense depth is 2, the layer degenerates into a regular RNN". Table 2's
HM-Dense* counts need both (``configs/hm_densernn.py``).

Copies carry no computation, so layer ``l`` is run as a ``DenseRecurrent`` layer over the
strided sequence of the lower layer's block-end states (``ceil(T / k^(l-1))`` steps).

Where a sequence ends inside a block of the layer below, the layers above also update
once at its last token (``update_points``), reading the lower layer's last state: eq. 6
read literally would drop the trailing partial block from every layer above, leave the top
layer at its initial state for sentences shorter than ``k^(L-1)`` tokens, and make the
sentence vector ignore up to ``k^(L-1) - 1`` final words. ``final_update=False`` runs eq. 6
as printed, for comparison: the layers above update at the block ends below them only.

Ablations (Table 3): ``multiscale=False`` updates every layer at every step (dense depth
``k^(l)`` on the full sequence); ``dense=False`` replaces every dense block by the plain
cell (one recurrent weight) while keeping the multiscale update schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from dense_rnn import cells
from dense_rnn.dense_block import DenseRecurrent
from dense_rnn.recurrent import (
    Initializer,
    check_per_layer,
    check_sequence,
    check_sizes,
    clamp_lengths,
    layer_carries,
)

Array = jax.Array


class LayerPlan(NamedTuple):
    """How one layer of the stack runs.

    ``stride``: input steps between the layer's updates (``k^(l-1)``, 1 for the first layer
    or without multiscale); ``subsample``: take every ``subsample``-th output of the layer
    below; ``own_depth``: dense depth in the layer's own steps (1 = plain cell);
    ``block_start``: ``x~`` also holds the state carried into the block (strided layers).
    """

    stride: int
    subsample: int
    own_depth: int
    block_start: bool


def layer_schedule(
    depths: Sequence[int], multiscale: bool = True, dense: bool = True
) -> list[LayerPlan]:
    """Each layer's ``LayerPlan``."""
    out, prev_stride = [], 1
    for i, k in enumerate(depths):
        stride = depths[i - 1] if multiscale and i else 1
        if stride % prev_stride or k % stride:
            raise ValueError(f"dense depths {tuple(depths)} must each divide the next")
        own = k // stride if dense else 1
        if stride == 1 and own == 2:
            own = 1  # "degenerates into a regular RNN" (Sec. 4.1)
        out.append(LayerPlan(stride, stride // prev_stride, own, own > 1 and stride > 1))
        prev_stride = stride
    return out


def update_points(x: Array, lengths: Array | None, sub: int, final_update: bool = True
                  ) -> tuple[Array, Array | None]:
    """The states of ``x (B, T, d)`` at which the layer above updates: every ``sub``-th
    step (the block ends) and, with ``final_update``, where a sequence ends inside a block,
    its last real step. ``lengths``: ``(B,)`` real lengths, clamped to the padded length ``T``.

    Returns ``(x_sub (B, ceil(T / sub), d), lengths_sub = ceil(lengths / sub))``; without
    ``final_update``, the block ends alone: ``(x_sub (B, T // sub, d), lengths // sub)``.
    """
    t = x.shape[1]
    if lengths is not None:
        lengths = clamp_lengths(lengths, t)
    if sub == 1:
        return x, lengths
    if not final_update:
        return x[:, sub - 1::sub], None if lengths is None else lengths // sub
    ends = jnp.arange(-(-t // sub)) * sub + sub - 1
    last = jnp.full((x.shape[0],), t - 1) if lengths is None else jnp.maximum(lengths - 1, 0)
    idx = jnp.minimum(ends[None, :], last[:, None])
    x = jnp.take_along_axis(x, idx[..., None], axis=1)
    return x, None if lengths is None else -(-lengths // sub)


class HMDenseStack(nn.Module):
    """``len(depths)`` dense recurrent layers of ``features`` units, hierarchical multiscale.

    ``__call__(x, carries=None, lengths=None) -> (final_carries, [h_1, ..., h_L])`` where
    ``h_l`` is layer ``l``'s state sequence on its own (strided) time axis.

    Attributes:
      cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
      features: hidden size of every layer.
      depths: the dense depths ``k^(l)`` in input steps, one per layer.
      multiscale / dense: the Table 3 ablations (module docstring).
      final_update: the layers above also update at a sequence's last token (default);
        ``False``: eq. 6 as printed (module docstring).
      kernel_init / recurrent_init / bias_init, param_dtype: every layer's
        (``DenseRecurrent``; None: ``pytorch_uniform(features)``).
    """

    cell: str
    features: int
    depths: Sequence[int]
    multiscale: bool = True
    dense: bool = True
    final_update: bool = True
    kernel_init: Initializer | None = None
    recurrent_init: Initializer | None = None
    bias_init: Initializer | None = None
    param_dtype: DTypeLike = jnp.float32

    def zero_carries(self, batch: int, dtype: DTypeLike | None = None) -> tuple:
        """Every layer's zero carry for ``batch`` sequences, in ``dtype`` (default: the
        parameters')."""
        zero = cells.get_cell(self.cell).zero_carry
        return tuple(zero(batch, self.features, dtype or self.param_dtype) for _ in self.depths)

    @nn.compact
    def __call__(self, x: Array, carries: Sequence | None = None,
                 lengths: Array | None = None) -> tuple[tuple, list[Array]]:
        """Each layer's final carry and its states on its own time axis.

        ``carries``: one initial carry per layer, shaped like ``zero_carries`` (default
        zeros); ``lengths``: optional ``(batch,)`` real lengths, clamped to the padded
        length. A sequence continued from the carries across calls runs as one long call
        when each call's length is a multiple of ``depths[-1]`` (every layer's blocks end
        with the call)."""
        check_sequence("HMDenseStack", x, lengths)
        check_sizes("HMDenseStack", features=self.features)
        check_per_layer("HMDenseStack", "depths", self.depths, "(2, 4, 8)")
        carries = layer_carries("HMDenseStack", carries, len(self.depths))
        outputs, finals = [], []
        plans = layer_schedule(self.depths, self.multiscale, self.dense)
        for i, (plan, carry) in enumerate(zip(plans, carries, strict=True)):
            x, lengths = update_points(x, lengths, plan.subsample, self.final_update)
            carry, x = DenseRecurrent(
                self.cell, self.features, plan.own_depth, plan.block_start,
                kernel_init=self.kernel_init, recurrent_init=self.recurrent_init,
                bias_init=self.bias_init, param_dtype=self.param_dtype, name=f"layer_{i}",
            )(x, carry, lengths)
            finals.append(carry)
            outputs.append(x)
        return tuple(finals), outputs
