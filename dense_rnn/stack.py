"""A stack of recurrent layers, stacked or densely connected.

One module covers both wirings (Godin et al. 2017, eq. 6 and eq. 10; Ding et al. 2018,
eq. 10):

* ``stacked``: layer ``l`` reads ``h_{l-1}`` (``h_0`` is the input ``e``).
* ``dense``:   layer ``l`` reads ``[h_{l-1}; ...; h_1; e]``.

Because every layer's whole input sequence exists before the layer runs, its input
projection over the concatenated history is a single matrix product outside the scan.

Dropout is applied once to each layer's output ``h_l`` (Zaremba et al.: non-recurrent
connections only), and the dropped ``h_l`` feeds every consumer. ``variational=True`` uses
one mask per sequence, shared over time, for the outputs and (LSTM) for ``h_{t-1}`` in the
recurrent product (Gal & Ghahramani 2016).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from dense_rnn import cells, recurrent
from dense_rnn.dropout import Dropout, bernoulli

Array = jax.Array
CONNECTIVITIES = ("stacked", "dense")


def dense_input(features: Sequence[Array]) -> Array:
    """Godin eq. 10 / 11: ``[h_{l-1}; ...; h_1; e]`` from ``features = [e, h_1, ..., h_{l-1}]``."""
    return jnp.concatenate(features[::-1], axis=-1) if len(features) > 1 else features[0]


class RecurrentStack(nn.Module):
    """``len(features)`` recurrent layers over ``(batch, time, d)`` inputs.

    Attributes:
      cell: cell name for every layer.
      features: hidden size of each layer.
      connectivity: ``"stacked"`` or ``"dense"``.
      bidirectional: each layer is a ``Bidirectional`` pair (outputs ``2 * features``).
      dropout_rate: dropout on each layer's output.
      variational: per-sequence dropout masks (and recurrent masks for LSTMs).
      unroll: ``lax.scan`` unroll factor.
      kernel_init / recurrent_init / bias_init: initializers of every layer's ``w_ih``,
        ``w_hh`` and ``b``.
      param_dtype: the parameters' dtype.
    """

    cell: str
    features: Sequence[int]
    connectivity: str = "stacked"
    bidirectional: bool = False
    dropout_rate: float = 0.0
    variational: bool = False
    unroll: int = 1
    kernel_init: recurrent.Initializer = nn.initializers.lecun_normal()
    recurrent_init: recurrent.Initializer = nn.initializers.orthogonal()
    bias_init: recurrent.Initializer = nn.initializers.zeros_init()
    param_dtype: DTypeLike = jnp.float32

    def zero_carries(self, batch: int, dtype: DTypeLike | None = None) -> tuple:
        """Zero initial carries of every layer (a forward, backward pair each if
        ``bidirectional``), in ``dtype`` (default: the parameters')."""
        zero, dtype = cells.get_cell(self.cell).zero_carry, dtype or self.param_dtype
        return tuple((zero((batch,), n, dtype),) * 2 if self.bidirectional
                     else zero((batch,), n, dtype) for n in self.features)

    def dropout(self, x: Array, deterministic: bool) -> Array:
        """Dropout on a layer's output ``x``; one mask per sequence if ``variational``."""
        broadcast = (1,) if self.variational else ()
        return Dropout(self.dropout_rate, broadcast_dims=broadcast)(x, deterministic)

    def recurrent_masks(
        self, batch: int, n: int, deterministic: bool
    ) -> Array | tuple[Array, Array] | None:
        """A layer's scaled recurrent dropout mask (batch, n), one per direction, or ``None``."""
        if not (self.variational and self.cell == "lstm") or deterministic or not self.dropout_rate:
            return None
        keep = 1.0 - self.dropout_rate
        shape = (2, batch, n) if self.bidirectional else (batch, n)
        m = bernoulli(self.make_rng("dropout"), keep, shape) / keep
        return (m[0], m[1]) if self.bidirectional else m

    @nn.compact
    def __call__(
        self,
        x: Array,
        carries: Sequence | None = None,
        lengths: Array | None = None,
        deterministic: bool = True,
    ) -> tuple[tuple, list[Array]]:
        """Returns ``(final_carries, [x, h_1, ..., h_L])`` with each ``h_l`` after dropout.

        ``carries``: one initial carry per layer (default zeros); ``lengths``: optional
        ``(batch,)`` real lengths, clamped to the padded length.
        """
        recurrent.check_per_layer("RecurrentStack", "features", self.features, "(200, 200)")
        recurrent.check_sequence("RecurrentStack", x, lengths)
        if not 0 <= self.dropout_rate < 1:
            raise ValueError(f"RecurrentStack: dropout_rate={self.dropout_rate} must be in "
                             "[0, 1)")
        if self.connectivity not in CONNECTIVITIES:
            raise ValueError(
                f"unknown connectivity {self.connectivity!r}; use one of {CONNECTIVITIES}"
            )
        layer_cls = recurrent.Bidirectional if self.bidirectional else recurrent.Recurrent
        carries = recurrent.layer_carries("RecurrentStack", carries, len(self.features))
        outputs, new_carries = [x], []
        for i, (n, carry) in enumerate(zip(self.features, carries, strict=True)):
            inp = dense_input(outputs) if self.connectivity == "dense" else outputs[-1]
            layer = layer_cls(
                cell=self.cell, features=n, unroll=self.unroll, kernel_init=self.kernel_init,
                recurrent_init=self.recurrent_init, bias_init=self.bias_init,
                param_dtype=self.param_dtype, name=f"layer_{i}",
            )
            rmask = self.recurrent_masks(x.shape[0], n, deterministic)
            carry, h = layer(inp, carry, lengths, rmask)
            new_carries.append(carry)
            outputs.append(self.dropout(h, deterministic))
        return tuple(new_carries), outputs
