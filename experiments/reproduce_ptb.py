r"""Reproduces Table 1 of Godin et al. (2017) and Zaremba et al.'s PTB rows.

Runs ``experiments.ptb_lm`` for each config (``--parallel`` at a time, each in its own
workdir under ``--root``; a rerun resumes every unfinished run), then writes the results
table, ours beside the paper's::

    python -m experiments.reproduce_ptb --root=workdirs/table1             # every row
    python -m experiments.reproduce_ptb --root=workdirs/table1 --report_only
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from dense_rnn.configs import ptb as ptb_configs

PAPER_ROWS = [n for n in ptb_configs.CONFIGS if n != "tiny"]

flags.DEFINE_list("configs", PAPER_ROWS, "Configs to run.")
flags.DEFINE_string("root", "workdirs/table1", "One workdir per config under this directory.")
flags.DEFINE_string("data_dir", None, "Passed on to experiments.ptb_lm.")
flags.DEFINE_integer("parallel", 1, "Runs at a time (several fit on one GPU).")
flags.DEFINE_list("extra", [], "Extra flags for every run, e.g. --extra=--max_epochs=20.")
flags.DEFINE_bool("report_only", False, "Only write the table from finished runs.")
flags.DEFINE_string("report", None, "Markdown table path (default ROOT/table1.md).")
FLAGS = flags.FLAGS


def launch(name: str) -> subprocess.Popen:
    workdir = os.path.join(FLAGS.root, name)
    os.makedirs(workdir, exist_ok=True)
    cmd = [sys.executable, "-m", "experiments.ptb_lm", f"--config={name}",
           f"--workdir={workdir}", *FLAGS.extra]
    if FLAGS.data_dir:
        cmd.append(f"--data_dir={FLAGS.data_dir}")
    with open(os.path.join(workdir, "command.txt"), "w") as f:
        f.write(" ".join(cmd[1:]) + "\n")
    log = open(os.path.join(workdir, "train.log"), "a")  # noqa: SIM115 (owned by the child)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_all(names: list[str]) -> None:
    pending, running = list(names), {}
    while pending or running:
        while pending and len(running) < FLAGS.parallel:
            name = pending.pop(0)
            running[name] = launch(name)
            print(f"started {name}", flush=True)
        time.sleep(5)
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                print(f"finished {name} (exit {proc.returncode})", flush=True)
                del running[name]


def report(names: list[str]) -> str:
    rows = ["| config | params | paper params | epochs | valid ppl | test ppl | paper valid "
            "| paper test | train tok/s | wall | device |", "|" + " --- |" * 11]
    for name in names:
        c = ptb_configs.CONFIGS[name]
        path = os.path.join(FLAGS.root, name, "summary.json")
        if not os.path.exists(path):
            rows.append(f"| {name} | | {c.paper_params} | not run | | | {c.paper_valid_ppl} "
                        f"| {c.paper_test_ppl} | | | |")
            continue
        with open(path) as f:
            s = json.load(f)
        rows.append(
            f"| {name} | {s['num_params']:,} | {c.paper_params} | {s['epochs_completed']} "
            f"| {s['best_valid_ppl']:.1f} | {s['test_ppl']:.1f} | {c.paper_valid_ppl} "
            f"| {c.paper_test_ppl} | {s['train_tokens_per_second']:,.0f} "
            f"| {s['wall_seconds'] / 60:.1f} min | {s['device']} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> None:
    del argv
    unknown = [n for n in FLAGS.configs if n not in ptb_configs.CONFIGS]
    if unknown:
        sys.exit(f"error: unknown configs {unknown}; known: {', '.join(ptb_configs.CONFIGS)}")
    if not FLAGS.report_only:
        run_all(FLAGS.configs)
    table = report(FLAGS.configs)
    path = FLAGS.report or os.path.join(FLAGS.root, "table1.md")
    with open(path, "w") as f:
        f.write(table)
    print(table)


if __name__ == "__main__":
    app.run(main)
