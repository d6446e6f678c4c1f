"""Scanned recurrent layers: hoisted projection, lengths, reverse, padding invariance."""

import re
import warnings

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn import cells, recurrent
from dense_rnn.dense_block import DenseRecurrent
from dense_rnn.hm_stack import HMDenseStack
from dense_rnn.hornn import GatedHORNN
from dense_rnn.models import DCBiLSTM, HMTextClassifier, LanguageModel
from tests.test_cells import np_gru, np_lstm, random_params


def np_scan(cell, p, x, lengths, reverse, carry, mask):
    """Float64 reference of any cell over each sequence's real tokens (from its last one when
    ``reverse``), from the initial ``carry`` (``(c, h)`` for an LSTM, else ``h``); an LSTM's
    recurrent product reads ``h_{t-1} * mask``. Zeros at padding; returns outputs, finals."""
    ys = np.zeros(x.shape[:2] + (p["w_hh"].shape[0],))
    finals = []
    for i in range(x.shape[0]):
        state = tuple(a[i] for a in carry) if cell == "lstm" else carry[i]
        order = range(lengths[i] - 1, -1, -1) if reverse else range(lengths[i])
        for s in order:
            if cell == "lstm":
                c, h = state
                state = np_lstm(p, c, h * mask[i], x[i, s])
                ys[i, s] = state[1]
            else:
                state = (np_gru(p, state, x[i, s]) if cell == "gru" else
                         np.tanh(x[i, s] @ p["w_ih"] + state @ p["w_hh"] + p["b"]))
                ys[i, s] = state
        finals.append(state)
    if cell == "lstm":
        return ys, tuple(np.stack([f[k] for f in finals]) for k in range(2))
    return ys, np.stack(finals)


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_numpy_with_lengths(x64, reverse):
    rng = np.random.default_rng(0)
    p = random_params(rng, 3, 4, 4)
    x = rng.normal(size=(3, 6, 3))
    lengths = np.array([6, 2, 4])
    carry = cells.get_cell("lstm").zero_carry((3,), 4, jnp.float64)
    (c, h), ys = recurrent.scan_cell(cells.get_cell("lstm"), p, cells.project(p, x), carry,
                                     jnp.asarray(lengths), reverse=reverse, unroll=2)
    ys_ref, (c_ref, h_ref) = np_scan("lstm", p, x, lengths, reverse, (np.zeros((3, 4)),) * 2,
                                     np.ones((3, 4)))
    np.testing.assert_allclose(ys, ys_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(c, c_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "both"])
def test_layers_from_a_given_carry_with_mask_and_lengths_match_numpy(x64, cell, direction):
    """``Recurrent`` (either way) and ``Bidirectional`` from random initial carries, with
    lengths and (LSTM) a recurrent dropout mask per direction, against ``np_scan``."""
    rng = np.random.default_rng(3)
    b, t, d, n = 3, 7, 3, 4
    x = rng.normal(size=(b, t, d))
    lengths = np.array([7, 3, 1])
    gates = cells.get_cell(cell).gates
    if direction == "both":
        layer = recurrent.Bidirectional(cell, n, param_dtype=jnp.float64)
    else:
        layer = recurrent.Recurrent(cell, n, reverse=direction == "reverse",
                                    param_dtype=jnp.float64)
    ways = {"both": [False, True], "forward": [False], "reverse": [True]}[direction]
    params = [random_params(rng, d, n, gates) for _ in ways]
    carries = [tuple(rng.normal(size=(b, n)) for _ in range(2)) if cell == "lstm"
               else rng.normal(size=(b, n)) for _ in ways]
    masks = [rng.integers(0, 2, size=(b, n)) / 0.5 for _ in ways] if cell == "lstm" else None
    tree = ({"fwd": params[0], "bwd": params[1]} if direction == "both" else params[0])
    arg = (lambda v: tuple(v)) if direction == "both" else (lambda v: v[0])
    final, y = layer.apply({"params": jax.tree.map(jnp.asarray, tree)}, jnp.asarray(x),
                           arg(jax.tree.map(jnp.asarray, carries)), jnp.asarray(lengths),
                           None if masks is None else arg([jnp.asarray(m) for m in masks]))
    for k, rev in enumerate(ways):
        ys, finals = np_scan(cell, params[k], x, lengths, rev, carries[k],
                             None if masks is None else masks[k])
        np.testing.assert_allclose(y[..., k * n:(k + 1) * n], ys, rtol=1e-10, atol=1e-12)
        got = final[k] if direction == "both" else final
        for a, want in zip(jax.tree.leaves(got), jax.tree.leaves(finals), strict=True):
            np.testing.assert_allclose(a, want, rtol=1e-10, atol=1e-12)


def _recorded_apply(module, variables, *args, **kwargs):
    """``module.apply``, recording every dropout's ``(input, output)`` and every recurrent
    layer's recurrent mask argument, in call order."""
    drops, rmasks = [], []

    def record(next_fun, a, k, context):
        out = next_fun(*a, **k)
        if context.method_name == "__call__" and isinstance(context.module, nn.Dropout):
            drops.append((np.asarray(a[0]), np.asarray(out)))
        if context.method_name == "__call__" and isinstance(
                context.module, (recurrent.Recurrent, recurrent.Bidirectional)):
            rmasks.append(jax.tree.map(np.asarray, a[3]))
        return out

    with nn.intercept_methods(record):
        return module.apply(variables, *args, **kwargs), drops, rmasks


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("connectivity", ["dense", "stacked"])
@pytest.mark.parametrize("bidirectional, variational", [(False, False), (True, True),
                                                        (False, True)])
def test_stack_in_training_matches_float64_numpy(x64, cell, connectivity, bidirectional,
                                                 variational):
    """Dropout on: each layer reads ``[h_{l-1}; ...; h_1; x]`` (dense) or ``h_{l-1}``, all after
    dropout, and runs with the recurrent mask it drew (variational LSTM); each output's
    mask is 0 or 1/keep, one per sequence and unit over time when variational."""
    from dense_rnn.stack import RecurrentStack

    rng = np.random.default_rng(7)
    b, t, d, keep = 3, 6, 4, 0.6
    lengths = np.array([6, 3, 1])
    stack = RecurrentStack(cell, (4, 3, 5), connectivity, bidirectional, 1 - keep, variational,
                           param_dtype=jnp.float64)
    x = rng.normal(size=(b, t, d))
    params = jax.tree.map(lambda a: rng.normal(size=a.shape) * 0.6,
                          stack.init(jax.random.key(0), jnp.asarray(x))["params"])
    (_, outs), drops, rmasks = _recorded_apply(
        stack, {"params": params}, jnp.asarray(x), None, jnp.asarray(lengths), False,
        rngs={"dropout": jax.random.key(5)})
    assert len(drops) == len(rmasks) == 3
    assert all((m is not None) == (variational and cell == "lstm") for m in rmasks)
    features = [x]
    for i, (n, (dropped_in, dropped_out), rmask) in enumerate(
            zip((4, 3, 5), drops, rmasks, strict=True)):
        inp = np.concatenate(features[::-1], -1) if connectivity == "dense" else features[-1]
        zero = (np.zeros((b, n)),) * 2 if cell == "lstm" else np.zeros((b, n))
        ways = [False, True] if bidirectional else [False]
        names = ["fwd", "bwd"] if bidirectional else [None]
        masks = rmask if bidirectional else (rmask,)
        h = np.concatenate([np_scan(cell, params[f"layer_{i}"][k] if k else params[f"layer_{i}"],
                                    inp, lengths, rev, zero,
                                    np.ones((b, n)) if m is None else m)[0]
                            for k, rev, m in zip(names, ways, masks or (None,) * 2,
                                                 strict=False)], -1)
        np.testing.assert_allclose(dropped_in, h, rtol=1e-10, atol=1e-12)
        scale = np.divide(dropped_out, h, out=np.zeros_like(h), where=h != 0)
        assert np.all(np.isclose(scale, 0) | np.isclose(scale, 1 / keep) | (h == 0))
        if variational:  # one mask per sequence and unit: the same at every real step
            real = np.arange(t)[None, :, None] < lengths[:, None, None]
            first = scale[:, :1]
            assert np.all(np.isclose(scale, first) | ~real | (h == 0))
        np.testing.assert_allclose(outs[i + 1], dropped_out)
        features.append(dropped_out)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_bidirectional_padding_invariance(cell):
    """Outputs at real positions do not change with more padding or longer batch-mates."""
    layer = recurrent.Bidirectional(cell, 5)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(1, 4, 3)), jnp.float32)
    params = layer.init(jax.random.key(0), x, lengths=jnp.array([4]))
    _, y_alone = layer.apply(params, x, lengths=jnp.array([4]))
    padded = jnp.concatenate([x, jnp.asarray(rng.normal(size=(1, 5, 3)), jnp.float32)], 1)
    _, y_padded = layer.apply(params, padded, lengths=jnp.array([4]))
    longer = jnp.asarray(rng.normal(size=(1, 9, 3)), jnp.float32)
    _, y_batch = layer.apply(params, jnp.concatenate([padded, longer]), lengths=jnp.array([4, 9]))
    np.testing.assert_allclose(y_padded[:, :4], y_alone, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y_batch[:1, :4], y_alone, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y_padded[:, 4:], 0.0)


def test_carry_passes_between_windows():
    """Two windows with the carry handed over equal one pass over both (truncated BPTT)."""
    layer = recurrent.Recurrent("lstm", 6, unroll=3)
    x = jax.random.normal(jax.random.key(0), (2, 10, 4))
    params = layer.init(jax.random.key(1), x)
    carry_full, y_full = layer.apply(params, x)
    carry, y1 = layer.apply(params, x[:, :4])
    carry, y2 = layer.apply(params, x[:, 4:], carry)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], 1), y_full, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(carry[1], carry_full[1], rtol=1e-5, atol=1e-6)


def test_recurrent_mask_is_lstm_only():
    p = {"w_hh": jnp.zeros((2, 2)), "w_ih": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
    with pytest.raises(ValueError, match="LSTM only"):
        recurrent.scan_cell(cells.get_cell("rnn"), p, jnp.zeros((1, 3, 2)), jnp.zeros((1, 2)),
                            recurrent_mask=jnp.ones((1, 2)))


def _float32_models():
    from dense_rnn.models import LanguageModel
    from dense_rnn.models.dc_bilstm import DCBiLSTM
    from dense_rnn.models.hm_densernn import NETS, HMTextClassifier

    x = jnp.ones((2, 5, 3), jnp.float32)
    tokens, lengths = jnp.ones((2, 5), jnp.int32), jnp.array([5, 2])
    yield recurrent.Recurrent("lstm", 4), (x,)
    yield recurrent.Recurrent("gru", 4), (x, None, lengths)
    yield recurrent.Bidirectional("lstm", 4), (x, None, lengths)
    yield DCBiLSTM(vocab_size=9, num_classes=3, embed_size=3, dl=2, dh=2, th=3), (tokens, lengths)
    yield LanguageModel(vocab_size=9, embed_size=3, hidden_size=4, num_layers=2,
                        connectivity="dense"), (tokens,)
    for net in NETS:
        yield HMTextClassifier(vocab_size=9, num_classes=3, embed_size=3, net=net,
                               features=4), (tokens, lengths)


def test_parameters_are_float32_also_under_x64(x64):
    """With ``jax_enable_x64`` on (as in float64 reference tests), every model still
    initialises float32 parameters and runs on float32 inputs."""
    for model, args in _float32_models():  # abstractly: only the dtypes are asked about
        variables = jax.eval_shape(model.init, jax.random.key(0), *args)
        dtypes = {a.dtype for a in jax.tree.leaves(variables)}
        assert dtypes == {jnp.dtype(jnp.float32)}, (type(model).__name__, dtypes)
        out = jax.eval_shape(model.apply, variables, *args)
        assert all(a.dtype in (jnp.float32, jnp.int32) for a in jax.tree.leaves(out))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_lengths_past_the_padded_length_mean_the_whole_row(cell):
    """Lengths are clamped to [0, T]: past T is the whole row (no NaN), below 0 is empty."""
    x = jax.random.normal(jax.random.key(0), (3, 6, 3))
    over, clamped = jnp.array([6, 9, -2]), jnp.array([6, 6, 0])
    for layer in (recurrent.Recurrent(cell, 4, reverse=True), recurrent.Bidirectional(cell, 4)):
        params = layer.init(jax.random.key(1), x)
        carry, y = layer.apply(params, x, lengths=over)
        want_carry, want = layer.apply(params, x, lengths=clamped)
        np.testing.assert_array_equal(y, want)
        for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(want_carry), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [jnp.uint8, jnp.uint32, jnp.int8])
def test_unsigned_and_narrow_lengths_mean_what_int32_ones_do(dtype):
    """uint8 250 against a padded length 300 must not wrap to 44 (nor ``0 - 1`` to 2^32 - 1)."""
    x = jax.random.normal(jax.random.key(0), (2, 300, 3))
    lengths = np.array([120, 0] if dtype == jnp.int8 else [250, 0])
    for layer in (recurrent.Recurrent("gru", 4, reverse=True), recurrent.Bidirectional("lstm", 4)):
        params = layer.init(jax.random.key(1), x)
        got = layer.apply(params, x, lengths=jnp.asarray(lengths, dtype))
        want = layer.apply(params, x, lengths=jnp.asarray(lengths, jnp.int32))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(a, b)


def test_stack_refuses_wrong_number_of_carries():
    from dense_rnn.stack import RecurrentStack

    stack = RecurrentStack("gru", (4, 4))
    x = jnp.ones((2, 3, 5))
    params = stack.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="carries has 1 entries for 2 layers"):
        stack.apply(params, x, [jnp.zeros((2, 4))])


def _layers():
    return [recurrent.Recurrent("lstm", 4), recurrent.Recurrent("gru", 4),
            recurrent.Bidirectional("lstm", 4), recurrent.Bidirectional("rnn", 4),
            DenseRecurrent("gru", 4, 2), GatedHORNN(4)]


@pytest.mark.parametrize("layer", _layers(), ids=lambda m: f"{type(m).__name__}")
def test_bfloat16_and_integer_inputs_with_float32_parameters_promote(layer):
    """As ``nn.Dense`` with ``dtype=None``: bfloat16 or integer inputs and float32
    parameters compute in float32, the input projection included, so exactly as the same
    inputs given in float32; an integer input's kernel gradient is not lost to rounding."""
    x = jax.random.normal(jax.random.key(0), (2, 5, 3)).astype(jnp.bfloat16)
    variables = layer.init(jax.random.key(1), x)
    _, y = layer.apply(variables, x)
    _, y32 = layer.apply(variables, x.astype(jnp.float32))
    assert y.dtype == jnp.float32
    np.testing.assert_array_equal(y, y32)
    xi = jax.random.randint(jax.random.key(2), (2, 5, 3), -3, 4)

    def loss(v, x):
        return layer.apply(v, x)[1].sum()

    np.testing.assert_array_equal(layer.apply(variables, xi)[1],
                                  layer.apply(variables, xi.astype(jnp.float32))[1])
    gi, gf = jax.grad(loss)(variables, xi), jax.grad(loss)(variables, xi.astype(jnp.float32))
    jax.tree.map(np.testing.assert_array_equal, gi, gf)


def test_bfloat16_parameters_with_the_default_orthogonal_init():
    x = jnp.ones((2, 3, 3), jnp.bfloat16)
    p16 = recurrent.Recurrent("lstm", 4, param_dtype=jnp.bfloat16).init(jax.random.key(0), x)
    p32 = recurrent.Recurrent("lstm", 4).init(jax.random.key(0), x)
    for k, v in p16["params"].items():  # the float32 draw, rounded
        assert v.dtype == jnp.bfloat16
        np.testing.assert_array_equal(v, p32["params"][k].astype(jnp.bfloat16))


def test_one_recurrent_mask_shared_by_both_directions_of_lstm_scan():
    """``lstm_scan`` with a direction axis takes a mask that broadcasts against ``h`` (D,
    batch, H): one (batch, H) mask for both directions, or one (1, H) for everything. Its
    gradient is the broadcast's: summed over the axes it was broadcast along."""
    k = jax.random.split(jax.random.key(0), 3)
    w = jax.random.normal(k[0], (2, 4, 16)) * 0.3
    xs = jax.random.normal(k[1], (2, 3, 5, 16))  # (direction, batch, time, 4H)
    carry = (jnp.zeros((2, 3, 4)), jnp.zeros((2, 3, 4)))

    def loss(mask):
        return recurrent.lstm_scan(w, xs, carry, None, mask)[1].sum()

    for shape in [(3, 4), (1, 4)]:
        r = jax.random.uniform(k[2], shape)
        full = jax.jit(jax.grad(lambda r: loss(jnp.broadcast_to(r, (2, 3, 4)))))(r)
        np.testing.assert_allclose(jax.jit(jax.grad(loss))(r), full, rtol=1e-6)


def test_bidirectional_wants_a_pair_of_recurrent_masks():
    layer = recurrent.Bidirectional("lstm", 4)
    x = jax.random.normal(jax.random.key(1), (2, 3, 3))
    variables = layer.init(jax.random.key(0), x)
    with pytest.raises(ValueError, match=r"\(forward, backward\) pair"):
        layer.apply(variables, x, recurrent_mask=jnp.ones((2, 4)))  # batch 2, one mask
    masks = jax.random.uniform(jax.random.key(2), (2, 2, 4))
    np.testing.assert_array_equal(layer.apply(variables, x, recurrent_mask=masks)[1],
                                  layer.apply(variables, x, recurrent_mask=tuple(masks))[1])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_float32_recurrent_mask_on_an_all_bfloat16_layer(bidirectional):
    """The mask takes the carry's dtype, which the scan keeps: a float32 mask on a bfloat16
    layer (bfloat16 inputs, parameters and carries) runs as the same mask in bfloat16."""
    layer = (recurrent.Bidirectional if bidirectional else recurrent.Recurrent)(
        "lstm", 4, param_dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (2, 3, 3)).astype(jnp.bfloat16)
    variables = layer.init(jax.random.key(0), x)
    m = jnp.where(jax.random.bernoulli(jax.random.key(2), 0.5, (2, 4)), 2.0, 0.0)
    mask32, mask16 = ((m, m), (m.astype(jnp.bfloat16),) * 2) if bidirectional else (
        m, m.astype(jnp.bfloat16))
    y32, y16 = (layer.apply(variables, x, recurrent_mask=k)[1] for k in (mask32, mask16))
    assert y32.dtype == jnp.bfloat16
    np.testing.assert_array_equal(y32, y16)
    grads = jax.grad(lambda v: layer.apply(v, x, recurrent_mask=mask32)[1].sum())(variables)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("layer", [recurrent.Recurrent("lstm", 4),
                                   recurrent.Bidirectional("lstm", 4)],
                         ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("mask", [np.ones((2, 5)), np.ones((3, 2, 4))], ids=["features", "rank"])
def test_a_recurrent_mask_of_the_wrong_shape_is_one_line(layer, mask):
    x = jax.random.normal(jax.random.key(1), (2, 3, 3))
    variables = layer.init(jax.random.key(0), x)
    masks = (mask, mask) if isinstance(layer, recurrent.Bidirectional) else mask
    with pytest.raises(ValueError, match=r"recurrent_mask must broadcast to \(batch, features\) "
                                         rf"\(2, 4\), got float64 {re.escape(str(mask.shape))}"):
        layer.apply(variables, x, recurrent_mask=masks)


@pytest.mark.parametrize("layer", _layers(), ids=lambda m: f"{type(m).__name__}")
@pytest.mark.parametrize("x_shape, lengths, message", [
    ((5, 3), None, r"x must be \(batch, time, features\), got shape \(5, 3\); add a batch"),
    ((1, 2, 5, 3), None, r"x must be .* got shape \(1, 2, 5, 3\); fold the extra axes into"),
    ("list", None, r"x must be an array \(batch, time, features\), got list; pass jnp.asarray"),
    ((2, 5, 3), np.array([[5], [3]]), r"lengths must be an integer array of shape \(2,\)"),
    ((2, 5, 3), np.array([5, 3, 1]), r"lengths .* one per sequence, got int64 \(3,\)"),
    ((2, 5, 3), np.array([5.0, 3.0]), r"lengths must be an integer array .* got float64"),
    ((2, 5, 3), [5, 3], r"lengths must be an integer array .* got list"),
])
def test_layers_reject_malformed_inputs_in_one_line(layer, x_shape, lengths, message):
    with pytest.raises(ValueError, match=f"{type(layer).__name__}: {message}") as e:
        x = np.ones((2, 5, 3)).tolist() if x_shape == "list" else jnp.ones(x_shape)
        layer.init(jax.random.key(0), x, lengths=lengths)
    assert "\n" not in str(e.value)


def test_malformed_layer_settings_are_one_line_errors():
    from dense_rnn import stack

    x = jnp.ones((2, 8, 3))
    for module, message in [
        (GatedHORNN(4, order=0), "order=0; it must be at least 1"),
        (DenseRecurrent("gru", 4, 0), "k=0; the dense depth must be at least 1"),
        (HMDenseStack("gru", 4, (2, 0)), r"depths=\(2, 0\)"),
        (stack.RecurrentStack("lstm", 4), "features=4 must be a sequence"),
        (HMDenseStack("gru", 4, 8), r"depths=8 must be a sequence of positive integers, one "
         r"per layer, e.g. depths=\(2, 4, 8\)"),
        (recurrent.Recurrent("lstm", 4, 2), "reverse=2 must be True or False; give unroll= "
         "by name"),
        (DenseRecurrent("gru", 0, 2), "DenseRecurrent: features=0"),
        (HMDenseStack("gru", 0, (2, 2)), "HMDenseStack: features=0"),
    ]:
        with pytest.raises(ValueError, match=message):  # raised while tracing: abstractly
            jax.eval_shape(module.init, jax.random.key(0), x)
    # lengths passed where the carry goes: the error says where they belong, also where the
    # batch (2) equals a stack's layer count
    for module in (recurrent.Recurrent("lstm", 4), recurrent.Bidirectional("gru", 4),
                   stack.RecurrentStack("lstm", (4, 4, 4)), stack.RecurrentStack("gru", (4, 4)),
                   DenseRecurrent("gru", 4, 2), GatedHORNN(4), HMDenseStack("gru", 4, (2, 4))):
        with pytest.raises(ValueError, match="; sequence lengths go in lengths=, after the "
                           "carr(y|ies)"):
            jax.eval_shape(module.init, jax.random.key(0), x, jnp.array([8, 3]))
        with pytest.raises(ValueError, match="; sequence lengths go in lengths=, after the "
                           "carr(y|ies)"):  # as a tuple of Python integers
            jax.eval_shape(module.init, jax.random.key(0), x, (8, 3))


def test_gradients_come_back_in_their_parameters_dtype():
    """bfloat16 parameters with the default float32 carries (the README's mixed-precision
    route): every gradient is bfloat16, as its parameter, also through ``lstm_scan``'s
    hand-written backward pass and with a float32 recurrent mask."""
    from dense_rnn.models import LanguageModel
    from dense_rnn.precision import cast_floating

    tokens = jnp.zeros((2, 5), jnp.int32)
    lm = LanguageModel(50, 8, 6, 2, connectivity="dense")
    # abstractly (``eval_shape``): only the dtypes are asked about
    v = jax.eval_shape(lambda: cast_floating(lm.init(jax.random.key(0), tokens), jnp.bfloat16))
    g = jax.eval_shape(jax.grad(lambda p: lm.apply(p, tokens, lm.zero_carries(2),
                                                   tokens)[0].sum()), v)
    assert {a.dtype for a in jax.tree.leaves(g)} == {jnp.dtype(jnp.bfloat16)}

    k = jax.random.split(jax.random.key(1), 4)
    args = (jax.random.normal(k[0], (4, 16), jnp.bfloat16),  # w_hh
            jax.random.normal(k[1], (3, 5, 16), jnp.bfloat16),  # xs
            (jax.random.normal(k[2], (3, 4)), jnp.zeros((3, 4))),  # float32 carry
            None, jax.random.uniform(k[3], (3, 4)))  # float32 recurrent mask

    def loss(w, xs, carry, mask, rmask):
        (c, h), ys = recurrent.lstm_scan(w, xs, carry, mask, rmask)
        return ys.astype(jnp.float32).sum() + c.sum() + h.sum()

    grads = jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2, 4)), *args)
    assert jax.tree.map(lambda a: a.dtype, grads) == jax.tree.map(
        lambda a: a.dtype, (args[0], args[1], args[2], args[4]))

    layer = recurrent.Bidirectional("lstm", 4)  # both directions in one lstm_scan
    x = jnp.ones((2, 3, 5), jnp.bfloat16)
    v = jax.eval_shape(lambda: cast_floating(layer.init(jax.random.key(2), x), jnp.bfloat16))
    zero = recurrent.Recurrent("lstm", 4).zero_carry(2)  # float32
    g = jax.eval_shape(jax.grad(lambda p: layer.apply(p, x, (zero, zero))[1].sum()), v)
    assert {a.dtype for a in jax.tree.leaves(g)} == {jnp.dtype(jnp.bfloat16)}


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_narrower_carry_is_promoted_to_the_parameters_dtype(cell):
    layer = recurrent.Recurrent(cell, 4)
    x = jax.random.normal(jax.random.key(0), (2, 3, 5))
    variables = layer.init(jax.random.key(1), x)
    carry, y = layer.apply(variables, x, layer.zero_carry(2, jnp.bfloat16))
    assert y.dtype == jnp.float32 and {a.dtype for a in jax.tree.leaves(carry)} == {y.dtype}
    np.testing.assert_array_equal(y, layer.apply(variables, x)[1])


def test_carries_as_numpy_arrays_lists_and_mixed_dtypes():
    """A NumPy float64 carry (JAX's float32 without x64), an LSTM carry as a list, and a
    carry whose parts differ in dtype (promoted to one) all run as the equivalent tuple."""
    layer = recurrent.Recurrent("lstm", 4)
    x = jax.random.normal(jax.random.key(0), (2, 3, 5))
    variables = layer.init(jax.random.key(1), x)
    c = np.random.default_rng(0).normal(size=(2, 4))
    want = layer.apply(variables, x, (jnp.asarray(c, jnp.float32),) * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for carry in [(c, c), [c, c], (c.astype(np.float32), jnp.asarray(c, jnp.bfloat16))]:
            got = layer.apply(variables, x, carry)
            np.testing.assert_allclose(got[1], want[1], atol=2e-2)
            assert {a.dtype for a in jax.tree.leaves(got)} == {jnp.dtype(jnp.float32)}


def test_bidirectional_gru_takes_a_stacked_carry():
    layer = recurrent.Bidirectional("gru", 4)
    x = jax.random.normal(jax.random.key(0), (2, 3, 5))
    variables = layer.init(jax.random.key(1), x)
    h = jax.random.normal(jax.random.key(2), (2, 2, 4))
    np.testing.assert_array_equal(layer.apply(variables, x, h)[1],
                                  layer.apply(variables, x, (h[0], h[1]))[1])


@pytest.mark.parametrize("layer, carry, message", [
    (recurrent.Recurrent("lstm", 4), (jnp.zeros((2, 3)),) * 2,
     r"Recurrent: carry must be shaped like zero_carry\(2\), \(\(2, 4\), \(2, 4\)\); got "
     r"\(\(2, 3\), \(2, 3\)\)"),
    (recurrent.Recurrent("gru", 4), (jnp.zeros((2, 4)),) * 2,
     r"carry must be shaped like zero_carry\(2\), \(2, 4\); got \(\(2, 4\), \(2, 4\)\)"),
    (recurrent.Bidirectional("gru", 4), jnp.zeros((2, 4)),
     r"Bidirectional: carry must be a \(forward, backward\) pair of carries"),
    (recurrent.Bidirectional("lstm", 4), (jnp.zeros((2, 4)),) * 2,
     r"Bidirectional \(each direction\): carry must be shaped like zero_carry\(2\)"),
])
def test_malformed_carries_are_one_line_errors(layer, carry, message):
    with pytest.raises(ValueError, match=message) as e:
        layer.init(jax.random.key(0), jnp.ones((2, 3, 5)), carry)
    assert "\n" not in str(e.value)


def _models():
    from dense_rnn.models import DCBiLSTM, HMTextClassifier, LanguageModel

    return [LanguageModel(50, 8, 6, 2), DCBiLSTM(50, 3, 8, dl=1, dh=4, th=4),
            HMTextClassifier(50, 3, 8, net="hm", cell="gru", features=4, depths=(2,))]


@pytest.mark.parametrize("model", _models(), ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("tokens, message", [
    (np.zeros(5, np.int32), r"got int32 \(5,\); add a batch axis with tokens\[None\]"),
    (np.zeros((2, 5), np.float32), r"got float32 \(2, 5\)(?!;)"),  # no batch-axis hint
    ([[1, 2]], r"got list(?!;)"),
])
def test_models_reject_malformed_tokens_in_one_line(model, tokens, message):
    with pytest.raises(ValueError, match=f"{type(model).__name__}: tokens must be integer ids "
                                         rf"of shape \(batch, time\), {message}"):
        model.init(jax.random.key(0), tokens)


@pytest.mark.parametrize("model", _models()[1:], ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("lengths, message", [
    (np.array([5.0, 3.0], np.float32), r"got float32 \(2,\)"),
    ([5, 3], "got list"),
    (np.array([5], np.int32), r"got int32 \(1,\)"),
])
def test_classifiers_name_themselves_for_malformed_lengths(model, lengths, message):
    with pytest.raises(ValueError, match=f"^{type(model).__name__}: lengths must be an integer "
                                         rf"array of shape \(2,\), one per sequence, {message}"):
        model.init(jax.random.key(0), jnp.zeros((2, 5), jnp.int32), lengths)


def test_language_model_settings_and_targets_are_checked():
    from dense_rnn import stack
    from dense_rnn.models import LanguageModel

    tokens = jnp.zeros((2, 5), jnp.int32)
    for model, args, message in [
        (LanguageModel(50, 8, 6, 0), (), "num_layers=0 must be at least 1"),
        (LanguageModel(50, 8, 6, 1, dropout_rate=-0.5), (), r"dropout_rate=-0.5 must be in"),
        (LanguageModel(50, 8, 6, 1), (None, tokens[:, :3]),
         r"targets \(2, 3\) must have the shape of tokens \(2, 5\)"),
        (stack.RecurrentStack("lstm", ()), (), r"features=\(\) must be a sequence"),
    ]:
        x = tokens if isinstance(model, LanguageModel) else jnp.ones((2, 5, 3))
        with pytest.raises(ValueError, match=message):
            model.init(jax.random.key(0), x, *args)


def test_bidirectional_masks_of_different_broadcast_shapes():
    """One direction's mask (batch, H), the other's (1, H): both broadcast to the carry."""
    layer = recurrent.Bidirectional("lstm", 4)
    x = jax.random.normal(jax.random.key(1), (2, 3, 3))
    variables = layer.init(jax.random.key(0), x)
    m = jax.random.uniform(jax.random.key(2), (2, 4))
    y = layer.apply(variables, x, recurrent_mask=(m, m[:1]))[1]
    np.testing.assert_array_equal(
        y, layer.apply(variables, x, recurrent_mask=(m, jnp.broadcast_to(m[:1], (2, 4))))[1])


def test_a_stack_dropout_rate_outside_0_1_is_one_line():
    from dense_rnn.stack import RecurrentStack

    x = jnp.ones((2, 3, 3))
    with pytest.raises(ValueError, match=r"dropout_rate=-0.5 must be in \[0, 1\)"):
        RecurrentStack("lstm", (4,), dropout_rate=-0.5).init(jax.random.key(0), x)


@pytest.mark.parametrize("layer, message", [
    (recurrent.Recurrent("lstm", 0), "Recurrent: features=0"),
    (recurrent.Bidirectional("gru", 0), "Bidirectional: features=0"),
    (GatedHORNN(0), "GatedHORNN: features=0"),
], ids=["Recurrent", "Bidirectional", "GatedHORNN"])
def test_a_layer_of_size_zero_is_one_line(layer, message):
    with pytest.raises(ValueError, match=message + "; sizes must be at least 1"):
        layer.init(jax.random.key(0), jnp.ones((2, 3, 3)))


@pytest.mark.parametrize("layer", [*_layers(), HMDenseStack("gru", 4, (2, 2))],
                         ids=lambda m: type(m).__name__)
def test_an_empty_batch_gives_empty_outputs(layer):
    x = jnp.ones((0, 6, 3))
    variables = layer.init(jax.random.key(0), x)
    _, y = layer.apply(variables, x)
    y = y[0] if isinstance(y, list) else y  # the HM stack: every layer's outputs
    assert y.shape[:2] == (0, 6)
    grads = jax.grad(lambda v: layer.apply(v, x)[1][0].sum() if isinstance(
        layer, HMDenseStack) else layer.apply(v, x)[1].sum())(variables)
    assert all(not np.asarray(g).any() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("model, message", [
    (LanguageModel(10, 0, 4, 1), "LanguageModel: embed_size=0; sizes"),
    (DCBiLSTM(10, 0, 0, dl=1, dh=2, th=2), "DCBiLSTM: num_classes=0, embed_size=0; sizes"),
    (HMTextClassifier(10, 0, 4, net="hm", features=4), "HMTextClassifier: num_classes=0; sizes"),
], ids=["lm", "dc_bilstm", "hm"])
def test_a_model_of_size_zero_is_one_line(model, message):
    with pytest.raises(ValueError, match=message):
        model.init(jax.random.key(0), jnp.zeros((2, 3), jnp.int32))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_stack_zero_carries_and_param_dtype(cell, bidirectional):
    """``RecurrentStack.zero_carries`` (and ``Bidirectional.zero_carry``) are the carries a
    stack starts from, and ``param_dtype`` reaches every layer's parameters."""
    from dense_rnn.stack import RecurrentStack

    x = jax.random.normal(jax.random.key(1), (3, 5, 4), jnp.bfloat16)
    s = RecurrentStack(cell, (6, 7), "dense", bidirectional, param_dtype=jnp.bfloat16)
    variables = jax.jit(s.init)(jax.random.key(0), x)  # compiled whole, not op by op
    assert {p.dtype for p in jax.tree.leaves(variables)} == {jnp.dtype(jnp.bfloat16)}
    zeros = s.zero_carries(3)  # in the parameters' dtype: the layers stay bfloat16
    assert {c.dtype for c in jax.tree.leaves(zeros)} == {jnp.dtype(jnp.bfloat16)}
    if bidirectional:
        pair = recurrent.Bidirectional(cell, 6).zero_carry(3)
        assert jax.tree.structure(zeros[0]) == jax.tree.structure(pair)
    apply = jax.jit(s.apply)
    (carries, out), (carries0, out0) = apply(variables, x), apply(variables, x, zeros)
    assert jax.tree.structure(carries) == jax.tree.structure(zeros)
    for a, b in zip(jax.tree.leaves((carries, out)), jax.tree.leaves((carries0, out0)),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_stack_gives_each_layer_and_direction_its_own_scaled_recurrent_mask(bidirectional):
    """Variational LSTM dropout on ``h_{t-1}`` (Gal & Ghahramani): each layer's scan gets
    one (batch, n) mask per direction, 0 or 1/keep, drawn apart from the other layers' and
    directions'; none when deterministic, not variational, not an LSTM or at rate 0."""
    import flax.linen as nn

    from dense_rnn.stack import RecurrentStack

    args = {"cell": "lstm", "features": (64, 64), "dropout_rate": 0.4, "variational": True,
            "bidirectional": bidirectional}
    stack, x, seen = RecurrentStack(**args), jnp.ones((8, 5, 3)), []

    def record(next_fun, args, kwargs, context):
        if (context.method_name == "__call__"
                and isinstance(context.module, (recurrent.Recurrent, recurrent.Bidirectional))
                and isinstance(context.module.parent, RecurrentStack)):
            seen.append(args[3])  # the stack passes (x, carry, lengths, recurrent_mask)
        return next_fun(*args, **kwargs)

    v = stack.init(jax.random.key(0), x)
    with nn.intercept_methods(record):
        stack.apply(v, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert len(seen) == 2
    drawn = [np.asarray(m) for layer in seen for m in (layer if bidirectional else (layer,))]
    for m in drawn:
        assert m.shape == (8, 64)
        np.testing.assert_allclose(np.unique(m), [0.0, 1 / 0.6], rtol=1e-6)
        assert 0.25 < (m == 0).mean() < 0.55
    for i in range(len(drawn)):
        for j in range(i):
            assert (drawn[i] != drawn[j]).any()
    for kw, deterministic in (({}, True), ({"variational": False}, False),
                              ({"cell": "gru"}, False), ({"dropout_rate": 0.0}, False)):
        assert RecurrentStack(**(args | kw)).apply(
            {}, 8, 64, deterministic, method=RecurrentStack.recurrent_masks,
            rngs={"dropout": jax.random.key(1)}) is None


def test_layers_take_initializers_and_a_param_dtype():
    """Every layer takes its initializers and ``param_dtype`` (the dense, HM and HORNN
    layers default to PyTorch's uniform init)."""
    x = jnp.ones((2, 4, 3))
    ones, zeros = nn.initializers.ones, nn.initializers.zeros
    for make in (lambda **kw: DenseRecurrent("lstm", 4, 2, **kw),
                 lambda **kw: GatedHORNN(4, **kw),
                 lambda **kw: HMDenseStack("gru", 4, (2, 4), **kw)):
        shapes = jax.eval_shape(make(param_dtype=jnp.bfloat16).init, jax.random.key(0), x)
        assert {a.dtype for a in jax.tree.leaves(shapes)} == {jnp.dtype(jnp.bfloat16)}
        params = jax.jit(make(kernel_init=ones, recurrent_init=zeros, bias_init=ones).init)(
            jax.random.key(0), x)["params"]
        flat = flax.traverse_util.flatten_dict(params, sep="/")
        for name, value in flat.items():
            leaf = name.rsplit("/", 1)[-1]
            want = 1.0 if leaf in ("w_ih", "b") else 0.0
            assert np.all(np.asarray(value) == want), name
        default = jax.jit(make().init)(jax.random.key(0), x)["params"]
        bound = 4 ** -0.5  # pytorch_uniform(features=4)
        assert all(0 < np.abs(a).max() <= bound for a in jax.tree.leaves(default))


@pytest.mark.parametrize("make, window", [
    (lambda: DenseRecurrent("lstm", 4, 3), 6),
    (lambda: DenseRecurrent("gru", 4, 2, block_start=True), 4),
    (lambda: GatedHORNN(4, order=2), 5),
])
def test_a_layer_continued_from_its_carry_runs_as_one_call(make, window):
    """Truncated BPTT / streaming: two calls, the second from the first's final carry,
    give the one long call's outputs (a dense layer's windows whole blocks)."""
    layer = make()
    x = jax.random.normal(jax.random.key(0), (2, 2 * window, 3))
    variables = layer.init(jax.random.key(1), x)
    apply = jax.jit(layer.apply)
    carry, whole = apply(variables, x)
    first_carry, first = apply(variables, x[:, :window])
    last_carry, second = apply(variables, x[:, window:], first_carry)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), whole, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), last_carry, carry)
    assert jax.tree.structure(carry) == jax.tree.structure(layer.zero_carry(2))


def test_the_hm_stack_continued_from_its_carries_runs_as_one_call():
    stack_ = HMDenseStack("gru", 4, (2, 4, 8))
    x = jax.random.normal(jax.random.key(0), (2, 16, 3))
    variables = stack_.init(jax.random.key(1), x)
    apply = jax.jit(stack_.apply)
    carries, outs = apply(variables, x)
    first_carries, first = apply(variables, x[:, :8])
    last, second = apply(variables, x[:, 8:], first_carries)
    for a, b, whole in zip(first, second, outs, strict=True):
        np.testing.assert_allclose(jnp.concatenate([a, b], 1), whole, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), last, carries)
    assert len(carries) == 3 and jax.tree.structure(carries) == jax.tree.structure(
        stack_.zero_carries(2))
    with pytest.raises(ValueError, match="carries has 2 entries for 3 layers"):
        stack_.apply(variables, x, carries[:2])


def test_a_cells_zero_carry_takes_a_batch_size():
    lstm = cells.get_cell("lstm")
    c, h = lstm.zero_carry(3, 5)
    assert c.shape == h.shape == (3, 5) and c.dtype == jnp.float32
    assert lstm.zero_carry((2, 3), 5, jnp.bfloat16)[0].shape == (2, 3, 5)
    for batch in (np.int64(3), jnp.array(3)):  # any integer, e.g. a shape's entry
        assert cells.get_cell("gru").zero_carry(batch, 5).shape == (3, 5)
        assert HMDenseStack("gru", 5, (2, 4)).zero_carries(batch)[1].shape == (3, 5)
