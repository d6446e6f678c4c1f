"""Shared test settings: the data directory, the compilation caches and float64 NumPy
references."""

import gc
import itertools
import os
import shutil
import tempfile

import pytest

from dense_rnn.data import DEFAULT_DATA_DIR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get("DENSE_RNN_DATA_DIR", DEFAULT_DATA_DIR)


def pytest_configure(config):
    """Each test process (each xdist worker) and the binaries it starts share one
    compilation cache made for it (never the user's ``~/.cache``): a step compiled once is
    loaded after that. Workers do not share one: JAX writes a cache entry in place."""
    config.compilation_cache_dir = tempfile.mkdtemp(prefix="dense_rnn_test_jax_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config.compilation_cache_dir
    # the BLAS handler (dense_rnn/blas.py) is built once per test session, into a directory
    # the workers inherit from the process that made it
    config.made_blas_cache = "DENSE_RNN_CACHE" not in os.environ
    if config.made_blas_cache:
        os.environ["DENSE_RNN_CACHE"] = tempfile.mkdtemp(prefix="dense_rnn_test_blas_")


def pytest_unconfigure(config):
    """Removes the caches. An xdist worker also freezes its heap first: pytest's last check
    for unraisable exceptions then runs ``gc.collect()`` five times, each through JAX's gc
    callback over every object the worker's tests left alive (seconds, after hundreds of
    tests), and a worker still busy 5 s after the controller asked it to exit is sent
    SIGINT by execnet, which then surfaces as a ``PytestUnraisableExceptionWarning`` from
    ``_xla_gc_callback``."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        gc.freeze()
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    shutil.rmtree(config.compilation_cache_dir, ignore_errors=True)
    if config.made_blas_cache:
        shutil.rmtree(os.environ.pop("DENSE_RNN_CACHE"), ignore_errors=True)


def grid(*axes: list, default: list[tuple]) -> list:
    """Every combination of ``axes`` as ``pytest.param``s, an axis's tuples flattened into
    their values; those not in ``default`` are marked slow. The default run checks the few
    combinations chosen to vary every axis, ``pytest -m slow`` the rest of the grid."""
    combos = [sum((v if isinstance(v, tuple) else (v,) for v in c), ())
              for c in itertools.product(*axes)]
    missing = [d for d in default if d not in combos]
    if missing:
        raise ValueError(f"default combinations not in the grid: {missing}")
    return [pytest.param(*c, marks=() if c in default else pytest.mark.slow) for c in combos]


@pytest.fixture(scope="session")
def data_dir() -> str:
    if not os.path.isdir(DATA_DIR):
        pytest.skip(f"no data at {DATA_DIR}; set DENSE_RNN_DATA_DIR")
    return DATA_DIR


@pytest.fixture
def x64():
    """Float64 JAX inside one test, for comparisons with float64 NumPy references."""
    import jax

    if hasattr(jax, "enable_x64"):
        context = jax.enable_x64(True)
    else:  # jax < 0.8
        from jax.experimental import enable_x64 as context_manager

        context = context_manager()
    with context:
        yield


def lm_step_off_and_on(monkeypatch, variable: str, target: str, available) -> tuple:
    """A tiny dense LM's training step with the C++ kernel switched by the environment
    ``variable`` off, then on: ``((nll, new_params), (nll, new_params))``. Asserts that the
    step calls ``target`` only when on; skipped where ``available()`` is false when on."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import optax

    from dense_rnn.configs.ptb import CONFIGS
    from dense_rnn.train import lm

    def one_step():
        c = dataclasses.replace(CONFIGS["tiny"], vocab_size=50, dropout_rate=0.0)
        model, params, tx = lm.make_model(c), lm.init_params(c, jax.random.key(0)), optax.sgd(1.0)
        x = jax.random.randint(jax.random.key(1), (c.batch_size, c.num_steps), 0, 50)
        step = lm.make_train_step(model, tx, 0, jnp.float32)
        lowered = step.lower(params, tx.init(params), model.zero_carries(4), x, x, 0).as_text()
        new, _, _, nll = step(params, tx.init(params), model.zero_carries(4), x, x, 0)
        return target in lowered, (nll, new)

    monkeypatch.setenv(variable, "off")
    used_off, off = one_step()
    monkeypatch.setenv(variable, "on")
    if not available():
        pytest.skip("the C++ kernels cannot be built or loaded here")
    used_on, on = one_step()
    assert used_on and not used_off
    return off, on
