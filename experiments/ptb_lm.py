r"""Trains and evaluates a PTB language model (Zaremba et al. 2014; Godin et al. 2017).

    python -m experiments.ptb_lm --config=godin_dense_200x2 --workdir=workdirs/dense

Every config field can be overridden by a flag of the same name (``--max_epochs=2``).
Starting on a workdir that holds a checkpoint resumes the run exactly.
"""

from __future__ import annotations

import os

from absl import flags

from dense_rnn.cli import run_binary
from dense_rnn.configs import ptb as ptb_configs
from dense_rnn.configs.flags import apply_overrides, define_override_flags
from dense_rnn.errors import UserError

DEFAULT_DATA_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "ptb")

flags.DEFINE_string("config", ptb_configs.DEFAULT_CONFIG,
                    f"Named config: {', '.join(ptb_configs.CONFIGS)}.")
flags.DEFINE_string("data_dir", DEFAULT_DATA_DIR, "Directory with ptb.{train,valid,test}.txt.")
flags.DEFINE_string("hf_dataset", None, "Hugging Face hub dataset instead of --data_dir "
                    "(e.g. ptb_text_only; needs network access).")
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and summary (default workdirs/CONFIG).")
flags.DEFINE_bool("dry_run", False, "Print the resolved config and parameter count, then exit.")
OVERRIDES = define_override_flags(ptb_configs.LMConfig)
FLAGS = flags.FLAGS


def resolve_config() -> ptb_configs.LMConfig:
    if FLAGS.config not in ptb_configs.CONFIGS:
        raise UserError(f"unknown config {FLAGS.config!r}; known configs: "
                        f"{', '.join(ptb_configs.CONFIGS)}")
    return apply_overrides(ptb_configs.CONFIGS[FLAGS.config], OVERRIDES, FLAGS)


def resolve_data_dir(data_dir: str) -> str:
    """Accepts the PTB directory itself or a data root that holds ``ptb/``."""
    nested = os.path.join(data_dir, "ptb")
    if not os.path.exists(os.path.join(data_dir, "ptb.train.txt")) and os.path.isdir(nested):
        return nested
    return data_dir


def run() -> None:
    config = resolve_config()
    from dense_rnn.train import lm  # after flag parsing: keeps --help and errors fast

    if FLAGS.dry_run:
        for k, v in config.to_dict().items():
            print(f"{k}={v}")
        print(f"num_params={lm.num_params(config)}")
        return
    workdir = FLAGS.workdir or os.path.join("workdirs", config.name)
    data_dir = None if FLAGS.hf_dataset else resolve_data_dir(FLAGS.data_dir)
    lm.train_and_evaluate(config, data_dir, workdir, FLAGS.hf_dataset,
                          log=lambda s: print(s, flush=True))


if __name__ == "__main__":
    run_binary(run)
