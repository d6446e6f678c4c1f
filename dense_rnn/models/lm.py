"""Word-level LSTM language models: stacked (Zaremba et al. 2014) and densely connected
(Godin et al. 2017).

* stacked: ``y_t = softmax(W h_{L,t} + b)`` (Godin eq. 5-7).
* dense:   layer ``l`` reads ``[h_{l-1,t}; ...; h_{1,t}; e_t]`` (eq. 10) and
  ``y_t = softmax(W [h_{L,t}; ...; h_{1,t}; e_t] + b)`` (eq. 11).

Dropout acts on the embedding and on every layer's output (non-recurrent connections);
``variational=True`` draws one mask per sequence (Gal & Ghahramani 2016; Inan et al. 2017).
All weights, biases included, are initialised uniformly in ``[-init_scale, init_scale]``.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from dense_rnn import cells, precision, recurrent, softmax, stack
from dense_rnn.dropout import Dropout

Array = jax.Array


class LanguageModel(nn.Module):
    """An embedding, ``num_layers`` LSTM layers and a softmax over the vocabulary.

    Call ``model.apply(variables, tokens, carries, deterministic=...)`` with ``tokens`` of
    shape (batch, time); returns ``(logits (batch, time, vocab), final_carries)``. With
    ``targets`` (batch, time) it returns the per-token NLL ``(batch, time)`` in place of the
    logits, from the fused softmax cross-entropy (``softmax.softmax_cross_entropy``): the
    way to train. Pass the returned carries to the next window for truncated BPTT;
    ``zero_carries`` starts a stream. ``embedded`` (batch, time, embed_size), the rows of
    the embedding table that ``tokens`` look up, stands in for the lookup (a training step
    that differentiates the loss with respect to those rows: ``lm.make_train_step``'s
    ``sparse_embedding``). With ``lengths`` (batch,), a row's carries stop at its
    last real token (a batch of padded sentences); the NLL at padding positions is computed
    all the same, for the caller to mask. The recurrent layers compute in the parameters'
    dtype (bfloat16 parameters, cast for a step: bfloat16 layers), the carries cast to it
    and returned in the dtype they came in; the logits and NLL are float32.
    """

    vocab_size: int
    embed_size: int
    hidden_size: int
    num_layers: int
    connectivity: str = "stacked"
    dropout_rate: float = 0.0
    variational: bool = False
    init_scale: float = 0.05
    scan_unroll: int = 1

    def zero_carries(self, batch: int, dtype: DTypeLike = jnp.float32) -> tuple:
        """Zero initial carries of every layer for a stream of ``batch`` rows."""
        zero = cells.get_cell("lstm").zero_carry
        return tuple(zero((batch,), self.hidden_size, dtype) for _ in range(self.num_layers))

    @nn.compact
    def __call__(
        self, tokens: Array, carries: tuple | None = None, targets: Array | None = None,
        deterministic: bool = True, lengths: Array | None = None,
        embedded: Array | None = None,
    ) -> tuple[Array, tuple]:
        """``(logits or per-token NLL, final carries)``; see the class docstring."""
        recurrent.check_tokens("LanguageModel", tokens, targets)
        if carries is not None and any(not jnp.issubdtype(jnp.result_type(c), jnp.floating)
                                       for c in jax.tree.leaves(carries)):
            hint = (recurrent.lengths_hint(carries, "the carries")
                    or "; targets go in targets=, after the carries")
            raise ValueError("LanguageModel: carries must be float arrays, one (c, h) pair per "
                             f"layer (zero_carries), got {recurrent.describe(carries)}{hint}")
        recurrent.check_sizes("LanguageModel", vocab_size=self.vocab_size,
                              embed_size=self.embed_size, hidden_size=self.hidden_size)
        if self.num_layers < 1:
            raise ValueError(f"LanguageModel: num_layers={self.num_layers} must be at least 1")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"LanguageModel: dropout_rate={self.dropout_rate} must be in [0, 1)")
        init = recurrent.uniform_init(self.init_scale)
        if embedded is None:
            e = nn.Embed(self.vocab_size, self.embed_size, embedding_init=init,
                         name="embed")(tokens)
        elif embedded.shape != (*tokens.shape, self.embed_size):
            raise ValueError(f"LanguageModel: embedded must be (batch, time, embed_size) = "
                             f"{(*tokens.shape, self.embed_size)}, the rows tokens look up; "
                             f"got {embedded.shape}")
        else:
            e = embedded
        broadcast = (1,) if self.variational else ()
        e = Dropout(self.dropout_rate, broadcast_dims=broadcast)(e, deterministic)
        zero = self.zero_carries(tokens.shape[0], e.dtype)
        if carries is None:
            carries = zero
        elif [jnp.shape(c) for c in jax.tree.leaves(carries)] != [
                c.shape for c in jax.tree.leaves(zero)]:
            raise ValueError(f"LanguageModel: carries must be shaped like zero_carries("
                             f"{tokens.shape[0]}), {jax.tree.map(jnp.shape, zero)}; got "
                             f"{jax.tree.map(jnp.shape, carries)}")
        given = [c.dtype for c in jax.tree.leaves(carries)]
        carries, features = stack.RecurrentStack(
            cell="lstm",
            features=(self.hidden_size,) * self.num_layers,
            connectivity=self.connectivity,
            dropout_rate=self.dropout_rate,
            variational=self.variational,
            unroll=self.scan_unroll,
            kernel_init=init,
            recurrent_init=init,
            bias_init=init,
            name="rnn",
        )(e, precision.cast_floating(carries, e.dtype), lengths, deterministic)
        carries = jax.tree.unflatten(jax.tree.structure(carries), [
            c.astype(d) for c, d in zip(jax.tree.leaves(carries), given, strict=True)])
        top = stack.dense_input(features) if self.connectivity == "dense" else features[-1]
        out = softmax.SoftmaxOutput(self.vocab_size, kernel_init=init, bias_init=init,
                                    name="softmax")(top, targets)
        return out, carries
