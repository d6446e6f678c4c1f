"""The C++ passes of the softmax layer (``dense_rnn/softmax_kernel.py``): the loss after the
forward product (``csrc/softmax_loss.cc``) and the backward pass (``csrc/softmax_grad.cc``),
against a float64 NumPy reference and XLA's, on shapes off their vectors, register tiles
and blocks, and which steps take them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import native, softmax, softmax_kernel
from dense_rnn.errors import UserError
from tests.conftest import lm_step_off_and_on

# tokens off the 6- or 10-row tiles, features off the 16- or 32-column panels, vocabularies
# off the panels, the 8-panel chunks and the 256-entry blocks; one of each
SHAPES = [(1, 1, 1), (7, 5, 13), (23, 37, 300), (41, 70, 1000), (400, 200, 10000)]


@pytest.fixture
def kernel_on(monkeypatch):
    """The kernel on whatever the CPU (skipped where it cannot build)."""
    monkeypatch.setenv(softmax_kernel.VARIABLE, "on")
    if not softmax_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")


def operands(n, d, v, seed=0):
    """The backward's operands as ``softmax._fwd`` saves them, a target in the last column."""
    k = jax.random.split(jax.random.key(seed), 5)
    x, w = jax.random.normal(k[0], (n, d)), 0.3 * jax.random.normal(k[1], (d, v))
    b, g = jax.random.normal(k[2], (v,)), jax.random.normal(k[4], (n,))
    y = jax.random.randint(k[3], (n,), 0, v).at[-1].set(v - 1)
    x2, kernel, e, inv_total, targets, _ = softmax._fwd(x, w, b, y)[1]
    return x2, kernel, e, inv_total, targets, g


def numpy_grads(x, w, e, inv_total, y, g):
    """``d = g (e / sum(e) - onehot(y))``, ``dx = d W^T``, ``dW = x^T d``, ``db = 1^T d``."""
    x, w, e, inv_total, g = (np.asarray(a, np.float64) for a in (x, w, e, inv_total, g))
    d = g[:, None] * (e * inv_total[:, None] - np.eye(w.shape[1])[np.asarray(y)])
    return d @ w.T, x.T @ d, d.sum(0)


@pytest.mark.parametrize("n, d, v", SHAPES)
def test_matches_float64_numpy(kernel_on, n, d, v):
    ops = operands(n, d, v)
    got = jax.jit(softmax_kernel.backward)(*ops)
    for a, want in zip(got, numpy_grads(*ops), strict=True):
        assert a.shape == want.shape and a.dtype == jnp.float32
        np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("n, d, v", SHAPES[1:])
def test_matches_xlas_backward(kernel_on, n, d, v):
    ops = operands(n, d, v, seed=1)
    got, want = jax.jit(softmax_kernel.backward)(*ops), jax.jit(softmax._xla_grads)(*ops)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_same_results_whatever_the_team(kernel_on):
    """Called again, and beside another call XLA may run at once: bit for bit the same."""
    a, b = operands(41, 70, 1000), operands(41, 70, 1000, seed=2)
    both = jax.jit(lambda a, b: (softmax_kernel.backward(*a), softmax_kernel.backward(*b)))(a, b)
    for got, ops in zip(both, (a, b), strict=True):
        for g, w in zip(got, jax.jit(softmax_kernel.backward)(*ops), strict=True):
            np.testing.assert_array_equal(g, w)


def test_vmapped_gradients_match_one_layer_at_a_time(kernel_on):
    """Under ``jax.vmap`` (an ensemble of layers, say) the kernel runs once per layer."""
    k = jax.random.split(jax.random.key(3), 3)
    x, w = jax.random.normal(k[0], (3, 7, 5)), jax.random.normal(k[1], (3, 5, 13))
    b, y = jnp.zeros((3, 13)), jax.random.randint(k[2], (3, 7), 0, 13)

    def grads(x, w, b, y):
        loss = lambda x, w, b: softmax.softmax_cross_entropy(x, w, b, y).sum()  # noqa: E731
        return jax.grad(loss, (0, 1, 2))(x, w, b)

    together = jax.jit(jax.vmap(grads))(x, w, b, y)
    for i in range(3):
        for got, want in zip(together, grads(x[i], w[i], b[i], y[i]), strict=True):
            np.testing.assert_array_equal(got[i], want)


def numpy_loss(raw, b, y):
    """``nll = log(sum(e)) + m - (raw + b)[y]``, ``e = exp(raw + b - m)``, ``m`` each row's
    maximum: ``(nll, e, 1 / sum(e))``."""
    z = np.asarray(raw, np.float64) + np.asarray(b, np.float64)
    m = z.max(1, keepdims=True)
    e = np.exp(z - m)
    return np.log(e.sum(1)) + m[:, 0] - z[np.arange(len(z)), np.asarray(y)], e, 1 / e.sum(1)


@pytest.mark.parametrize("n, v", [(1, 1), (7, 13), (23, 300), (41, 1000), (400, 10000)])
@pytest.mark.parametrize("save", [True, False], ids=["training", "loss alone"])
def test_loss_matches_float64_numpy(kernel_on, n, v, save):
    """Logits spread over ~40, so that many of ``e`` are far below 1."""
    k = jax.random.split(jax.random.key(4), 3)
    raw, b = 8 * jax.random.normal(k[0], (n, v)), jax.random.normal(k[1], (v,))
    y = jax.random.randint(k[2], (n,), 0, v)
    got = jax.jit(softmax_kernel.forward, static_argnums=3)(raw, b, y, save)
    want = numpy_loss(raw, b, y)
    if not save:
        got, want = (got,), want[:1]
    # e to its argument's float32 rounding (|x| up to ~40: ~3e-6 relative)
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape and a.dtype == jnp.float32
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5 * np.abs(w).min())


def test_loss_exponential_to_float32_precision(kernel_on):
    """``exp(x)`` for x in [-87, 0] (exact float32 arguments: the row's maximum is 0) within
    2 ulp; 0 or below the smallest normal float under ``log(FLT_MIN)``."""
    x = jnp.concatenate([jnp.linspace(-87.0, 0.0, 100_001), jnp.array([-87.5, -100.0, -1e30])])
    _, e, _ = softmax_kernel.forward(x[None], jnp.zeros_like(x), jnp.zeros(1, jnp.int32), True)
    want = np.exp(np.asarray(x, np.float64))
    np.testing.assert_allclose(e[0, :-3], want[:-3], rtol=2.4e-7)
    assert bool(jnp.all(e[0, -3:] <= 1.2e-38))


def test_loss_of_a_nan_logit_or_an_id_out_of_range_is_nan(kernel_on):
    raw = jnp.ones((3, 40)).at[0, 3].set(jnp.nan)
    nll = softmax_kernel.forward(raw, jnp.zeros(40), jnp.array([0, 40, 1]), False)
    assert bool(jnp.isnan(nll[0])) and bool(jnp.isnan(nll[1]))
    np.testing.assert_allclose(nll[2], np.log(40.0), rtol=1e-6)


def uses_forward_kernel(x, w, b, y) -> bool:
    """Whether the layer's loss, traced now (a new function: not a cached trace), calls the
    loss kernel."""
    loss = jax.jit(lambda *a: softmax.softmax_cross_entropy(*a)).lower(x, w, b, y).as_text()
    return native.target("softmax_forward") in loss


def test_which_losses_take_the_kernel(kernel_on, monkeypatch):
    """Every loss whose logits are float32, bfloat16 products' included (they return
    float32); XLA's where the kernel is off, and in float64."""
    x, w, _, _, y, _ = operands(7, 5, 13)
    b = jnp.zeros(13)
    assert uses_forward_kernel(x, w, b, y)
    assert uses_forward_kernel(*(a.astype(jnp.bfloat16) for a in (x, w, b)), y)
    monkeypatch.setenv(softmax_kernel.VARIABLE, "off")
    assert not uses_forward_kernel(x, w, b, y)


def uses_kernel(x, w, b, y) -> bool:
    """Whether the layer's gradient, traced now, calls the kernel."""
    grad = jax.grad(lambda x, w, b: softmax.softmax_cross_entropy(x, w, b, y).sum(), (0, 1, 2))
    return native.target("softmax_backward") in jax.jit(grad).lower(x, w, b).as_text()


def test_which_gradients_take_the_kernel(kernel_on, monkeypatch):
    x, w, e, _, y, _ = operands(7, 5, 13)
    b = jnp.zeros(13)
    assert uses_kernel(x, w, b, y)
    assert not uses_kernel(*(a.astype(jnp.bfloat16) for a in (x, w, b)), y)
    monkeypatch.setenv(softmax_kernel.VARIABLE, "off")
    assert not softmax_kernel.available() and not uses_kernel(x, w, b, y)


def test_lm_training_step_same_with_the_kernel(monkeypatch):
    """An LM's training step with the layer's loss and backward in C++ against XLA's: the
    same loss and update within float32 rounding."""
    (nll_off, new_off), (nll_on, new_on) = lm_step_off_and_on(
        monkeypatch, softmax_kernel.VARIABLE, native.target("softmax_backward"),
        softmax_kernel.available)
    np.testing.assert_allclose(nll_on, nll_off, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(new_on), jax.tree.leaves(new_off), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mode(monkeypatch):
    monkeypatch.setenv(softmax_kernel.VARIABLE, "sometimes")
    with pytest.raises(UserError, match="DENSE_RNN_SOFTMAX_KERNEL=sometimes: use one of"):
        softmax_kernel.available()


@pytest.mark.parametrize("vendor, family, flags, on", [
    ("AuthenticAMD", 26, "avx2 avx512f", True), ("AuthenticAMD", 26, "avx2", False),
    ("AuthenticAMD", 25, "avx2 avx512f", False), ("GenuineIntel", 6, "avx2 avx512f", False),
])
def test_auto_picks_the_kernel_by_cpu(monkeypatch, vendor, family, flags, on):
    """``auto``: on AMD's Zen 5 (CPU family 26) and later with AVX-512, where it was measured
    (RESULTS.md, item 61); ``on`` and ``off`` whatever the CPU."""
    monkeypatch.setattr(native, "cpuinfo", lambda: (f"vendor_id\t: {vendor}\ncpu family\t: "
                                                    f"{family}\nflags\t\t: fpu {flags}"))
    monkeypatch.setattr(native, "cpu_backend", lambda: True)
    monkeypatch.setattr(softmax_kernel, "_loaded", lambda: True)
    monkeypatch.delenv(softmax_kernel.VARIABLE, raising=False)
    assert softmax_kernel.available() == on
    for value in ("on", "off"):
        monkeypatch.setenv(softmax_kernel.VARIABLE, value)
        assert softmax_kernel.available() == (value == "on")
