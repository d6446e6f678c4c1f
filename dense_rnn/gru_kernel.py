"""The float32 dense GRU layer as one C++ call a sequence, on AVX-512 CPUs.

``dense_block.dense_scan`` with ``cell="gru"`` (DenseGRU, eq. 7-8; the layers of
``HMDenseStack``) and, at dense depth ``k = 1``, the plain GRU scans of
``recurrent.scan_cell``: the forward scan, with the residuals its backward needs, and that
backward scan, each one XLA FFI call (``csrc/gru_scan.cc``, built by ``dense_rnn.native``)
in place of the ~20 XLA kernels of each step. The step's two products (``x~ W_rz``, then
``(x~ * r) W_n``) and the backward's two run the LSTM kernel's register tile over weights
packed once a call, the gates beside them; the batch rows are cut into groups of one tile,
each an independent sequence whose steps XLA's intra-op threads claim one at a time, with
no barrier between the threads. ``scan`` is the differentiable layer: the weights'
gradients are one XLA product per block position over the saved operands.
``tests/test_gru_kernel.py`` checks it against float64 NumPy and XLA's scan.

``DENSE_RNN_GRU_KERNEL``: ``auto`` (default: x86-64 Linux CPUs with AVX-512), ``on`` (any
x86-64 Linux CPU), ``off`` (XLA's scan).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dense_rnn import native

Array = jax.Array
VARIABLE = "DENSE_RNN_GRU_KERNEL"


def mode() -> str:
    """``DENSE_RNN_GRU_KERNEL``, one of ``native.MODES``; an unknown value raises
    ``UserError``."""
    return native.mode(VARIABLE)


def _loaded() -> bool:
    return native.loaded(VARIABLE, "GRU scans")


def available() -> bool:
    """Whether float32 dense GRU scans on the CPU run the C++ kernel: as
    ``DENSE_RNN_GRU_KERNEL`` says, on x86-64 Linux with JAX's default backend the CPU,
    where the kernels build and load."""
    return native.enabled(VARIABLE, native.avx512(), _loaded)


def applies(w_hh: list[Array] | tuple[Array, ...], xw: Array, h0: Array) -> bool:
    """Whether a dense GRU scan of these operands runs the kernel: the weights ``W2^{(n)}``,
    ``xw (B, T, 3H)`` and ``h0 (B, H)`` all float32, and ``available()``."""
    return (xw.ndim == 3 and h0.ndim == 2
            and all(a.dtype == jnp.float32 for a in (*w_hh, xw, h0)) and available())


def _call(name: str, shapes: list[tuple[int, ...]], *args: Array, **attrs) -> list[Array]:
    outs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.ffi.ffi_call(native.target(name), outs, vmap_method="sequential")(*args, **attrs)


def _mask(mask: Array | None) -> Array:
    return jnp.zeros((0,), jnp.float32) if mask is None else mask.astype(jnp.float32)


Residuals = tuple[Array, tuple[tuple[Array, Array], ...]]  # gates, operands by position


def forward(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
            block_start: bool, save: bool) -> tuple[Array, Array, Residuals | None]:
    """The dense GRU scan over ``xw (B, T, 3H)`` from ``h0 (B, H)``, ``w_hh[n - 1]`` =
    ``W2^{(n)}``; ``mask (B, T)`` (a prefix one) or None. Returns ``(h, ys (B, T, H),
    residuals)``: with ``save`` the gates ``[r, z, n]`` (B, T, 3H) and, per block position
    ``n``, the operands ``x~`` and ``x~ * tile(r)`` of its products, each ``(blocks, B,
    W2^{(n)}'s rows)`` as ``dense_block._scan``'s; else None."""
    if isinstance(lib := native.library(), str):
        raise RuntimeError(f"the C++ GRU kernel is unavailable: {lib}")
    batch, time, g = xw.shape
    blocks = -(-time // len(w_hh))
    ops = [(blocks, batch, w.shape[0]) for w in w_hh for _ in range(2)] if save else []
    shapes = [(batch, time, g // 3), h0.shape, xw.shape if save else (0,), *ops]
    ys, h, acts, *ops = _call("gru_forward", shapes, jnp.concatenate(w_hh, axis=0), xw, h0,
                              _mask(mask), k=len(w_hh), block_start=block_start)
    return h, ys, (acts, tuple(zip(ops[::2], ops[1::2], strict=True))) if save else None


def backward(w_hh: tuple[Array, ...], dys: Array, dh: Array, mask: Array | None,
             block_start: bool, res: Residuals) -> tuple[Array, Array]:
    """The backward scan of ``forward``: the gates' pre-activation gradients ``dxw (B, T,
    3H)`` and the initial carry's ``dh0``, from the final carry's ``dh`` and ``dys``."""
    acts, ops = res
    dxw, dh0 = _call("gru_backward", [acts.shape, dh.shape], jnp.concatenate(w_hh, axis=0),
                     dys, dh, _mask(mask), acts, *jax.tree.leaves(ops), k=len(w_hh),
                     block_start=block_start)
    return dxw, dh0


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def scan(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
         block_start: bool) -> tuple[Array, Array]:
    """``forward``'s ``(h, ys)``, differentiable: the kernel's backward for ``xw`` and
    ``h0``; for each ``W2^{(n)}`` one product over its block position's steps of the saved
    operands and the gates' gradients (``x~^T d_rz`` beside ``(x~ * tile(r))^T d_n``),
    rather than a small product accumulated at every step."""
    return forward(w_hh, xw, h0, mask, block_start, False)[:2]


def _scan_fwd(w_hh: tuple[Array, ...], xw: Array, h0: Array, mask: Array | None,
              block_start: bool) -> tuple[tuple[Array, Array], tuple]:
    h, ys, res = forward(w_hh, xw, h0, mask, block_start, True)
    return (h, ys), (w_hh, mask, res)


def _scan_bwd(block_start: bool, res: tuple, cotangents: tuple[Array, Array]
              ) -> tuple[tuple[Array, ...], Array, Array, None]:
    w_hh, mask, (acts, operands) = res
    dxw, dh0 = backward(w_hh, cotangents[1], cotangents[0], mask, block_start, (acts, operands))
    batch, time, g = dxw.shape
    k, rz = len(w_hh), 2 * g // 3
    blocks = operands[0][0].shape[0]
    dz = jnp.pad(dxw, ((0, 0), (0, blocks * k - time), (0, 0))).reshape(batch, blocks, k, g)
    # the operands are block-major and dz batch-major: one einsum each over (blocks, batch)
    dw = tuple(
        jnp.concatenate([jnp.einsum("mbw,bmg->wg", rec, dz[:, :, n, :rz]),
                         jnp.einsum("mbw,bmg->wg", gated, dz[:, :, n, rz:])], axis=-1)
        for n, (rec, gated) in enumerate(operands))
    return dw, dxw, dh0, None


scan.defvjp(_scan_fwd, _scan_bwd)
