"""The fused softmax cross-entropy (``softmax.softmax_cross_entropy``): its value and every
gradient against a float64 NumPy reference of the same equation, and against JAX's
autodiff of ``optax.softmax_cross_entropy_with_integer_labels`` in float32; each with the
C++ passes of ``softmax_kernel`` off and on."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn import softmax, softmax_kernel

B, T, D, V = 3, 4, 6, 11


@pytest.fixture(autouse=True, params=["off", "on"], ids=["xla", "kernel"])
def kernel_mode(request, monkeypatch):
    """Every test with the layer's C++ passes off, then on (skipped where they cannot
    build)."""
    monkeypatch.setenv(softmax_kernel.VARIABLE, request.param)
    if request.param == "on" and not softmax_kernel.available():
        pytest.skip("the C++ kernels cannot be built or loaded here")
    return request.param


def inputs(dtype):
    k = jax.random.split(jax.random.key(0), 5)
    return (jax.random.normal(k[0], (B, T, D), dtype), jax.random.normal(k[1], (D, V), dtype),
            jax.random.normal(k[2], (V,), dtype), jax.random.randint(k[3], (B, T), 0, V),
            jax.random.normal(k[4], (B, T), dtype))


def numpy_reference(x, w, b, y, g):
    """``nll = logsumexp(z) - z[y]``, ``z = x W + b``, and the gradients of ``sum(g * nll)``:
    ``dz = g (softmax(z) - onehot(y))``, ``dx = dz W^T``, ``dW = x^T dz``, ``db = sum dz``."""
    x, w, b, g = (np.asarray(a, np.float64) for a in (x, w, b, g))
    y = np.asarray(y)
    z = x @ w + b
    m = z.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(z - m).sum(-1))
    nll = lse - np.take_along_axis(z, y[..., None], -1)[..., 0]
    p = np.exp(z - lse[..., None])
    dz = g[..., None] * (p - np.eye(V)[y])
    flat_x, flat_dz = x.reshape(-1, D), dz.reshape(-1, V)
    return nll, dz @ w.T, flat_x.T @ flat_dz, flat_dz.sum(0)


def fused_value_and_grads(x, w, b, y, g):
    def loss(x, w, b):
        nll = softmax.softmax_cross_entropy(x, w, b, y)
        return jnp.sum(g * nll), nll

    (_, nll), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, w, b)
    return (nll, *grads)


def test_matches_float64_numpy_reference(x64):
    a = inputs(jnp.float64)
    for got, want in zip(fused_value_and_grads(*a), numpy_reference(*a), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)


def test_matches_optax_autodiff_float32():
    x, w, b, y, g = inputs(jnp.float32)

    def loss(x, w, b):
        nll = optax.softmax_cross_entropy_with_integer_labels(x @ w + b, y)
        return jnp.sum(g * nll), nll

    (_, nll), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, w, b)
    for got, want in zip(fused_value_and_grads(x, w, b, y, g), (nll, *grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_module_logits_and_nll_agree(dtype):
    """In bfloat16 the products take bfloat16 inputs but the logits and the softmax are
    float32: logits and NLL are those of the float32 product of the rounded inputs."""
    x, _, _, y, _ = inputs(jnp.float32)
    layer = softmax.SoftmaxOutput(V)
    params = layer.init(jax.random.key(1), x)
    x = x.astype(dtype)
    logits = layer.apply(params, x)
    assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
    nll = layer.apply(params, x, y)
    assert nll.shape == (B, T) and nll.dtype == jnp.float32
    p = jax.tree.map(lambda a: a.astype(dtype).astype(jnp.float32), params["params"])
    exact = x.astype(jnp.float32) @ p["kernel"] + p["bias"]
    np.testing.assert_allclose(logits, exact, rtol=1e-5, atol=1e-5)
    want = optax.softmax_cross_entropy_with_integer_labels(exact, y)
    np.testing.assert_allclose(nll, want, rtol=1e-5, atol=1e-5)


def test_bfloat16_gradients_match_float64_reference():
    """bfloat16 operands (the bias gradient then comes out of the kernel gradient's
    product, ``[x, 1]^T dz``): every gradient is the reference's to bfloat16 precision."""
    a = inputs(jnp.float32)
    x, w, b = (v.astype(jnp.bfloat16) for v in a[:3])
    got = fused_value_and_grads(x, w, b, a[3], a[4])
    assert [v.dtype for v in got] == [jnp.float32] + [jnp.bfloat16] * 3
    for v, want in zip(got, numpy_reference(x, w, b, a[3], a[4]), strict=True):
        np.testing.assert_allclose(np.asarray(v, np.float64), want, rtol=3e-2, atol=3e-2)


def test_nll_of_a_vanishing_target_is_finite():
    """The saved ``exp(logits - max)`` underflows to 0 at the target; the NLL and its
    gradient come from the logit itself."""
    x = jnp.eye(3, 4, dtype=jnp.float32)
    kernel = jnp.zeros((4, 5)).at[0, 0].set(-200.0).at[1, 1].set(150.0)
    bias, y = jnp.zeros(5), jnp.array([0, 0, 2])
    nll = softmax.softmax_cross_entropy(x, kernel, bias, y)
    want = [200.0 + np.log(4.0), 150.0, np.log(5.0)]  # logits [-200, 0, 0, 0, 0], ...
    np.testing.assert_allclose(nll, want, rtol=1e-6)
    grads = jax.grad(lambda k: softmax.softmax_cross_entropy(x, k, bias, y).sum())(kernel)
    assert bool(jnp.all(jnp.isfinite(grads)))


def test_bias_spread_past_the_shift_bound_uses_the_exact_max():
    """The shift ``max(x W) + max(b)`` overshoots a row's maximum by up to the bias's spread;
    at a spread of ~100 every ``exp`` would underflow. Such rows take the exact maximum, and
    value and gradients still match the float64 reference."""
    x, w, b, y, g = inputs(jnp.float32)
    x = x.at[..., -1].set(1.0)
    w, b = w.at[-1, 0].set(-300.0), b.at[0].set(100.0)  # logit 0 ~ -200, bias spread ~100
    raw = x.reshape(-1, D) @ w
    assert float(softmax._shifted_exp(raw, b, exact=False)[2].min()) < softmax._MIN_TOTAL
    for got, want in zip(fused_value_and_grads(x, w, b, y, g),
                         numpy_reference(x, w, b, y, g), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_each_gradient_comes_back_in_its_operands_dtype():
    """A bfloat16 kernel beside a float32 bias: the bias gradient stays float32."""
    x, w, b, y, _ = inputs(jnp.float32)
    grads = jax.grad(lambda w, b: softmax.softmax_cross_entropy(x, w, b, y).sum(),
                     argnums=(0, 1))(w.astype(jnp.bfloat16), b)
    assert [g.dtype for g in grads] == [jnp.bfloat16, jnp.float32]


@pytest.mark.parametrize("targets", [np.zeros((3, 2), np.int32), np.zeros(6, np.int32),
                                     np.zeros((2, 3), np.float32)],
                         ids=["time-major", "flat", "float"])
def test_targets_of_another_shape_or_dtype_are_one_line(targets):
    """Only the element count would otherwise have to match: time-major targets against
    batch-major features would pair the wrong rows silently."""
    x, kernel, bias = jnp.ones((2, 3, 4)), jnp.ones((4, 5)), jnp.zeros(5)
    message = ("softmax_cross_entropy: targets must be integer ids of shape (2, 3) (x's "
               f"leading shape), got {targets.dtype} {targets.shape}")
    with pytest.raises(ValueError, match=re.escape(message)):
        softmax.softmax_cross_entropy(x, kernel, bias, jnp.asarray(targets))
    with pytest.raises(ValueError, match=re.escape(message)):
        softmax.SoftmaxOutput(5).init(jax.random.key(0), x, jnp.asarray(targets))
