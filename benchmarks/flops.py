"""Exact matrix-product FLOP counts of each benchmarked step.

Convention: a product of ``(m, k) @ (k, n)`` is ``2mkn`` FLOPs; a training step does every
product of the forward pass three times (forward, gradient of the input, gradient of the
weight). Elementwise work (gates, softmax, optimizer) is not counted. Counts follow the
model equations, so every implementation of a workload is credited the same work.
"""

from __future__ import annotations

from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.configs.dc_bilstm import dense_features
from dense_rnn.configs.ptb import LMConfig
from dense_rnn.dense_block import rec_rows
from dense_rnn.hm_stack import layer_schedule

TRAIN_FACTOR = 3  # forward + d(input) + d(weight)


def matmul(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def lstm_layer(rows: int, d: int, h: int) -> int:
    """One LSTM layer over ``rows`` (batch x time) positions: input and recurrent products."""
    return matmul(rows, d, 4 * h) + matmul(rows, h, 4 * h)


def lm_softmax_shape(c: LMConfig, batch: int, time: int) -> tuple[int, int, int]:
    """``(m, k, n)`` of the output layer's product, the dominant GEMM of a PTB LM."""
    top = c.embed_size + c.num_layers * c.hidden_size if c.connectivity == "dense" else (
        c.hidden_size)
    return batch * time, top, c.vocab_size


def lm_forward(c: LMConfig, batch: int, time: int) -> int:
    """Forward FLOPs of ``LanguageModel`` (Godin eq. 5-11) on a ``(batch, time)`` window."""
    rows, total = batch * time, 0
    for layer in range(c.num_layers):
        if c.connectivity == "dense":
            d = c.embed_size + layer * c.hidden_size
        else:
            d = c.embed_size if layer == 0 else c.hidden_size
        total += lstm_layer(rows, d, c.hidden_size)
    return total + matmul(*lm_softmax_shape(c, batch, time))


def dc_bilstm_forward(c: ClassifierConfig, batch: int, time: int, num_classes: int) -> int:
    """Forward FLOPs of ``DCBiLSTM`` (Ding et al. eq. 10-13): both directions of every layer."""
    a, rows = c.model_args, batch * time
    d, total = c.embed_size, 0
    for h in dense_features(a["dl"], a["dh"], a["th"]):
        total += 2 * lstm_layer(rows, d, h)
        d += 2 * h
    return total + matmul(batch, 2 * a["th"], num_classes)


def hm_forward(c: ClassifierConfig, batch: int, time: int, num_classes: int) -> int:
    """Forward FLOPs of an ``HMTextClassifier`` with ``net="hm"`` on full-length sequences.

    Layer ``l`` updates ``time // stride`` times; at block position ``n`` (1-based) its
    recurrent input holds ``rec_rows(n, block_start)`` states (Zhao et al. eq. 2, 5), each
    of ``H`` units. Exact when ``time`` is a multiple of the top layer's block length (the
    model pads the last block of every layer and computes the padding too).
    """
    a = c.model_args
    h, gates = a["features"], {"rnn": 1, "gru": 3, "lstm": 4}[a["cell"]]
    d, total = c.embed_size, 0
    for plan in layer_schedule(a["depths"], a.get("multiscale", True), a.get("dense", True)):
        steps = time // plan.stride
        total += matmul(batch * steps, d, gates * h)
        total += sum(matmul(batch, rec_rows(t % plan.own_depth + 1, plan.block_start) * h,
                            gates * h) for t in range(steps))
        d = h
    return total + matmul(batch, h, num_classes)
