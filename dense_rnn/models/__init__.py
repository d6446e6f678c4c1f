"""Flax models. ``CLASSIFIERS`` maps the ``model`` names used by classifier configs to classes."""

from dense_rnn.models.lm import LanguageModel

CLASSIFIERS: dict[str, type] = {}

__all__ = ["CLASSIFIERS", "LanguageModel"]
