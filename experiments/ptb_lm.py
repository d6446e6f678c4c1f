r"""Trains and evaluates a PTB language model (Zaremba et al. 2014; Godin et al. 2017).

    python -m experiments.ptb_lm --config=godin_dense_200x2 --workdir=workdirs/dense

Every config field can be overridden by a flag of the same name (``--max_epochs=2``).
Starting on a workdir that holds a checkpoint resumes the run exactly.

The best checkpoint of a finished run samples text or scores a file (natural-log
probabilities per sentence, each from a zero state, then the perplexity; training's test
perplexity carries the state across sentences, so the two differ on the same text)::

    python -m experiments.ptb_lm --mode=sample --workdir=W --prompt="the company" --seed=1
    python -m experiments.ptb_lm --mode=score --workdir=W --text_file=sentences.txt
"""

from __future__ import annotations

import itertools
import os
import sys

from absl import flags

from dense_rnn.cli import command_line, run_binary, stop_on_signals
from dense_rnn.configs import flags as config_flags
from dense_rnn.configs import ptb as ptb_configs
from dense_rnn.configs.flags import (
    apply_overrides,
    define_override_flags,
    define_path,
    refuse_given,
)
from dense_rnn.data import DEFAULT_DATA_DIR
from dense_rnn.errors import UserError
from dense_rnn.platform import share_gpu_memory

flags.DEFINE_string("config", ptb_configs.DEFAULT_CONFIG,
                    "Named config, one per paper row: "
                    f"{', '.join(n for n in ptb_configs.CONFIGS if n != 'tiny')}; or tiny (a "
                    "smoke-test model, not a paper row).")
define_path("data_dir", os.path.join(DEFAULT_DATA_DIR, "ptb"),
            "Directory with ptb.{train,valid,test}.txt.")
flags.DEFINE_string("hf_dataset", None, "Hugging Face hub dataset instead of --data_dir "
                    "(NAME[:CONFIG][@REVISION], e.g. ptb_text_only@refs/convert/parquet; needs "
                    "network access).")
define_path("workdir", None, "Checkpoints, metrics and summary (default workdirs/CONFIG).")
flags.DEFINE_bool("dry_run", False, "Print the resolved config and parameter count, then exit.")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first: run the same "
                  "command on every host of a TPU pod or GPU cluster (see BUILD.md).")
flags.DEFINE_enum("mode", "train", ["train", "sample", "score"], "Train, or sample text "
                  "from / score --text_file with the best checkpoint in --workdir.")
flags.DEFINE_string("prompt", "", "sample: words to continue (after a sentence start).")
flags.DEFINE_float("temperature", 1.0, "sample: softmax temperature; 0 is greedy.")
flags.DEFINE_integer("num_words", 50, "sample: words to draw (--seed picks them).")
define_path("text_file", None, "score: one sentence a line, words split on spaces; "
            "each sentence is scored from a zero state.")
OVERRIDES = define_override_flags(ptb_configs.LMConfig,
                                  helps={"seed": "In --mode=sample: the sampling seed."})
flags.adopt_module_key_flags(config_flags)
FLAGS = flags.FLAGS
# The flags only one mode reads; the others refuse them.
TRAIN_ONLY = ["dry_run", "multihost", "data_dir", "hf_dataset"]
MODE_ONLY = {"sample": ["prompt", "temperature", "num_words"], "score": ["text_file"]}
MODE_DOES = {"sample": "draws words from", "score": "scores --text_file with"}


def resolve_config() -> ptb_configs.LMConfig:
    """The named ``--config`` with every override flag given applied."""
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


def infer(workdir: str) -> None:
    """``--mode=sample`` or ``--mode=score`` on the best checkpoint in ``workdir``."""
    from dense_rnn.train import lm_infer

    if FLAGS.mode == "score" and not FLAGS.text_file:
        raise UserError("--mode=score needs --text_file=FILE, one sentence a line")
    trained = lm_infer.load(workdir)
    if FLAGS.mode == "sample":
        unknown = [w for w in FLAGS.prompt.split() if w not in trained.word_to_id]
        if unknown:
            print(f"note: the model reads {len(unknown)} prompt word(s) as <unk>, not in its "
                  f"vocabulary: {' '.join(unknown[:10])} (PTB's words are lower-case, its "
                  "numbers N)", file=sys.stderr)
        words = lm_infer.generate(trained, FLAGS.prompt, FLAGS.num_words, FLAGS.temperature,
                                  FLAGS.seed or 0)
        for piece in lm_infer.stream_text(itertools.chain(FLAGS.prompt.split(), words)):
            print(piece, end="", flush=True)  # each word as it is drawn
        print()
        return
    scores = lm_infer.score_file(trained, FLAGS.text_file)
    for sentence, log_prob in zip(scores.sentences, scores.log_probs, strict=True):
        print(f"{log_prob:.4f}\t{sentence}")
    print(f"{len(scores.sentences)} sentences, {scores.num_tokens} tokens "
          f"({scores.num_unknown} unknown -> <unk>): log-prob {scores.log_probs.sum():.4f}, "
          f"perplexity {scores.perplexity:.2f}")
    if scores.num_unknown:
        print(f"note: {scores.num_unknown} word(s) scored as <unk>, which the model finds "
              "likely, so they lower the perplexity; PTB's words are lower-case, its numbers "
              "N, without punctuation: write the text so to score it as PTB", file=sys.stderr)


def check_mode_flags() -> None:
    """Refuses the flags that ``--mode`` would ignore."""
    others = [n for mode, names in MODE_ONLY.items() if mode != FLAGS.mode for n in names]
    if FLAGS.mode == "train":
        refuse_given(others, FLAGS, "--mode=train trains")
    else:
        ignored = TRAIN_ONLY + [n for n in OVERRIDES if n != "seed" or FLAGS.mode != "sample"]
        ignored += ["config"] * bool(FLAGS.workdir)  # (it names the default workdir)
        refuse_given(ignored + others, FLAGS, f"--mode={FLAGS.mode} {MODE_DOES[FLAGS.mode]} "
                     "the trained run in --workdir, as it was configured")


def run() -> None:
    """Trains ``--config`` (or samples/scores with a trained one, per ``--mode``)."""
    check_mode_flags()
    if FLAGS.mode != "train":  # the run's own config applies, not --config's overrides
        if FLAGS.seed is not None and not 0 <= FLAGS.seed < 2**63:  # jax.random.key's range
            raise UserError(f"--seed={FLAGS.seed} must be in [0, 2**63)")
        if not FLAGS.workdir and FLAGS.config not in ptb_configs.CONFIGS:
            resolve_config()  # its unknown-config error
        share_gpu_memory()
        infer(FLAGS.workdir or os.path.join("workdirs", FLAGS.config))
        return
    if FLAGS.hf_dataset:
        refuse_given(["data_dir"], FLAGS, "--hf_dataset names the data (a hub dataset or "
                     "a local dataset directory)")
    config = resolve_config()
    from dense_rnn import precision
    from dense_rnn.train import lm  # after flag parsing: keeps --help and errors fast

    precision.compute_dtype(config.compute_dtype)  # an unknown name: the error now, not later
    if FLAGS.dry_run:
        for k, v in config.to_dict().items():
            print(f"{k}={v}")
        print(f"num_params={lm.num_params(config)}")
        return
    if FLAGS.multihost:
        from dense_rnn.parallel import initialize_distributed

        initialize_distributed()
    workdir = FLAGS.workdir or os.path.join("workdirs", config.name)
    data_dir = None if FLAGS.hf_dataset else resolve_data_dir(FLAGS.data_dir)
    with stop_on_signals() as should_stop:
        lm.train_and_evaluate(config, data_dir, workdir, FLAGS.hf_dataset,
                              log=lambda s: print(s, flush=True), should_stop=should_stop,
                              command=command_line())


if __name__ == "__main__":
    run_binary(run)
