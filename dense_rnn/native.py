"""The C++ kernels of ``csrc/``: XLA FFI handlers, compiled on first use and registered.

Every ``csrc/*.cc`` is compiled into one shared library with the system C++ compiler
(``$CXX``, default ``c++``) and JAX's FFI headers, for the CPU it runs on
(``-march=native``; several seconds), and cached in ``$DENSE_RNN_CACHE`` (default
``~/.cache/dense_rnn``) under a key of the sources, the headers, the JAX version and the
CPU (its model and flags). Each handler of ``HANDLERS`` is registered as the XLA CPU target
``target(name)``. Where no compiler is found or the build fails, ``library()`` says why and
the callers (``blas``, ``lstm_kernel``, ``dense_kernel``, ``softmax_kernel``) keep XLA's own
kernels.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import logging
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable

import jax
import jax.numpy as jnp

from dense_rnn.errors import UserError

MODES = ("auto", "on", "off")
HANDLERS = {"sgemm": "DenseRnnSgemm", "lstm_forward": "DenseRnnLstmForward",
            "lstm_backward": "DenseRnnLstmBackward", "gru_forward": "DenseRnnGruForward",
            "gru_backward": "DenseRnnGruBackward", "dense_lstm_forward": "DenseRnnDenseLstmForward",
            "dense_lstm_backward": "DenseRnnDenseLstmBackward",
            "softmax_forward": "DenseRnnSoftmaxForward",
            "softmax_backward": "DenseRnnSoftmaxBackward"}
_CSRC = os.path.join(os.path.dirname(__file__), "csrc")
_SOURCES = sorted(glob.glob(os.path.join(_CSRC, "*.cc")))
_HEADERS = sorted(glob.glob(os.path.join(_CSRC, "*.h")))
# a copy of the package under another name (benchmarks.ab's) registers targets of its own
_PREFIX = __name__.rsplit(".", 1)[0].replace(".", "_")
_log = logging.getLogger(__name__)


def target(name: str) -> str:
    """The XLA custom-call target of handler ``name`` (a key of ``HANDLERS``)."""
    return f"{_PREFIX}_{name}"


def mode(variable: str) -> str:
    """The environment ``variable``'s value, one of ``MODES`` (unset: ``auto``); an
    unknown value raises ``UserError``."""
    value = os.environ.get(variable, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise UserError(f"{variable}={value}: use one of {', '.join(MODES)}")
    return value


@functools.cache
def cpuinfo() -> str:
    """The first processor's entry of ``/proc/cpuinfo`` ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read(1 << 16).split("\n\n")[0]
    except OSError:
        return ""


def intel() -> bool:
    """Whether the CPU is an Intel one."""
    return "GenuineIntel" in cpuinfo()


def amd_family() -> int:
    """The CPU family of an AMD CPU (26 for Zen 5, 25 for Zen 3 and 4), 0 for another CPU."""
    if "AuthenticAMD" not in cpuinfo():
        return 0
    for line in cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu family" and value.strip().isdigit():
            return int(value)
    return 0


def avx512() -> bool:
    """Whether the CPU has AVX-512 (where the scan kernels are on by default)."""
    return " avx512f" in cpuinfo()


def cpu_backend() -> bool:
    """Whether the kernels can run: x86-64 Linux with JAX's default backend the CPU."""
    return (sys.platform.startswith("linux") and platform.machine() == "x86_64"
            and jax.default_backend() == "cpu")


def enabled(variable: str, default: bool, ready: Callable[[], bool]) -> bool:
    """Whether a kernel runs, as the environment ``variable`` says (``off``: never, ``on``: on
    any CPU ``cpu_backend()`` allows, ``auto``: where ``default`` too), and ``ready()``."""
    wanted = mode(variable)
    if wanted == "off" or not cpu_backend():
        return False
    return (wanted == "on" or default) and ready()


def unavailable(variable: str, message: str) -> None:
    """Logs why a kernel stays off: a warning where ``variable`` asked for it (``on``)."""
    _log.log(logging.WARNING if mode(variable) == "on" else logging.INFO, "dense_rnn: %s",
             message)


@functools.cache
def loaded(variable: str, what: str) -> bool:
    """Whether the kernels built and loaded; where not, says once (``unavailable``) that
    ``what`` stay XLA's, and why."""
    lib = library()
    if isinstance(lib, str):
        unavailable(variable, f"{what} stay XLA's; the C++ kernels are unavailable: {lib}")
        return False
    return True


def _build() -> str:
    """The compiled library's path, built into the cache unless it is there already."""
    include = jax.ffi.include_dir()
    cpu = [line for line in cpuinfo().splitlines()  # not "cpu MHz", which drifts
           if line.split(":")[0].strip() in ("vendor_id", "model name", "flags")]
    key = hashlib.sha256("\n".join([include, jax.__version__, *cpu]).encode())
    for source in _SOURCES + _HEADERS:
        with open(source, "rb") as f:
            key.update(f.read())
    cache = os.environ.get("DENSE_RNN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dense_rnn")
    path = os.path.join(cache, f"kernels-{key.hexdigest()[:16]}.so")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    cmd = [os.environ.get("CXX", "c++"), "-O3", "-march=native", "-ffp-contract=fast",
           "-std=c++17", "-shared", "-fPIC", "-w", f"-I{include}", *_SOURCES, "-o", tmp]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(tmp, path)  # atomic: concurrent builders each leave a whole file
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


@functools.cache
def library() -> ctypes.CDLL | str:
    """The kernels, built, loaded and registered once; or, as a string, why they cannot be."""
    try:
        lib = ctypes.CDLL(_build())
        for name, symbol in HANDLERS.items():
            jax.ffi.register_ffi_target(target(name), jax.ffi.pycapsule(getattr(lib, symbol)),
                                        platform="cpu")
    except (OSError, AttributeError, subprocess.CalledProcessError) as e:
        if isinstance(e, subprocess.CalledProcessError):
            return ((e.stderr or "").strip().splitlines() or [f"{e.cmd[0]} failed"])[-1]
        return str(e)
    return lib


def call(name: str, shapes: list[tuple[int, ...]], *args: jax.Array, variable: str,
         **attrs) -> list[jax.Array]:
    """Handler ``name``'s float32 results of ``shapes`` for ``args`` and the attributes
    ``attrs``; raises ``RuntimeError`` where the kernels are unavailable. A handler has no
    derivative (the callers' ``jax.custom_vjp`` rules call them): differentiating one, as a
    gradient of a gradient does, raises ``NotImplementedError`` naming ``variable``, the
    environment variable that turns it off."""
    if isinstance(lib := library(), str):
        raise RuntimeError(f"the C++ kernels are unavailable: {lib}")
    outs = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    ffi = jax.ffi.ffi_call(target(name), outs, vmap_method="sequential")

    @jax.custom_jvp
    def run(*operands: jax.Array) -> list[jax.Array]:
        return ffi(*operands, **attrs)

    @run.defjvp
    def _no_derivative(primals: tuple, tangents: tuple) -> tuple:
        raise NotImplementedError(
            f"dense_rnn's C++ kernel {name} has no derivative, so a gradient of a gradient "
            f"(jax.hessian, a gradient penalty) cannot pass through it: set {variable}=off "
            "before the function is traced, for JAX's own ops")

    return run(*args)


def optional(x: jax.Array | None) -> jax.Array:
    """An operand a handler may go without, in float32: ``x``, or an empty array for None."""
    return jnp.zeros((0,), jnp.float32) if x is None else x.astype(jnp.float32)


def note(compute_dtype: str) -> str:
    """What a binary's start-up line adds: which C++ kernels its float32 steps run ("" for
    none)."""
    # they build on this module
    from dense_rnn import blas, dense_kernel, lstm_kernel, softmax_kernel

    if compute_dtype != "float32":
        return ""
    return (", large products through OpenBLAS" if blas.available() else "") + (
        ", LSTM scans in C++" if lstm_kernel.available() else "") + (
        ", dense-block scans in C++" if dense_kernel.available() else "") + (
        ", the softmax layer's loss and backward in C++" if softmax_kernel.available() else "")
