"""The configuration shared by every sentence/document classifier.

Each model family keeps its named configs (one per paper row) in its own module,
``dense_rnn/configs/<family>.py``, as a ``CONFIGS: dict[str, ClassifierConfig]``. A config
names its model class in ``dense_rnn.models.CLASSIFIERS``; the class is built as
``cls(vocab_size=V, num_classes=C, embed_size=config.embed_size, **config.model_args)``
and called as ``model(tokens[B, T] int32, lengths[B] int32, deterministic=bool) -> logits[B, C]``.
Its word embedding is a submodule named ``embed`` (``nn.Embed``), so the trainer can load
GloVe vectors into it and freeze it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dense_rnn.errors import UserError


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
    """A classifier and how to train it. The defaults are Ding et al. 2018's recipe (300-d
    embeddings, Adam at 0.005, batch 200) where the paper gives one; the epoch budget and
    early stopping, which it does not give, are ours."""

    name: str
    model: str
    model_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embed_size: int = 300
    freeze_embeddings: bool = False
    learning_rate: float = 0.005
    batch_size: int = 200
    max_epochs: int = 20  # not in Ding et al.: ours
    max_grad_norm: float = 0.0  # 0: no clipping
    l2: float = 0.0  # L2 weight on the softmax weights
    early_stopping_patience: int = 5  # epochs without dev improvement; 0: off (ours)
    seed: int = 0
    checkpoint_every_steps: int = 0  # also checkpoint mid-epoch every N steps; 0: off
    compute_dtype: str = "float32"  # "bfloat16": mixed precision (params, optimizer, loss f32)
    num_devices: int = 0  # data-parallel devices (batch split over them); 0: all visible
    paper: str = ""  # the paper row this config reproduces, with its reported numbers

    def __post_init__(self) -> None:
        """Rejects values no recipe can take (flag overrides land here)."""
        problems = [f"{k}={getattr(self, k)} must be at least 1"
                    for k in ("embed_size", "batch_size", "max_epochs") if getattr(self, k) < 1]
        problems += [f"{k}={getattr(self, k)} must be 0 or more" for k in (
            "max_grad_norm", "l2", "early_stopping_patience", "checkpoint_every_steps",
            "num_devices") if not getattr(self, k) >= 0]  # nan fails too
        if not 0 <= self.seed < 2**63:  # jax.random.key's range
            problems.append(f"seed={self.seed} must be in [0, 2**63)")
        if not self.learning_rate > 0:
            problems.append(f"learning_rate={self.learning_rate} must be positive")
        if problems:
            raise UserError(f"config {self.name}: {'; '.join(problems)}")

    def to_dict(self) -> dict[str, Any]:
        """The config's fields as a plain dict (``model_args`` as a ``dict``)."""
        d = dataclasses.asdict(self)
        d["model_args"] = dict(self.model_args)
        return d
