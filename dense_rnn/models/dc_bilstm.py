"""DC-Bi-LSTM sentence classifier (Ding et al. 2018, Sec. 3.3, eq. 10-13).

embedding -> dropout -> dense Bi-LSTM module (``dl`` layers of ``dh`` units, layer ``l``
reading ``M^{l-1} = [e; h^1; ...; h^{l-1}]``; ``RecurrentStack`` concatenates it newest
first, ``[h^{l-1}; ...; h^1; e]``, the same layer up to a permutation of the rows of its
input weights) -> top Bi-LSTM of ``th`` units reading
``M^{dl}`` -> average pooling over real tokens -> dropout -> softmax layer.
``dl = 0`` (or ``dh = 0``) is the plain Bi-LSTM baseline.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dense_rnn.configs.dc_bilstm import dense_features
from dense_rnn.dropout import Dropout
from dense_rnn.recurrent import check_sizes, check_tokens, clamp_lengths, length_mask
from dense_rnn.stack import RecurrentStack

Array = jax.Array


def masked_mean(h: Array, lengths: Array | None) -> Array:
    """Average pooling ``h* = average(h_1, ..., h_s)`` over each sequence's real tokens.

    ``h``: (batch, time, features); ``lengths``: ``(batch,)`` real lengths, clamped to the
    padded length (None: every row full length). An empty sequence pools to zeros.
    """
    if lengths is None:  # not h.mean: an empty sequence (time 0) pools to zeros, not NaN
        return h.sum(axis=1) / max(h.shape[1], 1)
    lengths = clamp_lengths(lengths, h.shape[1])
    mask = length_mask(lengths, h.shape[1])[..., None].astype(h.dtype)
    return (h * mask).sum(axis=1) / jnp.maximum(lengths, 1)[:, None].astype(h.dtype)


class DCBiLSTM(nn.Module):
    """Densely connected Bi-LSTM classifier; ``__call__(tokens, lengths=None) -> logits``.

    Attributes:
      vocab_size, num_classes, embed_size: sizes (``embed`` is an ``nn.Embed``).
      dl, dh, th: dense layers, their units per direction, top Bi-LSTM units.
      dropout_embed, dropout_pool: dropout on word embeddings and on the pooled vector.

    The pooled sentence vector (before its dropout) is sown as ``intermediates/sentence``:
    ``model.apply(variables, tokens, lengths, mutable=["intermediates"])`` returns it
    beside the logits.
    """

    vocab_size: int
    num_classes: int
    embed_size: int
    dl: int
    dh: int
    th: int
    dropout_embed: float = 0.0
    dropout_pool: float = 0.0

    @nn.compact
    def __call__(
        self, tokens: Array, lengths: Array | None = None, deterministic: bool = True
    ) -> Array:
        """Float32 logits ``(batch, num_classes)`` of padded ``tokens`` (batch, time); ``lengths``:
        ``(batch,)`` real lengths, clamped to the padded length (None: every row full)."""
        if self.dl < 0 or self.dh < 0 or self.th < 1:
            raise ValueError(f"dl={self.dl}, dh={self.dh}, th={self.th}: dl and dh must be "
                             ">= 0 and th >= 1")
        for name in ("dropout_embed", "dropout_pool"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1)")
        check_tokens("DCBiLSTM", tokens, lengths=lengths)
        check_sizes("DCBiLSTM", vocab_size=self.vocab_size, num_classes=self.num_classes,
                    embed_size=self.embed_size)
        e = nn.Embed(self.vocab_size, self.embed_size, name="embed")(tokens)
        e = Dropout(self.dropout_embed)(e, deterministic)
        _, hs = RecurrentStack(
            cell="lstm",
            features=dense_features(self.dl, self.dh, self.th),
            connectivity="dense",
            bidirectional=True,
            name="dense_bilstm",
        )(e, lengths=lengths, deterministic=deterministic)
        sentence = masked_mean(hs[-1], lengths)
        self.sow("intermediates", "sentence", sentence)
        pooled = Dropout(self.dropout_pool)(sentence, deterministic)
        return nn.Dense(self.num_classes, name="softmax")(pooled).astype(jnp.float32)
