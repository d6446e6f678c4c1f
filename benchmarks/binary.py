"""``python -m benchmarks.binary CONFIG [--steps N] [--log_every L] [--repeats R]``: the PTB
training binary, run as a user runs it, against the suite's implementations of the same
config, alternated in one run.

Each repeat runs ``python -m experiments.ptb_lm --config=CONFIG --max_steps=N
--log_every_steps=L --num_devices=1`` in a fresh workdir (a subprocess; the binary logs
tokens/s of wall clock over every L steps, input pipeline, logging and mid-epoch checkpoints
included, the compiling first step left out) and takes the median of its logged rates;
then it times each implementation's step, each in a worker process of its own, as
``benchmarks.run`` does (PyTorch with OpenMP's default wait policy). The binary gets the
environment this command was given, without the settings the suite adds for its own peers.
It dispatches steps ahead and waits once a logged window, where the suite waits for every
step, so its rate also gains the host work it overlaps with the computation.
Reported per repeat and as the median over repeats: the binary's rate, each
implementation's, and the binary's rate over each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile

from benchmarks import options, run
from dense_rnn.cli import run_script
from dense_rnn.configs import ptb
from dense_rnn.data import DEFAULT_DATA_DIR
from dense_rnn.errors import UserError

RATE = re.compile(r"([\d,]+) tok/s")
# Config fields --binary_flags may set: they leave each training step's work as it is.
SAME_WORK = ("learning_rate", "max_grad_norm", "checkpoint_every_steps", "max_epochs",
             "early_stopping_patience", "eval_batch_size", "seed")
# Flags of the binary that this command sets itself, or that would stop it from training.
OWN_FLAGS = ("config", "workdir", "max_steps", "log_every_steps", "num_devices", "data_dir",
             "mode", "dry_run")


def binary_rate(config: str, steps: int, log_every: int, flags: list[str]) -> float:
    """Median of the tokens/s that one fresh ``experiments.ptb_lm`` run logs."""
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.run(
            [sys.executable, "-m", "experiments.ptb_lm", f"--config={config}",
             f"--max_steps={steps}", f"--log_every_steps={log_every}", "--num_devices=1",
             f"--workdir={workdir}", *flags], capture_output=True, text=True, check=False,
            env=run.user_env())
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        raise UserError(f"experiments.ptb_lm failed: {lines[-1] if lines else proc.returncode}")
    rates = [float(m.group(1).replace(",", "")) for m in RATE.finditer(proc.stdout)]
    if not rates:
        raise UserError(f"experiments.ptb_lm logged no rate in {steps} steps; give --steps a "
                        f"multiple of --log_every={log_every}")
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.workloads import GEMM, OURS, lm_workload

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a PTB config (dense_rnn/configs/ptb.py)")
    p.add_argument("--steps", type=options.count, default=300, help="training steps per binary run")
    p.add_argument("--log_every", type=options.count, default=50, help="steps per logged rate")
    p.add_argument("--repeats", type=options.count, default=3)
    p.add_argument("--impls", default=f"{OURS},torch nn.LSTM",
                   help="comma-separated implementations timed beside the binary")
    p.add_argument("--min_time", type=options.seconds, default=2.0,
                   help="seconds per timed step set")
    p.add_argument("--warmup", type=options.seconds_or_zero, default=3.0,
                   help="seconds each implementation runs before it is timed (as benchmarks.run)")
    p.add_argument("--data_dir", default=DEFAULT_DATA_DIR)
    p.add_argument("--binary_flags", default="",
                   help="more flags for the binary, one string: --binary_flags=\"--a=1 --b=2\"")
    a = p.parse_args(argv)
    if a.config not in ptb.CONFIGS:
        raise UserError(f"unknown config {a.config!r}; known: {', '.join(ptb.CONFIGS)}")
    w = lm_workload(a.config)
    known = [n for n in w.impls if not n.startswith(GEMM)]
    names = a.impls.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown implementations {unknown}; known: {', '.join(known)}")
    extra = shlex.split(a.binary_flags)
    names_of = {f: f.split("=")[0].lstrip("-") for f in extra}
    if own := [f for f, n in names_of.items() if n in OWN_FLAGS]:
        p.error(f"--binary_flags: {' '.join(own)} cannot be given there: this command sets "
                "the binary's config, workdir, data, steps and logging itself, and trains")
    fields = {f.name for f in dataclasses.fields(ptb.LMConfig)} - set(SAME_WORK)
    changing = [f for f, n in names_of.items() if n.removeprefix("no") in fields]
    if changing:
        raise UserError(f"--binary_flags: {' '.join(changing)} would change the model, its "
                        "shape or its step, and the implementations timed beside the binary "
                        "run the config as it is; pick another config")
    flags = [f"--data_dir={a.data_dir}", *extra]
    print(json.dumps(run.environment()), flush=True)
    rates: dict[str, list[float]] = {"binary": [], **{n: [] for n in names}}
    # built side by side, as benchmarks.run builds them: none carries being built first
    with run.Workers(a.config, names, a.min_time, a.warmup, parallel=True) as workers:
        if failed := [f"{n}: {i['error']}" for n, i in workers.info.items() if "error" in i]:
            raise UserError(f"could not build {'; '.join(failed)}")
        for r in range(a.repeats):
            for name in run.round_robin(["binary", *names], r):
                if name == "binary":
                    rates["binary"].append(binary_rate(a.config, a.steps, a.log_every, flags))
                elif (seconds := workers.time(name)) is None:
                    raise UserError(f"{name} failed: {workers.info[name]['error']}")
                else:
                    rates[name].append(w.items / seconds)
    ratios = {n: [b / x for b, x in zip(rates["binary"], rates[n], strict=True)] for n in names}
    lines = ["| repeat | binary, tok/s | " + " | ".join(f"{n}, tok/s | binary / {n}"
                                                         for n in names) + " |",
             "|" + " --- |" * (2 + 2 * len(names))]
    for r in [*range(a.repeats), None]:
        pick = statistics.median if r is None else (lambda v, r=r: v[r])
        cells = [f"{pick(rates[n]):,.0f} | {pick(ratios[n]):.2f}" for n in names]
        lines.append(f"| {'median' if r is None else r + 1} | {pick(rates['binary']):,.0f} | "
                     + " | ".join(cells) + " |")
    print(f"\n{a.config}: the binary {a.steps} steps a run, its rate logged every "
          f"{a.log_every}; median row: medians of the rates and of the per-repeat ratios\n")
    print("\n".join(lines), flush=True)
    return rates


if __name__ == "__main__":
    run_script(main)
