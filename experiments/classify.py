r"""Trains and evaluates a sentence classifier (Ding et al. 2018 DC-Bi-LSTM and others).

    python -m experiments.classify --config=dc_bilstm --dataset=sst2 \
        --data_dir=../shared/data --workdir=workdirs/dc_sst2 \
        --embeddings=../shared/data/glove/glove.6B.50d.txt.gz

Every scalar config field but ``name``, ``model`` and ``paper``, and every model argument
of the known configs, can be overridden by a flag of the same name (``--max_epochs=2``,
``--dl=5``; a tuple of integers as a list, ``--depths=2,4,8``). Starting on a workdir that
holds a checkpoint resumes the run exactly. MR and Subj run 10-fold CV (``--folds`` picks
some folds), each fold in ``WORKDIR/fold_K``. A trained run classifies new text::

    python -m experiments.classify --mode=predict --workdir=workdirs/dc_sst2 --text_file=F

printing ``label<TAB>name<TAB>probability<TAB>text`` for each non-blank line of ``F``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from types import ModuleType
from typing import Any

from absl import flags

from dense_rnn.cli import command_line, run_binary, stop_on_signals
from dense_rnn.configs import flags as config_flags
from dense_rnn.configs.classifier import ClassifierConfig
from dense_rnn.configs.families import all_configs, get_config
from dense_rnn.configs.flags import (
    DEFINE_BY_TYPE,
    apply_overrides,
    define_override_flags,
    define_path,
    refuse_given,
)
from dense_rnn.data import DEFAULT_DATA_DIR
from dense_rnn.errors import UserError
from dense_rnn.platform import share_gpu_memory

flags.DEFINE_string("config", "dc_bilstm", "Named config, one per paper row: "
                    f"{', '.join(all_configs())}.")
flags.DEFINE_string("dataset", "sst2", "Dataset: mr, sst1, sst2, subj, trec, sst1_phrases, "
                    "sst2_phrases (Ding et al.); imdb, sst5, ag (Zhao et al.).")
define_path("data_dir", DEFAULT_DATA_DIR,
            "Root holding mr/, sst/, subj/, trec/, imdb/, ag_news/ (and glove/).")
flags.DEFINE_string("hf_dataset", None, "Read --dataset from this Hugging Face hub dataset "
                    "(NAME[:CONFIG][@REVISION], or a local dataset directory) instead of "
                    "--data_dir, e.g. fancyzhx/ag_news for --dataset=ag; BUILD.md lists one "
                    "per dataset.")
define_path("workdir", None, "Checkpoints, metrics and summary "
            "(default workdirs/CONFIG_DATASET).")
define_path("embeddings", None, "GloVe .txt or .txt.gz file (any dimension; "
            "embed_size follows it). Unset: randomly initialised embeddings.")
flags.DEFINE_enum("oov", "drop", ["drop", "random"], "Words without a pretrained vector: "
                  "dropped from the sentences (Ding et al.) or randomly initialised.")
flags.DEFINE_enum("select", "dev", ["dev", "test"], "Reported test accuracy: at the best "
                  "dev epoch, or 'test' = best test accuracy during training (the paper's "
                  "protocol, optimistic; labelled so in every output).")
flags.DEFINE_list("folds", None, "CV folds to run (MR, Subj); default all 10.")
flags.DEFINE_list("lr_sweep", None, "Learning rates to try, e.g. 1e-2,1e-3,1e-4 (Zhao et al.): "
                  "one run each in WORKDIR/lr_RATE, the best on dev reported in WORKDIR.")
flags.DEFINE_integer("max_len", 0, "Keep only N tokens of every text (0: all), the first or "
                     "the last (--keep); recorded in the summary (e.g. IMDB).")
flags.DEFINE_enum("keep", "first", ["first", "last"], "Which --max_len tokens of a longer text "
                  "are kept: its first or its last (a review's verdict often comes last).")
flags.DEFINE_bool("dry_run", False, "Print the resolved config and parameter counts, exit.")
flags.DEFINE_bool("multihost", False, "Call jax.distributed.initialize() first: run the same "
                  "command on every host of a TPU pod or GPU cluster (see BUILD.md).")
flags.DEFINE_enum("mode", "train", ["train", "predict"], "Train, or classify each line of "
                  "--text_file with the best checkpoint in --workdir.")
define_path("text_file", None, "predict: one text a line (UTF-8).")
OVERRIDES = define_override_flags(ClassifierConfig, skip=("name", "model", "paper"))
FLAGS = flags.FLAGS


def _define_model_arg_flags() -> list[str]:
    """``--<arg>`` for every model argument of every known config and its family's
    ``OPTIONAL_MODEL_ARGS`` (first type seen wins); a tuple of ints is a list flag
    (``--depths=2,4,8``)."""
    names: list[str] = []
    for config, family in all_configs().values():
        for k, v in {**config.model_args, **_optional_args(family)}.items():
            if k in names or k in FLAGS:
                continue
            if type(v) in DEFINE_BY_TYPE:
                DEFINE_BY_TYPE[type(v)](k, None, "Override the model argument of that name.")
                names.append(k)
            elif type(v) is tuple and v and all(type(x) is int for x in v):
                flags.DEFINE_list(k, None, "Override the model argument of that name "
                                  "(comma-separated integers).")
                names.append(k)
    return names


def _optional_args(family: ModuleType) -> dict[str, Any]:
    """The model arguments a config of ``family`` does not set but a run may."""
    return getattr(family, "OPTIONAL_MODEL_ARGS", {})


def _model_arg(name: str) -> Any:
    """The value of model-argument flag ``name``; a list flag's as a tuple of ints."""
    value = FLAGS[name].value
    if not isinstance(value, list):
        return value
    try:
        ints = tuple(int(x) for x in value)
    except ValueError:
        ints = ()
    if not ints:
        raise UserError(f"--{name}={','.join(value)}: give integers like 2,4,8")
    return ints


MODEL_ARG_FLAGS = _define_model_arg_flags()
flags.adopt_module_key_flags(config_flags)
# The flags that only training reads; --mode=predict refuses them (and training --text_file).
TRAIN_ONLY = ["data_dir", "hf_dataset", "embeddings", "oov", "select", "folds", "lr_sweep",
              "max_len", "keep", "dry_run", "multihost"]


def resolve_config() -> tuple[ClassifierConfig, ModuleType]:
    """The named ``--config`` and its family, with every override and model-argument flag
    given applied; its model is built once to reject arguments the model cannot take."""
    config, family = get_config(FLAGS.config)
    config = apply_overrides(config, OVERRIDES, FLAGS)
    given = {n: _model_arg(n) for n in MODEL_ARG_FLAGS if FLAGS[n].present}
    unknown = sorted(set(given) - set(config.model_args) - set(_optional_args(family)))
    if unknown:
        raise UserError(f"config {config.name} has no model argument "
                        f"{', '.join(unknown)}; its arguments: {', '.join(config.model_args)}")
    if given:
        config = dataclasses.replace(config, model_args={**config.model_args, **given})
    if FLAGS.embeddings:  # the run takes the embedding size of the file
        from dense_rnn.data.glove import glove_dim

        dim = glove_dim(FLAGS.embeddings)
        if FLAGS["embed_size"].present and FLAGS.embed_size != dim:
            raise UserError(f"--embed_size={FLAGS.embed_size}, but the vectors of "
                            f"--embeddings={FLAGS.embeddings} have {dim} dimensions; drop "
                            "--embed_size (it follows the file)")
        sized = dataclasses.replace(config, embed_size=dim)
        if dim != config.embed_size:  # a given --embed_size matches the file (above)
            print(f"note: the vectors of --embeddings have {dim} dimensions, config "
                  f"{config.name}'s embed_size is {config.embed_size}: this model reads {dim}-d "
                  f"words and has {family.paper_param_count(sized):,} parameters in the "
                  f"paper's count, against {family.paper_param_count(config):,} at "
                  f"{config.embed_size}", file=sys.stderr)
        config = sized
    from dense_rnn import precision
    from dense_rnn.train import classify  # after the checks above: keeps their errors fast

    precision.compute_dtype(config.compute_dtype)  # an unknown name: the error now, not later
    try:
        classify.num_params_without_embedding(config, num_classes=2)  # builds the model
    except (ValueError, TypeError) as e:
        raise UserError(f"config {config.name}: {e}") from None
    return config, family


def predict(workdir: str) -> None:
    """``--mode=predict``: the label and its probability for every line of --text_file."""
    from dense_rnn.data.text_classification import read_lines
    from dense_rnn.train import classify_infer

    if not FLAGS.text_file:
        raise UserError("--mode=predict needs --text_file=FILE, one text a line")
    numbered = read_lines(FLAGS.text_file, "utf-8", "text file",
                          "pass --text_file=FILE with one text a line")
    texts = [line for _, line in numbered]
    trained = classify_infer.load(workdir)
    out = classify_infer.predict(trained, texts)
    names = trained.class_names
    for text, p, label in zip(texts, out.probs, out.labels, strict=True):
        print(f"{label}\t{names[label]}\t{p[label]:.4f}\t{text}")
    fate = "dropped" if trained.vocab.drop_unknown else "mapped to <unk>"
    print(f"{len(texts)} texts, {out.num_words} words, {out.num_unknown} not in the vocabulary "
          f"({fate}); {trained.config.name} trained on {trained.dataset}", file=sys.stderr)
    empty = [str(n) for (n, _), e in zip(numbered, out.empty, strict=True) if e]
    if empty:
        print(f"warning: {len(empty)} text(s) hold no word the model reads (line(s) "
              f"{', '.join(empty[:10])}{', ...' * (len(empty) > 10)}): their label is the "
              "model's guess for an empty text", file=sys.stderr)


def run() -> None:
    """Trains ``--config`` on ``--dataset`` (or classifies ``--text_file`` with a trained run)."""
    if FLAGS.mode == "predict":
        refuse_given(TRAIN_ONLY + OVERRIDES + MODEL_ARG_FLAGS
                     + ["config", "dataset"] * bool(FLAGS.workdir), FLAGS, "--mode=predict "
                     "reads the trained run's config and vocabulary from --workdir")
        share_gpu_memory()
        predict(FLAGS.workdir or os.path.join("workdirs", f"{FLAGS.config}_{FLAGS.dataset}"))
        return
    refuse_given(["text_file"], FLAGS, "--mode=train trains on --dataset")
    if FLAGS.hf_dataset:
        refuse_given(["data_dir"], FLAGS, "--hf_dataset names the data (a hub dataset or "
                     "a local dataset directory)")
    if not FLAGS.embeddings:
        refuse_given(["oov"], FLAGS, "without --embeddings every word is learnt (none lacks a "
                     "pretrained vector)")
    if not FLAGS.max_len:
        refuse_given(["keep"], FLAGS, "without --max_len every token is kept")
    if FLAGS.lr_sweep:
        refuse_given(["learning_rate"], FLAGS, "--lr_sweep sets each run's learning rate")
    config, family = resolve_config()
    from dense_rnn.data.text_classification import get_dataset
    from dense_rnn.train import classify

    spec = get_dataset(FLAGS.dataset)
    if FLAGS.dry_run:
        for k, v in config.to_dict().items():
            print(f"{k}={v}")
        print(f"dataset={FLAGS.dataset}")
        print(f"num_params_paper={family.paper_param_count(config)}")
        print(f"num_params={classify.num_params_without_embedding(config, spec.num_classes)}")
        return
    try:
        folds = None if FLAGS.folds is None else [int(f) for f in FLAGS.folds]
    except ValueError:
        raise UserError(f"--folds={','.join(FLAGS.folds)}: give fold numbers like 0,1,2") from None
    if FLAGS.multihost:
        from dense_rnn.parallel import initialize_distributed

        initialize_distributed()
    workdir = FLAGS.workdir or os.path.join("workdirs", f"{config.name}_{FLAGS.dataset}")
    kwargs = dict(family=family, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir,
                  embeddings=FLAGS.embeddings, oov=FLAGS.oov, select=FLAGS.select, folds=folds,
                  log=lambda s: print(s, flush=True), max_len=FLAGS.max_len, keep=FLAGS.keep,
                  hf_dataset=FLAGS.hf_dataset, command=command_line())
    rates = None
    if FLAGS.lr_sweep:
        try:
            rates = [float(r) for r in FLAGS.lr_sweep]
        except ValueError:
            raise UserError(f"--lr_sweep={','.join(FLAGS.lr_sweep)}: give learning rates "
                            "like 1e-2,1e-3,1e-4") from None
    with stop_on_signals() as should_stop:
        if rates is not None:
            classify.run_lr_sweep(config, rates, workdir, should_stop=should_stop, **kwargs)
        else:
            classify.run(config, workdir=workdir, should_stop=should_stop, **kwargs)


if __name__ == "__main__":
    run_binary(run)
