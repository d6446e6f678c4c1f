"""The implementations ours is timed against.

* ``FlaxLSTMLM``: the PTB LMs built from Flax's own ``nn.RNN(nn.OptimizedLSTMCell)``, ``nn.Dense``
  and ``optax.softmax_cross_entropy_with_integer_labels``.
* ``torch_lm``: the same LMs from PyTorch's ``nn.LSTM`` (cuDNN's LSTM on a GPU).
* ``FlaxLSTMLM(..., lstm=rnn.lstm)``: the same LMs on ``jax.experimental.rnn.lstm``, JAX's
  cuDNN LSTM (GPU only); ``CudnnLSTMStack``: a stack of LSTM layers alone, in one such call.
* ``FlaxDCBiLSTM`` (``flax_dc_bilstm_port``) / ``torch_dc_bilstm``: the DC-Bi-LSTM from
  ``nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell))`` layers / from PyTorch's bidirectional
  ``nn.LSTM`` over packed sequences.
* ``dc_bilstm_port`` / ``hm_port``: straightforward ``lax.scan`` ports of the DC-Bi-LSTM and
  HM-DenseRNN equations on our parameter trees: the input projection is done per step
  inside the scan, and the HM upper layers run at the input rate, copying their state at
  the steps they do not update (Zhao et al. eq. 6), or (``strided``) only over their update
  points. ``Port.apply`` has the signature of ``nn.Module.apply``, so the library's own
  training step drives them unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.experimental import rnn

from dense_rnn import cells
from dense_rnn.hm_stack import layer_schedule, update_points
from dense_rnn.models.dc_bilstm import masked_mean
from dense_rnn.precision import cast_floating
from dense_rnn.recurrent import length_mask, reverse_padded, uniform_init

Array = jax.Array


class FlaxLSTMLM(nn.Module):
    """``dense_rnn.models.lm.LanguageModel`` rebuilt from stock parts, with ``nn.Dense``
    logits and, given ``targets``, optax's cross-entropy: what a Flax user writes.

    ``lstm=None`` runs each layer as ``nn.RNN(nn.OptimizedLSTMCell)``. Otherwise ``lstm``
    has the signature of ``jax.experimental.rnn.lstm``, JAX's cuDNN LSTM (it has a GPU
    lowering only; the tests pass ``lstm_reference``), called as ``cudnn_calls`` says, each
    call's weights one flat cuDNN vector (``b_ih`` and ``b_hh``: 4H more parameters per
    layer than ours)."""

    vocab_size: int
    embed_size: int
    hidden_size: int
    num_layers: int
    connectivity: str = "stacked"
    dropout_rate: float = 0.0
    init_scale: float = 0.05
    lstm: Callable | None = None

    @nn.compact
    def __call__(self, tokens: Array, carries: tuple, targets: Array | None = None, *,
                 deterministic: bool = True):
        init, dense = uniform_init(self.init_scale), self.connectivity == "dense"
        drop = nn.Dropout(self.dropout_rate)
        e = nn.Embed(self.vocab_size, self.embed_size, embedding_init=init)(tokens)
        features, new_carries = [drop(e, deterministic)], []
        # the carries in the compute dtype (the parameters' once cast, as ``LanguageModel``
        # casts them): float32 carries would promote every product of the stack to float32
        given, carries = carries, cast_floating(carries, e.dtype)
        lengths = jnp.full(tokens.shape[:1], tokens.shape[1], jnp.int32)
        calls = cudnn_calls(self.num_layers, dense or self.lstm is None, self.dropout_rate)
        for n, layers in enumerate(calls):
            inp = jnp.concatenate(features[::-1], -1) if dense else features[-1]
            if self.lstm is None:
                cell = nn.OptimizedLSTMCell(self.hidden_size, kernel_init=init,
                                            recurrent_kernel_init=init, bias_init=init)
                carry, y = nn.RNN(cell, return_carry=True)(inp, initial_carry=carries[n])
                new_carries.append(carry)
            else:
                args = (inp.shape[-1], self.hidden_size, len(layers))
                w = self.param(f"lstm_{n}", init, (rnn.get_num_params_in_lstm(*args, False),))
                c0, h0 = (jnp.stack([carries[i][k] for i in layers]) for k in (0, 1))
                y, h, c = self.lstm(inp, h0, c0, w, lengths, *args, 0.0, False)  # Flax's dropout
                new_carries += [(c[k], h[k]) for k in range(len(layers))]
            features.append(drop(y, deterministic))
        top = jnp.concatenate(features[::-1], -1) if dense else features[-1]
        logits = nn.Dense(self.vocab_size, kernel_init=init, bias_init=init)(top)
        if targets is not None:  # the stock loss, differentiated by JAX
            logits = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), targets)
        return logits, jax.tree.map(lambda n, g: n.astype(g.dtype), tuple(new_carries), given)


class CudnnLSTMStack(nn.Module):
    """``num_layers`` LSTM layers over ``(batch, time, d)`` inputs in one ``lstm`` call
    (signature of ``jax.experimental.rnn.lstm``, JAX's cuDNN LSTM), from zero carries and
    without dropout; returns the top layer's outputs. The stack workloads' GPU peer."""

    hidden_size: int
    num_layers: int
    init_scale: float = 0.05
    lstm: Callable = rnn.lstm

    @nn.compact
    def __call__(self, x: Array) -> Array:
        args = (x.shape[-1], self.hidden_size, self.num_layers)
        w = self.param("lstm", uniform_init(self.init_scale),
                       (rnn.get_num_params_in_lstm(*args, False),))
        zeros = jnp.zeros((self.num_layers, x.shape[0], self.hidden_size), x.dtype)
        lengths = jnp.full(x.shape[:1], x.shape[1], jnp.int32)
        return self.lstm(x, zeros, zeros, w, lengths, *args, 0.0, False)[0]


def cudnn_calls(num_layers: int, per_layer: bool, dropout_rate: float) -> list[list[int]]:
    """The layers of each ``rnn.lstm`` call: one multi-layer call for a stacked LM without
    dropout, else one call per layer with Flax's dropout between them (JAX's cuDNN call
    failed with CUDNN_STATUS_BAD_PARAM given dropout, run Q: H200, JAX 0.11.2)."""
    if per_layer or dropout_rate > 0:
        return [[i] for i in range(num_layers)]
    return [list(range(num_layers))]


def lstm_reference(x, h_0, c_0, weights, seq_lengths, input_size, hidden_size, num_layers,
                   dropout, bidirectional):
    """``rnn.lstm`` through JAX's own reference of cuDNN's LSTM (``rnn.lstm_ref``): runs on
    any backend, without dropout."""
    unpacked = rnn.unpack_lstm_weights(weights, input_size, hidden_size, num_layers,
                                       bidirectional)
    return rnn.lstm_ref(x, h_0, c_0, *unpacked, seq_lengths, input_size, hidden_size,
                        num_layers, dropout, bidirectional)


def torch_lm(vocab_size: int, embed_size: int, hidden_size: int, num_layers: int,
             connectivity: str, dropout_rate: float):
    """The same LM in PyTorch: one multi-layer ``nn.LSTM`` (stacked) or one per layer (dense)."""
    import torch

    class TorchLSTMLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab_size, embed_size)
            self.drop = torch.nn.Dropout(dropout_rate)
            dense = connectivity == "dense"
            if dense:
                sizes = [embed_size + i * hidden_size for i in range(num_layers)]
                self.lstms = torch.nn.ModuleList(
                    torch.nn.LSTM(d, hidden_size, batch_first=True) for d in sizes)
                top = embed_size + num_layers * hidden_size
            else:
                self.lstms = torch.nn.ModuleList([torch.nn.LSTM(
                    embed_size, hidden_size, num_layers, batch_first=True,
                    dropout=dropout_rate)])
                top = hidden_size
            self.dense = dense
            self.softmax = torch.nn.Linear(top, vocab_size)

        def forward(self, tokens, carries):
            features, new = [self.drop(self.embed(tokens))], []
            for lstm, carry in zip(self.lstms, carries, strict=True):
                inp = torch.cat(features[::-1], -1) if self.dense else features[-1]
                h, carry = lstm(inp, carry)
                new.append(carry)
                features.append(self.drop(h))
            top = torch.cat(features[::-1], -1) if self.dense else features[-1]
            return self.softmax(top), new

    return TorchLSTMLM()


@dataclasses.dataclass(frozen=True)
class Port:
    """A pure ``forward(params, tokens, lengths, dropout_key | None) -> logits`` dressed as
    a Flax module for the library's training step."""

    forward: Callable[[Any, Array, Array, Array | None], Array]

    def apply(self, variables, tokens, lengths, deterministic: bool = True, rngs=None):
        key = None if deterministic else rngs["dropout"]
        return self.forward(variables["params"], tokens, lengths, key)


def dropout(x: Array, rate: float, key: Array | None) -> Array:
    if key is None or not rate:
        return x
    return jnp.where(jax.random.bernoulli(key, 1.0 - rate, x.shape), x / (1.0 - rate), 0.0)


def naive_lstm(p: dict, x: Array, lengths: Array, reverse: bool) -> Array:
    """An LSTM layer as one ``lax.scan`` computing ``x_t W + h_{t-1} U + b`` every step."""
    batch, time, _ = x.shape
    n = p["w_hh"].shape[0]
    if reverse:
        x = reverse_padded(x, lengths)

    def body(carry, inputs):
        x_t, m_t = inputs
        c, h = carry
        i, f, g, o = jnp.split(x_t @ p["w_ih"] + h @ p["w_hh"] + p["b"], 4, axis=-1)
        c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        keep = m_t[:, None]
        c_new, h_new = jnp.where(keep, c_new, c), jnp.where(keep, h_new, h)
        return (c_new, h_new), jnp.where(keep, h_new, 0.0)

    zeros = jnp.zeros((batch, n), x.dtype)
    mask = length_mask(lengths, time).T
    _, ys = jax.lax.scan(body, (zeros, zeros), (jnp.swapaxes(x, 0, 1), mask))
    ys = jnp.swapaxes(ys, 0, 1)
    return reverse_padded(ys, lengths) if reverse else ys


def dc_bilstm_port(dropout_embed: float, dropout_pool: float, num_layers: int) -> Port:
    """DC-Bi-LSTM (Ding et al. eq. 10-13) on ``DCBiLSTM``'s parameter tree."""

    def forward(params, tokens, lengths, key):
        keys = [None, None] if key is None else list(jax.random.split(key))
        feats = [dropout(params["embed"]["embedding"][tokens], dropout_embed, keys[0])]
        for i in range(num_layers):
            layer = params["dense_bilstm"][f"layer_{i}"]
            inp = jnp.concatenate(feats[::-1], -1)
            feats.append(jnp.concatenate(
                [naive_lstm(layer["fwd"], inp, lengths, False),
                 naive_lstm(layer["bwd"], inp, lengths, True)], -1))
        pooled = dropout(masked_mean(feats[-1], lengths), dropout_pool, keys[1])
        return pooled @ params["softmax"]["kernel"] + params["softmax"]["bias"]

    return Port(forward)


class FlaxDCBiLSTM(nn.Module):
    """``dense_rnn.models.dc_bilstm.DCBiLSTM`` rebuilt from stock parts: each layer (``features``:
    the dense layers' sizes, then the top layer's) an ``nn.Bidirectional`` of two
    ``nn.RNN(nn.OptimizedLSTMCell)`` given ``seq_lengths``, reading every earlier layer's
    output and the embedding, newest first; ``nn.Dropout`` and an ``nn.Dense`` softmax."""

    vocab_size: int
    num_classes: int
    embed_size: int
    features: tuple[int, ...]
    dropout_embed: float = 0.0
    dropout_pool: float = 0.0

    @nn.compact
    def __call__(self, tokens: Array, lengths: Array, deterministic: bool = True) -> Array:
        e = nn.Embed(self.vocab_size, self.embed_size, name="embed")(tokens)
        feats = [nn.Dropout(self.dropout_embed)(e, deterministic)]
        for h in self.features:
            layer = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(h)),
                                     nn.RNN(nn.OptimizedLSTMCell(h)))
            feats.append(layer(jnp.concatenate(feats[::-1], -1), seq_lengths=lengths))
        pooled = nn.Dropout(self.dropout_pool)(masked_mean(feats[-1], lengths), deterministic)
        return nn.Dense(self.num_classes, name="softmax")(pooled)


def flax_lstm_cell(p: dict) -> dict:
    """One LSTM's ``w_ih``, ``w_hh`` and ``b`` in ``nn.OptimizedLSTMCell``'s layout: one kernel
    per gate and input, the bias on the recurrent kernels."""
    w_ih, w_hh, b = (jnp.split(p[k], 4, -1) for k in ("w_ih", "w_hh", "b"))
    cell = {}
    for gate, a, u, bias in zip("ifgo", w_ih, w_hh, b, strict=True):
        cell[f"i{gate}"] = {"kernel": a}
        cell[f"h{gate}"] = {"kernel": u, "bias": bias}
    return cell


def flax_dc_bilstm_port(features: tuple[int, ...], dropout_embed: float,
                        dropout_pool: float) -> Port:
    """``FlaxDCBiLSTM`` on ``DCBiLSTM``'s parameter tree: each step maps our parameters into
    its layout (gradients flow back through the map), so the trainer's optimizer updates the
    very tree it updates for ours."""

    def forward(params, tokens, lengths, key):
        (vocab, embed), classes = params["embed"]["embedding"].shape, params["softmax"]["bias"].size
        model = FlaxDCBiLSTM(vocab, classes, embed, features, dropout_embed, dropout_pool)
        layers = params["dense_bilstm"]
        cells = {f"OptimizedLSTMCell_{2 * i + d}": flax_lstm_cell(layers[f"layer_{i}"][k])
                 for i in range(len(features)) for d, k in enumerate(("fwd", "bwd"))}
        theirs = {"embed": params["embed"], "softmax": params["softmax"], **cells}
        return model.apply({"params": theirs}, tokens, lengths, deterministic=key is None,
                           rngs=None if key is None else {"dropout": key})

    return Port(forward)


def torch_dc_bilstm(vocab_size: int, num_classes: int, embed_size: int,
                    features: tuple[int, ...], dropout_embed: float, dropout_pool: float):
    """The same DC-Bi-LSTM in PyTorch, ``forward(tokens, lengths) -> logits`` (``lengths`` on
    the CPU, each at least 1): one ``nn.LSTM(bidirectional=True)`` per layer (``b_ih`` and
    ``b_hh``: 4H more parameters per direction than ours). The embeddings are packed once
    (``pack_padded_sequence``); every layer reads the packed concatenation of the earlier
    outputs, newest first."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class TorchDCBiLSTM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(vocab_size, embed_size)
            sizes = itertools.accumulate((2 * h for h in features[:-1]), initial=embed_size)
            self.lstms = torch.nn.ModuleList(
                torch.nn.LSTM(d, h, batch_first=True, bidirectional=True)
                for d, h in zip(sizes, features, strict=True))
            self.drop_embed = torch.nn.Dropout(dropout_embed)
            self.drop_pool = torch.nn.Dropout(dropout_pool)
            self.softmax = torch.nn.Linear(2 * features[-1], num_classes)

        def forward(self, tokens, lengths):
            packed = pack_padded_sequence(self.drop_embed(self.embed(tokens)), lengths,
                                          batch_first=True, enforce_sorted=False)
            feats = [packed.data]
            for lstm in self.lstms:
                packed, _ = lstm(packed._replace(data=torch.cat(feats[::-1], -1)))
                feats.append(packed.data)
            h, _ = pad_packed_sequence(packed, batch_first=True)  # zeros at padding
            return self.softmax(self.drop_pool(h.sum(1) / lengths.to(h)[:, None]))

    return TorchDCBiLSTM()


def naive_dense_cell(cell: str, p: dict, w_hh: list[Array], x: Array, update: Array,
                     pos: Array, block_start: bool) -> Array:
    """A DenseRNN, DenseGRU or DenseLSTM layer (Zhao et al. eq. 2-3, 7-8) run at the input
    rate: at steps where ``update[b, t]`` is false it copies its state (eq. 6); ``pos[t]`` is
    the block position of an update at ``t``; with ``block_start`` the state before the
    block's first update is read by every update of the block (eq. 5). Returns ``h`` at
    every step."""
    batch = x.shape[0]
    n = w_hh[0].shape[1] // cells.get_cell(cell).gates
    first = int(block_start)  # slots: [carried state,] the block's updates

    def step(w, state, x_t, rec):  # state: (h,) or the LSTM's (h, c)
        xw = x_t @ p["w_ih"] + p["b"]
        if cell == "rnn":
            return (jnp.tanh(xw + rec @ w),)
        if cell == "lstm":
            i, f, g, o = jnp.split(xw + rec @ w, 4, -1)
            c = jax.nn.sigmoid(f) * state[1] + jax.nn.sigmoid(i) * jnp.tanh(g)
            return jax.nn.sigmoid(o) * jnp.tanh(c), c
        r, z = jnp.split(jax.nn.sigmoid(xw[:, : 2 * n] + rec @ w[:, : 2 * n]), 2, -1)
        reset = jnp.tile(r, rec.shape[-1] // n)
        cand = jnp.tanh(xw[:, 2 * n :] + (reset * rec) @ w[:, 2 * n :])
        return ((1.0 - z) * state[0] + z * cand,)

    branches = [
        lambda state, block, x_t, j=j: step(
            w_hh[j], state, x_t, state[0] if j + first == 0 else block[:, : j + first].reshape(
                batch, (j + first) * n))
        for j in range(len(w_hh))
    ]
    slots = jnp.arange(len(w_hh) + first)

    def body(carry, inputs):
        state, block = carry
        x_t, u_t, pos_t = inputs
        if block_start:
            block = jnp.where((u_t & (pos_t == 0))[:, None, None] & (slots == 0)[None, :, None],
                              state[0][:, None], block)
        new = jax.lax.switch(pos_t, branches, state, block, x_t)
        state = tuple(jnp.where(u_t[:, None], a, b) for a, b in zip(new, state, strict=True))
        slot = u_t[:, None, None] & (slots == pos_t + first)[None, :, None]
        return (state, jnp.where(slot, state[0][:, None], block)), state[0]

    zeros = jnp.zeros((batch, n), x.dtype)
    carry = ((zeros, zeros) if cell == "lstm" else (zeros,),
             jnp.zeros((batch, len(w_hh) + first, n), x.dtype))
    _, hs = jax.lax.scan(body, carry, (jnp.swapaxes(x, 0, 1), update.T, pos))
    return jnp.swapaxes(hs, 0, 1)


def dense_layer_port(cell: str, k: int) -> Callable[[Any, Array], tuple[None, Array]]:
    """A ``DenseRecurrent(cell, H, k)`` layer (eq. 2-3) as ``naive_dense_cell``, on the
    layer's variables: ``apply(variables, x) -> (None, ys)`` (no final carry)."""

    def apply(variables, x):
        p = variables["params"]
        time = x.shape[1]
        update = jnp.ones(x.shape[:2], bool)
        w_hh = [p[f"w_hh_{n}"] for n in range(1, k + 1)]
        return None, naive_dense_cell(cell, p, w_hh, x, update, jnp.arange(time) % k, False)

    return apply


def hm_port(depths: tuple[int, ...], strided: bool = False, cell: str = "gru") -> Port:
    """HM-DenseGRU (Zhao et al. eq. 4-8), or HM-DenseRNN / HM-DenseLSTM by ``cell``, on
    ``HMTextClassifier``'s (``net="hm"``) parameters.

    Layer ``l`` updates at input steps ``t`` with ``(t + 1) % stride_l == 0`` inside the
    sequence and at its last real step; the classifier reads the top layer's state there.
    Every layer runs at the input rate, copying its state between updates (eq. 6), or with
    ``strided`` only over the lower layer's states at its update points.
    """
    schedule = layer_schedule(depths)

    def forward(params, tokens, lengths, key):
        x = params["embed"]["embedding"][tokens]
        for i, (stride, sub, k, block_start) in enumerate(schedule):
            layer = params["hm"][f"layer_{i}"]
            w_hh = [layer[f"w_hh_{j}"] for j in range(1, k + 1)]
            if strided:
                x, lengths = update_points(x, lengths, sub)
                t = jnp.arange(x.shape[1])
                update, pos = t[None, :] < lengths[:, None], t % k
            else:
                t = jnp.arange(tokens.shape[1])
                inside = t[None, :] < lengths[:, None]
                update = (((t + 1) % stride == 0)[None, :] & inside) | (
                    t[None, :] == lengths[:, None] - 1)
                pos = (-(-(t + 1) // stride) - 1) % k
            x = naive_dense_cell(cell, layer, w_hh, x, update, pos, block_start)
        last = jnp.take_along_axis(x, jnp.maximum(lengths - 1, 0)[:, None, None], 1)[:, 0]
        return last @ params["softmax"]["kernel"] + params["softmax"]["bias"]

    return Port(forward)
