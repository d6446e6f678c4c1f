"""Process set-up of the binaries: XLA flags, the persistent compilation cache, malloc."""

import os
import sys
from types import SimpleNamespace

import jax
import pytest

from dense_rnn import platform


@pytest.fixture
def cache_config():
    """Restores JAX's cache directory setting after the test."""
    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def test_cache_defaults_to_the_user_cache_dir(cache_config, monkeypatch, tmp_path):
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = os.path.join(tmp_path, "dense_rnn", "jax")
    assert platform.enable_compilation_cache() == path
    assert jax.config.jax_compilation_cache_dir == path


def test_cache_keeps_the_users_setting_and_an_empty_one_turns_it_off(cache_config, monkeypatch):
    jax.config.update("jax_compilation_cache_dir", "/somewhere/else")
    assert platform.enable_compilation_cache() == "/somewhere/else"
    jax.config.update("jax_compilation_cache_dir", "")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")
    assert platform.enable_compilation_cache() is None
    assert not jax.config.jax_compilation_cache_dir


def test_xla_flags_go_in_front_of_the_users_and_can_be_told_apart(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("DENSE_RNN_ADDED_XLA_FLAGS", raising=False)
    platform.default_xla_flags()
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=false"
    assert platform.user_xla_flags() == ""
    given = '--xla_dump_to="/tmp/a  b" intra_op_parallelism_threads=1'  # kept as written
    monkeypatch.setenv("XLA_FLAGS", given)
    platform.default_xla_flags()
    assert os.environ["XLA_FLAGS"] == f"--xla_gpu_enable_triton_gemm=false {given}"
    assert platform.user_xla_flags() == given
    platform.default_xla_flags()  # again (a re-executed process): nothing more
    assert platform.user_xla_flags() == given


@pytest.mark.parametrize("given", ["--xla_gpu_enable_triton_gemm=true",
                                   "--xla_dump_to=/tmp/d --xla_gpu_enable_triton_gemm=true",
                                   "/path/to/flags.txt"])  # XLA reads a file of flags
def test_xla_flags_the_user_set_are_kept(monkeypatch, given):
    monkeypatch.setenv("XLA_FLAGS", given)
    monkeypatch.delenv("DENSE_RNN_ADDED_XLA_FLAGS", raising=False)
    platform.default_xla_flags()
    assert os.environ["XLA_FLAGS"] == platform.user_xla_flags() == given


def test_inference_runs_take_gpu_memory_as_needed_unless_told(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    platform.share_gpu_memory()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    platform.share_gpu_memory()
    assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_fast_malloc_sets_what_the_user_left_unset(monkeypatch):
    calls = []
    fake = SimpleNamespace(mallopt=lambda param, value: calls.append((param, value)) or 1)
    monkeypatch.setattr(platform.ctypes, "CDLL", lambda name: fake)
    for name in platform.FAST_MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the user's: kept
    assert platform.fast_malloc() == sys.platform.startswith("linux")
    if sys.platform.startswith("linux"):  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (an int)
        assert calls == [(-3, 2_000_000_000), (-1, 2**31 - 1)]


def test_fast_malloc_takes_effect_here():
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's mallopt")
    assert platform.fast_malloc()
