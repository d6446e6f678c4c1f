"""Named PTB language-model configs, one per paper row.

Zaremba et al. (2014): 2 layers, batch 20, SGD lr 1, uniform init, embedding = hidden.
Godin et al. (2017) Table 1: embedding 200 for the dense models (= hidden for the stacked
rows, which is what makes their 5M / 9M counts come out), dropout 0.6 (hidden 200) or 0.75
(hidden 650) on every layer's output, init 0.05, batch 20, unroll 35, lr 1 for 6 epochs then
x0.95 per epoch, clip 3, up to 100 epochs with early stopping.

Every parameter count below is exact: an LSTM layer with input d and hidden n has
4n(d + n) weights and 4n biases, the softmax (input s) s*V + V, the embedding V*e.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dense_rnn.errors import UserError


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """A PTB language model and its training recipe."""

    name: str
    hidden_size: int
    num_layers: int
    embed_size: int
    connectivity: str = "stacked"
    dropout_rate: float = 0.0
    variational: bool = False
    init_scale: float = 0.05
    vocab_size: int = 10_000
    batch_size: int = 20
    num_steps: int = 35  # truncated-BPTT window (the papers' "unroll")
    learning_rate: float = 1.0
    lr_decay: float = 0.95  # multiplied in once per epoch after `decay_after_epochs`
    decay_after_epochs: int = 6  # epochs at the full learning rate
    max_grad_norm: float = 3.0
    max_epochs: int = 100
    max_steps: int = 0  # stop after this many training steps; 0: no limit
    early_stopping_patience: int = 0  # epochs without a better valid ppl; 0: off
    eval_batch_size: int = 10
    scan_unroll: int = 1  # lax.scan unroll factor (speed only)
    compute_dtype: str = "float32"  # "bfloat16": mixed precision (params, optimizer, loss f32)
    num_devices: int = 0  # data-parallel devices (batch split over them); 0: all visible
    seed: int = 0
    log_every_steps: int = 200
    checkpoint_every_steps: int = 500  # 0: only at epoch ends
    paper_params: str = ""  # the table's rounded parameter count
    paper_valid_ppl: float = 0.0
    paper_test_ppl: float = 0.0

    def __post_init__(self) -> None:
        """Rejects values no model or recipe can take (flag overrides land here)."""
        problems = [f"{k}={getattr(self, k)} must be positive" for k in (
            "hidden_size", "num_layers", "embed_size", "vocab_size", "batch_size", "num_steps",
            "eval_batch_size", "max_epochs", "scan_unroll", "log_every_steps", "learning_rate",
            "lr_decay", "init_scale", "max_grad_norm") if not getattr(self, k) > 0]  # nan fails too
        problems += [f"{k}={getattr(self, k)} must not be negative" for k in (
            "max_steps", "early_stopping_patience", "checkpoint_every_steps",
            "decay_after_epochs", "num_devices") if getattr(self, k) < 0]
        if not 0 <= self.seed < 2**63:  # jax.random.key's range
            problems.append(f"seed={self.seed} must be in [0, 2**63)")
        if self.connectivity not in ("stacked", "dense"):
            problems.append(f"connectivity={self.connectivity!r} must be stacked or dense")
        if not 0.0 <= self.dropout_rate < 1.0:
            problems.append(f"dropout_rate={self.dropout_rate} must be in [0, 1)")
        if problems:
            raise UserError(f"config {self.name}: {'; '.join(problems)}")

    def to_dict(self) -> dict[str, Any]:
        """The config's fields as a plain dict."""
        return dataclasses.asdict(self)


def _zaremba(name: str, hidden: int, steps: int, init: float, dropout: float, epochs: int,
             decay: float, after: int, clip: float, params: str, v: float, t: float) -> LMConfig:
    return LMConfig(
        name=name, hidden_size=hidden, num_layers=2, embed_size=hidden, dropout_rate=dropout,
        init_scale=init, num_steps=steps, lr_decay=decay, decay_after_epochs=after,
        max_grad_norm=clip, max_epochs=epochs, paper_params=params, paper_valid_ppl=v,
        paper_test_ppl=t,
    )


GODIN_PATIENCE = 10  # Godin et al. stop early on validation without saying after how long


def _godin(name: str, hidden: int, layers: int, connectivity: str, dropout: float, params: str,
           v: float, t: float, **kw: Any) -> LMConfig:
    embed = 200 if connectivity == "dense" else hidden
    return LMConfig(
        name=name, hidden_size=hidden, num_layers=layers, embed_size=embed,
        connectivity=connectivity, dropout_rate=dropout, paper_params=params, paper_valid_ppl=v,
        paper_test_ppl=t, early_stopping_patience=GODIN_PATIENCE, **kw,
    )


CONFIGS: dict[str, LMConfig] = {
    c.name: c
    for c in [
        # Zaremba et al. 2014 (small has no dropout); Godin's Table 1 rows 2-3 cite medium
        # and large. Its row 1 is Godin et al.'s own 200x2 run with dropout in Zaremba's
        # medium setup (their footnote): ``zaremba_small_dropout``.
        _zaremba("zaremba_small", 200, 20, 0.1, 0.0, 13, 0.5, 4, 5.0, "5M", 120.7, 114.5),
        _zaremba("zaremba_small_dropout", 200, 35, 0.05, 0.5, 39, 1 / 1.2, 6, 5.0, "5M",
                 104.5, 100.4),
        _zaremba("zaremba_medium", 650, 35, 0.05, 0.5, 39, 1 / 1.2, 6, 5.0, "20M", 86.2, 82.7),
        _zaremba("zaremba_large", 1500, 35, 0.04, 0.65, 55, 1 / 1.15, 14, 10.0, "66M", 82.2, 78.4),
        # Godin et al. 2017, Table 1. The 350x2 dropout is not stated; 0.6 (as for 200) is used.
        _godin("godin_stacked_200x2", 200, 2, "stacked", 0.6, "5M", 105.0, 100.9),
        _godin("godin_stacked_200x3", 200, 3, "stacked", 0.6, "5M", 113.0, 108.8),
        _godin("godin_stacked_350x2", 350, 2, "stacked", 0.6, "9M", 91.5, 87.9),
        _godin("godin_dense_200x2", 200, 2, "dense", 0.6, "9M", 83.4, 80.4),
        _godin("godin_dense_200x3", 200, 3, "dense", 0.6, "11M", 81.5, 78.5),
        _godin("godin_dense_200x4", 200, 4, "dense", 0.6, "14M", 79.2, 76.8),
        _godin("godin_dense_200x5", 200, 5, "dense", 0.6, "17M", 79.7, 76.9),
        _godin("godin_dense_650x2", 650, 2, "dense", 0.75, "23M", 81.5, 78.9),
        _godin("godin_dense_650x2_vd", 650, 2, "dense", 0.5, "23M", 81.3, 78.3, variational=True),
        # Not a paper row: a seconds-long model for tests and smoke runs.
        LMConfig(
            name="tiny", hidden_size=16, num_layers=2, embed_size=16, connectivity="dense",
            dropout_rate=0.1, batch_size=4, num_steps=5, max_epochs=2, eval_batch_size=2,
            log_every_steps=20, checkpoint_every_steps=50,
        ),
    ]
}
DEFAULT_CONFIG = "godin_dense_200x2"

