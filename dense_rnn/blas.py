"""Float32 matrix products through a BLAS on Intel CPUs, as an XLA FFI custom call.

On Intel Xeons XLA's float32 products run at 0.7-0.9x the rate of the BLAS libraries
(``benchmarks/RESULTS.md``, items 37-39); on AMD EPYCs XLA's are the faster. So on an Intel
CPU the large float32 products of ``dense_rnn.precision`` call ``sgemm`` from the OpenBLAS
that NumPy ships, with no copies: ``csrc/blas_gemm.cc`` is an XLA FFI handler (built by
``dense_rnn.native``) that splits the product into row blocks over XLA's own intra-op
threads, one single-threaded ``sgemm`` each. Where the handler or NumPy's OpenBLAS is
missing, the products stay XLA's.

``DENSE_RNN_BLAS``: ``auto`` (default: Intel x86-64 Linux CPUs), ``on`` (any x86-64 Linux
CPU), ``off``.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import jax
import jax.numpy as jnp
import numpy as np

from dense_rnn import native

TARGET = native.target("sgemm")
VARIABLE = "DENSE_RNN_BLAS"
# Products with fewer multiply-adds stay XLA's: (700, 200) x (200, 800), 112M, ran at
# 0.86-0.92x XLA's rate through the handler (RESULTS.md, item 39).
MIN_MACS = 1 << 27


def mode() -> str:
    """``DENSE_RNN_BLAS``, one of ``native.MODES``; an unknown value raises ``UserError``."""
    return native.mode(VARIABLE)


def _openblas() -> ctypes.CDLL:
    """NumPy's OpenBLAS (the ``scipy_openblas64`` its wheels bundle), already loaded."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so*")))
    if not found:
        raise OSError(f"no libscipy_openblas64_ under {os.path.normpath(libs)}")
    return ctypes.CDLL(found[0])


@functools.cache
def _handler() -> bool:
    """Hands NumPy's OpenBLAS to the compiled handler once; why it cannot is logged once."""
    lib = native.library()
    try:
        if isinstance(lib, str):
            raise OSError(lib)
        blas = _openblas()
        lib.dense_rnn_set_blas(ctypes.cast(blas.scipy_cblas_sgemm64_, ctypes.c_void_p),
                               ctypes.cast(blas.openblas_set_num_threads_local,
                                           ctypes.c_void_p))
    except (OSError, AttributeError) as e:
        native.unavailable(VARIABLE, f"float32 products stay XLA's; the BLAS handler is "
                           f"unavailable: {e}")
        return False
    return True


def available() -> bool:
    """Whether large float32 products on the CPU go through the BLAS handler: as
    ``DENSE_RNN_BLAS`` says, on x86-64 Linux with JAX's default backend the CPU, where the
    handler builds and loads."""
    return native.enabled(VARIABLE, native.intel(), _handler)


def applies(a: jax.Array, b: jax.Array, macs: int) -> bool:
    """Whether ``gemm`` should compute a product of 2-D ``a`` and ``b`` of ``macs``
    multiply-adds (float32, large enough, and the handler available)."""
    return (a.ndim == b.ndim == 2 and a.dtype == b.dtype == jnp.float32
            and macs >= MIN_MACS and available())


def _ffi(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> jax.Array:
    if not (a.ndim == b.ndim == 2 and a.dtype == b.dtype == jnp.float32
            and a.shape[0 if trans_a else 1] == b.shape[1 if trans_b else 0]):
        raise TypeError(f"blas.gemm takes 2-D float32 operands whose contracted sizes agree, "
                        f"got {a.dtype}{a.shape} (trans_a={trans_a}) and {b.dtype}{b.shape} "
                        f"(trans_b={trans_b})")
    m, n = a.shape[1 if trans_a else 0], b.shape[0 if trans_b else 1]
    out = jax.ShapeDtypeStruct((m, n), jnp.float32)
    call = jax.ffi.ffi_call(TARGET, out, vmap_method="sequential")
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


def _xla(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> jax.Array:
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def gemm(a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """``op(a) @ op(b)`` for 2-D float32 ``a``, ``b`` (``op`` transposes where ``trans_*``):
    the BLAS handler on a CPU where ``available()``, else XLA's product. Reverse-mode
    differentiable (its gradients are ``gemm``s too)."""
    trans = {"trans_a": trans_a, "trans_b": trans_b}
    cpu = _ffi if available() else _xla
    return jax.lax.platform_dependent(a, b, cpu=functools.partial(cpu, **trans),
                                      default=functools.partial(_xla, **trans))


def _gemm_fwd(
    a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return gemm(a, b, trans_a, trans_b), (a, b)


def _gemm_bwd(
    trans_a: bool, trans_b: bool, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    a, b = residuals  # C = op(a) op(b): d op(a) = g op(b)^T, d op(b) = op(a)^T g
    da = gemm(b, g, trans_b, True) if trans_a else gemm(g, b, False, not trans_b)
    db = gemm(g, a, True, trans_a) if trans_b else gemm(a, g, not trans_a, False)
    return da, db


gemm.defvjp(_gemm_fwd, _gemm_bwd)
