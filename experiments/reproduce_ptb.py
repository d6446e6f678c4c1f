r"""Reproduces Table 1 of Godin et al. (2017) and Zaremba et al.'s PTB rows.

Runs ``experiments.ptb_lm`` for each config (``--parallel`` at a time, each in its own
workdir under ``--root``; a rerun skips the runs finished under the same command and
resumes the others, so ``--extra=--max_epochs=N`` extends finished runs), then
writes the results table, ours beside the paper's, to ``ROOT/table1.md``; ``--report_only``
prints the table of the runs already under ``--root``. Ctrl-C (or SIGTERM) stops the runs
going, each with a checkpoint, and waits for them; the same command resumes them::

    python -m experiments.reproduce_ptb --root=workdirs/table1             # every row
    python -m experiments.reproduce_ptb --root=workdirs/table1 --report_only

``--record=DIR`` copies each finished run's ``command.txt``, ``summary.json``,
``metrics.jsonl`` and ``curves.png`` to ``DIR/CONFIG/``, where ``--report_only
--root=DIR`` prints the table again.
"""

from __future__ import annotations

import os
import subprocess

from absl import flags

from dense_rnn.cli import run_binary
from dense_rnn.configs import ptb as ptb_configs
from dense_rnn.configs.flags import define_path
from dense_rnn.errors import UserError
from experiments import runner

PAPER_ROWS = [n for n in ptb_configs.CONFIGS if n != "tiny"]

flags.DEFINE_list("configs", PAPER_ROWS, "Configs to run.")
define_path("root", "workdirs/table1", "One workdir per config under this directory.")
define_path("data_dir", None, "Passed on to experiments.ptb_lm.")
flags.DEFINE_integer("parallel", 1, "Runs at a time (several fit on one GPU).")
flags.DEFINE_multi_string("extra", [], runner.EXTRA_HELP)
flags.DEFINE_bool("report_only", False, "Only print the table of the runs under --root.")
flags.DEFINE_string("report", None, "Also write the table to this file (default after "
                    "running: ROOT/table1.md).")
define_path("record", None, "Copy every finished run's records (command, summary, "
            "metrics, curves) to DIR/CONFIG/, for experiments/results.")
FLAGS = flags.FLAGS
RESERVED = ("config", "data_dir", "workdir", "mode")  # the flags each run gets from here
REPORTED = ("num_params", "epochs_completed", "best_valid_ppl", "test_ppl",
            "train_tokens_per_second", "wall_seconds", "device")  # summary fields in the table


def start(name: str, extra: list[str]) -> subprocess.Popen | None:
    """Launches the training run of config ``name`` in ``ROOT/name`` with the flags
    ``extra`` (None: it has finished under this command)."""
    data_dir = [f"--data_dir={FLAGS.data_dir}"] if FLAGS.data_dir else []
    return runner.launch("experiments.ptb_lm", [f"--config={name}", *data_dir, *extra],
                         os.path.join(FLAGS.root, name))


def report(names: list[str]) -> str:
    """A markdown table of the runs of ``names`` beside the paper's numbers."""
    rows = ["| config | params | paper params | epochs | valid ppl | test ppl | paper valid "
            "| paper test | train tok/s | wall | device |", "|" + " --- |" * 11]
    for name in names:
        c = ptb_configs.CONFIGS[name]
        s = runner.summary(FLAGS.root, name, REPORTED)
        if s is None:
            status = runner.not_finished(FLAGS.root, [name])
            rows.append(f"| {name} | | {c.paper_params} | {status} | | | {c.paper_valid_ppl} "
                        f"| {c.paper_test_ppl} | | | |")
            continue
        rows.append(
            f"| {name} | {s['num_params']:,} | {c.paper_params} | {s['epochs_completed']} "
            f"| {s['best_valid_ppl']:.1f} | {s['test_ppl']:.1f} | {c.paper_valid_ppl} "
            f"| {c.paper_test_ppl} | {s['train_tokens_per_second']:,.0f} "
            f"| {s['wall_seconds'] / 60:.1f} min | {s['device']} |")
    return "\n".join(rows) + "\n"


def run() -> None:
    """Runs the unfinished configs (unless --report_only), then writes and prints the table."""
    runner.check_lists(configs=FLAGS.configs)
    unknown = [n for n in FLAGS.configs if n not in ptb_configs.CONFIGS]
    if unknown:
        raise UserError(f"unknown configs {', '.join(unknown)}; known: "
                        f"{', '.join(ptb_configs.CONFIGS)}")
    extra = runner.extra_args(FLAGS.extra, RESERVED)
    runner.check_data_dir(FLAGS.data_dir, extra, FLAGS.report_only)
    runner.check(FLAGS.root, FLAGS.parallel, FLAGS.report_only, FLAGS.record)
    if FLAGS.configs and not FLAGS.report_only:
        runner.check_extra("experiments.ptb_lm", [f"--config={FLAGS.configs[0]}"], extra)
    runner.check_parent("report", FLAGS.report)
    failed = [] if FLAGS.report_only else runner.run_all(
        FLAGS.root, FLAGS.configs, lambda name: start(name, extra), FLAGS.parallel)
    if FLAGS.record:
        runner.record(FLAGS.root, FLAGS.configs, FLAGS.record)
    table = report(FLAGS.configs)
    path = FLAGS.report or (None if FLAGS.report_only else os.path.join(FLAGS.root, "table1.md"))
    if path:
        with open(path, "w") as f:
            f.write(table)
    print(table)
    runner.check_all_finished(failed, FLAGS.root)


if __name__ == "__main__":
    run_binary(run)
