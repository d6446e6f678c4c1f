"""The float32 dense GRU and vanilla RNN layers as one C++ call a sequence, on AVX-512 CPUs.

``dense_block.dense_scan`` with ``cell="gru"`` (DenseGRU, eq. 7-8; the layers of
``HMDenseStack``) or ``cell="rnn"`` (DenseRNN, eq. 3: the GRU's candidate alone) and, at
dense depth ``k = 1``, the plain GRU and RNN scans of ``recurrent.scan_cell``: the forward
scan, with the residuals its backward needs, and that backward scan, each one XLA FFI call
(``csrc/gru_scan.cc``, built by ``dense_rnn.native``) in place of the ~20 XLA kernels of
each step. The GRU step's two products (``x~ W_rz``, then ``(x~ * r) W_n``) and the
backward's two run the LSTM kernel's register tile over weights packed once a call, the
gates beside them; the batch rows are cut into groups of one tile, each an independent
sequence whose steps XLA's intra-op threads claim one at a time, with no barrier between the
threads. ``scan`` is the differentiable layer: the weights' gradients are one XLA product
per block position over the saved operands. ``tests/test_gru_kernel.py`` checks it against
float64 NumPy and XLA's scan.

``DENSE_RNN_GRU_KERNEL``: ``auto`` (default: x86-64 Linux CPUs with AVX-512), ``on`` (any
x86-64 Linux CPU), ``off`` (XLA's scan).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dense_rnn import native

Array = jax.Array
Residuals = tuple[Array, tuple[tuple[Array, ...], ...]]  # gates, operands by position
VARIABLE = "DENSE_RNN_GRU_KERNEL"
GATES = {"gru": 3, "rnn": 1}  # the cells the kernel runs, and their gates
OPERANDS = {"gru": 2, "rnn": 1}  # saved a block position: x~ (and x~ * tile(r))


def _loaded() -> bool:
    return native.loaded(VARIABLE, "GRU and RNN scans")


def available() -> bool:
    """Whether float32 GRU and RNN scans on the CPU run the C++ kernel: as
    ``DENSE_RNN_GRU_KERNEL`` says, on x86-64 Linux with JAX's default backend the CPU,
    where the kernels build and load."""
    return native.enabled(VARIABLE, native.avx512(), _loaded)


def applies(w_hh: list[Array] | tuple[Array, ...], xw: Array, h0: Array) -> bool:
    """Whether a dense GRU or RNN scan of these operands runs the kernel: the weights
    ``W2^{(n)}``, ``xw (B, T, gH)`` and ``h0 (B, H)`` all float32, and ``available()``."""
    return (xw.ndim == 3 and h0.ndim == 2
            and all(a.dtype == jnp.float32 for a in (*w_hh, xw, h0)) and available())



def forward(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
            block_start: bool, save: bool, cell: str = "gru"
            ) -> tuple[Array, Array, Residuals | None]:
    """The dense GRU (or, with ``cell="rnn"``, vanilla RNN: ``h_t = tanh(xw + x~ W2)``)
    scan over ``xw (B, T, gH)`` from ``h0 (B, H)``, ``w_hh[n - 1]`` = ``W2^{(n)}``; ``mask
    (B, T)`` (a prefix one) or None. Returns ``(h, ys (B, T, H), residuals)``: with
    ``save`` the gates (``[r, z, n]``, or ``n``) and, per block position ``n``, the
    operands of its products (``x~`` and ``x~ * tile(r)``, or ``x~``), each ``(blocks, B,
    W2^{(n)}'s rows)`` as ``dense_block._scan``'s; else None."""
    batch, time, g = xw.shape
    blocks, per = -(-time // len(w_hh)), OPERANDS[cell]
    ops = [(blocks, batch, w.shape[0]) for w in w_hh for _ in range(per)] if save else []
    shapes = [(batch, time, g // GATES[cell]), h0.shape, xw.shape if save else (0,), *ops]
    ys, h, acts, *ops = native.call("gru_forward", shapes, jnp.concatenate(w_hh, axis=0), xw,
                                    h0, native.optional(mask), k=len(w_hh),
                                    block_start=block_start, gru=cell == "gru")
    grouped = tuple(tuple(ops[i: i + per]) for i in range(0, len(ops), per))
    return h, ys, (acts, grouped) if save else None


def backward(w_hh: tuple[Array, ...], dys: Array, dh: Array, mask: Array | None,
             block_start: bool, res: Residuals, cell: str = "gru") -> tuple[Array, Array]:
    """The backward scan of ``forward``: the gates' pre-activation gradients ``dxw (B, T,
    gH)`` and the initial carry's ``dh0``, from the final carry's ``dh`` and ``dys``."""
    acts, ops = res
    dxw, dh0 = native.call("gru_backward", [acts.shape, dh.shape],
                           jnp.concatenate(w_hh, axis=0), dys, dh, native.optional(mask), acts,
                           *jax.tree.leaves(ops), k=len(w_hh), block_start=block_start,
                           gru=cell == "gru")
    return dxw, dh0


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def scan(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
         block_start: bool, cell: str = "gru") -> tuple[Array, Array]:
    """``forward``'s ``(h, ys)``, differentiable: the kernel's backward for ``xw`` and
    ``h0``; for each ``W2^{(n)}`` one product over its block position's steps of the saved
    operands and the gates' gradients (the GRU's ``x~^T d_rz`` beside ``(x~ * tile(r))^T
    d_n``, the vanilla RNN's ``x~^T d_n``), rather than a small product accumulated at
    every step."""
    return forward(w_hh, xw, h0, mask, block_start, False, cell)[:2]


def _scan_fwd(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
              block_start: bool, cell: str) -> tuple[tuple[Array, Array], tuple]:
    h, ys, res = forward(w_hh, xw, h0, mask, block_start, True, cell)
    return (h, ys), (w_hh, mask, res)


def _scan_bwd(block_start: bool, cell: str, res: tuple, cotangents: tuple[Array, Array]
              ) -> tuple[tuple[Array, ...], Array, Array, None]:
    w_hh, mask, (acts, operands) = res
    dxw, dh0 = backward(w_hh, cotangents[1], cotangents[0], mask, block_start,
                        (acts, operands), cell)
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
    return dw, dxw, dh0, None


scan.defvjp(_scan_fwd, _scan_bwd)
