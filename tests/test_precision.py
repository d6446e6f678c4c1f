"""Mixed precision: bfloat16 compute against float32, float32 parameters and loss."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn import precision
from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.errors import UserError
from dense_rnn.train import lm
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
