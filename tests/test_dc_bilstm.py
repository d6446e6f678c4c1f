"""DC-Bi-LSTM (Ding et al. 2018): configs, parameter counts, padding invariance, eq. 10-13."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn.configs import dc_bilstm as cfg
from dense_rnn.models import CLASSIFIERS, DCBiLSTM
from dense_rnn.models.dc_bilstm import masked_mean
from dense_rnn.recurrent import Bidirectional
from dense_rnn.train.classify import num_params_without_embedding

# name: (dl, dh, th, paper count = LSTM weights only, m=300; full count without the
# embedding for 2 classes; for 5 classes). By hand: a Bi-LSTM layer of d units reading n
# features has 8d(n + d) weights and 8d biases; dense layer l reads 300 + 2dh(l-1), the top
# 300 + 2dh*dl; softmax 2th*C + C. E.g. dc_bilstm: 104 * sum_l (313 + 26(l-1)) = 772,200,
# top 800 * 790 = 632,000 -> 1,404,200; + 8 * 295 biases + 402 softmax = 1,406,962.
EXPECTED = {
    "dc_bilstm": (15, 13, 100, 1404200, 1406962, 1407565),
    "bilstm": (0, 10, 300, 1440000, 1443602, 1445405),
    "dc_bilstm_t3_dl0_dh10": (0, 10, 300, 1440000, 1443602, 1445405),
    "dc_bilstm_t3_dl5_dh40": (5, 40, 100, 1440000, 1442802, 1443405),
    "dc_bilstm_t3_dl10_dh20": (10, 20, 100, 1440000, 1442802, 1443405),
    "dc_bilstm_t3_dl15_dh13": (15, 13, 100, 1404200, 1406962, 1407565),
    "dc_bilstm_t3_dl20_dh10": (20, 10, 100, 1440000, 1442802, 1443405),
    "dc_bilstm_t4_dl0_dh10": (0, 10, 100, 320000, 321202, 321805),
    "dc_bilstm_t4_dl5_dh10": (5, 10, 100, 540000, 541602, 542205),
    "dc_bilstm_t4_dl10_dh10": (10, 10, 100, 800000, 802002, 802605),
    "dc_bilstm_t4_dl15_dh10": (15, 10, 100, 1100000, 1102402, 1103005),
    "dc_bilstm_t4_dl20_dh10": (20, 10, 100, 1440000, 1442802, 1443405),
    "dc_bilstm_t5_dl10_dh0": (10, 0, 100, 320000, 321202, 321805),
    "dc_bilstm_t5_dl10_dh5": (10, 5, 100, 540000, 541602, 542205),
    "dc_bilstm_t5_dl10_dh10": (10, 10, 100, 800000, 802002, 802605),
    "dc_bilstm_t5_dl10_dh15": (10, 15, 100, 1100000, 1102402, 1103005),
    "dc_bilstm_t5_dl10_dh20": (10, 20, 100, 1440000, 1442802, 1443405),
}
# The Params column of Tables 3-5, rounded as printed (transcribed here, not read from
# the configs).
PAPER_ROUNDED = {
    "dc_bilstm": "1.40M", "bilstm": "1.44M",
    "dc_bilstm_t3_dl0_dh10": "1.44M", "dc_bilstm_t3_dl5_dh40": "1.44M",
    "dc_bilstm_t3_dl10_dh20": "1.44M", "dc_bilstm_t3_dl15_dh13": "1.40M",
    "dc_bilstm_t3_dl20_dh10": "1.44M",
    "dc_bilstm_t4_dl0_dh10": "0.32M", "dc_bilstm_t4_dl5_dh10": "0.54M",
    "dc_bilstm_t4_dl10_dh10": "0.80M", "dc_bilstm_t4_dl15_dh10": "1.10M",
    "dc_bilstm_t4_dl20_dh10": "1.44M",
    "dc_bilstm_t5_dl10_dh0": "0.32M", "dc_bilstm_t5_dl10_dh5": "0.54M",
    "dc_bilstm_t5_dl10_dh10": "0.80M", "dc_bilstm_t5_dl10_dh15": "1.10M",
    "dc_bilstm_t5_dl10_dh20": "1.44M",
}


def test_the_configs_params_columns_are_the_papers():
    assert {f"dc_bilstm_t{t}_dl{dl}_dh{dh}": p for t, dl, dh, _, p, _, _ in cfg.TABLE_ROWS} == {
        k: v for k, v in PAPER_ROUNDED.items() if k.startswith("dc_bilstm_t")}


def full_param_count(dl: int, dh: int, th: int, num_classes: int) -> int:
    """All parameters but the embedding (m = 300): LSTM weights and biases, softmax."""
    biases = sum(2 * 4 * d for d in cfg.dense_features(dl, dh, th))
    return cfg.lstm_weight_count(300, dl, dh, th) + biases + 2 * th * num_classes + num_classes


def test_every_named_config_is_pinned():
    assert set(cfg.CONFIGS) == set(EXPECTED)
    assert len(cfg.TABLE_ROWS) == 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_values_and_param_counts(name):
    dl, dh, th, paper, full2, full5 = EXPECTED[name]
    c = cfg.CONFIGS[name]
    assert (c.model_args["dl"], c.model_args["dh"], c.model_args["th"]) == (dl, dh, th)
    assert c.model == "dc_bilstm" and c.model in CLASSIFIERS
    assert (c.embed_size, c.learning_rate, c.batch_size, c.l2) == (300, 0.005, 200, 1e-3)
    # the recipe's values the paper does not give (ours; see the config module)
    assert (c.model_args["dropout_embed"], c.model_args["dropout_pool"], c.max_epochs,
            c.early_stopping_patience, c.max_grad_norm, c.freeze_embeddings) == (
                0.3, 0.5, 20, 5, 0.0, False)
    assert cfg.paper_param_count(c) == paper
    assert f"{paper / 1e6:.2f}M" == PAPER_ROUNDED[name]
    assert full_param_count(dl, dh, th, 2) == full2
    assert full_param_count(dl, dh, th, 5) == full5


@pytest.mark.parametrize("name", ["dc_bilstm", "bilstm", "dc_bilstm_t5_dl10_dh0"])
def test_model_param_count_matches_hand_count(name):
    _, _, _, _, full2, full5 = EXPECTED[name]
    assert num_params_without_embedding(cfg.CONFIGS[name], 2) == full2
    assert num_params_without_embedding(cfg.CONFIGS[name], 5) == full5


def test_biases_would_not_reproduce_table_1_count():
    # 1.40M only comes out without biases: with them dc_bilstm has 1,406,560 -> 1.41M.
    assert f"{(1404200 + 8 * (15 * 13 + 100)) / 1e6:.2f}M" == "1.41M"


def test_masked_mean_against_numpy():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(3, 5, 4)).astype(np.float32)
    lengths = np.array([5, 2, 0])
    out = np.asarray(masked_mean(jnp.asarray(h), jnp.asarray(lengths)))
    ref = np.stack([h[0].astype(np.float64).mean(0), h[1, :2].astype(np.float64).mean(0),
                    np.zeros(4)])
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)


def test_masked_mean_clamps_lengths():
    h = jax.random.normal(jax.random.key(0), (3, 5, 4))
    np.testing.assert_array_equal(masked_mean(h, jnp.array([7, 5, -1])),
                                  masked_mean(h, jnp.array([5, 5, 0])))
    np.testing.assert_allclose(masked_mean(h, None), masked_mean(h, jnp.array([5, 5, 5])),
                               rtol=1e-6)


def test_masked_mean_of_no_steps_is_zero():
    h = jnp.ones((2, 0, 4))
    np.testing.assert_array_equal(masked_mean(h, None), np.zeros((2, 4)))
    np.testing.assert_array_equal(masked_mean(h, jnp.array([0, 3])), np.zeros((2, 4)))


def _bidir_outputs(x, lengths, params=None):
    layer = Bidirectional(cell="lstm", features=3)
    params = params or layer.init(jax.random.key(1), x, lengths=lengths)
    return params, np.asarray(layer.apply(params, x, lengths=lengths)[1])


def test_bidirectional_padding_invariance():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 6, 4)), jnp.float32)
    lengths = jnp.array([6, 3])
    params, y = _bidir_outputs(x, lengths)
    # more padding appended (filled with garbage)
    x_pad = jnp.concatenate([x, jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32)], 1)
    _, y_pad = _bidir_outputs(x_pad, lengths, params)
    # the short sequence alone, then batched with a longer one
    _, y_alone = _bidir_outputs(x[1:, :3], lengths[1:], params)
    for b, n in enumerate([6, 3]):
        np.testing.assert_allclose(y_pad[b, :n], y[b, :n], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y[1, :3], y_alone[0], rtol=1e-6, atol=1e-6)
    assert np.all(y_pad[1, 3:] == 0.0)


def _small_model(**kw):
    args = dict(vocab_size=20, num_classes=3, embed_size=5, dl=3, dh=2, th=4) | kw
    return DCBiLSTM(**args)


def test_model_padding_invariance():
    model = _small_model()
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(2, 20, size=(2, 7)), jnp.int32)
    lengths = jnp.array([7, 4])
    params = model.init(jax.random.key(0), tokens, lengths)
    apply = jax.jit(model.apply)  # one compile per shape, not one per operation
    logits = apply(params, tokens, lengths)
    padded = jnp.concatenate([tokens, jnp.asarray(rng.integers(0, 20, (2, 9)), jnp.int32)], 1)
    np.testing.assert_allclose(apply(params, padded, lengths), logits, rtol=1e-5, atol=1e-6)
    alone = apply(params, tokens[1:, :4], lengths[1:])
    np.testing.assert_allclose(alone[0], logits[1], rtol=1e-5, atol=1e-6)


def test_model_lengths_past_padded_length_and_none():
    """Lengths past T are the whole row (no NaN); ``lengths=None``: every row full length."""
    model = _small_model()
    tokens = jax.random.randint(jax.random.key(0), (3, 12), 2, 20)
    params = model.init(jax.random.key(1), tokens)
    full = model.apply(params, tokens, jnp.array([12, 12, 0]))
    np.testing.assert_array_equal(model.apply(params, tokens, jnp.array([12, 20, 0])), full)
    np.testing.assert_allclose(model.apply(params, tokens), model.apply(
        params, tokens, jnp.full((3,), 12)), rtol=1e-6, atol=1e-6)


def _np_lstm(p, xs, reverse):
    """float64 LSTM over one sequence (gate order i, f, g, o, eq. 2-4)."""
    w_ih, w_hh, b = (np.asarray(p[k], np.float64) for k in ("w_ih", "w_hh", "b"))
    n = w_hh.shape[0]
    h, c, out = np.zeros(n), np.zeros(n), [None] * len(xs)
    sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
    for t in (range(len(xs))[::-1] if reverse else range(len(xs))):
        i, f, g, o = np.split(xs[t] @ w_ih + h @ w_hh + b, 4)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        out[t] = h
    return np.stack(out)


def _np_dc_bilstm(p, tokens, pooled=False):
    """eq. 10-13, average pooling and the softmax layer on one unpadded sentence, float64
    (with ``pooled``, the pooled sentence vector instead)."""
    memory = [p["embed"]["embedding"][tokens]]  # M^{l-1} = [h^0; h^1; ...], h^0 = e
    for layer_id in range(4):  # 3 dense layers + the top Bi-LSTM
        layer = p["dense_bilstm"][f"layer_{layer_id}"]
        inp = np.concatenate(memory[::-1], -1)  # stack.dense_input's order of the same rows
        memory.append(np.concatenate([_np_lstm(layer["fwd"], inp, False),
                                      _np_lstm(layer["bwd"], inp, True)], -1))
    sentence = memory[-1].mean(0)
    return sentence if pooled else sentence @ p["softmax"]["kernel"] + p["softmax"]["bias"]


def test_model_against_numpy_reference():
    """A padded batch (garbage past each length) against each sentence alone in float64."""
    model = _small_model()
    rng = np.random.default_rng(4)
    tokens = rng.integers(0, 20, size=(3, 9))
    lengths = np.array([5, 2, 9])
    params = model.init(jax.random.key(3), jnp.asarray(tokens), jnp.asarray(lengths))
    logits = np.asarray(model.apply(params, jnp.asarray(tokens), jnp.asarray(lengths)))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
    for row, n, got in zip(tokens, lengths, logits, strict=True):
        np.testing.assert_allclose(got, _np_dc_bilstm(p, row[:n]), rtol=1e-5, atol=1e-6)


def test_model_against_float64_numpy_with_random_parameters(x64):
    """The model in float64 (the XLA scans) with every parameter random, biases included:
    the sown sentence vector to 1e-10, the logits (float32, as always) to their rounding."""
    model = _small_model()
    rng = np.random.default_rng(5)
    tokens, lengths = rng.integers(0, 20, size=(3, 9)), np.array([5, 2, 9])
    init = model.init(jax.random.key(3), jnp.asarray(tokens), jnp.asarray(lengths))
    p = jax.tree.map(lambda a: rng.normal(size=a.shape) * 0.5, init["params"])
    logits, state = model.apply({"params": p}, jnp.asarray(tokens), jnp.asarray(lengths),
                                mutable=["intermediates"])
    (sentences,) = state["intermediates"]["sentence"]
    for row, n, got, sentence in zip(tokens, lengths, np.asarray(logits), sentences,
                                     strict=True):
        np.testing.assert_allclose(sentence, _np_dc_bilstm(p, row[:n], pooled=True),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(got, _np_dc_bilstm(p, row[:n]), rtol=1e-6, atol=1e-7)


def test_each_dropout_rate_at_its_place():
    """``dropout_embed`` on the word embeddings, ``dropout_pool`` on the pooled vector."""
    model = DCBiLSTM(vocab_size=20, num_classes=3, embed_size=64, dl=1, dh=2, th=400,
                     dropout_embed=0.2, dropout_pool=0.7)
    tokens = jnp.asarray(np.random.default_rng(0).integers(2, 20, (4, 6)), jnp.int32)
    params = model.init(jax.random.key(0), tokens)
    _, state = model.apply(params, tokens, deterministic=False, capture_intermediates=True,
                           rngs={"dropout": jax.random.key(1)}, mutable=["intermediates"])
    dropped = {k: float(np.mean(np.asarray(v["__call__"][0]) == 0))
               for k, v in state["intermediates"].items() if k.startswith("Dropout")}
    assert dropped.keys() == {"Dropout_0", "Dropout_1"}  # embeddings, then the pooled vector
    assert abs(dropped["Dropout_0"] - 0.2) < 0.05 and abs(dropped["Dropout_1"] - 0.7) < 0.05


def test_dropout_only_in_training():
    model = _small_model(dropout_embed=0.5, dropout_pool=0.5)
    tokens, lengths = jnp.array([[2, 3, 4]], jnp.int32), jnp.array([3])
    params = model.init(jax.random.key(0), tokens, lengths)
    a = model.apply(params, tokens, lengths)
    np.testing.assert_array_equal(a, model.apply(params, tokens, lengths))
    b = model.apply(params, tokens, lengths, deterministic=False,
                    rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(a, b)
