"""The training arithmetic of both trainers against independent computations: global-norm
clipping, the LM's loss scale and perplexity, the classifier's L2 penalty, filler rows,
frozen embeddings and GloVe rows."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dense_rnn.configs.families import get_config
from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.data import text_classification as tc
from dense_rnn.data.glove import load_glove
from dense_rnn.train import classify, lm

# gradient elements are all below MAX_NORM, their global norm above it
MAX_NORM = 5.0
BIG_GRAD = {"a": jnp.array([4.0, -4.0, 3.0, -2.0]), "b": jnp.array([[4.0, 1.0], [-3.0, 4.0]])}


def global_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree.leaves(tree))))


def capture_grads() -> optax.GradientTransformation:
    """An optimizer that leaves the parameters alone and keeps the gradient as its state."""
    return optax.GradientTransformation(
        lambda params: jax.tree.map(jnp.zeros_like, params),
        lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))


def copy(tree):
    """A fresh copy of ``tree`` (the train steps donate their arguments)."""
    return jax.tree.map(jnp.array, tree)


def nll_from_logits(logits, targets):
    """Per-token (or per-row) NLL from logits, by ``log_softmax``."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def assert_trees_close(got, want, rtol=1e-4, atol=1e-6):
    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    flat_want = jax.tree_util.tree_flatten_with_path(want)[0]
    assert [p for p, _ in flat_got] == [p for p, _ in flat_want]
    for (path, g), (_, w) in zip(flat_got, flat_want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path))


# --- gradient clipping ---------------------------------------------------------------------


def test_assumed_gradient_is_clipped_only_by_global_norm():
    """The test gradient: every element under the threshold, the global norm over it."""
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(BIG_GRAD)) < MAX_NORM
    assert global_norm(BIG_GRAD) > MAX_NORM


def test_lm_optimizer_clips_by_global_norm():
    """Above ``max_grad_norm`` the update is ``-lr * max_norm * g / |g|``; below, ``-lr * g``."""
    c = dataclasses.replace(CONFIGS["tiny"], learning_rate=0.5, max_grad_norm=MAX_NORM)
    tx = lm.make_optimizer(c, steps_per_epoch=100)
    state = tx.init(jax.tree.map(jnp.zeros_like, BIG_GRAD))
    update = jax.jit(tx.update)  # one compilation, not one per operation
    norm = global_norm(BIG_GRAD)
    updates, state = update(BIG_GRAD, state)
    assert_trees_close(updates, jax.tree.map(lambda g: -0.5 * MAX_NORM * g / norm, BIG_GRAD))
    np.testing.assert_allclose(global_norm(updates), 0.5 * MAX_NORM, rtol=1e-6)
    small = jax.tree.map(lambda g: g / 4, BIG_GRAD)  # norm under the threshold: unclipped
    updates, _ = update(small, state)
    assert_trees_close(updates, jax.tree.map(lambda g: -0.5 * g, small))


def test_classifier_optimizer_clips_by_global_norm():
    """Adam on the globally clipped gradient: two steps (Adam's first update hardly depends
    on the gradient's scale, its second on the ratio of the two gradients' scales)."""
    c, _ = get_config("dc_bilstm")
    c = dataclasses.replace(c, learning_rate=0.01, max_grad_norm=MAX_NORM)
    params = jax.tree.map(jnp.zeros_like, BIG_GRAD)
    second = {"a": jnp.array([0.5, 1.0, -0.5, 0.25]), "b": jnp.array([[-1.0, 0.5], [0.5, 1.0]])}
    assert global_norm(second) < MAX_NORM
    clipped = jax.tree.map(lambda g: MAX_NORM * g / global_norm(BIG_GRAD), BIG_GRAD)
    want_tx = optax.adam(0.01)
    tx = classify.make_optimizer(c, params)
    want_state, state = want_tx.init(params), tx.init(params)
    want_update, update = jax.jit(want_tx.update), jax.jit(tx.update)
    for got_grad, want_grad in [(BIG_GRAD, clipped), (second, second)]:
        want, want_state = want_update(want_grad, want_state, params)
        got, state = update(got_grad, state, params)
        assert_trees_close(got, want, rtol=1e-5, atol=1e-8)


# --- the language model ----------------------------------------------------------------------


def tiny_lm(**kw):
    """The tiny LM config with one layer, deterministic (no dropout), over 20 words."""
    return dataclasses.replace(CONFIGS["tiny"], **{"vocab_size": 20, "dropout_rate": 0.0,
                                                   "num_layers": 1, **kw})


def test_lm_step_sums_the_nll_over_time_and_averages_over_the_batch():
    """The step's NLL is the per-token NLL summed over the window, and its gradient that of
    ``sum_t NLL / batch`` (not of the mean over tokens), from carried-in state."""
    c = tiny_lm()
    model = lm.make_model(c)
    params = lm.init_params(c, jax.random.key(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, c.vocab_size, (c.batch_size, c.num_steps + 1)),
                         jnp.int32)
    x, y = tokens[:, :-1], tokens[:, 1:]
    # the state carried in from an earlier window (no gradient flows into it)
    carries = jax.tree.map(lambda z: jnp.asarray(rng.uniform(-0.5, 0.5, z.shape), z.dtype),
                           model.zero_carries(c.batch_size))

    def loss(p):
        logits, out = model.apply({"params": p}, x, carries)
        nll = nll_from_logits(logits, y)
        return nll.sum() / c.batch_size, (nll.sum(), out)

    want_grads, (want_nll, want_carries) = jax.jit(jax.grad(loss, has_aux=True))(params)
    train_step = lm.make_train_step(model, capture_grads(), c.seed)
    tx_state = capture_grads().init(params)
    _, grads, new_carries, nll = train_step(copy(params), tx_state, copy(carries), x, y, 0)
    np.testing.assert_allclose(float(nll), float(want_nll), rtol=1e-5)
    assert_trees_close(grads, want_grads)
    assert_trees_close(new_carries, want_carries)


def test_embedding_rows_gradient_is_the_table_gradient():
    """``embedding_rows_gradient``: the distinct tokens and their rows' summed gradients,
    scattered into a zero table, are the table's gradient (``np.add.at``); the padding ids
    lie past the table and their rows are zero."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 7, (4, 5))  # 20 lookups of at most 7 words: repeats
    d_rows = rng.normal(size=(4, 5, 3)).astype(np.float32)
    want = np.zeros((9, 3))
    np.add.at(want, tokens.reshape(-1), d_rows.reshape(-1, 3))
    ids, rows = jax.jit(lm.embedding_rows_gradient, static_argnums=2)(
        jnp.asarray(tokens), jnp.asarray(d_rows), 9)
    ids, rows = np.asarray(ids), np.asarray(rows)
    distinct = np.unique(tokens)
    np.testing.assert_array_equal(ids[:distinct.size], distinct)
    assert (ids[distinct.size:] == 9).all() and (rows[distinct.size:] == 0).all()
    got = np.zeros((9, 3))
    got[ids[:distinct.size]] = rows[:distinct.size]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("connectivity", ["stacked", "dense"])
def test_sparse_embedding_step_is_the_dense_step(connectivity):
    """``sparse_embedding``: three steps of the LM optimizer, clipping (a gradient norm over
    ``max_grad_norm``) and dropout on, from a window with repeated words, give the dense
    step's parameters, optimizer state, carries and NLL."""
    c = tiny_lm(num_layers=2, dropout_rate=0.3, max_grad_norm=0.05, connectivity=connectivity)
    model = lm.make_model(c)
    params = lm.init_params(c, jax.random.key(0))
    tx = lm.make_optimizer(c, steps_per_epoch=2)  # the learning rate decays in between
    x = jax.random.randint(jax.random.key(1), (c.batch_size, c.num_steps), 0, 6)
    y = jax.random.randint(jax.random.key(2), (c.batch_size, c.num_steps), 0, c.vocab_size)
    runs = []
    for sparse in (False, True):
        step = lm.make_train_step(model, tx, c.seed, sparse_embedding=sparse)
        state = (copy(params), tx.init(params), model.zero_carries(c.batch_size))
        for i in range(3):
            *state, nll = step(*state, x, y, i)
        runs.append((state, nll))
    (want, want_nll), (got, got_nll) = runs
    np.testing.assert_allclose(float(got_nll), float(want_nll), rtol=1e-6)
    assert_trees_close(got, want, rtol=1e-5, atol=1e-7)
    grads = jax.grad(lambda p: model.apply({"params": p}, x, None, y)[0].sum())(params)
    assert global_norm(grads) / c.batch_size > c.max_grad_norm  # the clipping was on


def test_sparse_embedding_refuses_state_per_parameter_and_other_models():
    c = tiny_lm()
    model, params = lm.make_model(c), lm.init_params(c, jax.random.key(0))
    tx = optax.adam(1e-3)
    step = lm.make_train_step(model, tx, c.seed, sparse_embedding=True)
    x = jnp.zeros((c.batch_size, c.num_steps), jnp.int32)
    with pytest.raises(ValueError, match="sparse_embedding needs an optimizer that keeps no "
                                         "state per parameter"):
        step(params, tx.init(params), model.zero_carries(c.batch_size), x, x, 0)
    other = {"softmax": params["softmax"]}  # another model's parameters: no table
    with pytest.raises(ValueError, match="sparse_embedding needs a LanguageModel's parameters"):
        step(other, tx.init(other), model.zero_carries(c.batch_size), x, x, 0)


def test_lm_perplexity_is_exp_mean_nll_over_the_split_from_zero_state():
    """``evaluate`` is ``exp`` of the mean NLL of one pass over ``batch`` streams from zero
    state (windows carry it on; the last window is shorter); twice the same."""
    c = tiny_lm(init_scale=1.0)  # a larger init: the carried state matters to the logits
    model = lm.make_model(c)
    params = lm.init_params(c, jax.random.key(1))
    batch, num_steps = 2, 5
    ids = np.random.default_rng(1).integers(0, c.vocab_size, 27).astype(np.int32)
    streams = jnp.asarray(ids[:26].reshape(batch, 13))  # 12 targets a stream: 5 + 5 + 2
    logits, _ = jax.jit(model.apply)({"params": params}, streams[:, :-1])  # from zero state
    want = float(np.exp(np.mean(np.asarray(nll_from_logits(logits, streams[:, 1:]),
                                           np.float64))))
    eval_step = lm.make_eval_step(model)
    for _ in range(2):
        got = lm.evaluate(model, eval_step, params, ids, batch, num_steps)
        np.testing.assert_allclose(got, want, rtol=1e-5)


# --- the classifier ----------------------------------------------------------------------------

L2 = 0.3
VOCAB, CLASSES = 30, 3


@pytest.fixture(scope="module")
def classifier():
    """A tiny deterministic DC-Bi-LSTM config with an L2 weight, its model and parameters."""
    c, _ = get_config("dc_bilstm")
    c = dataclasses.replace(
        c, embed_size=8, batch_size=5, l2=L2, max_grad_norm=0.0,
        model_args={**c.model_args, "dl": 0, "dh": 2, "th": 4, "dropout_embed": 0.0,
                    "dropout_pool": 0.0})
    model = classify.make_model(c, VOCAB, CLASSES)
    params = classify.init_params(model, jax.random.key(0))
    # a softmax kernel large enough that its penalty's gradient stands out, and a nonzero
    # bias (a penalty on it would show)
    params = {**params, "softmax": {"kernel": params["softmax"]["kernel"] + 0.5,
                                    "bias": params["softmax"]["bias"] + 0.5}}
    capture_step, _ = classify.make_steps(model, capture_grads(), c)
    return c, model, params, capture_step


def make_batch(n_real, batch_size, seed=0):
    """A padded batch of ``n_real`` random sentences (``tc.batches``: filler rows after)."""
    rng = np.random.default_rng(seed)
    ids = [rng.integers(2, VOCAB, rng.integers(2, 9)).astype(np.int32) for _ in range(n_real)]
    labels = rng.integers(0, CLASSES, n_real)
    return next(tc.batches(ids, labels, batch_size))


def expected_grads(model, params, batch, l2):
    """The gradient of the mean cross-entropy over the real rows plus ``l2 * ||W||^2`` of
    the softmax kernel, and the summed cross-entropy, computed on the real rows alone."""
    real = np.asarray(batch["weights"]) > 0
    tokens, lengths, labels = (jnp.asarray(batch[k][real]) for k in ("tokens", "lengths", "labels"))

    def loss(p):
        ce = nll_from_logits(model.apply({"params": p}, tokens, lengths), labels)
        return ce.mean() + l2 * jnp.sum(p["softmax"]["kernel"] ** 2), ce.sum()

    return jax.jit(jax.grad(loss, has_aux=True))(params)


def step_grads(capture_step, params, batch):
    """The gradient and summed cross-entropy of a classifier's training step."""
    _, grads, ce_sum, _ = capture_step(copy(params), capture_grads().init(params), batch, 0)
    return grads, ce_sum


def test_classifier_l2_is_on_the_softmax_kernel_only(classifier):
    """The step's gradient is that of cross-entropy + ``l2 * ||W_softmax||^2`` (the kernel:
    not its bias, not other parameters); the reported sum is the cross-entropy alone."""
    _, model, params, capture_step = classifier
    batch = make_batch(5, 5)
    assert batch["weights"].all()
    grads, ce_sum = step_grads(capture_step, params, batch)
    want, want_ce = expected_grads(model, params, batch, L2)
    assert_trees_close(grads, want)
    np.testing.assert_allclose(float(ce_sum), float(want_ce), rtol=1e-5)
    # the penalty's share of the gradient is far above the tolerance: it is tested
    without = want["softmax"]["kernel"] - 2 * L2 * params["softmax"]["kernel"]
    assert not np.allclose(want["softmax"]["kernel"], without, rtol=1e-2)


def test_classifier_filler_rows_add_nothing(classifier):
    """Rows of weight 0 change neither the loss nor the gradient, whatever they hold: the
    step equals one on the real rows alone."""
    _, model, params, capture_step = classifier
    batch = make_batch(3, 5, seed=1)
    assert batch["weights"].tolist() == [1, 1, 1, 0, 0]
    filler = {k: np.array(v) for k, v in batch.items()}
    rng = np.random.default_rng(2)
    filler["tokens"][3:] = rng.integers(2, VOCAB, filler["tokens"][3:].shape)
    filler["lengths"][3:] = [4, 7]
    filler["labels"][3:] = [1, 2]
    want, want_ce = expected_grads(model, params, batch, L2)
    for b in (batch, filler):
        grads, ce_sum = step_grads(capture_step, params, b)
        assert_trees_close(grads, want)
        np.testing.assert_allclose(float(ce_sum), float(want_ce), rtol=1e-5)


def test_frozen_embeddings_stay_put_while_the_rest_trains(classifier):
    """With ``freeze_embeddings`` a step leaves the embedding table bit for bit and changes
    every other parameter."""
    c, model, params, _ = classifier
    c = dataclasses.replace(c, freeze_embeddings=True)
    before = jax.tree.map(lambda x: np.array(x, copy=True), params)
    tx = classify.make_optimizer(c, params)
    train_step, _ = classify.make_steps(model, tx, c)
    after, _, _, _ = train_step(copy(params), tx.init(params), make_batch(5, 5), 0)
    np.testing.assert_array_equal(after["embed"]["embedding"], before["embed"]["embedding"])
    rest = [(p, a, b) for (p, a), (_, b) in zip(
        jax.tree_util.tree_flatten_with_path(after)[0],
        jax.tree_util.tree_flatten_with_path(before)[0], strict=True) if p[0].key != "embed"]
    assert rest
    for path, a, b in rest:
        assert not np.array_equal(a, b), jax.tree_util.keystr(path)


def test_glove_vectors_fill_the_rows_of_their_words(tmp_path):
    """``encode`` puts each word's GloVe vector in that word's row; padding is zero, and the
    unknown word and training words without a vector are drawn from U(-0.25, 0.25)."""
    path = tmp_path / "glove.txt"
    vectors = {w: np.arange(4, dtype=np.float32) + 10 * (i + 1) for i, w in
               enumerate(["good", "film", "bad", "plot", "unused"])}
    path.write_text("".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()))
    splits = {
        "train": {"tokens": [["good", "film", "zz"], ["bad", "plot"]], "label": [1, 0]},
        "dev": {"tokens": [["good", "plot"]], "label": [1]},
        "test": {"tokens": [["bad", "yy"]], "label": [0]},
    }
    dim, loaded = load_glove(str(path), tc.all_words(splits))
    assert dim == 4 and set(loaded) == {"good", "film", "bad", "plot"}
    data = classify.encode(splits, loaded, "random", seed=0)
    words, table = data.vocab.words, data.embeddings
    assert table.shape == (len(words), 4)
    assert set(words) == {"<pad>", "<unk>", "good", "film", "bad", "plot", "zz"}
    for i, w in enumerate(words):
        if w in loaded:
            np.testing.assert_array_equal(table[i], vectors[w], err_msg=w)
        elif i == tc.PAD:
            np.testing.assert_array_equal(table[i], 0.0)
        else:
            assert np.all(np.abs(table[i]) <= classify.EMBED_INIT_SCALE), w
            assert np.any(table[i] != 0.0), w
