"""The softmax layer's cross-entropy after its forward product, and its float32 backward
pass, as one C++ call each.

``softmax._nll`` (each row's maximum, ``exp(logits - maximum)`` and its sum, the NLL) as one
XLA FFI call (``csrc/softmax_loss.cc``): each row of the logits read from memory once,
where XLA's three passes (the maximum, the exponential, its sum) read it three times
(RESULTS.md, item 65).

``softmax._bwd`` (``dlogits = (softmax - onehot) * g``, then ``dx = dlogits W^T``,
``dW = x^T dlogits``, ``db = 1^T dlogits``) as one XLA FFI call (``csrc/softmax_grad.cc``,
built by ``dense_rnn.native``): ``dlogits`` built a panel of vocabulary columns at a time,
each panel's ``dW`` and ``db`` computed by the thread that built it while it is in L2, and
``dx`` by the LSTM kernels' register tile over ``W^T`` packed in blocks that stay in L2.
XLA's YNNPACK product ran ``dx``, with its contraction over the whole vocabulary, at
0.6-0.7x the rate of the forward product (RESULTS.md, item 61). ``tests/test_softmax.py``
and ``tests/test_softmax_kernel.py`` check both against XLA's passes and float64 NumPy.

``DENSE_RNN_SOFTMAX_KERNEL``: ``auto`` (default: AMD CPUs of family 26, Zen 5, or later,
with AVX-512, where it was measured; on the Zen 4 a similar C++ layer measured level with
XLA's, item 44, and on Intel CPUs the large float32 products go to OpenBLAS,
``dense_rnn.blas``), ``on`` (any x86-64 Linux CPU), ``off`` (XLA's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dense_rnn import native

Array = jax.Array
VARIABLE = "DENSE_RNN_SOFTMAX_KERNEL"
_PANEL = 32  # the widest register tile's columns (AVX-512): the packed W^T's padding


def _loaded() -> bool:
    return native.loaded(VARIABLE, "the softmax layer's backward products")


def available() -> bool:
    """Whether the softmax layer's float32 backward pass on the CPU runs the C++ kernel: as
    ``DENSE_RNN_SOFTMAX_KERNEL`` says, on x86-64 Linux with JAX's default backend the CPU,
    where the kernels build and load."""
    return native.enabled(VARIABLE, native.avx512() and native.amd_family() >= 26, _loaded)


def applies(*arrays: Array) -> bool:
    """Whether the backward pass of these floating-point operands runs the kernel: all
    float32, and ``available()``."""
    return all(a.dtype == jnp.float32 for a in arrays) and available()


def forward(raw: Array, bias: Array, targets: Array, save: bool
            ) -> tuple[Array, Array, Array] | Array:
    """``(nll, e, inv_total)`` of the float32 logits ``raw + bias`` (``raw`` (N, V), without
    the bias) and ``targets`` (N), as ``softmax._xla_nll``: each row's NLL,
    ``e = exp(raw + bias - max)`` (N, V) (the backward's residual) and the reciprocals of its
    row sums; without ``save`` the NLL alone."""
    n, v = raw.shape
    nll, inv_total, e = native.call("softmax_forward", [(n,), (n,), (n, v) if save else (0,)],
                                    raw, bias, targets.astype(jnp.int32), variable=VARIABLE)
    return (nll, e, inv_total) if save else nll


def backward(x: Array, kernel: Array, e: Array, inv_total: Array, targets: Array, g: Array
             ) -> tuple[Array, Array, Array]:
    """``(dx, dW, db)`` of the softmax layer for features ``x`` (N, d), its ``kernel``
    (d, V), the saved ``e = exp(logits - shift)`` (N, V) and reciprocals of its row sums
    ``inv_total`` (N), the ``targets`` (N) and the loss's cotangent ``g`` (N)."""
    (n, d), v = x.shape, kernel.shape[1]
    packed = -(-d // _PANEL) * _PANEL * v + d * n  # W^T's panels and x^T
    dx, dw, db, _, _ = native.call("softmax_backward", [(n, d), (d, v), (v,), (n, v), (packed,)],
                                   x, kernel, e, inv_total, targets.astype(jnp.int32), g,
                                   variable=VARIABLE)
    return dx, dw, db
