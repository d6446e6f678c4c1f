"""The dense recurrent block of DenseRNNs (Zhao et al. 2019, eq. 2-3; DenseGRU eq. 7-8).

The sequence is cut into blocks of ``k`` steps. At step ``t = mk + n`` (``n`` in ``1..k``)
the unit reads the input ``x_t`` and the recurrent input (eq. 2 / 7)::

    x~_t = h_{t-1}                              if n = 1 (last state of the previous block)
    x~_t = [h_{mk+1}; ...; h_{mk+n-1}]          otherwise

and updates ``h_t = f(W1 x_t + W2^{(n)} x~_t + b)`` (eq. 3). ``W1`` is shared by all steps;
the recurrent weight ``W2^{(n)}`` (``(max(n-1, 1) * H, g * H)``) is owned by the position
``n`` and shared across blocks. ``k = 1`` is the plain cell.

The whole layer is ONE ``lax.scan`` with fixed shapes: the carry holds the cell state and
a buffer of the block's states ``h_{mk+1..mk+k-1}``; at position ``n`` the buffer is masked
to its first ``n - 1`` slots (or replaced by ``h_{t-1}`` at ``n = 1``) and multiplied by
``W2^{(n)}`` zero-padded to the full buffer width. ``W1 x_t + b`` is hoisted out of the scan.

Cells (``DENSE_STEPS``), with ``r = W2^{(n)} x~_t`` split per gate:

* ``rnn``:  ``h_t = tanh(W1 x_t + r + b)``
* ``gru`` (eq. 8): ``z, r_gate = sigmoid(...)``, ``h~ = tanh(W x_t + U (r_gate . x~_t) + b)``
  with the reset gate applied to every state of ``x~_t``, ``h_t = (1 - z) h_{t-1} + z h~``.
  Eq. 8 as printed reads ``U (r_t . h_{t-1})``, an ``H x H`` ``U``; Table 2's DenseGRU counts
  (144k at 64 units = 3 x (300H + 7H^2 + 2H), all three gates reading ``x~_t``) need ``U``
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
from jax.ad_checkpoint import checkpoint_name

from dense_rnn import cells
from dense_rnn.recurrent import Initializer, length_mask, uniform_init

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
    h = jnp.tanh(xw + cells.recurrent_product(rec, ws[0]))
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


def rec_rows(n: int) -> int:
    """Number of hidden states in ``x~_t`` at block position ``n`` (1-based), eq. 2."""
    return max(n - 1, 1)


def dense_scan(
    cell: str,
    w_hh: list[Array],
    xw: Array,
    carry: cells.Carry,
    lengths: Array | None = None,
) -> tuple[cells.Carry, Array]:
    """Runs a dense recurrent block layer over pre-projected inputs ``xw`` (batch, time, gH).

    Args:
      cell: ``"rnn"``, ``"gru"`` or ``"lstm"``.
      w_hh: ``k`` recurrent weights; ``w_hh[n-1]`` is ``W2^{(n)}``, ``(rec_rows(n) * H, gH)``.
      xw: ``W1 x_t + b`` for every step.
      carry: initial cell carry (``h`` or ``(c, h)``), batch-major.
      lengths: optional ``(batch,)`` real lengths; later steps keep the carry, output 0.

    Returns:
      ``(final_carry, outputs (batch, time, H))``.

    Differentiated by hand for the weights: every recurrent product's output enters a gate's
    pre-activation beside ``xw``, so its cotangent is that of ``xw``, and the gradient of
    ``W2^{(n)}`` is ONE product over the steps at position ``n`` of their saved operands and
    ``dxw``, instead of a small product accumulated inside the backward scan at every step.
    """
    return _dense_scan(cell, tuple(w_hh), xw, carry, lengths)


def _scan(
    cell: str, w_all: Array, xw: Array, carry: cells.Carry, lengths: Array | None
) -> tuple[tuple[cells.Carry, Array], tuple[Array, ...]]:
    """The layer's ``lax.scan`` with the stacked, zero-padded weights ``w_all`` (k, width, gH):
    ``((final_carry, outputs), operands)``, operands time-major (time, batch, width)."""
    step = DENSE_STEPS[cell]
    k, width = w_all.shape[:2]
    h0 = cells.carry_output(carry)
    n_hidden = h0.shape[-1]
    slots = width // n_hidden
    batch, time = xw.shape[:2]
    buf0 = jnp.zeros((batch, slots, n_hidden), h0.dtype)
    pos = jnp.arange(time) % k  # 0-based position in the block
    mask = jnp.ones((batch, time), bool) if lengths is None else length_mask(lengths, time)
    w_parts = jnp.split(w_all, _cuts(cell, n_hidden), axis=-1)

    def body(
        state: tuple[cells.Carry, Array], inputs: tuple[Array, Array, Array]
    ) -> tuple[tuple[cells.Carry, Array], tuple[Array, tuple[Array, ...]]]:
        carry, buf = state
        xw_t, p, m_t = inputs
        h_prev = cells.carry_output(carry)
        first = jnp.zeros_like(buf).at[:, 0].set(h_prev)
        in_block = (jnp.arange(slots) < p)[None, :, None]
        rec = jnp.where(p == 0, first, jnp.where(in_block, buf, 0.0)).reshape(batch, width)
        # re-sliced by the backward pass rather than saved for every step
        ws = tuple(checkpoint_name(w[p], "dense_w") for w in w_parts)
        new_carry, h, operands = step(ws, carry, xw_t, rec)
        new_buf = jnp.where((jnp.arange(slots) == p)[None, :, None], h[:, None], buf)
        keep = m_t[:, None]
        new_carry = jax.tree.map(lambda a, b: jnp.where(keep, a, b), new_carry, carry)
        new_buf = jnp.where(keep[:, :, None], new_buf, buf)
        return (new_carry, new_buf), (jnp.where(keep, h, 0.0), operands)

    xs = (jnp.swapaxes(xw, 0, 1), pos, jnp.swapaxes(mask, 0, 1))
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.save_anything_except_these_names(
        "dense_w"))
    (carry, _), (ys, operands) = jax.lax.scan(body, (carry, buf0), xs)
    return (carry, jnp.swapaxes(ys, 0, 1)), operands


def _cuts(cell: str, n_hidden: int) -> list[int]:
    """Where the columns of ``W2^{(n)}`` split between the step's recurrent products."""
    return list(itertools.accumulate(b * n_hidden for b in OPERAND_BLOCKS[cell][:-1]))


def _stack(w_hh: tuple[Array, ...]) -> Array:
    """``(k, width, gH)``: every ``W2^{(n)}`` zero-padded to the widest, ``rec_rows(k) * H``."""
    width = max(w.shape[0] for w in w_hh)
    return jnp.stack([jnp.pad(w, ((0, width - w.shape[0]), (0, 0))) for w in w_hh])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_scan(
    cell: str, w_hh: tuple[Array, ...], xw: Array, carry: cells.Carry, lengths: Array | None
) -> tuple[cells.Carry, Array]:
    return _scan(cell, _stack(w_hh), xw, carry, lengths)[0]


def _dense_scan_fwd(
    cell: str, w_hh: tuple[Array, ...], xw: Array, carry: cells.Carry, lengths: Array | None
) -> tuple[tuple[cells.Carry, Array], tuple]:
    w_all = _stack(w_hh)  # a constant of the vjp: its gradient is not accumulated per step
    out, vjp, operands = jax.vjp(
        lambda xw, carry: _scan(cell, w_all, xw, carry, lengths), xw, carry, has_aux=True)
    return out, (vjp, operands, w_hh)


def _dense_scan_bwd(
    cell: str, res: tuple, cotangents: tuple[cells.Carry, Array]
) -> tuple[tuple[Array, ...], Array, cells.Carry, None]:
    vjp, operands, w_hh = res
    k = len(w_hh)
    dxw, dcarry = vjp(cotangents)
    time, batch, width = operands[0].shape
    blocks = time // k + (time % k > 0)  # steps m * k + p, padded to whole blocks
    dz = jnp.pad(jnp.swapaxes(dxw, 0, 1), ((0, blocks * k - time), (0, 0), (0, 0)))
    n_hidden = dxw.shape[-1] // sum(OPERAND_BLOCKS[cell])
    dw = jnp.concatenate([
        jnp.einsum("mpbw,mpbg->pwg",
                   jnp.pad(a, ((0, blocks * k - time), (0, 0), (0, 0))).reshape(
                       blocks, k, batch, width),
                   d.reshape(blocks, k, batch, -1),
                   preferred_element_type=jnp.promote_types(a.dtype, jnp.float32))
        for a, d in zip(operands, jnp.split(dz, _cuts(cell, n_hidden), axis=-1), strict=True)],
        axis=-1)
    dw_hh = tuple(dw[n - 1, : w.shape[0]].astype(w.dtype) for n, w in enumerate(w_hh, 1))
    return dw_hh, dxw, dcarry, None


_dense_scan.defvjp(_dense_scan_fwd, _dense_scan_bwd)


def pytorch_uniform(features: int) -> Initializer:
    """PyTorch's RNN default, uniform in ``[-1/sqrt(H), 1/sqrt(H)]`` (the paper's framework)."""
    return uniform_init(features**-0.5)


class DenseRecurrent(nn.Module):
    """One DenseRNN / DenseGRU / DenseLSTM layer (eq. 2-3, 7-8) of dense depth ``k``.

    Parameters: ``w_ih`` (d, gH) = ``W1``, ``b`` (gH), ``w_hh_{n}`` = ``W2^{(n)}`` for
    ``n = 1..k``. ``__call__(x, lengths) -> (final_carry, (batch, time, H))``.
    """

    cell: str
    features: int
    k: int

    @nn.compact
    def __call__(self, x: Array, lengths: Array | None = None) -> tuple[cells.Carry, Array]:
        """``x``: (batch, time, in_features) -> ``(final_carry, (batch, time, features))``."""
        spec = cells.get_cell(self.cell)
        g = spec.gates * self.features
        init = pytorch_uniform(self.features)
        params = {
            "w_ih": self.param("w_ih", init, (x.shape[-1], g)),
            "b": self.param("b", init, (g,)),
        }
        w_hh = [
            self.param(f"w_hh_{n}", init, (rec_rows(n) * self.features, g))
            for n in range(1, self.k + 1)
        ]
        carry = spec.zero_carry((x.shape[0],), self.features, x.dtype)
        return dense_scan(self.cell, w_hh, cells.project(params, x), carry, lengths)
