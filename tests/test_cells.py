"""Cells against independent float64 NumPy implementations of the paper equations."""

import numpy as np
import pytest

from dense_rnn import cells

pytestmark = pytest.mark.usefixtures("x64")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm(p, c, h, x):
    """Zaremba et al. 2014 LSTM, gates i, f, g, o written out one by one."""
    n = h.shape[-1]
    w = lambda k: p["w_ih"][:, k * n:(k + 1) * n]  # noqa: E731
    u = lambda k: p["w_hh"][:, k * n:(k + 1) * n]  # noqa: E731
    b = lambda k: p["b"][k * n:(k + 1) * n]  # noqa: E731
    i = sigmoid(x @ w(0) + h @ u(0) + b(0))
    f = sigmoid(x @ w(1) + h @ u(1) + b(1))
    g = np.tanh(x @ w(2) + h @ u(2) + b(2))
    o = sigmoid(x @ w(3) + h @ u(3) + b(3))
    c = f * c + i * g
    return c, o * np.tanh(c)


def np_gru(p, h, x):
    """Cho et al. 2014 GRU: reset applied before the recurrent product of the candidate."""
    n = h.shape[-1]
    w = lambda k: p["w_ih"][:, k * n:(k + 1) * n]  # noqa: E731
    u = lambda k: p["w_hh"][:, k * n:(k + 1) * n]  # noqa: E731
    b = lambda k: p["b"][k * n:(k + 1) * n]  # noqa: E731
    r = sigmoid(x @ w(0) + h @ u(0) + b(0))
    z = sigmoid(x @ w(1) + h @ u(1) + b(1))
    cand = np.tanh(x @ w(2) + (r * h) @ u(2) + b(2))
    return (1 - z) * h + z * cand


def random_params(rng, d, n, gates):
    return {"w_ih": rng.normal(size=(d, gates * n)), "w_hh": rng.normal(size=(n, gates * n)),
            "b": rng.normal(size=(gates * n,))}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lstm_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    p = random_params(rng, 5, 7, 4)
    c, h, x = rng.normal(size=(3, 7)), rng.normal(size=(3, 7)), rng.normal(size=(3, 5))
    (c_j, h_j), y = cells.get_cell("lstm")(p, (c, h), x)
    c_n, h_n = np_lstm(p, c, h, x)
    np.testing.assert_allclose(c_j, c_n, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h_j, h_n, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(y, h_j)


@pytest.mark.parametrize("seed", [0, 1])
def test_gru_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    p = random_params(rng, 4, 6, 3)
    h, x = rng.normal(size=(2, 6)), rng.normal(size=(2, 4))
    h_j, _ = cells.get_cell("gru")(p, h, x)
    np.testing.assert_allclose(h_j, np_gru(p, h, x), rtol=1e-12, atol=1e-12)


def test_rnn_matches_numpy():
    rng = np.random.default_rng(0)
    p = random_params(rng, 4, 6, 1)
    h, x = rng.normal(size=(2, 6)), rng.normal(size=(2, 4))
    h_j, _ = cells.get_cell("rnn")(p, h, x)
    np.testing.assert_allclose(h_j, np.tanh(x @ p["w_ih"] + h @ p["w_hh"] + p["b"]), rtol=1e-12)


def test_unknown_cell():
    with pytest.raises(ValueError, match="unknown cell"):
        cells.get_cell("transformer")
