"""Mixed precision: bfloat16 compute against float32, float32 parameters and loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn import precision
from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.data import text_classification as tc
from dense_rnn.errors import UserError
from dense_rnn.train import classify, lm
from tests.test_ptb_lm_binary import corpus_dir, tiny  # noqa: F401

# bfloat16 keeps 8 significant bits (relative rounding 2^-9 = 0.2%); the LM's NLL and its
# gradient differ from float32 by well under these bounds.
LOSS_RTOL = 1e-2
GRAD_COSINE = 0.99
PPL_RTOL = 0.03


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
    a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > GRAD_COSINE


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
    losses = {}
    for dtype in ["float32", "bfloat16"]:
        c = dataclasses.replace(config, compute_dtype=dtype)
        params = classify.init_params(model, jax.random.key(0))
        tx = classify.make_optimizer(c, params)
        train_step, _ = classify.make_steps(model, tx, c)
        new, _, losses[dtype], _ = train_step(params, tx.init(params), batch, 0)
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new))
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=LOSS_RTOL)
