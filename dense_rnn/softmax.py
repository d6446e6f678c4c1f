"""The softmax output layer and its cross-entropy, fused, with a hand-written backward pass.

``nll_t = logsumexp(W^T x_t + b) - (W^T x_t + b)[y_t]``: the negative log-likelihood of the
softmax layer of Zaremba et al. (2014) and Godin et al. (2017, eq. 7 / 11).

Differentiating ``optax.softmax_cross_entropy_with_integer_labels(x @ W + b, y)`` makes XLA
scatter a one-hot into a fresh (tokens, vocab) buffer, run the log-softmax's backward in
several passes, and lay out ``dlogits`` transposed for the kernel gradient. Here the backward
is written out: one elementwise pass ``dlogits = (softmax - onehot) * g``, then the three
products ``dx = dlogits W^T``, ``dW = x^T dlogits``, ``db = 1^T dlogits`` on canonical
layouts. The two matrix products take the compute dtype's operands (``precision.matmul_nt``
/ ``matmul_tn_colsum``), so in bfloat16 they run at the bfloat16 rate; there ``db`` is one
more row of the ``dW`` product, ``[x, 1]^T dlogits``. The forward pass saves
``exp(logits - shift)`` (which its normaliser needs anyway) and the reciprocals of its row
sums rather than the logits, so the backward's softmax is one product per element instead
of another ``exp`` over the (tokens, vocab) array. The shift is an upper bound of each row's
maximum, ``max(x W) + max(b)``, so the biased logits are never written out (``_xla_nll``).
On AMD's Zen 5 and later CPUs the pass after the forward product (each row's exact
maximum, the exponential, its sum and the NLL) and, in float32, the whole backward pass are
one C++ call each (``softmax_kernel``).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike

from dense_rnn import precision, softmax_kernel

Array = jax.Array


# A row whose sum of ``exp(logits - shift)`` falls below this had its shift overshoot its
# maximum by more than ~46: it is recomputed with the exact maximum (see ``_nll``).
_MIN_TOTAL = 1e-20


def _shifted_exp(raw: Array, bias: Array, exact: bool) -> tuple[Array, Array, Array]:
    """``(shift, exp(raw + bias - shift), row sums)`` for the logits ``raw + bias``.

    The exact shift is each row's maximum logit, which needs the biased logits written
    out for the max reduction. ``max(raw) + max(bias)`` bounds that maximum from above and
    needs only ``raw``, so the biased logits never touch memory: each pass adds the bias as
    it reads. It overshoots by at most ``max(bias) - min(bias)``."""
    if exact:
        shift = (raw + bias[None]).max(axis=-1, keepdims=True)
    else:
        shift = raw.max(axis=-1, keepdims=True) + bias.max()
    e = jnp.exp(raw + bias[None] - shift)
    return shift, e, e.sum(axis=-1)


def _xla_nll(raw: Array, bias: Array, targets: Array, save: bool = True
             ) -> tuple[Array, Array, Array] | Array:
    """Per-row NLL of the logits ``raw + bias`` (tokens, vocab), with ``save`` also
    ``exp(logits - shift)`` and the reciprocals of its row sums: the softmax is their
    product, with no second ``exp``. The shift is the bound of ``_shifted_exp``; where it
    overshot so far that a row's sum nears underflow (a bias spread over ~46), the exact
    maximum is used instead."""
    shift, e, total = _shifted_exp(raw, bias, exact=False)
    shift, e, total = jax.lax.cond(
        total.min(initial=jnp.inf) < _MIN_TOTAL, lambda: _shifted_exp(raw, bias, exact=True),
        lambda: (shift, e, total))
    picked = jnp.take_along_axis(raw, targets[:, None], axis=-1)[:, 0] + bias[targets]
    nll = jnp.log(total) + shift[:, 0] - picked
    return (nll, e, 1 / total) if save else nll


def _nll(raw: Array, bias: Array, targets: Array, save: bool
         ) -> tuple[Array, Array, Array] | Array:
    """``_xla_nll``: ``(nll, e, inv_total)``, or without ``save`` the NLL alone; for float32
    logits on the CPUs ``softmax_kernel`` runs on, one C++ pass over them, shifted by each
    row's exact maximum."""
    bias = bias.astype(raw.dtype)
    xla = functools.partial(_xla_nll, save=save)
    if softmax_kernel.applies(raw, bias):
        return jax.lax.platform_dependent(
            raw, bias, targets, cpu=functools.partial(softmax_kernel.forward, save=save),
            default=xla)
    return xla(raw, bias, targets)


@jax.custom_vjp
def softmax_cross_entropy(x: Array, kernel: Array, bias: Array, targets: Array) -> Array:
    """Per-token NLL of the softmax layer ``(kernel, bias)`` on features ``x``.

    Args:
      x: features (..., d); the products take it in its dtype, the logits and the
        softmax are at least float32.
      kernel: (d, vocab). bias: (vocab,).
      targets: integer ids in ``[0, vocab)`` with the leading shape of ``x``. An id outside
        it gives a NaN or wrapped loss and a gradient that disagrees with it: replace such ids
        (``jnp.where(valid, targets, 0)``) and give their rows zero weight.

    Returns:
      The NLL (float32, or float64 for float64 inputs) with the leading shape of ``x``.
    """
    return _fwd(x, kernel, bias, targets)[0]


def _check_targets(x: Array, targets: Array) -> None:
    """A one-line ``ValueError`` unless ``targets`` are integer ids shaped ``x.shape[:-1]``
    (time-major targets against batch-major features would otherwise pair wrong rows)."""
    if targets.shape != x.shape[:-1] or not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"softmax_cross_entropy: targets must be integer ids of shape "
                         f"{x.shape[:-1]} (x's leading shape), got {targets.dtype} "
                         f"{targets.shape}")


def _fwd(
    x: Array, kernel: Array, bias: Array, targets: Array
) -> tuple[Array, tuple[Array, Array, Array, Array, Array, Array]]:
    _check_targets(x, targets)
    x2 = x.reshape(-1, x.shape[-1])
    nll, e, inv_total = _nll(precision.matmul(x2, kernel), bias, targets.reshape(-1), save=True)
    return nll.reshape(targets.shape), (x2, kernel, e, inv_total, targets, bias)


def _bwd(
    residuals: tuple[Array, Array, Array, Array, Array, Array], g: Array
) -> tuple[Array, Array, Array, None]:
    x2, kernel, e, inv_total, targets, bias = residuals
    operands = (x2, kernel, e, inv_total, targets.reshape(-1), g.reshape(-1))
    if softmax_kernel.applies(x2, kernel, e, inv_total, g):
        dx, dw, db = jax.lax.platform_dependent(*operands, cpu=softmax_kernel.backward,
                                                default=_xla_grads)
    else:
        dx, dw, db = _xla_grads(*operands)
    dx = dx.astype(x2.dtype).reshape(*targets.shape, x2.shape[-1])
    return dx, dw.astype(kernel.dtype), db.astype(bias.dtype), None


def _xla_grads(x2: Array, kernel: Array, e: Array, inv_total: Array, targets: Array, g: Array
               ) -> tuple[Array, Array, Array]:
    """``(dx, dW, db)`` of the flattened layer (``softmax_kernel.backward``'s operands) in
    XLA: one elementwise pass writes ``dlogits``, then the products."""
    onehot = jnp.arange(e.shape[-1])[None] == targets[:, None]
    d = ((e * inv_total[:, None] - onehot) * g[:, None]).astype(x2.dtype)
    dw, db = precision.matmul_tn_colsum(x2, d)
    return precision.matmul_nt(d, kernel), dw, db


softmax_cross_entropy.defvjp(_fwd, _bwd)


class SoftmaxOutput(nn.Module):
    """The softmax layer: logits, or with ``targets`` the fused per-token NLL.

    Its parameters are ``nn.Dense``'s (``kernel`` (d, vocab), ``bias`` (vocab,)).
    """

    vocab_size: int
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros_init()
    param_dtype: DTypeLike = jnp.float32

    @nn.compact
    def __call__(self, x: Array, targets: Array | None = None) -> Array:
        """Logits (..., vocab) of ``x`` (..., d), or with ``targets`` the per-token NLL."""
        kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.vocab_size),
                            self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.vocab_size,), self.param_dtype)
        kernel, bias = kernel.astype(x.dtype), bias.astype(x.dtype)
        if targets is None:
            return precision.matmul(x, kernel) + lax.broadcast_to_rank(bias, x.ndim)
        return softmax_cross_entropy(x, kernel, bias, targets)
