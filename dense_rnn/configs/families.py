"""The classifier config families and their named configs.

Light on purpose (no JAX): ``experiments.classify`` lists every config's model arguments
before parsing its flags, and reports an unknown ``--config`` without loading the trainer.
Every module in ``FAMILIES`` provides ``CONFIGS``, ``paper_param_count(config)``
and ``paper_accuracy(name, dataset)``.
"""

from __future__ import annotations

from types import ModuleType

from dense_rnn.configs import dc_bilstm, hm_densernn
from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.errors import UserError

FAMILIES: tuple[ModuleType, ...] = (dc_bilstm, hm_densernn)


def all_configs() -> dict[str, tuple[ClassifierConfig, ModuleType]]:
    """Every named classifier config with the family module that defines it."""
    return {n: (c, fam) for fam in FAMILIES for n, c in fam.CONFIGS.items()}


def get_config(name: str) -> tuple[ClassifierConfig, ModuleType]:
    """The config named ``name`` and its family module; a ``UserError`` lists the known ones."""
    configs = all_configs()
    if name not in configs:
        raise UserError(f"unknown config {name!r}; known configs: {', '.join(configs)}")
    return configs[name]
