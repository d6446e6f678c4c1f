"""Shared test settings: the data directory, the compilation cache and float64 NumPy
references."""

import os
import shutil
import tempfile

import pytest

from dense_rnn.data import DEFAULT_DATA_DIR

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get("DENSE_RNN_DATA_DIR", DEFAULT_DATA_DIR)


def pytest_configure(config):
    """The tests and the binaries they start share one compilation cache made for this
    session (never the user's ``~/.cache``): a step compiled once is loaded after that."""
    config.compilation_cache_dir = tempfile.mkdtemp(prefix="dense_rnn_test_jax_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = config.compilation_cache_dir


def pytest_unconfigure(config):
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    shutil.rmtree(config.compilation_cache_dir, ignore_errors=True)


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
