"""The float32 LSTM recurrence as one C++ call a sequence, on AVX-512 CPUs.

``recurrent.lstm_scan``'s forward scan (with the residuals its backward needs) and its
backward scan, each as one XLA FFI call (``csrc/lstm_scan.cc``, built by
``dense_rnn.native``) in place of ~16 XLA kernels a step, on the layers' batch-major
sequences where they lie (XLA's scans would read them through transposed copies) and with
the gates' biases added as the input projection is read: the recurrent weight packed once
a call for a register-tiled product, the gates and the state update computed beside it,
each step's panels of hidden units claimed one at a time by XLA's intra-op threads (a
thread the OS deschedules holds up a step by one panel at most). The arithmetic
is ``cells.lstm_step``'s; ``tests/test_lstm_kernel.py`` checks both calls against the XLA
scans and float64 NumPy. A scan with a direction axis (``lstm_scan``'s D independent LSTMs,
a bidirectional layer's two) is one call too: each step's panels of every direction are
its items, so the directions' steps run side by side (DC-Bi-LSTM's training step measured
1.14x on an AMD EPYC; one call per direction had measured 0.96x on an Intel Xeon, run AG).

``DENSE_RNN_LSTM_KERNEL``: ``auto`` (default: x86-64 Linux CPUs with AVX-512, where it
measured 1.02-1.19x XLA's scans on Intel Xeons and AMD EPYCs; with AVX2 alone its 6x16
register tile measured 0.94-1.06x, on an AVX-512 EPYC built without it), ``on`` (any
x86-64 Linux CPU), ``off`` (XLA's scans).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dense_rnn import native

Array = jax.Array
# acts, c_{t-1}, tanh(c_t), time-major (time, [D,] batch, .) as XLA's scan saves them (both
# paths' residuals have one shape); h_{t-1} batch-major ([D,] batch, time, H), as the gates'
# gradients it is multiplied with for dW_hh
Residuals = tuple[Array, Array, Array, Array]
VARIABLE = "DENSE_RNN_LSTM_KERNEL"


def mode() -> str:
    """``DENSE_RNN_LSTM_KERNEL``, one of ``native.MODES``; an unknown value raises
    ``UserError``."""
    return native.mode(VARIABLE)


def _loaded() -> bool:
    return native.loaded(VARIABLE, "LSTM scans")


def available() -> bool:
    """Whether float32 LSTM scans on the CPU run the C++ kernel: as
    ``DENSE_RNN_LSTM_KERNEL`` says, on x86-64 Linux with JAX's default backend the CPU,
    where the kernels build and load."""
    return native.enabled(VARIABLE, native.avx512(), _loaded)


def applies(w_hh: Array, *arrays: Array | None) -> bool:
    """Whether ``lstm_scan`` with the recurrent weight ``w_hh`` (H, 4H), or (D, H, 4H) for D
    directions, and these operands runs the kernel: all float32, and ``available()``."""
    return (w_hh.ndim in (2, 3)
            and all(a is None or a.dtype == jnp.float32 for a in (w_hh, *arrays))
            and available())


def forward(w_hh: Array, xs: Array, carry: tuple[Array, Array], mask: Array | None,
            rmask: Array | None, save: bool, b: Array | None = None
            ) -> tuple[tuple[Array, Array], Array, Residuals | None]:
    """``recurrent._lstm_forward`` (no ``unroll``) as the kernel: ``(carry, ys, residuals)``,
    ``xs`` and ``ys`` batch-major (batch, time, .), the residuals as ``lstm_scan`` keeps
    them and ``None`` unless ``save``; ``b`` (4H) or (D, 4H), the gates' biases, is added
    to ``xs`` as it is read. With a direction axis (``w_hh`` (D, H, 4H), ``xs`` (D, B, T,
    4H), the carry (D, B, H)) the D directions run in one call, their steps side by side."""
    c0, h0 = carry
    r = None if rmask is None else jnp.broadcast_to(rmask, h0.shape)
    *lead, t, g = xs.shape  # lead: ([D,] B)
    n = g // 4
    seq, saved = (*lead, t, n), (t, *lead, n)
    shapes = [seq, h0.shape, h0.shape,
              *([(t, *lead, g), saved, saved, seq] if save else [(0,)] * 4)]
    ys, c, h, *res = native.call("lstm_forward", shapes, w_hh, xs, c0, h0, native.optional(mask),
                                 native.optional(r), native.optional(b), variable=VARIABLE)
    return (c, h), ys, tuple(res) if save else None


def backward(w_hh: Array, dys: Array, dcarry: tuple[Array, Array], mask: Array | None,
             rmask: Array | None, res: Residuals
             ) -> tuple[Array, tuple[Array, Array], Array | None]:
    """The backward scan of ``recurrent._lstm_scan_bwd`` as the kernel: the gates'
    gradients ``dzs`` (batch-major, as ``dys``), the initial carry's cotangents and, with
    ``rmask``, ``sum_t h_{t-1} dh_in_t`` at the carry's shape (``None`` without)."""
    dc, dh = dcarry
    r = None if rmask is None else jnp.broadcast_to(rmask, dh.shape)
    *steps, n = dys.shape  # steps: ([D,] B, T)
    shapes = [(*steps, 4 * n), dh.shape, dh.shape, dh.shape if r is not None else (0,)]
    dzs, dc0, dh0, drmask = native.call("lstm_backward", shapes, w_hh, dys, dc, dh,
                                        native.optional(mask), native.optional(r), *res,
                                        variable=VARIABLE)
    return dzs, (dc0, dh0), drmask if r is not None else None
