"""Recurrent layers: a cell's step scanned over time with ``jax.lax.scan``.

The input projection of every time step is one matrix product outside the scan
(``cells.project``); only the recurrent product ``h @ w_hh`` runs inside it. Inputs and
outputs are batch-major ``(batch, time, features)``; ``lax.scan`` runs time-major, the C++
kernels of ``lstm_kernel`` and ``dense_kernel`` on the batch-major arrays as they lie.

Padding is first-class: given ``lengths``, steps at ``t >= length`` leave the carry
untouched and output zeros, and a reversed layer starts each sequence at its own last
real token, so outputs at real positions do not depend on the padding that follows.
Lengths are clamped to ``[0, time]``: a length past the padded length means the whole row.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from dense_rnn import cells, dense_kernel, lstm_kernel, precision

Array = jax.Array
Initializer = Callable[..., Array]


def uniform_init(scale: float) -> Initializer:
    """Uniform in ``[-scale, scale]`` (Zaremba et al., Godin et al.)."""

    def init(key: Array, shape: tuple[int, ...], dtype: DTypeLike = jnp.float32) -> Array:
        return jax.random.uniform(key, shape, dtype, -scale, scale)

    return init


def clamp_lengths(lengths: Array, max_len: int) -> Array:
    """``lengths`` as int32, clipped to ``[0, max_len]``: a length past the padded length is
    the whole row. int32 first: an unsigned ``lengths`` would wrap ``max_len`` and ``- 1``."""
    return jnp.clip(jnp.asarray(lengths).astype(jnp.int32), 0, max_len)


def length_mask(lengths: Array, max_len: int) -> Array:
    """``(batch, time)`` boolean mask, true at real (non-padding) positions."""
    return jnp.arange(max_len)[None, :] < lengths[:, None]


def describe(a: object) -> str:
    """``a``'s dtype and shape, or its type if it is not an array (a list, a scalar)."""
    dtype = getattr(a, "dtype", None)
    return type(a).__name__ if dtype is None else f"{dtype} {jnp.shape(a)}"


def check_sequence(layer: str, x: Array, lengths: Array | None) -> None:
    """Raises a one-line ``ValueError`` unless ``x`` is (batch, time, features) and
    ``lengths`` is ``None`` or integer ``(batch,)``."""
    if not hasattr(x, "ndim"):
        raise ValueError(f"{layer}: x must be an array (batch, time, features), got "
                         f"{describe(x)}; pass jnp.asarray(x)")
    if x.ndim != 3:
        fix = ("add a batch axis with x[None]" if x.ndim < 3 else
               "fold the extra axes into the batch with x.reshape(-1, *x.shape[-2:])")
        raise ValueError(f"{layer}: x must be (batch, time, features), got shape {x.shape}; "
                         f"{fix}")
    check_lengths(layer, lengths, x.shape[0])


def check_lengths(layer: str, lengths: Array | None, batch: int) -> None:
    """Raises a one-line ``ValueError`` unless ``lengths`` is ``None`` or integer
    ``(batch,)``."""
    dtype = getattr(lengths, "dtype", None)  # None: a list or a scalar, not an array
    if lengths is not None and (dtype is None or jnp.shape(lengths) != (batch,)
                                or not jnp.issubdtype(dtype, jnp.integer)):
        raise ValueError(f"{layer}: lengths must be an integer array of shape ({batch},), "
                         f"one per sequence, got {describe(lengths)}")


def check_tokens(model: str, tokens: Array, targets: Array | None = None,
                 lengths: Array | None = None) -> None:
    """Raises a one-line ``ValueError`` unless ``tokens`` (and ``targets``, if given) are
    integer (batch, time) arrays of one shape and ``lengths`` is ``None`` or integer
    ``(batch,)``."""
    for name, a in (("tokens", tokens), ("targets", targets)):
        dtype = getattr(a, "dtype", None)
        if a is not None and (dtype is None or jnp.ndim(a) != 2
                              or not jnp.issubdtype(dtype, jnp.integer)):
            hint = f"; add a batch axis with {name}[None]" if getattr(a, "ndim", 0) == 1 else ""
            raise ValueError(f"{model}: {name} must be integer ids of shape (batch, time), got "
                             f"{describe(a)}{hint}")
    if targets is not None and targets.shape != tokens.shape:
        raise ValueError(f"{model}: targets {targets.shape} must have the shape of tokens "
                         f"{tokens.shape}")
    check_lengths(model, lengths, tokens.shape[0])


def check_sizes(layer: str, **sizes: int) -> None:
    """Raises a one-line ``ValueError`` unless every size (features, classes...) is >= 1."""
    bad = ", ".join(f"{name}={n}" for name, n in sizes.items() if n < 1)
    if bad:
        raise ValueError(f"{layer}: {bad}; sizes must be at least 1")


def check_per_layer(layer: str, name: str, values: Any, example: str) -> None:
    """Raises a one-line ``ValueError`` unless ``values`` is a non-empty sequence of
    positive integers, one per layer (``features=4`` where ``(4, 4)`` was meant, say)."""
    if isinstance(values, numbers.Integral) or not isinstance(values, Sequence) or not values \
            or not all(isinstance(n, numbers.Integral) and n > 0 for n in values):
        raise ValueError(f"{layer}: {name}={values!r} must be a sequence of positive integers, "
                         f"one per layer, e.g. {name}={example}")


def lengths_hint(carry: Any, place: str = "the carry") -> str:
    """A note for an error about ``carry`` when it looks like sequence lengths (a 1-D integer
    array, or a list or tuple of Python integers), given positionally in ``place``; else
    ``""``."""
    def integer(a: Any, ndim: int) -> bool:  # an integer array (or int) of rank ``ndim``
        return (isinstance(a, int) or hasattr(a, "dtype")) and jnp.ndim(a) == ndim and \
            jnp.issubdtype(jnp.result_type(a), jnp.integer)

    leaves = jax.tree.leaves(carry)
    if (len(leaves) == 1 and integer(leaves[0], 1)) or (
            isinstance(carry, (list, tuple)) and carry
            and all(integer(v, 0) for v in carry)):
        return f"; sequence lengths go in lengths=, after {place}"
    return ""


def layer_carries(layer: str, carries: Any, n: int) -> Any:
    """A stack's ``carries``, one initial carry per layer of ``n`` (None: ``n`` Nones for
    zeros); a one-line ``ValueError`` for another count, or for lengths in their place."""
    # checked first: where the batch equals the number of layers, the count would pass
    if hint := lengths_hint(carries, "the carries"):
        raise ValueError(f"{layer}: carries must be one carry per layer, or None for zeros, "
                         f"got {describe(carries)}{hint}")
    if carries is None:
        return (None,) * n
    if len(carries) != n:
        raise ValueError(f"{layer}: carries has {len(carries)} entries for {n} layers; pass "
                         "one carry per layer, or None for zeros")
    return carries


def initial_carry(layer: str, spec: cells.Cell, carry: cells.Carry | None, batch: int,
                  features: int, dtype: DTypeLike) -> cells.Carry:
    """``carry``, or the zero carry if ``None``, every part in ``dtype`` promoted with the
    carry's own (a float32 carry stays float32 under bfloat16 parameters); a one-line
    ``ValueError`` if its structure or shapes are not those of ``spec.zero_carry``."""
    zero = spec.zero_carry((batch,), features, dtype)
    if carry is None:
        return zero
    given = carry
    carry = jax.tree.map(jnp.asarray, tuple(carry) if isinstance(carry, list) else carry)
    shapes, expected = jax.tree.map(jnp.shape, carry), jax.tree.map(jnp.shape, zero)
    if jax.tree.structure(carry) != jax.tree.structure(zero) or shapes != expected:
        raise ValueError(f"{layer}: carry must be shaped like zero_carry({batch}), {expected}; "
                         f"got {shapes}{lengths_hint(given)}")
    common = jnp.result_type(dtype, *jax.tree.leaves(carry))
    return jax.tree.map(lambda c: c.astype(common), carry)


def _recurrent_mask(layer: str, mask: Array, h: Array) -> Array:
    """``mask`` in the dtype and shape of ``h`` (the scan's carry keeps its dtype, a float32
    mask on a bfloat16 layer included); a one-line ``ValueError`` unless it broadcasts to
    ``h``'s (batch, features) without growing it."""
    try:
        grown = jnp.broadcast_shapes(jnp.shape(mask), h.shape) != h.shape
    except ValueError:
        grown = True
    if grown:
        raise ValueError(f"{layer}: recurrent_mask must broadcast to (batch, features) "
                         f"{h.shape}, got {describe(mask)}")
    return jnp.broadcast_to(jnp.asarray(mask).astype(h.dtype), h.shape)


def drawn_wide(init: Initializer) -> Initializer:
    """``init`` drawn in at least float32, then cast to the requested dtype: some
    initializers (``orthogonal``'s QR) have no bfloat16 kernel."""

    def wide(key: Array, shape: tuple[int, ...], dtype: DTypeLike = jnp.float32) -> Array:
        return init(key, shape, jnp.promote_types(dtype, jnp.float32)).astype(dtype)

    return wide


def reverse_padded(x: Array, lengths: Array | None) -> Array:
    """Reverses each sequence of ``x`` (batch, time, ...) within its own length.

    Padding positions stay where they are; the map is its own inverse. ``lengths``:
    ``(batch,)`` real lengths, clamped to the padded length.
    """
    if lengths is None:
        return jnp.flip(x, axis=1)
    lengths = clamp_lengths(lengths, x.shape[1])
    t = jnp.arange(x.shape[1])[None, :]
    idx = jnp.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _fast_lstm(cell: cells.Cell) -> bool:
    """Whether ``cell`` is the plain LSTM, which runs on ``lstm_scan`` (hand-written backward)."""
    return cell.name == "lstm" and cell.step is cells.lstm_step


def _kernel_cell(cell: cells.Cell, params: cells.Params, xw: Array, carry: cells.Carry) -> bool:
    """Whether ``cell`` is the plain GRU or vanilla RNN in float32 on an AVX-512 CPU, which
    runs as the C++ dense-block kernel at dense depth 1 (``dense_kernel``)."""
    steps = {"gru": cells.gru_step, "rnn": cells.rnn_step}
    return steps.get(cell.name) is cell.step and dense_kernel.applies((params["w_hh"],), xw, carry)


def scan_cell(
    cell: cells.Cell,
    params: cells.Params,
    xw: Array,
    carry: cells.Carry,
    lengths: Array | None = None,
    reverse: bool = False,
    unroll: int = 1,
    recurrent_mask: Array | None = None,
    bias: Array | None = None,
) -> tuple[cells.Carry, Array]:
    """Runs ``cell.step`` over a pre-projected sequence ``xw`` (batch, time, gates).

    Args:
      cell: the cell whose step to scan.
      params: the cell's parameters (``w_hh`` is the one used here).
      xw: input projections of every step, ``cells.project(params, x)``.
      carry: initial carry, batch-major.
      lengths: optional ``(batch,)`` real lengths, clamped to the padded length; steps
        past them are padding.
      reverse: run from each sequence's last real token back to its first.
      unroll: ``lax.scan`` unroll factor.
      recurrent_mask: optional ``(batch, hidden)`` dropout mask (already scaled) applied
        to ``h_{t-1}`` in the recurrent product, the same at every step (Gal & Ghahramani
        2016), in the carry's dtype. LSTM only: there ``h_{t-1}`` enters the step through
        that product alone.
      bias: optional ``(gates,)`` added to ``xw`` at every step, for an ``xw`` projected
        without it (``cells.project(params, x, bias=False)``): the LSTM kernel adds it as it
        reads ``xw``, saving a pass over the sequence.

    Returns:
      ``(final_carry, outputs)``; outputs are ``(batch, time, hidden)``, zero at padding.
      With ``lengths``, the final carry is the carry after each sequence's last real step.
    """
    if recurrent_mask is not None and not _fast_lstm(cell):
        raise ValueError("recurrent (variational) dropout is implemented for the LSTM only "
                         "(cells.lstm_step)")
    if recurrent_mask is not None:  # the scan keeps its carry's dtype
        recurrent_mask = jnp.asarray(recurrent_mask).astype(carry[1].dtype)
    if reverse:
        xw = reverse_padded(xw, lengths)
    mask = None if lengths is None else length_mask(lengths, xw.shape[1])  # (batch, time)
    if _fast_lstm(cell):  # batch-major, as xw; the C++ kernel adds the bias as it reads xw
        carry, ys = lstm_scan(params["w_hh"], xw, carry, mask, recurrent_mask, unroll, bias)
    else:
        xw = xw if bias is None else xw + jnp.expand_dims(bias, (-3, -2))
        if _kernel_cell(cell, params, xw, carry):  # batch-major too
            carry, ys = dense_kernel.scan((params["w_hh"],), xw, carry, mask, False, cell.name)
        else:  # a time-major lax.scan
            xs, mask = jnp.swapaxes(xw, 0, 1), None if mask is None else mask.T
            carry, ys = _generic_scan(cell, params, xs, carry, mask, unroll)
            ys = jnp.swapaxes(ys, 0, 1)
    if reverse:
        ys = reverse_padded(ys, lengths)
    return carry, ys


def _generic_scan(
    cell: cells.Cell,
    params: cells.Params,
    xs: Array,
    carry: cells.Carry,
    mask: Array | None,
    unroll: int,
) -> tuple[cells.Carry, Array]:
    """``cell.step`` scanned over time-major ``xs``; differentiated by JAX."""

    def body(carry: cells.Carry, inputs: tuple[Array, Array | None]) -> tuple[cells.Carry, Array]:
        xw_t, m_t = inputs
        new_carry, y = cell.step(params, carry, xw_t)
        if m_t is not None:
            keep = m_t[:, None]
            new_carry = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new_carry, carry)
            y = jnp.where(keep, y, 0.0)
        return new_carry, y

    return jax.lax.scan(body, carry, (xs, mask), unroll=unroll)


def _lstm_forward(
    w_hh: Array,
    xs: Array,
    carry: tuple[Array, Array],
    mask: Array | None,
    rmask: Array | None,
    b: Array | None,
    unroll: int,
    save: bool,
) -> tuple[tuple[Array, Array], Array, lstm_kernel.Residuals | None]:
    """The LSTM scan of ``cells.lstm_step`` (its gates and ``cells.lstm_update``) over
    ``xs + b``; with ``save`` it also returns per step the residuals its backward pass
    needs. In float32 on an AVX-512 CPU, one call of the C++ kernel (``lstm_kernel``)."""
    xla = functools.partial(_xla_lstm_forward, unroll=unroll, save=save)
    if not lstm_kernel.applies(w_hh, xs, *carry, rmask, b):
        return xla(w_hh, xs, carry, mask, rmask, b)
    return jax.lax.platform_dependent(
        w_hh, xs, carry, mask, rmask, b, default=xla,
        cpu=lambda w, x, c, m, r, b: lstm_kernel.forward(w, x, c, m, r, save, b))


def _xla_lstm_forward(
    w_hh: Array,
    xs: Array,
    carry: tuple[Array, Array],
    mask: Array | None,
    rmask: Array | None,
    b: Array | None,
    unroll: int,
    save: bool,
) -> tuple[tuple[Array, Array], Array, lstm_kernel.Residuals | None]:
    """``_lstm_forward`` as a ``lax.scan`` of XLA's kernels, over ``xs`` moved time-major."""
    if b is not None:  # (4H) or (D, 4H), over every batch row and step
        xs = xs + jnp.expand_dims(b, (-3, -2))
    if rmask is not None:
        rmask = jnp.broadcast_to(rmask, carry[1].shape)

    def body(
        carry: tuple[Array, Array], inputs: tuple[Array, Array | None]
    ) -> tuple[tuple[Array, Array], tuple[Array, tuple[Array, Array, Array, Array] | None]]:
        c, h = carry
        xw_t, m_t = inputs
        h_in = h if rmask is None else h * rmask
        acts = cells.lstm_gates(xw_t + cells.recurrent_product(h_in, w_hh))
        c_new, tc, h_new = cells.lstm_update(acts, c)
        res = (acts, c, tc, h) if save else None
        if m_t is None:
            return (c_new, h_new), (h_new, res)
        keep = m_t[:, None]
        new = (jnp.where(keep, c_new, c), jnp.where(keep, h_new, h))
        return new, (jnp.where(keep, h_new, 0.0), res)

    carry, (ys, res) = jax.lax.scan(body, carry, (jnp.moveaxis(xs, -2, 0),
                                                  None if mask is None else mask.T),
                                    unroll=unroll)
    if save:  # h_{t-1} in the layout of the gates' gradients dW_hh multiplies it with
        res = (*res[:3], jnp.moveaxis(res[3], 0, -2))
    return carry, jnp.moveaxis(ys, 0, -2), res


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def lstm_scan(w_hh: Array, xs: Array, carry: tuple[Array, Array], mask: Array | None,
              rmask: Array | None, unroll: int = 1, b: Array | None = None
              ) -> tuple[tuple[Array, Array], Array]:
    """The LSTM over batch-major pre-projected inputs ``xs`` (batch, time, 4H), with a
    hand-written backward pass; the outputs are (batch, time, H). With a leading direction
    axis on ``w_hh`` (D, H, 4H), ``xs`` (D, batch, time, 4H) and the carry (D, batch, H), D
    independent LSTMs run in one scan (a bidirectional layer's two directions, the backward
    one on reversed inputs).

    ``mask`` (batch, time) marks real steps (padding keeps the carry and outputs 0),
    ``rmask`` (batch, H) or (D, batch, H) is the recurrent dropout mask on ``h_{t-1}``;
    ``b`` (4H) or (D, 4H), if given, is added to ``xs`` (the C++ kernel adds it as it reads
    ``xs``, with no pass of its own over the sequence). The
    forward scan computes all four gates in one elementwise pass and saves them as one
    array. The backward scan carries only ``(dc, dh)`` and emits the gate gradients ``dz``;
    the weight gradient is then one matrix product over all steps, ``sum_t h_{t-1}^T dz_t``,
    instead of a small product accumulated at every step. In float32 on an AVX-512 CPU each of
    the two scans is one call of a C++ kernel (``lstm_kernel``) with the same arithmetic.
    """
    carry, ys, _ = _lstm_forward(w_hh, xs, carry, mask, rmask, b, unroll, save=False)
    return carry, ys


def _lstm_scan_fwd(
    w_hh: Array,
    xs: Array,
    carry: tuple[Array, Array],
    mask: Array | None,
    rmask: Array | None,
    unroll: int,
    b: Array | None,
) -> tuple[tuple[tuple[Array, Array], Array], tuple]:
    carry, ys, res = _lstm_forward(w_hh, xs, carry, mask, rmask, b, unroll, save=True)
    # empty arrays carry xs's and b's dtypes, which the gradients must have, to the backward
    b_dtype = None if b is None else jnp.empty((0,), b.dtype)
    return (carry, ys), (w_hh, jnp.empty((0,), xs.dtype), b_dtype, mask, rmask, res)


def _lstm_scan_bwd(
    unroll: int, residuals: tuple, cotangents: tuple[tuple[Array, Array], Array]
) -> tuple[Array, Array, tuple[Array, Array], None, Array | None, Array | None]:
    w_hh, xs_dtype, b_dtype, mask, rmask, res = residuals
    dcarry, dys = cotangents
    xla = functools.partial(_xla_lstm_backward, unroll=unroll)
    if lstm_kernel.applies(w_hh, dys, *dcarry, rmask, *res):
        dzs, (dc0, dh0), drmask = jax.lax.platform_dependent(
            w_hh, dys, dcarry, mask, rmask, res, cpu=lstm_kernel.backward, default=xla)
    else:
        dzs, (dc0, dh0), drmask = xla(w_hh, dys, dcarry, mask, rmask, res)
    if rmask is not None:  # a mask broadcast against h (one (batch, H) mask for D
        # directions, say) gets its gradient summed over the axes it was broadcast along
        drmask = _sum_to_shape(drmask, rmask.shape).astype(rmask.dtype)
    h_prev = res[-1] if rmask is None else res[-1] * jnp.expand_dims(  # over time
        jnp.broadcast_to(rmask, dcarry[1].shape), -2)
    dw = jax.vmap(_sum_over_steps) if w_hh.ndim == 3 else _sum_over_steps
    # each gradient in its primal's dtype (a float32 carry under bfloat16 weights, say)
    dcarry = (dc0.astype(res[1].dtype), dh0.astype(res[-1].dtype))
    # the bias's: summed over the batch and the steps, in at least float32
    db = None if b_dtype is None else dzs.sum(
        (-3, -2), dtype=jnp.promote_types(dzs.dtype, jnp.float32)).astype(b_dtype.dtype)
    return (dw(h_prev, dzs).astype(w_hh.dtype), dzs.astype(xs_dtype.dtype), dcarry, None,
            drmask, db)


def _xla_lstm_backward(
    w_hh: Array,
    dys: Array,
    dcarry: tuple[Array, Array],
    mask: Array | None,
    rmask: Array | None,
    res: lstm_kernel.Residuals,
    unroll: int,
) -> tuple[Array, tuple[Array, Array], Array | None]:
    """The backward scan of ``lstm_scan`` as a ``lax.scan`` of XLA's kernels, time-major:
    the gates' gradients ``dzs`` (batch-major, as ``dys``), the initial carry's cotangents
    and, with ``rmask``, its gradient at the carry's shape."""
    dc_last, dh_last = dcarry
    rmask = None if rmask is None else jnp.broadcast_to(rmask, dh_last.shape)
    # h_{t-1}, time-major, only for the recurrent mask's gradient
    res = (*res[:3], None if rmask is None else jnp.moveaxis(res[3], -2, 0))

    def body(
        carry: tuple[Array, Array, Array | None],
        inputs: tuple[Array, Array | None, tuple[Array, Array, Array, Array]],
    ) -> tuple[tuple[Array, Array, Array | None], Array]:
        dc, dh, drmask = carry
        dy, m_t, (acts, c_prev, tc, h_prev) = inputs
        i, f, g, o = jnp.split(acts, 4, axis=-1)
        dh_out, dc_out = dh + dy, dc
        if m_t is not None:  # padding: the carry passed through unchanged
            keep = m_t[:, None]
            dh_out, dc_out = jnp.where(keep, dh_out, 0.0), jnp.where(keep, dc, 0.0)
            dh, dc = jnp.where(keep, 0.0, dh), jnp.where(keep, 0.0, dc)
        else:
            dh, dc = 0.0, 0.0
        dc_new = dc_out + dh_out * o * (1.0 - tc * tc)
        dz = jnp.concatenate([
            dc_new * g * i * (1.0 - i), dc_new * c_prev * f * (1.0 - f),
            dc_new * i * (1.0 - g * g), dh_out * tc * o * (1.0 - o)], axis=-1)
        dh_in = precision.matmul_nt(dz, w_hh, use_blas=False).astype(dz.dtype)
        if rmask is not None:
            drmask = drmask + (h_prev * dh_in).astype(drmask.dtype)
            dh_in = dh_in * rmask
        return (dc + dc_new * f, dh + dh_in, drmask), dz

    drmask0 = None if rmask is None else jnp.zeros(
        dh_last.shape, jnp.promote_types(rmask.dtype, dh_last.dtype))
    (dc0, dh0, drmask), dzs = jax.lax.scan(
        body, (dc_last, dh_last, drmask0),
        (jnp.moveaxis(dys, -2, 0), None if mask is None else mask.T, res), reverse=True,
        unroll=unroll)
    return jnp.moveaxis(dzs, 0, -2), (dc0, dh0), drmask


def _sum_to_shape(x: Array, shape: tuple[int, ...]) -> Array:
    """``x`` summed over the axes along which an array of ``shape`` broadcast to it."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
    return x.sum(axes).reshape(shape) if axes else x


def _sum_over_steps(h: Array, dz: Array) -> Array:
    """``sum_t h_t^T dz_t`` over ``h`` (batch, time, H) and ``dz`` (batch, time, G), as one
    product."""
    return precision.matmul_tn(h.reshape(-1, h.shape[-1]), dz.reshape(-1, dz.shape[-1]))


lstm_scan.defvjp(_lstm_scan_fwd, _lstm_scan_bwd)


def layer_param(module: nn.Module, name: str, init: Initializer,
                shape: tuple[int, ...]) -> Array:
    """A parameter of ``module``, drawn by ``init`` (``drawn_wide``) in its ``param_dtype``."""
    return module.param(name, drawn_wide(init), shape, module.param_dtype)


def make_cell_params(module: nn.Module, input_features: int) -> cells.Params:
    """``w_ih``, ``w_hh`` and ``b`` of ``module``'s cell, created in ``module``'s scope (in
    its ``param_dtype``)."""
    g = cells.get_cell(module.cell).gates * module.features
    return {
        "w_ih": layer_param(module, "w_ih", module.kernel_init, (input_features, g)),
        "w_hh": layer_param(module, "w_hh", module.recurrent_init, (module.features, g)),
        "b": layer_param(module, "b", module.bias_init, (g,)),
    }


class CellParams(nn.Module):
    """The parameters of one direction of a ``Bidirectional`` layer (as a ``Recurrent``'s)."""

    cell: str
    features: int
    kernel_init: Initializer
    recurrent_init: Initializer
    bias_init: Initializer
    param_dtype: DTypeLike

    @nn.compact
    def __call__(self, input_features: int) -> cells.Params:
        """This direction's ``w_ih``, ``w_hh`` and ``b`` (``make_cell_params``)."""
        return make_cell_params(self, input_features)


class Recurrent(nn.Module):
    """One recurrent layer over a whole sequence.

    Attributes:
      cell: ``"lstm"``, ``"gru"`` or ``"rnn"`` (see ``cells.CELLS``).
      features: hidden size.
      reverse: process each sequence from its last real token to its first.
      unroll: ``lax.scan`` unroll factor.
      kernel_init / recurrent_init / bias_init: initializers of ``w_ih``, ``w_hh`` and ``b``.
      param_dtype: the parameters' dtype (float32 also under ``jax_enable_x64``).
    """

    cell: str
    features: int
    reverse: bool = False
    unroll: int = 1
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()
    param_dtype: DTypeLike = jnp.float32

    def cell_params(self, input_features: int) -> cells.Params:
        """This layer's ``w_ih``, ``w_hh`` and ``b`` (``make_cell_params``)."""
        return make_cell_params(self, input_features)

    def zero_carry(self, batch: int, dtype: DTypeLike | None = None) -> cells.Carry:
        """The cell's zero carry for ``batch`` sequences, in ``dtype`` (default: the
        parameters')."""
        return cells.get_cell(self.cell).zero_carry((batch,), self.features,
                                                    dtype or self.param_dtype)

    @nn.compact
    def __call__(
        self,
        x: Array,
        carry: cells.Carry | None = None,
        lengths: Array | None = None,
        recurrent_mask: Array | None = None,
    ) -> tuple[cells.Carry, Array]:
        """``x``: (batch, time, in_features) -> ``(final_carry, (batch, time, features))``.

        ``carry``: initial carry, shaped like ``zero_carry`` (default zeros); ``lengths``:
        optional ``(batch,)`` real lengths, clamped to the padded length;
        ``recurrent_mask``: see ``scan_cell``.
        """
        check_sequence("Recurrent", x, lengths)
        check_sizes("Recurrent", features=self.features)
        if not isinstance(self.reverse, (bool, np.bool_)):  # Recurrent("lstm", 64, 4), say
            raise ValueError(f"Recurrent: reverse={self.reverse!r} must be True or False; "
                             "give unroll= by name")
        params = self.cell_params(x.shape[-1])
        # every time step in one matrix product; the scan adds the bias (scan_cell)
        xw = cells.project(params, x, bias=False)
        spec = cells.get_cell(self.cell)
        # in the dtype of x and the parameters promoted, as nn.Dense's output
        carry = initial_carry("Recurrent", spec, carry, x.shape[0], self.features, xw.dtype)
        if recurrent_mask is not None and spec.name == "lstm":
            recurrent_mask = _recurrent_mask("Recurrent", recurrent_mask, carry[1])
        return scan_cell(spec, params, xw, carry, lengths, self.reverse, self.unroll,
                         recurrent_mask, params["b"])


class Bidirectional(nn.Module):
    """A forward and a backward ``Recurrent`` layer; outputs concatenated ``[fwd; bwd]``.

    The backward layer starts at each sequence's last real token, so with ``lengths``
    the outputs at real positions are independent of padding.

    Attributes:
      cell: ``"lstm"``, ``"gru"`` or ``"rnn"`` (see ``cells.CELLS``).
      features: hidden size of each direction (outputs have ``2 * features``).
      unroll: ``lax.scan`` unroll factor.
      kernel_init / recurrent_init / bias_init: initializers of ``w_ih``, ``w_hh`` and ``b``
        (both directions).
      param_dtype: the parameters' dtype (float32 also under ``jax_enable_x64``).
    """

    cell: str
    features: int
    unroll: int = 1
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_init: Initializer = nn.initializers.orthogonal()
    bias_init: Initializer = nn.initializers.zeros_init()
    param_dtype: DTypeLike = jnp.float32

    def zero_carry(self, batch: int, dtype: DTypeLike | None = None
                   ) -> tuple[cells.Carry, cells.Carry]:
        """The (forward, backward) pair of zero carries for ``batch`` sequences, in
        ``dtype`` (default: the parameters')."""
        zero = cells.get_cell(self.cell).zero_carry((batch,), self.features,
                                                    dtype or self.param_dtype)
        return zero, zero

    @nn.compact
    def __call__(
        self,
        x: Array,
        carry: tuple[cells.Carry, cells.Carry] | None = None,
        lengths: Array | None = None,
        recurrent_mask: tuple[Array, Array] | Array | None = None,
    ) -> tuple[tuple[cells.Carry, cells.Carry], Array]:
        """``x``: (batch, time, in_features) -> ``((fwd_carry, bwd_carry), (batch, time,
        2 * features))``; ``carry``: a (forward, backward) pair of initial carries, each
        shaped like ``Recurrent.zero_carry`` (default zeros); ``lengths``: optional
        ``(batch,)`` real lengths, clamped to the padded length; ``recurrent_mask``: a
        (forward, backward) pair of ``scan_cell`` masks (LSTM only), or one
        ``(2, batch, features)`` array.

        Both directions' input projections are one matrix product; for the LSTM both
        directions then run in one scan (``lstm_scan`` with a direction axis)."""
        check_sequence("Bidirectional", x, lengths)
        check_sizes("Bidirectional", features=self.features)
        if recurrent_mask is not None and not _per_direction(recurrent_mask):
            # not one 2-D mask for both: (2, features) could be a pair of (features,) masks
            raise ValueError("Bidirectional: recurrent_mask must be a (forward, backward) pair "
                             "of (batch, features) masks, or one (2, batch, features) array")
        kw = dict(cell=self.cell, features=self.features, kernel_init=self.kernel_init,
                  recurrent_init=self.recurrent_init, bias_init=self.bias_init,
                  param_dtype=self.param_dtype)
        pf = CellParams(**kw, name="fwd")(x.shape[-1])
        pb = CellParams(**kw, name="bwd")(x.shape[-1])
        spec = cells.get_cell(self.cell)
        # both directions' projections in one product; the scans add the biases
        xw = cells.project(jax.tree.map(lambda a, b: jnp.concatenate([a, b], -1), pf, pb), x,
                           bias=False)
        xf, xb = jnp.split(xw, 2, axis=-1)
        hint = "" if carry is None else lengths_hint(carry)
        if carry is not None and (hint or not _per_direction(carry)):
            raise ValueError("Bidirectional: carry must be a (forward, backward) pair of "
                             "carries (for a GRU or RNN also one (2, batch, features) array), "
                             f"or None for zeros{hint}")
        carry = tuple(initial_carry("Bidirectional (each direction)", spec, c, x.shape[0],
                                    self.features, xw.dtype)
                      for c in ((None, None) if carry is None else carry))
        rmask = (None, None) if recurrent_mask is None else recurrent_mask
        if recurrent_mask is not None and spec.name == "lstm":
            rmask = tuple(_recurrent_mask("Bidirectional (each direction)", m, c[1])
                          for m, c in zip(rmask, carry, strict=True))
        if not _fast_lstm(spec):
            cf, yf = scan_cell(spec, pf, xf, carry[0], lengths, False, self.unroll, rmask[0],
                               pf["b"])
            cb, yb = scan_cell(spec, pb, xb, carry[1], lengths, True, self.unroll, rmask[1],
                               pb["b"])
            return (cf, cb), jnp.concatenate([yf, yb], axis=-1)
        xs = jnp.stack([xf, reverse_padded(xb, lengths)])  # (direction, batch, time, 4H)
        mask = None if lengths is None else length_mask(lengths, x.shape[1])
        (c, h), ys = lstm_scan(
            jnp.stack([pf["w_hh"], pb["w_hh"]]), xs, jax.tree.map(_stack2, *carry), mask,
            None if recurrent_mask is None else jnp.stack(rmask), self.unroll,
            jnp.stack([pf["b"], pb["b"]]))
        return ((c[0], h[0]), (c[1], h[1])), jnp.concatenate(
            [ys[0], reverse_padded(ys[1], lengths)], axis=-1)


def _per_direction(v: object) -> bool:
    """Whether ``v`` is one value per direction: a pair, or an array (2, batch, H)."""
    return (isinstance(v, tuple | list) or getattr(v, "ndim", 0) == 3) and len(v) == 2


def _stack2(a: Array, b: Array) -> Array:
    return jnp.stack([a, b])
