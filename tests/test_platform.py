"""Process set-up of the binaries: the persistent compilation cache."""

import os

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
