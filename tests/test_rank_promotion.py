"""Every model's training and evaluation steps under ``jax_numpy_rank_promotion="raise"``
(the setting of codebases that forbid implicit rank broadcasting), with the C++ kernels
where they apply and without them (the XLA paths of GPUs and TPUs)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.data import text_classification as tc
from dense_rnn.train import classify, lm

KERNELS = ("DENSE_RNN_LSTM_KERNEL", "DENSE_RNN_DENSE_KERNEL", "DENSE_RNN_SOFTMAX_KERNEL")


@pytest.fixture(params=["default", "off"])
def kernels(request, monkeypatch):
    """The C++ kernels as the platform chooses them, then all off."""
    for variable in KERNELS:
        if request.param == "off":
            monkeypatch.setenv(variable, "off")
        else:
            monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("connectivity, variational", [
    ("dense", False), ("stacked", False), ("dense", True)])
def test_language_model_steps(kernels, connectivity, variational):
    c = dataclasses.replace(CONFIGS["tiny"], vocab_size=50, connectivity=connectivity,
                            variational=variational)
    x = jax.random.randint(jax.random.key(1), (c.batch_size, c.num_steps), 0, 50)
    with jax.numpy_rank_promotion("raise"):
        model, params, tx = lm.make_model(c), lm.init_params(c, jax.random.key(0)), optax.sgd(1.0)
        train = lm.make_train_step(model, tx, 0, jnp.float32)
        params, _, _, nll = train(params, tx.init(params), model.zero_carries(4), x, x, 0)
        _, eval_nll = lm.make_eval_step(model, jnp.float32)(params, model.zero_carries(4), x, x)
    assert np.isfinite(nll) and np.all(np.isfinite(eval_nll))


@pytest.mark.parametrize("name", ["dc_bilstm", "hm_densernn_64", "hm_densegru_64",
                                  "hm_denselstm_64", "stacked_lstm_64", "hornn_64"])
def test_classifier_steps(kernels, name):
    config, _ = classify.get_config(name)
    small = {k: v for k, v in {"dl": 2, "dh": 4, "th": 8}.items() if k in config.model_args}
    config = dataclasses.replace(config, embed_size=16, batch_size=8,
                                 model_args={**config.model_args, **small})
    rng = np.random.default_rng(0)
    ids = [rng.integers(2, 30, rng.integers(1, 12)) for _ in range(8)]
    batch = next(tc.batches(ids, rng.integers(0, 3, 8), 8))
    with jax.numpy_rank_promotion("raise"):
        model = classify.make_model(config, vocab_size=30, num_classes=3)
        params, tx = classify.init_params(model, jax.random.key(0)), optax.adam(1e-3)
        train_step, eval_step = classify.make_steps(model, tx, config)
        params, _, loss, _ = train_step(params, tx.init(params), batch, 0)
        correct = eval_step(params, batch)
    assert np.isfinite(loss) and 0 <= int(correct) <= 8
