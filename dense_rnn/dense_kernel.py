"""The float32 dense-block layers (GRU, vanilla RNN, LSTM) as one C++ call a sequence, on
AVX-512 CPUs.

``dense_block.dense_scan`` with ``cell="gru"`` (DenseGRU, eq. 7-8; the layers of
``HMDenseStack``), ``cell="rnn"`` (DenseRNN, eq. 3: the GRU's candidate alone) or
``cell="lstm"`` (DenseLSTM: ``cells.lstm_step`` with ``U x~_t`` for ``U h_{t-1}``) and, at
dense depth ``k = 1``, the plain GRU and RNN scans of ``recurrent.scan_cell`` (the plain
LSTM's are ``lstm_kernel``'s): the forward scan, with the residuals its backward needs, and
that backward scan, each one XLA FFI call (``csrc/dense_scan.cc``, built by
``dense_rnn.native``) in place of the ~20 XLA kernels of each step. The GRU step's two
products (``x~ W_rz``, then ``(x~ * r) W_n``), the RNN's and LSTM's one, and the backward's
run the LSTM kernel's register tile over weights packed once a call, the gates beside them;
the batch rows are cut into groups of one tile, each an independent sequence whose steps
XLA's intra-op threads claim one at a time, with no barrier between the threads. ``scan``
is the differentiable layer: the weights' gradients are one XLA product per block position
over the saved operands. ``tests/test_dense_kernel.py`` checks it against float64 NumPy and
XLA's scan.

``DENSE_RNN_DENSE_KERNEL``: ``auto`` (default: x86-64 Linux CPUs with AVX-512), ``on`` (any
x86-64 Linux CPU), ``off`` (XLA's scan).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dense_rnn import native

Array = jax.Array
Carry = Array | tuple[Array, Array]  # h, or the LSTM's (c, h)
# the saved arrays (the GRU's and RNN's gates; the LSTM's gates, c_{t-1} and tanh(c_t)) and,
# per block position, the operands of its products
Residuals = tuple[tuple[Array, ...], tuple[tuple[Array, ...], ...]]
VARIABLE = "DENSE_RNN_DENSE_KERNEL"
GATES = {"gru": 3, "rnn": 1, "lstm": 4}  # the cells the kernel runs, and their gates
OPERANDS = {"gru": 2, "rnn": 1, "lstm": 1}  # saved a block position: x~ (, x~ * tile(r))


def _loaded() -> bool:
    return native.loaded(VARIABLE, "dense GRU, RNN and LSTM scans")


def available() -> bool:
    """Whether float32 dense GRU, RNN and LSTM scans on the CPU run the C++ kernel: as
    ``DENSE_RNN_DENSE_KERNEL`` says, on x86-64 Linux with JAX's default backend the CPU,
    where the kernels build and load."""
    return native.enabled(VARIABLE, native.avx512(), _loaded)


def applies(w_hh: list[Array] | tuple[Array, ...], xw: Array, carry: Carry) -> bool:
    """Whether a dense scan of these operands runs the kernel: the weights ``W2^{(n)}``,
    ``xw (B, T, gH)`` and the carry (``h0`` or ``(c0, h0)``, each ``(B, H)``) all float32,
    and ``available()``."""
    leaves = jax.tree.leaves(carry)
    return (xw.ndim == 3 and all(a.ndim == 2 for a in leaves)
            and all(a.dtype == jnp.float32 for a in (*w_hh, xw, *leaves)) and available())


def forward(w_hh: tuple[Array, ...], xw: Array, carry: Carry, mask: Array | None,
            block_start: bool, save: bool, cell: str = "gru"
            ) -> tuple[Carry, Array, Residuals | None]:
    """The dense GRU, vanilla RNN (``h_t = tanh(xw + x~ W2)``) or LSTM (``cells.lstm_step``
    with ``x~ W2`` for ``h_{t-1} U``) scan over ``xw (B, T, gH)`` from ``carry`` (``h0``, or
    the LSTM's ``(c0, h0)``, ``(B, H)``), ``w_hh[n - 1]`` = ``W2^{(n)}``; ``mask (B, T)`` (a
    prefix one) or None. Returns ``(carry, ys (B, T, H), residuals)``: with ``save`` the
    saved arrays (the gates ``[r, z, n]`` or ``n``; the LSTM's ``[i, f, g, o]``, ``c_{t-1}``
    and ``tanh(c_t)``) and, per block position ``n``, the operands of its products (``x~``,
    and the GRU's ``x~ * tile(r)``), each ``(blocks, B, W2^{(n)}'s rows)`` as
    ``dense_block._scan``'s; else None."""
    batch, time, g = xw.shape
    n_hidden = g // GATES[cell]
    blocks, per = -(-time // len(w_hh)), OPERANDS[cell]
    ops = [(blocks, batch, w.shape[0]) for w in w_hh for _ in range(per)] if save else []
    step = (batch, time, n_hidden)
    w = jnp.concatenate(w_hh, axis=0)
    attrs = {"k": len(w_hh), "block_start": block_start}
    if cell == "lstm":
        c0, h0 = carry
        saved = [xw.shape, step, step] if save else [(0,)] * 3
        ys, c, h, *rest = native.call("dense_lstm_forward", [step, c0.shape, h0.shape, *saved,
                                                             *ops],
                                      w, xw, c0, h0, native.optional(mask), **attrs,
                                      variable=VARIABLE)
        carry, saved, ops = (c, h), tuple(rest[:3]), rest[3:]
    else:
        ys, carry, acts, *ops = native.call(
            "gru_forward", [step, carry.shape, xw.shape if save else (0,), *ops], w, xw, carry,
            native.optional(mask), **attrs, gru=cell == "gru",
            variable=VARIABLE)
        saved = (acts,)
    grouped = tuple(tuple(ops[i: i + per]) for i in range(0, len(ops), per))
    return carry, ys, (saved, grouped) if save else None


def backward(w_hh: tuple[Array, ...], dys: Array, dcarry: Carry, mask: Array | None,
             block_start: bool, res: Residuals, cell: str = "gru") -> tuple[Array, Carry]:
    """The backward scan of ``forward``: the gates' pre-activation gradients ``dxw (B, T,
    gH)`` and the initial carry's cotangent, from the final carry's ``dcarry`` and ``dys``."""
    saved, ops = res
    w = jnp.concatenate(w_hh, axis=0)
    attrs = {"k": len(w_hh), "block_start": block_start}
    if cell == "lstm":
        dc, dh = dcarry
        dxw, dc0, dh0 = native.call("dense_lstm_backward", [saved[0].shape, dc.shape, dh.shape],
                                    w, dys, dc, dh, native.optional(mask), *saved,
                                    *jax.tree.leaves(ops), **attrs, variable=VARIABLE)
        return dxw, (dc0, dh0)
    dxw, dh0 = native.call("gru_backward", [saved[0].shape, dcarry.shape], w, dys, dcarry,
                           native.optional(mask), *saved, *jax.tree.leaves(ops), **attrs,
                           gru=cell == "gru", variable=VARIABLE)
    return dxw, dh0


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def scan(w_hh: tuple[Array, ...], xw: Array, carry: Carry, mask: Array | None,
         block_start: bool, cell: str = "gru") -> tuple[Carry, Array]:
    """``forward``'s ``(carry, ys)``, differentiable: the kernel's backward for ``xw`` and
    the carry; for each ``W2^{(n)}`` one product over its block position's steps of the
    saved operands and the gates' gradients (the GRU's ``x~^T d_rz`` beside ``(x~ *
    tile(r))^T d_n``; the RNN's and LSTM's ``x~^T dxw``), rather than a small product
    accumulated at every step."""
    return forward(w_hh, xw, carry, mask, block_start, False, cell)[:2]


def _scan_fwd(w_hh: tuple[Array, ...], xw: Array, carry: Carry, mask: Array | None,
              block_start: bool, cell: str) -> tuple[tuple[Carry, Array], tuple]:
    carry, ys, res = forward(w_hh, xw, carry, mask, block_start, True, cell)
    return (carry, ys), (w_hh, mask, res)


def _scan_bwd(block_start: bool, cell: str, res: tuple, cotangents: tuple[Carry, Array]
              ) -> tuple[tuple[Array, ...], Array, Carry, None]:
    w_hh, mask, (saved, operands) = res
    dxw, dcarry = backward(w_hh, cotangents[1], cotangents[0], mask, block_start,
                           (saved, operands), cell)
    batch, time, g = dxw.shape
    k = len(w_hh)
    blocks = operands[0][0].shape[0]
    dz = jnp.pad(dxw, ((0, 0), (0, blocks * k - time), (0, 0))).reshape(batch, blocks, k, g)
    cuts = [0, 2 * g // 3, g] if cell == "gru" else [0, g]  # the columns each operand meets
    # the operands are block-major and dz batch-major: one einsum each over (blocks, batch)
    dw = tuple(
        jnp.concatenate([jnp.einsum("mbw,bmg->wg", a, dz[:, :, n, lo:hi])
                         for a, lo, hi in zip(ops, cuts[:-1], cuts[1:], strict=True)], axis=-1)
        for n, ops in enumerate(operands))
    return dw, dxw, dcarry, None


scan.defvjp(_scan_fwd, _scan_bwd)
