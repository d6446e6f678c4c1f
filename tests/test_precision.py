"""Mixed precision: bfloat16 compute against float32, float32 parameters and loss."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn import precision, softmax
from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.data import text_classification as tc
from dense_rnn.errors import UserError
from dense_rnn.train import classify, lm
from tests.test_ptb_lm_binary import corpus_dir, tiny  # noqa: F401

# bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); the NLL and each
# parameter's gradient differ from float32 by well under these bounds (the gradients of
# the tiny models here by 0.1-6%, the largest at biases of HM-DenseLSTM).
LOSS_RTOL = 1e-2
GRAD_RTOL = 0.1
PPL_RTOL = 0.03


def assert_grads_close(got, want):
    """Each parameter's gradient within ``GRAD_RTOL`` (relative, in norm) of float32's: a
    layer's gradient lost in bfloat16 shows, whatever its share of the whole."""
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got),
                            strict=True):
        err = np.linalg.norm(np.ravel(g) - np.ravel(w)) / np.linalg.norm(np.ravel(w))
        assert err < GRAD_RTOL, (jax.tree_util.keystr(path), err)


def one_step(dtype):
    c = dataclasses.replace(CONFIGS["tiny"], vocab_size=50, dropout_rate=0.0)
    model = lm.make_model(c)
    params = lm.init_params(c, jax.random.key(0))
    tx = optax.sgd(1.0)
    x = jax.random.randint(jax.random.key(1), (c.batch_size, c.num_steps), 0, 50)
    y = jnp.roll(x, -1, axis=1)
    step = lm.make_train_step(model, tx, 0, dtype)
    before = jax.tree.map(np.asarray, params)  # the step donates its inputs
    new, _, carries, nll = step(params, tx.init(params), model.zero_carries(4), x, y, 0)
    grads = jax.tree.map(lambda a, b: a - b, before, new)  # lr 1: the update is the gradient
    return nll, grads, new, carries


def test_bfloat16_step_matches_float32():
    nll32, g32, _, _ = one_step(jnp.float32)
    nll16, g16, new16, carries16 = one_step(jnp.bfloat16)
    assert nll16.dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves((new16, carries16)))
    np.testing.assert_allclose(nll16, nll32, rtol=LOSS_RTOL)
    assert_grads_close(g16, g32)


def test_bfloat16_training_run(corpus_dir, tmp_path):  # noqa: F811
    runs = {d: lm.train_and_evaluate(tiny(max_steps=60, compute_dtype=d), corpus_dir,
                                     str(tmp_path / d), log=lambda s: None)
            for d in ["float32", "bfloat16"]}
    np.testing.assert_allclose(runs["bfloat16"]["best_valid_ppl"],
                               runs["float32"]["best_valid_ppl"], rtol=PPL_RTOL)
    np.testing.assert_allclose(runs["bfloat16"]["test_ppl"], runs["float32"]["test_ppl"],
                               rtol=PPL_RTOL)


def test_unknown_dtype():
    with pytest.raises(UserError, match="float32, bfloat16"):
        precision.compute_dtype("float8")


def test_cast_floating_casts_floating_leaves_only():
    tree = {"w": jnp.ones(2), "scale": 0.5, "ids": jnp.arange(2), "n": 3, "mask": jnp.ones(2, bool)}
    cast = precision.cast_floating(tree, jnp.bfloat16)
    assert cast["w"].dtype == cast["scale"].dtype == jnp.bfloat16
    assert cast["ids"].dtype == tree["ids"].dtype and cast["n"] == 3
    assert cast["mask"].dtype == jnp.bool_


@pytest.mark.parametrize("name", ["dc_bilstm", "hm_denselstm_64"])
def test_bfloat16_classifier_step(name):
    config, _ = classify.get_config(name)
    small = {k: v for k, v in {"dl": 2, "dh": 4, "th": 8}.items() if k in config.model_args}
    config = dataclasses.replace(config, embed_size=16, batch_size=8,
                                 model_args={**config.model_args, **small})
    model = classify.make_model(config, vocab_size=30, num_classes=3)
    rng = np.random.default_rng(0)
    ids = [rng.integers(2, 30, rng.integers(1, 12)) for _ in range(8)]
    batch = next(tc.batches(ids, rng.integers(0, 3, 8), 8))
    losses, grads = {}, {}
    for dtype in ["float32", "bfloat16"]:
        c = dataclasses.replace(config, compute_dtype=dtype)
        params = classify.init_params(model, jax.random.key(0))
        tx = optax.sgd(1.0)  # the update is the gradient (the L2 term's included)
        train_step, _ = classify.make_steps(model, tx, c)
        before = jax.tree.map(np.asarray, params)  # the step donates its inputs
        new, _, losses[dtype], _ = train_step(params, tx.init(params), batch, 0)
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new))
        grads[dtype] = jax.tree.map(lambda a, b: a - b, before, new)
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=LOSS_RTOL)
    assert_grads_close(grads["bfloat16"], grads["float32"])


@pytest.mark.parametrize("name", ["dc_bilstm", "hm_densegru_64", "hornn_64"])
def test_classifiers_return_float32_logits_under_bfloat16_parameters(name):
    """As the language model's logits: a user's own cross-entropy gets float32 logits."""
    config, _ = classify.get_config(name)
    model = classify.make_model(config, vocab_size=30, num_classes=3)
    tokens, lengths = jnp.ones((2, 5), jnp.int32), jnp.array([5, 2])
    params = jax.eval_shape(lambda: precision.cast_floating(
        model.init(jax.random.key(0), tokens, lengths), jnp.bfloat16))
    assert jax.eval_shape(model.apply, params, tokens, lengths).dtype == jnp.float32


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_products_match_numpy(dtype):
    """``matmul``, ``matmul_nt`` and ``matmul_tn`` are ``a @ b``, ``a @ b.T`` and
    ``a.T @ b`` of the rounded inputs, returned in float32; ``matmul_nt`` also over a
    leading batch axis (a bidirectional layer's two directions)."""
    shapes = {"a": (5, 7), "b": (7, 3), "c": (5, 3), "e": (3, 7), "p": (2, 5, 7), "q": (2, 3, 7)}
    keys = jax.random.split(jax.random.key(0), len(shapes))
    x = {n: jax.random.normal(k, s, dtype) for k, (n, s) in zip(keys, shapes.items(), strict=True)}
    f = {n: np.asarray(v, np.float64) for n, v in x.items()}
    for got, want in [(precision.matmul(x["a"], x["b"]), f["a"] @ f["b"]),
                      (precision.matmul_nt(x["a"], x["e"]), f["a"] @ f["e"].T),
                      (precision.matmul_nt(x["p"], x["q"]), f["p"] @ f["q"].transpose(0, 2, 1)),
                      (precision.matmul_tn(x["a"], x["c"]), f["a"].T @ f["c"])]:
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _dot_operand_types(hlo: str) -> list[tuple[str, ...]]:
    """The element types of every dot's operands in an HLO module's text."""
    types = dict(re.findall(r"%(\S+) = (\w+)\[", hlo))
    return [tuple(types[o] for o in operands) for operands in
            (re.findall(r"%([\w.\-]+)", args) for args in re.findall(r" dot\(([^)]*)\)", hlo))]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA CPU's choice of kernels")
def test_bfloat16_softmax_gradient_keeps_bfloat16_products():
    """All three products of the softmax layer's bfloat16 training step (logits, d(input),
    d(kernel)) keep bfloat16 operands: on CPU, XLA runs any other form at the float32 rate."""
    n, d, v = 64, 32, 512
    x = jnp.ones((n, d), jnp.bfloat16)
    w, y = jnp.ones((d, v), jnp.bfloat16), jnp.zeros((n,), jnp.int32)

    def loss(x, w):
        return softmax.softmax_cross_entropy(x, w, jnp.zeros((v,), jnp.bfloat16), y).sum()

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).compile().as_text()
    operand_types = _dot_operand_types(hlo)
    assert len(operand_types) == 3
    assert all(t == ("bf16", "bf16") for t in operand_types), operand_types


def test_linear_value_and_gradients_match_numpy(x64):
    """``linear`` and its hand-written backward: ``x @ w``, ``g w^T`` and ``x^T g`` over a
    leading batch shape, against float64 NumPy."""
    k = jax.random.split(jax.random.key(0), 3)
    x, w = jax.random.normal(k[0], (2, 3, 5), jnp.float64), jax.random.normal(k[1], (5, 4))
    g = jax.random.normal(k[2], (2, 3, 4), jnp.float64)
    out, vjp = jax.vjp(precision.linear, x, w)
    dx, dw = vjp(g)
    xn, wn, gn = (np.asarray(a) for a in (x, w, g))
    np.testing.assert_allclose(out, xn @ wn, rtol=1e-12)
    np.testing.assert_allclose(dx, gn @ wn.T, rtol=1e-12)
    np.testing.assert_allclose(dw, xn.reshape(-1, 5).T @ gn.reshape(-1, 4), rtol=1e-12)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA CPU's choice of kernels")
@pytest.mark.parametrize("name", ["zaremba_small", "godin_dense_200x2", "godin_dense_650x2_vd"])
def test_bfloat16_lm_step_keeps_bfloat16_products(name):
    """Every product of a bfloat16 LM training step (input projections, recurrent products
    in both scans, weight gradients, softmax layer) keeps bfloat16 operands."""
    c = dataclasses.replace(CONFIGS[name], vocab_size=64, hidden_size=32, embed_size=32,
                            batch_size=4, num_steps=5)
    model, tx = lm.make_model(c), optax.sgd(1.0)
    params = lm.init_params(c, jax.random.key(0))
    x = jnp.zeros((4, 5), jnp.int32)
    step = lm.make_train_step(model, tx, 0, jnp.bfloat16)
    hlo = step.lower(params, tx.init(params), model.zero_carries(4), x, x, 0).compile().as_text()
    operand_types = _dot_operand_types(hlo)
    assert len(operand_types) >= 3 * 2 * c.num_layers
    assert all(t == ("bf16", "bf16") for t in operand_types), operand_types


def test_bfloat16_parameters_compute_in_bfloat16_whatever_the_carries_dtype():
    """The README's recipe: bfloat16 parameters and float32 carries (a stream's state). Every
    product of the model's gradient keeps bfloat16 operands (a float32 carry would make its
    layer, and the layers and softmax above it, float32), and the carries come back in the
    dtype they came in."""
    c = dataclasses.replace(CONFIGS["tiny"], vocab_size=50)
    model = lm.make_model(c)
    params = precision.cast_floating(lm.init_params(c, jax.random.key(0)), jnp.bfloat16)
    tokens = jnp.zeros((4, 5), jnp.int32)
    for dtype in (jnp.float32, jnp.bfloat16):
        carries = model.zero_carries(4, dtype)

        def loss(p, carries=carries):
            nll, out = model.apply({"params": p}, tokens, carries, tokens)
            return nll.astype(jnp.float32).sum(), out

        (_, out), _ = jax.eval_shape(jax.value_and_grad(loss, has_aux=True), params)
        assert {c.dtype for c in jax.tree.leaves(out)} == {jnp.dtype(dtype)}
        hlo = jax.jit(jax.grad(lambda p: loss(p)[0])).lower(params).compile().as_text()
        operand_types = _dot_operand_types(hlo)
        assert operand_types and all(t == ("bf16", "bf16") for t in operand_types), (
            dtype, operand_types)
