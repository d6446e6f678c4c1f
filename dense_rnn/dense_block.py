"""The dense recurrent block of DenseRNNs (Zhao et al. 2019, eq. 2-3; DenseGRU eq. 7-8).

The sequence is cut into blocks of ``k`` steps. At step ``t = mk + n`` (``n`` in ``1..k``)
the unit reads the input ``x_t`` and the recurrent input (eq. 2 / 7)::

    x~_t = h_{t-1}                              if n = 1 (last state of the previous block)
    x~_t = [h_{mk+1}; ...; h_{mk+n-1}]          otherwise

and updates ``h_t = f(W1 x_t + W2^{(n)} x~_t + b)`` (eq. 3). ``W1`` is shared by all steps;
the recurrent weight ``W2^{(n)}`` (``(max(n-1, 1) * H, g * H)``) is owned by the position
``n`` and shared across blocks. ``k = 1`` is the plain cell.

``block_start=True`` is eq. 5 on a layer of the hierarchical multiscale stack that updates
every ``s > 1`` input steps (``hm_stack``): its block's first ``s - 1`` steps copy the
state carried into the block, so ``x~`` at its ``n``-th update in the block holds that
state and its ``n - 1`` updates so far (``W2^{(n)}``: ``n * H`` rows; copies of a state
are not repeated).

The whole layer is ONE ``lax.scan`` over blocks: its body unrolls the ``k`` steps of a
block, so position ``n`` concatenates the block's states so far and multiplies them by
``W2^{(n)}`` at its own width (no buffer, masking or zero-padded weight inside the loop);
time is padded to whole blocks and the padding masked. ``W1 x_t + b`` is hoisted out of
the scan. A float32 layer on an AVX-512 CPU runs instead as one C++ call forward and one
backward (``dense_kernel``), with the same residuals for the weights' gradients.

Cells (``DENSE_STEPS``), with ``r = W2^{(n)} x~_t`` split per gate:

* ``rnn``:  ``h_t = tanh(W1 x_t + r + b)``
* ``gru`` (eq. 8): ``z, r_gate = sigmoid(...)``, ``h~ = tanh(W x_t + U (r_gate . x~_t) + b)``
  with the reset gate applied to every state of ``x~_t``, ``h_t = (1 - z) h_{t-1} + z h~``.
  Eq. 8 as printed reads ``U (r_t . h_{t-1})``, an ``H x H`` ``U``; Table 2's DenseGRU counts
  (144k at 64 units = 3 x (300H + 7H^2 + 2H), all three gates reading ``x~_t``; 2H: two
  biases per gate, the PyTorch count the configs use) need ``U``
  as wide as ``U_z``, ``U_r``, so ``U`` reads ``x~_t`` too.
* ``lstm``: the LSTM of ``cells.lstm_step`` with ``U h_{t-1}`` replaced by ``U x~_t``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from dense_rnn import cells, dense_kernel
from dense_rnn.recurrent import (
    Initializer,
    check_sequence,
    check_sizes,
    initial_carry,
    layer_param,
    length_mask,
    uniform_init,
)

Array = jax.Array
# A dense step takes ``W2^{(n)}`` split by columns into the blocks its recurrent products
# use (``OPERAND_BLOCKS``: how many H-wide gate blocks each spans) and returns, besides the
# new carry and output, the left operand of each product: ``operands[i] @ ws[i]``.
DenseStep = Callable[
    [tuple[Array, ...], cells.Carry, Array, Array],
    tuple[cells.Carry, Array, tuple[Array, ...]]]


def _rnn(
    ws: tuple[Array], carry: Array, xw: Array, rec: Array
) -> tuple[Array, Array, tuple[Array]]:
    h, _ = cells.rnn_step({"w_hh": ws[0]}, rec, xw)
    return h, h, (rec,)


def _gru(
    ws: tuple[Array, Array], carry: Array, xw: Array, rec: Array
) -> tuple[Array, Array, tuple[Array, Array]]:
    w_rz, w_n = ws
    n_hidden = carry.shape[-1]
    r, z = jnp.split(jax.nn.sigmoid(xw[..., : 2 * n_hidden] + cells.recurrent_product(rec, w_rz)),
                     2, -1)
    reset = jnp.tile(r, rec.shape[-1] // n_hidden)  # r_t applied to every state of x~_t
    gated = reset * rec
    cand = jnp.tanh(xw[..., 2 * n_hidden :] + cells.recurrent_product(gated, w_n))
    h = (1.0 - z) * carry + z * cand
    return h, h, (rec, gated)


def _lstm(
    ws: tuple[Array], carry: tuple[Array, Array], xw: Array, rec: Array
) -> tuple[tuple[Array, Array], Array, tuple[Array]]:
    carry, h = cells.lstm_step({"w_hh": ws[0]}, (carry[0], rec), xw)
    return carry, h, (rec,)


DENSE_STEPS: dict[str, DenseStep] = {"rnn": _rnn, "gru": _gru, "lstm": _lstm}
OPERAND_BLOCKS: dict[str, tuple[int, ...]] = {"rnn": (1,), "gru": (2, 1), "lstm": (4,)}


def rec_rows(n: int, block_start: bool = False) -> int:
    """Number of hidden states in ``x~_t`` at block position ``n`` (1-based): eq. 2, or
    with ``block_start`` eq. 5 on a strided layer (the state carried into the block too)."""
    return n if block_start else max(n - 1, 1)


def dense_scan(
    cell: str,
    w_hh: list[Array],
    xw: Array,
    carry: cells.Carry,
    lengths: Array | None = None,
    block_start: bool = False,
) -> tuple[cells.Carry, Array]:
    """Runs a dense recurrent block layer over pre-projected inputs ``xw`` (batch, time, gH).

    Args:
      cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
      w_hh: ``k`` recurrent weights; ``w_hh[n-1]`` is ``W2^{(n)}``,
        ``(rec_rows(n, block_start) * H, gH)``.
      xw: ``W1 x_t + b`` for every step.
      carry: initial cell carry (``h`` or ``(c, h)``), batch-major.
      lengths: optional ``(batch,)`` real lengths; later steps keep the carry, output 0.
      block_start: every position also reads the state carried into the block (eq. 5).

    Returns:
      ``(final_carry, outputs (batch, time, H))``.

    Differentiated by hand for the weights: every recurrent product's output enters a gate's
    pre-activation beside ``xw``, so its cotangent is that of ``xw``, and the gradient of
    ``W2^{(n)}`` is ONE product over the steps at position ``n`` of their saved operands and
    ``dxw``, instead of a small product accumulated inside the backward scan at every step.
    """
    if _kernel(cell, w_hh, xw, carry):
        mask = None if lengths is None else length_mask(lengths, xw.shape[1])
        return dense_kernel.scan(tuple(w_hh), xw, carry, mask, block_start, cell)
    return _dense_scan(cell, block_start, tuple(w_hh), xw, carry, lengths)


def _kernel(cell: str, w_hh: list[Array], xw: Array, carry: cells.Carry) -> bool:
    """Whether the layer runs as the C++ dense-block kernel (``dense_kernel``): float32, on
    an AVX-512 CPU."""
    return cell in dense_kernel.GATES and dense_kernel.applies(w_hh, xw, carry)


def _scan(
    cell: str, block_start: bool, w_hh: tuple[Array, ...], xw: Array, carry: cells.Carry,
    lengths: Array | None
) -> tuple[tuple[cells.Carry, Array], tuple[tuple[Array, ...], ...]]:
    """The layer as ONE ``lax.scan`` over blocks of ``k`` steps (time padded to whole blocks,
    the padding masked); the ``k`` steps of a block are unrolled in the body, so position
    ``n`` multiplies exactly ``x~_t`` by ``W2^{(n)}``: no buffer, masking or padded weight.
    Returns ``((final_carry, outputs), operands)``; ``operands[n - 1]`` holds the left
    operands of position ``n``'s products, each
    ``(blocks, batch, rec_rows(n, block_start) * H)``."""
    step = DENSE_STEPS[cell]
    k = len(w_hh)
    n_hidden = cells.carry_output(carry).shape[-1]
    batch, time = xw.shape[:2]
    blocks = -(-time // k)
    pad = blocks * k - time
    mask = jnp.ones((batch, time), bool) if lengths is None else length_mask(lengths, time)
    xw = jnp.pad(xw, ((0, 0), (0, pad), (0, 0))).reshape(batch, blocks, k, xw.shape[-1])
    xs = (xw.transpose(1, 2, 0, 3),
          jnp.pad(mask, ((0, 0), (0, pad))).reshape(batch, blocks, k).transpose(1, 2, 0))
    ws = [tuple(jnp.split(w, _cuts(cell, n_hidden), axis=-1)) for w in w_hh]

    def body(
        carry: cells.Carry, inputs: tuple[Array, Array]
    ) -> tuple[cells.Carry, tuple[Array, tuple[tuple[Array, ...], ...]]]:
        xw_b, m_b = inputs  # (k, batch, gH), (k, batch)
        # eq. 2: the previous state, then the block's states so far; eq. 5 (block_start):
        # the state carried into the block, then it and the block's states so far
        hs = [cells.carry_output(carry)] if block_start else []
        ys, operands = [], []
        for n in range(k):
            rec = jnp.concatenate(hs, axis=-1) if hs else cells.carry_output(carry)
            new_carry, h, ops = step(ws[n], carry, xw_b[n], rec)
            keep = m_b[n][:, None]  # a prefix mask: later steps of an ended row are masked too
            carry = jax.tree.map(lambda a, b, keep=keep: jnp.where(keep, a, b), new_carry, carry)
            hs.append(h)
            ys.append(jnp.where(keep, h, 0.0))
            operands.append(ops)
        return carry, (jnp.stack(ys), tuple(operands))

    carry, (ys, operands) = jax.lax.scan(body, carry, xs)
    ys = ys.transpose(2, 0, 1, 3).reshape(batch, blocks * k, n_hidden)[:, :time]
    return (carry, ys), operands


def _cuts(cell: str, n_hidden: int) -> list[int]:
    """Where the columns of ``W2^{(n)}`` split between the step's recurrent products."""
    return list(itertools.accumulate(b * n_hidden for b in OPERAND_BLOCKS[cell][:-1]))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _dense_scan(
    cell: str, block_start: bool, w_hh: tuple[Array, ...], xw: Array, carry: cells.Carry,
    lengths: Array | None
) -> tuple[cells.Carry, Array]:
    return _scan(cell, block_start, w_hh, xw, carry, lengths)[0]


def _dense_scan_fwd(
    cell: str, block_start: bool, w_hh: tuple[Array, ...], xw: Array, carry: cells.Carry,
    lengths: Array | None
) -> tuple[tuple[cells.Carry, Array], tuple]:
    # the weights are constants of the vjp: their gradient is not accumulated per step
    out, vjp, operands = jax.vjp(
        lambda xw, carry: _scan(cell, block_start, w_hh, xw, carry, lengths), xw, carry,
        has_aux=True)
    return out, (vjp, operands, w_hh)


def _dense_scan_bwd(
    cell: str, block_start: bool, res: tuple, cotangents: tuple[cells.Carry, Array]
) -> tuple[tuple[Array, ...], Array, cells.Carry, None]:
    vjp, operands, w_hh = res
    k = len(w_hh)
    dxw, dcarry = vjp(cotangents)
    batch, time, g = dxw.shape
    blocks = operands[0][0].shape[0]
    dz = jnp.pad(dxw, ((0, 0), (0, blocks * k - time), (0, 0))).reshape(batch, blocks, k, g)
    cuts = _cuts(cell, g // sum(OPERAND_BLOCKS[cell]))
    # One einsum per operand over (blocks, batch): the operands are block-major and dz is
    # batch-major; transposing dz to call recurrent's sum over steps cost hm_densegru 2%.
    dw_hh = tuple(
        jnp.concatenate([
            jnp.einsum("mbw,bmg->wg", a, d,
                       preferred_element_type=jnp.promote_types(a.dtype, jnp.float32))
            for a, d in zip(operands[n], jnp.split(dz[:, :, n], cuts, axis=-1), strict=True)],
            axis=-1).astype(w.dtype)
        for n, w in enumerate(w_hh))
    return dw_hh, dxw, dcarry, None


_dense_scan.defvjp(_dense_scan_fwd, _dense_scan_bwd)


def pytorch_uniform(features: int) -> Initializer:
    """PyTorch's RNN default, uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` (the paper's framework)."""
    return uniform_init(features**-0.5)


class DenseRecurrent(nn.Module):
    """One DenseRNN / DenseGRU / DenseLSTM layer (eq. 2-3, 7-8) of dense depth ``k``.

    Parameters: ``w_ih`` (d, gH) = ``W1``, ``b`` (gH), ``w_hh_{n}`` = ``W2^{(n)}`` for
    ``n = 1..k``. ``block_start``: ``x~`` also holds the state carried into the block (eq. 5
    on a strided layer of the HM stack).

    Attributes:
      cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
      features: hidden size.
      k: dense depth, the block length.
      block_start: see above.
      kernel_init / recurrent_init / bias_init: initializers of ``w_ih``, every ``w_hh_{n}``
        and ``b`` (None: ``pytorch_uniform(features)``, the paper's framework's default).
      param_dtype: the parameters' dtype.
    """

    cell: str
    features: int
    k: int
    block_start: bool = False
    kernel_init: Initializer | None = None
    recurrent_init: Initializer | None = None
    bias_init: Initializer | None = None
    param_dtype: DTypeLike = jnp.float32

    def zero_carry(self, batch: int, dtype: DTypeLike | None = None) -> cells.Carry:
        """The cell's zero carry for ``batch`` sequences, in ``dtype`` (default: the
        parameters')."""
        return cells.get_cell(self.cell).zero_carry(batch, self.features,
                                                    dtype or self.param_dtype)

    @nn.compact
    def __call__(self, x: Array, carry: cells.Carry | None = None,
                 lengths: Array | None = None) -> tuple[cells.Carry, Array]:
        """``x``: (batch, time, in_features) -> ``(final_carry, (batch, time, features))``.

        ``carry``: the state before the first block, shaped like ``zero_carry`` (default
        zeros); ``lengths``: optional ``(batch,)`` real lengths, clamped to the padded
        length (later steps keep the carry and output zeros). A sequence continued from a
        carry across calls runs as one long call when each call's length is a multiple of
        ``k`` (blocks restart at every call)."""
        check_sequence("DenseRecurrent", x, lengths)
        check_sizes("DenseRecurrent", features=self.features)
        if self.k < 1:
            raise ValueError(f"DenseRecurrent: k={self.k}; the dense depth must be at least 1")
        spec = cells.get_cell(self.cell)
        g = spec.gates * self.features
        default = pytorch_uniform(self.features)
        params = {
            "w_ih": layer_param(self, "w_ih", self.kernel_init or default, (x.shape[-1], g)),
            "b": layer_param(self, "b", self.bias_init or default, (g,)),
        }
        w_hh = [
            layer_param(self, f"w_hh_{n}", self.recurrent_init or default,
                        (rec_rows(n, self.block_start) * self.features, g))
            for n in range(1, self.k + 1)
        ]
        xw = cells.project(params, x)
        carry = initial_carry("DenseRecurrent", spec, carry, x.shape[0], self.features,
                              xw.dtype)
        if x.shape[1] == 0:  # no step: the carry passes through, as a scan of length 0
            return carry, jnp.zeros((*x.shape[:2], self.features), xw.dtype)
        return dense_scan(self.cell, w_hh, xw, carry, lengths, self.block_start)
