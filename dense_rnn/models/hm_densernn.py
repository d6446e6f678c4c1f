"""Text classifiers of Zhao et al. 2019 (Table 2 and 3): one model, three recurrent nets.

embedding (300-d) -> recurrent net -> final hidden state of the top layer -> softmax.
The paper gives no pooling or dropout, so none is used: the last state of the top layer
(every layer updates at each sequence's last real token) feeds the softmax layer.

``net``:
* ``"stacked"``: ``layers`` plain ``cell`` layers (``RecurrentStack``): RNN, GRU, LSTM and
  their 3-layer stacks.
* ``"hornn"``: ``layers`` Gated HORNN layers (Soltani & Jiang 2016), order ``hornn_order``.
* ``"hm"``: ``HMDenseStack`` with dense depths ``depths`` (one entry: DenseRNN/GRU/LSTM;
  three: HM-DenseRNN/GRU/LSTM), ``multiscale`` and ``dense`` switch the Table 3 ablations.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from dense_rnn import cells
from dense_rnn.dense_block import pytorch_uniform
from dense_rnn.hm_stack import HMDenseStack
from dense_rnn.hornn import GatedHORNN
from dense_rnn.recurrent import check_per_layer, check_sizes, check_tokens
from dense_rnn.stack import RecurrentStack

Array = jax.Array
NETS = ("stacked", "hornn", "hm")
# The attributes each net does not read.
UNUSED = {"stacked": ("depths", "multiscale", "dense", "final_update", "hornn_order"),
          "hornn": ("cell", "depths", "multiscale", "dense", "final_update"),
          "hm": ("layers", "hornn_order")}


class HMTextClassifier(nn.Module):
    """Zhao et al.'s classifier; ``__call__(tokens[B, T], lengths[B] = None) -> logits[B, C]``.

    A paper row's model is ``HMTextClassifier(vocab_size=V, num_classes=C, embed_size=300,
    **configs.hm_densernn.CONFIGS[name].model_args)``, e.g. ``name = "hm_densegru_64"``.

    Attributes:
      vocab_size, num_classes, embed_size: sizes (``embed`` is an ``nn.Embed``).
      net: ``"stacked"``, ``"hornn"`` or ``"hm"`` (``NETS``; see the module docstring).
      features: hidden units of every recurrent layer (all nets).
      cell: ``"rnn"``, ``"gru"`` or ``"lstm"``; ``stacked`` and ``hm`` only.
      layers: number of layers; ``stacked`` and ``hornn`` only (``hm`` has ``len(depths)``).
      depths: dense depths ``k^(l)`` of the layers, each dividing the next; ``hm`` only.
      multiscale, dense: ``hm`` only; ``False`` gives the Table 3 ablations.
      final_update: ``hm`` only; ``False``: eq. 6 as printed, no update of the layers above
        at a sentence's last token (``dense_rnn.hm_stack``).
      hornn_order: order of the Gated HORNN; ``hornn`` only.

    An attribute that does not apply to ``net``, set away from its default, is an error.
    The sentence vector the softmax layer reads (the top layer's final state) is sown as
    ``intermediates/sentence``: ``model.apply(variables, tokens, lengths,
    mutable=["intermediates"])`` returns it beside the logits.
    """

    vocab_size: int
    num_classes: int
    embed_size: int
    net: str
    features: int
    cell: str = "gru"
    layers: int = 1
    depths: Sequence[int] = (4,)
    multiscale: bool = True
    dense: bool = True
    final_update: bool = True
    hornn_order: int = 2

    def _recurrent_net(self, x: Array, lengths: Array | None) -> Array:
        """Final hidden state of the top recurrent layer, ``(batch, features)``."""
        if self.net == "stacked":
            init = pytorch_uniform(self.features)
            carries, _ = RecurrentStack(
                cell=self.cell, features=(self.features,) * self.layers, kernel_init=init,
                recurrent_init=init, bias_init=init, name="rnn",
            )(x, lengths=lengths)
            return cells.carry_output(carries[-1])
        if self.net == "hornn":
            for i in range(self.layers):
                carry, x = GatedHORNN(self.features, self.hornn_order, name=f"hornn_{i}")(
                    x, lengths=lengths)
            return cells.carry_output(carry)
        if self.net == "hm":
            carries, _ = HMDenseStack(
                self.cell, self.features, tuple(self.depths), self.multiscale, self.dense,
                self.final_update, name="hm",
            )(x, lengths=lengths)
            return cells.carry_output(carries[-1])
        raise ValueError(f"unknown net {self.net!r}; use one of {NETS}")

    @nn.compact
    def __call__(
        self, tokens: Array, lengths: Array | None = None, deterministic: bool = True
    ) -> Array:
        """Float32 logits ``(batch, num_classes)`` of padded ``tokens`` (batch, time); ``lengths``:
        ``(batch,)`` real lengths, clamped to the padded length (None: every row full).
        ``deterministic`` is unused (these models have no dropout): it is accepted so the
        trainer calls every classifier alike."""
        check_sizes("HMTextClassifier", features=self.features, layers=self.layers)
        check_per_layer("HMTextClassifier", "depths", self.depths, "(2, 4, 8)")
        fields = type(self).__dataclass_fields__
        unused = [f"{k}={getattr(self, k)!r}" for k in UNUSED.get(self.net, ())
                  if getattr(self, k) != fields[k].default]
        if unused:
            raise ValueError(f"HMTextClassifier: {', '.join(unused)} does not apply to "
                             f"net={self.net!r}; leave it out")
        check_tokens("HMTextClassifier", tokens, lengths=lengths)
        check_sizes("HMTextClassifier", vocab_size=self.vocab_size,
                    num_classes=self.num_classes, embed_size=self.embed_size)
        e = nn.Embed(self.vocab_size, self.embed_size, name="embed")(tokens)
        sentence = self._recurrent_net(e, lengths)
        self.sow("intermediates", "sentence", sentence)
        return nn.Dense(self.num_classes, name="softmax")(sentence).astype(jnp.float32)
