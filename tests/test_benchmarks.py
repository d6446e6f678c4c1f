"""The benchmark suite runs: the --quick path on its smallest workload, FLOP counts, and the
lax.scan ports compute the same function as the library models they are timed against."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import flops, peers, profile, run
from dense_rnn.configs import ptb
from dense_rnn.train import classify


def test_quick_path_runs_a_tiny_workload(capsys):
    results = run.main(["--quick", "--workloads", "tiny_lm", "--repeats", "1",
                        "--min_time", "0.01", "--impls", "flax nn.RNN"])
    (res,) = results
    impls = {r["impl"]: r for r in res["rows"]}
    assert {"ours", "flax nn.RNN", "gemm xla"} <= set(impls)
    assert impls["ours"]["ours_x"] == 1.0 and impls["ours"]["rate"] > 0
    assert "| tiny train" in capsys.readouterr().out


def test_profile_reports_kernels_of_a_tiny_workload():
    out = profile.main(["tiny_lm", "--steps", "2", "--min_ms", "0"])
    assert out.startswith("step ms: ") and len(out.splitlines()[0].split()) == 4
    assert "fastest step" in out and "while" in out  # the LSTM scans are kernels too


def test_lm_flops_count_every_product():
    c = ptb.CONFIGS["zaremba_small"]  # embed = hidden = 200, 2 layers, V = 10k
    rows = 20 * 20
    lstm = 2 * (2 * rows * 200 * 800 + 2 * rows * 200 * 800)
    assert flops.lm_forward(c, 20, 20) == lstm + 2 * rows * 200 * 10_000
    dense = ptb.CONFIGS["godin_dense_200x2"]  # layer 2 reads [h1; e] = 400, softmax 600
    assert flops.lm_softmax_shape(dense, 20, 35) == (700, 600, 10_000)


def _batch(vocab, batch, time):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.integers(0, vocab, (batch, time), dtype=np.int32)),
            jnp.array([time, time // 2, 1, time - 1][:batch], jnp.int32))


@pytest.mark.parametrize("config", ["dc_bilstm_t4_dl5_dh10", "hm_densegru_64"])
def test_ports_compute_the_models_function(config):
    c, _ = classify.get_config(config)
    model = classify.make_model(c, 50, 3)
    params = classify.init_params(model, jax.random.key(0))
    a = c.model_args
    if a.get("net") == "hm":
        port = peers.hm_port(tuple(a["depths"]))
    else:
        port = peers.dc_bilstm_port(0.0, 0.0, a["dl"] + 1)
    tokens, lengths = _batch(50, 4, 16)
    want = model.apply({"params": params}, tokens, lengths)
    got = port.apply({"params": params}, tokens, lengths)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
