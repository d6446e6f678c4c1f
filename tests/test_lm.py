"""Language models: Godin eq. 10-11 against a float64 NumPy reference, wiring, dropout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn.models import LanguageModel
from tests.test_cells import np_lstm


def np_lm(params, tokens, connectivity, carries=None):
    """Embedding, LSTM layers (dense: layer l reads [h_{l-1}; ...; h_1; e]), softmax; each
    layer starts from its ``(c, h)`` in ``carries`` (default zeros). Returns the logits and
    the final carries."""
    p = jax.tree.map(np.asarray, params)
    e = p["embed"]["embedding"][tokens]  # (B, T, E)
    feats = [e]
    layers = sorted(k for k in p["rnn"] if k.startswith("layer_"))
    finals = []
    for k, name in enumerate(layers):
        lp = p["rnn"][name]
        inp = np.concatenate(feats[::-1], -1) if connectivity == "dense" else feats[-1]
        n = lp["w_hh"].shape[0]
        b, t, _ = inp.shape
        c, h = (np.zeros((b, n)),) * 2 if carries is None else map(np.asarray, carries[k])
        hs = []
        for s in range(t):
            c, h = np_lstm(lp, c, h, inp[:, s])
            hs.append(h)
        feats.append(np.stack(hs, 1))
        finals.append((c, h))
    top = np.concatenate(feats[::-1], -1) if connectivity == "dense" else feats[-1]
    return top @ p["softmax"]["kernel"] + p["softmax"]["bias"], finals


@pytest.mark.parametrize("connectivity", ["dense", "stacked"])
def test_lm_matches_numpy(x64, connectivity):
    model = LanguageModel(vocab_size=13, embed_size=5, hidden_size=4, num_layers=3,
                          connectivity=connectivity, init_scale=0.5)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 13, (2, 6)))
    params = model.init(jax.random.key(0), tokens)["params"]
    params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
    logits, _ = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(logits, np_lm(params, np.asarray(tokens), connectivity)[0],
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("connectivity", ["dense", "stacked"])
def test_lm_from_carried_state_matches_numpy(x64, connectivity):
    """A window that starts from the previous window's state (truncated BPTT): logits and
    final carries against the reference started from the same state."""
    model = LanguageModel(vocab_size=13, embed_size=5, hidden_size=4, num_layers=3,
                          connectivity=connectivity, init_scale=0.5)
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, 13, (2, 6)))
    params = model.init(jax.random.key(0), tokens)["params"]
    params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
    carries = tuple((rng.normal(size=(2, 4)), rng.normal(size=(2, 4))) for _ in range(3))
    logits, finals = model.apply({"params": params}, tokens,
                                 jax.tree.map(jnp.asarray, carries))
    want, want_finals = np_lm(params, np.asarray(tokens), connectivity, carries)
    np.testing.assert_allclose(logits, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.tree.leaves(finals)),
                               np.asarray(jax.tree.leaves(want_finals)), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("connectivity", ["dense", "stacked"])
def test_lm_nll_with_targets_matches_numpy(x64, connectivity):
    """``model(tokens, targets=y)`` is the per-token NLL of the reference's softmax."""
    model = LanguageModel(vocab_size=13, embed_size=5, hidden_size=4, num_layers=2,
                          connectivity=connectivity, init_scale=0.5)
    rng = np.random.default_rng(1)
    tokens, targets = (jnp.asarray(rng.integers(0, 13, (2, 6))) for _ in range(2))
    params = model.init(jax.random.key(0), tokens)["params"]
    params = jax.tree.map(lambda x: x.astype(jnp.float64), params)
    nll, _ = model.apply({"params": params}, tokens, None, targets)
    z, _ = np_lm(params, np.asarray(tokens), connectivity)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    want = lse - np.take_along_axis(z, np.asarray(targets)[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, want, rtol=1e-10, atol=1e-12)


def test_dense_wiring_shapes():
    """Layer l's input is e plus every lower layer; the softmax reads all of them."""
    model = LanguageModel(vocab_size=11, embed_size=7, hidden_size=3, num_layers=4,
                          connectivity="dense")
    params = model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]
    for i in range(4):
        assert params["rnn"][f"layer_{i}"]["w_ih"].shape == (7 + 3 * i, 12)
    assert params["softmax"]["kernel"].shape == (7 + 3 * 4, 11)


def test_padded_sentences_stop_their_carries_at_their_lengths():
    """``lengths``: each row's final carries are those after its last real token, as if the
    row ran alone; the logits at real positions do not depend on the padding."""
    model = LanguageModel(vocab_size=11, embed_size=5, hidden_size=4, num_layers=2,
                          connectivity="dense")
    tokens = jax.random.randint(jax.random.key(1), (3, 6), 0, 11)
    variables = model.init(jax.random.key(0), tokens)
    apply = jax.jit(model.apply)
    lengths = jnp.array([6, 2, 4])
    logits, carries = apply(variables, tokens, lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        alone, want = apply(variables, tokens[b:b + 1, :n])
        np.testing.assert_allclose(logits[b, :n], alone[0], atol=1e-5)
        jax.tree.map(lambda a, w, b=b: np.testing.assert_allclose(a[b], w[0], atol=1e-6),
                     carries, want)


def test_carries_of_another_batch_or_depth_name_zero_carries():
    model = LanguageModel(vocab_size=11, embed_size=5, hidden_size=4, num_layers=2)
    tokens = jnp.zeros((2, 3), jnp.int32)
    variables = model.init(jax.random.key(0), tokens)
    for carries in (model.zero_carries(3), model.zero_carries(2)[:1]):
        with pytest.raises(ValueError, match=r"^LanguageModel: carries must be shaped like "
                                             r"zero_carries\(2\), \(\(\(2, 4\), \(2, 4\)\), "):
            model.apply(variables, tokens, carries)


def test_targets_given_in_the_carries_place_and_empty_windows():
    model = LanguageModel(vocab_size=11, embed_size=5, hidden_size=4, num_layers=2)
    tokens = jnp.zeros((2, 3), jnp.int32)
    variables = model.init(jax.random.key(0), tokens)
    with pytest.raises(ValueError, match=r"carries must be float arrays, .*got int32 \(2, 3\); "
                                         r"targets go in targets=, after the carries"):
        model.apply(variables, tokens, tokens)
    with pytest.raises(ValueError, match=r"got int32 \(2,\); sequence lengths go in lengths=, "
                                         r"after the carries"):
        model.apply(variables, tokens, jnp.array([3, 1]))
    empty = tokens[:, :0]  # no tokens: empty NLL and logits, the carries unchanged
    nll, carries = jax.jit(model.apply)(variables, empty, targets=empty)
    assert nll.shape == (2, 0) and nll.dtype == jnp.float32
    assert model.apply(variables, empty)[0].shape == (2, 0, 11)
    jax.tree.map(lambda c, z: np.testing.assert_array_equal(c, z), carries,
                 model.zero_carries(2))


def test_looked_up_rows_stand_in_for_the_embedding():
    """``embedded``: the rows ``tokens`` look up, given in place of the lookup, give the same
    logits and carries; rows of another shape are refused in one line."""
    model = LanguageModel(vocab_size=11, embed_size=5, hidden_size=4, num_layers=2,
                          connectivity="dense")
    tokens = jax.random.randint(jax.random.key(1), (3, 6), 0, 11)
    variables = model.init(jax.random.key(0), tokens)
    rows = variables["params"]["embed"]["embedding"][tokens]
    want = model.apply(variables, tokens)
    got = model.apply(variables, tokens, embedded=rows)
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(g, w), got, want)
    with pytest.raises(ValueError, match=r"embedded must be \(batch, time, embed_size\) = "
                                         r"\(3, 6, 5\), .*got \(3, 6, 4\)"):
        model.apply(variables, tokens, embedded=rows[..., :4])


def test_init_is_uniform_in_scale():
    model = LanguageModel(vocab_size=50, embed_size=8, hidden_size=8, num_layers=2,
                          init_scale=0.05)
    params = model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]
    for path, x in jax.tree_util.tree_leaves_with_path(params):  # biases included
        top = float(jnp.abs(x).max())
        assert 0.04 < top <= 0.05, (jax.tree_util.keystr(path), top)
        # centred: within 5 standard errors of uniform(-0.05, 0.05)'s mean over x.size draws
        assert abs(float(x.mean())) < 5 * 0.05 / np.sqrt(3 * x.size), jax.tree_util.keystr(path)


@pytest.mark.parametrize("variational", [False, True])
def test_dropout_only_in_training(variational):
    model = LanguageModel(vocab_size=20, embed_size=8, hidden_size=8, num_layers=2,
                          connectivity="dense", dropout_rate=0.5, variational=variational)
    tokens = jnp.ones((3, 7), jnp.int32)
    v = model.init(jax.random.key(0), tokens)
    eval1, _ = model.apply(v, tokens)
    eval2, _ = model.apply(v, tokens)
    train1, _ = model.apply(v, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
    train2, _ = model.apply(v, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
    np.testing.assert_array_equal(eval1, eval2)
    np.testing.assert_array_equal(train1, train2)
    assert not np.allclose(train1, eval1)


@pytest.mark.parametrize("variational", [False, True])
def test_dropout_masks_over_time(variational):
    """Every dropout inside the model (embedding, each layer's output) drops different
    units in different sequences; the same units at every time step of a sequence if
    ``variational`` (Gal & Ghahramani), else new ones at every step (Zaremba et al.)."""
    model = LanguageModel(vocab_size=5, embed_size=64, hidden_size=64, num_layers=2,
                          connectivity="dense", dropout_rate=0.5, variational=variational)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 5, (2, 6)))
    v = model.init(jax.random.key(0), tokens)
    _, state = model.apply(v, tokens, deterministic=False, rngs={"dropout": jax.random.key(2)},
                           capture_intermediates=True, mutable=["intermediates"])
    outs = [x for path, x in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
            if "Dropout" in jax.tree_util.keystr(path)]
    assert len(outs) == 3  # embedding, layer 0, layer 1
    for out in outs:
        zero = np.asarray(out) == 0
        assert 0.3 < zero.mean() < 0.7
        assert (zero == zero[:, :1]).all() == variational
        assert (zero[0] != zero[1]).any()


def test_rematerialised_model_computes_the_same_with_dropout():
    """``deterministic`` is an ordinary argument, so ``nn.remat`` can take it as static (a
    keyword-only one it would trace), and the rematerialised model's NLL and gradients are
    the model's own."""
    args = (50, 8, 8, 2, "dense", 0.3)
    tokens = jax.random.randint(jax.random.key(2), (2, 5), 0, 50)
    variables = LanguageModel(*args).init(jax.random.key(0), tokens)
    rngs = {"dropout": jax.random.key(1)}
    results = []
    for model in (LanguageModel(*args), nn.remat(LanguageModel, static_argnums=(4,))(*args)):
        def loss(p, model=model):
            return model.apply({"params": p}, tokens, None, tokens, False, rngs=rngs)[0].sum()

        results.append(jax.jit(jax.value_and_grad(loss))(variables["params"]))
    for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
