r"""Reproduces the classification tables: Ding et al. 2018 (Tables 1, 3-5) and Zhao et al.
2019 (Tables 2, 3), by running ``experiments.classify`` once per (config, dataset, seed or
CV fold), ``--parallel`` at a time, each in its own workdir under ``--root``::

    python -m experiments.reproduce_classify --suite=dc_table1 --root=workdirs/cls
    python -m experiments.reproduce_classify --suite=hm_table2 --root=workdirs/cls --seeds=0,1,2
    python -m experiments.reproduce_classify --suite=dc_table1 --root=workdirs/cls --report_only

A rerun skips finished runs and resumes unfinished ones. Runs are named
``CONFIG_DATASET_sSEED`` (``_fFOLD`` for MR/Subj, one CV fold per run; ``_sweep`` for a
learning-rate sweep). Zhao et al. choose the learning rate on validation: seed 0 runs the
sweep over ``LR_SWEEP`` and the other seeds train at the rate it chose. Each run's
``command.txt`` holds its exact command. ``--record=DIR`` copies every finished run's
``command.txt``, ``summary.json`` and ``metrics.jsonl`` to ``DIR/RUN/`` (the records kept in
``experiments/results/{dc_bilstm,hm_densernn}/runs/``); the report reads either tree. The
report (Markdown, also written to ``ROOT/SUITE.md`` after running) pools the runs of each
(config, dataset) into mean ± std beside the paper's accuracy; ``--plot=PNG`` draws their
dev/test curves.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from dense_rnn.configs import dc_bilstm, hm_densernn

GLOVE = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "glove",
                     "glove.6B.50d.txt.gz")
CV_DATASETS = {"mr": 10, "subj": 10}
HM_MODELS = tuple(hm_densernn.TABLE2)

flags.DEFINE_string("suite", "dc_table1", "dc_table1 | dc_table3 | dc_table4 | dc_table5 | "
                    "hm_table2 | hm_table3 | hm_imdb | hm_ag.")
flags.DEFINE_string("root", "workdirs/cls", "One workdir per run under this directory.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the non-CV datasets.")
flags.DEFINE_list("folds", [str(k) for k in range(10)], "CV folds of MR and Subj.")
flags.DEFINE_list("datasets", None, "Restrict the suite to these datasets.")
flags.DEFINE_list("configs", None, "Restrict the suite to these configs.")
flags.DEFINE_list("units", ["64", "128"], "HM suites: the unit counts of Table 2 to run.")
flags.DEFINE_bool("sweep", True, "HM suites: choose the learning rate on dev (seed 0 sweeps "
                  "LR_SWEEP); --nosweep trains every seed at the config's rate.")
flags.DEFINE_string("data_dir", None, "Passed on to experiments.classify.")
flags.DEFINE_string("embeddings", GLOVE, "GloVe file passed on to experiments.classify.")
flags.DEFINE_integer("parallel", 1, "Runs at a time.")
flags.DEFINE_list("extra", [], "Extra flags for every run, e.g. --extra=--max_epochs=5.")
flags.DEFINE_bool("report_only", False, "Only write the report from finished runs.")
flags.DEFINE_string("record", None, "Copy every finished run's records to DIR/RUN/.")
flags.DEFINE_string("plot", None, "Also draw the dev/test curves of every group to this PNG.")
FLAGS = flags.FLAGS


@dataclasses.dataclass(frozen=True)
class Job:
    """One ``experiments.classify`` run; ``lr_from`` names the sweep whose rate it takes."""

    name: str
    args: tuple[str, ...]
    lr_from: str | None = None


def _dc_jobs(configs: list[str], datasets: list[str]) -> list[Job]:
    jobs = []
    for ds in datasets:
        for config in configs:
            base = ("--config=" + config, "--dataset=" + ds)
            if ds in CV_DATASETS:
                jobs += [Job(f"{config}_{ds}_f{k}", (*base, f"--folds={k}"))
                         for k in FLAGS.folds]
            else:
                jobs += [Job(f"{config}_{ds}_s{s}", (*base, f"--seed={s}")) for s in FLAGS.seeds]
    return jobs


def _dc_table(table: int) -> list[str]:
    """Config names of a Ding et al. table; rows equal to Table 1 models use those names."""
    alias = {(0, 10, 300): "bilstm", (15, 13, 100): "dc_bilstm"}
    return [alias.get((dl, dh, th), f"dc_bilstm_t{t}_dl{dl}_dh{dh}")
            for t, dl, dh, th, *_ in dc_bilstm.TABLE_ROWS if t == table]


def _hm_jobs(configs: list[str], dataset: str, extra: tuple[str, ...] = ()) -> list[Job]:
    """Seed 0 sweeps the learning rate on dev; the other seeds reuse the rate it chose
    (``--nosweep``: every seed at the config's rate)."""
    jobs = []
    for config in configs:
        base = ("--config=" + config, "--dataset=" + dataset, *extra)
        if not FLAGS.sweep:
            jobs += [Job(f"{config}_{dataset}_s{s}", (*base, f"--seed={s}")) for s in FLAGS.seeds]
            continue
        sweep = f"{config}_{dataset}_sweep"
        rates = ",".join(f"{r:g}" for r in hm_densernn.LR_SWEEP)
        jobs.append(Job(sweep, (*base, "--seed=0", f"--lr_sweep={rates}")))
        jobs += [Job(f"{config}_{dataset}_s{s}", (*base, f"--seed={s}"), lr_from=sweep)
                 for s in FLAGS.seeds if s != "0"]
    return jobs


def suite_jobs(suite: str) -> list[Job]:
    units = [int(u) for u in FLAGS.units]
    table1 = ["dc_bilstm", "bilstm"]
    suites = {
        "dc_table1": lambda: _dc_jobs(table1, ["mr", "sst1", "sst2", "subj", "trec"]),
        "dc_table3": lambda: _dc_jobs(_dc_table(3), ["sst1", "sst2"]),
        "dc_table4": lambda: _dc_jobs(_dc_table(4), ["sst1", "sst2"]),
        "dc_table5": lambda: _dc_jobs(_dc_table(5), ["sst1", "sst2"]),
        "hm_table2": lambda: _hm_jobs([f"{m}_{u}" for u in units for m in HM_MODELS], "sst5"),
        # "- hierarchy" is DenseGRU: the Table 2 row densegru_64 is the same model.
        "hm_table3": lambda: _hm_jobs(["hm_densegru_64", "densegru_64"] + [
            f"hm_densegru_64_{k}" for k in hm_densernn.TABLE3 if k != "no_hierarchy"], "sst5"),
        "hm_imdb": lambda: _hm_jobs([f"{m}_{u}" for u in units for m in (
            "gru", "lstm", "hm_densegru", "hm_denselstm")], "imdb", ("--max_len=400",)),
        # AG News: train.csv in the data dir, or --extra=--hf_dataset=fancyzhx/ag_news
        "hm_ag": lambda: _hm_jobs([f"{m}_{u}" for u in units for m in HM_MODELS], "ag"),
    }
    if suite not in suites:
        raise app.UsageError(f"unknown --suite={suite}; known: {', '.join(suites)}")
    jobs = suites[suite]()
    if FLAGS.datasets:
        jobs = [j for j in jobs if _arg(j, "dataset") in FLAGS.datasets]
    if FLAGS.configs:
        jobs = [j for j in jobs if _arg(j, "config") in FLAGS.configs]
    return jobs


def _arg(job: Job, name: str) -> str:
    return next(a.split("=", 1)[1] for a in job.args if a.startswith(f"--{name}="))


def _summary(root: str, name: str) -> dict | None:
    path = os.path.join(root, name, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def launch(job: Job) -> subprocess.Popen:
    workdir = os.path.join(FLAGS.root, job.name)
    os.makedirs(workdir, exist_ok=True)
    args = list(job.args)
    if job.lr_from:
        rate = _summary(FLAGS.root, job.lr_from)["learning_rate_chosen"]
        args.append(f"--learning_rate={rate:g}")
    cmd = [sys.executable, "-m", "experiments.classify", *args, f"--workdir={workdir}",
           f"--embeddings={FLAGS.embeddings}", *FLAGS.extra]
    if FLAGS.data_dir:
        cmd.append(f"--data_dir={FLAGS.data_dir}")
    env = " ".join(f"{k}={os.environ[k]!r}" for k in ("XLA_FLAGS",) if k in os.environ)
    with open(os.path.join(workdir, "command.txt"), "w") as f:
        f.write((env + " " if env else "") + "python " + " ".join(cmd[1:]) + "\n")
    log = open(os.path.join(workdir, "train.log"), "a")  # noqa: SIM115 (owned by the child)
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def run_all(jobs: list[Job]) -> None:
    """Runs the unfinished jobs, ``--parallel`` at a time, each once its sweep has ended."""
    pending = [j for j in jobs if _summary(FLAGS.root, j.name) is None]
    running: dict[str, tuple[Job, subprocess.Popen]] = {}
    while pending or running:
        for job in list(pending):
            if len(running) >= FLAGS.parallel:
                break
            if job.lr_from and _summary(FLAGS.root, job.lr_from) is None:
                if job.lr_from in running or any(p.name == job.lr_from for p in pending):
                    continue
                print(f"skipped {job.name}: its sweep {job.lr_from} failed", flush=True)
                pending.remove(job)
                continue
            pending.remove(job)
            running[job.name] = (job, launch(job))
            print(f"{time.strftime('%H:%M:%S')} started {job.name}", flush=True)
        time.sleep(2)
        for name, (_, proc) in list(running.items()):
            if proc.poll() is not None:
                print(f"{time.strftime('%H:%M:%S')} finished {name} (exit {proc.returncode})",
                      flush=True)
                del running[name]


def record(jobs: list[Job], dest: str) -> None:
    """Copies each finished run's command, summary and per-epoch metrics (its own, and its
    learning rates' and folds') to ``dest/RUN``."""
    for job in jobs:
        if _summary(FLAGS.root, job.name) is None:
            continue
        src = os.path.join(FLAGS.root, job.name)
        for sub in ("", "lr_*", "fold_*", "lr_*/fold_*"):
            for d in glob.glob(os.path.join(src, sub)):
                out = os.path.join(dest, job.name, os.path.relpath(d, src))
                os.makedirs(out, exist_ok=True)
                for f in ("command.txt", "summary.json", "metrics.jsonl"):
                    if os.path.exists(os.path.join(d, f)):
                        shutil.copy2(os.path.join(d, f), os.path.join(out, f))


def _family(name: str):
    return hm_densernn if name in hm_densernn.CONFIGS else dc_bilstm


def _paper(name: str, dataset: str) -> str:
    acc = _family(name).paper_accuracy(name, dataset)
    return "-" if acc is None else f"{acc}"


def report(jobs: list[Job]) -> str:
    """One row per (config, dataset): test accuracy mean ± std over seeds or folds."""
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    for job in jobs:
        s = _summary(FLAGS.root, job.name)
        groups[(_arg(job, "config"), _arg(job, "dataset"))].append(s)
    rows = ["| config | data | params, paper's count (d=300) | params, paper's count (run's d) "
            "| params of the run (no emb.) | runs | test % mean ± std | dev % mean | paper % | lr "
            "| epochs best/ran | wall min/run | device |", "|" + "---|" * 13]
    for (config, dataset), runs in groups.items():
        done = [s for s in runs if s is not None]
        paper_count = f"{_family(config).paper_param_count(_family(config).CONFIGS[config]):,}"
        if not done:
            rows.append(f"| {config} | {dataset} | {paper_count} | | | 0 of {len(runs)} | "
                        f"not run | | {_paper(config, dataset)} | | | | |")
            continue
        tests = [100 * s["test_accuracy"] for s in done]
        lrs = sorted({s.get("learning_rate_chosen", s["config"]["learning_rate"]) for s in done})
        sel = "" if done[0]["selection"].startswith("test accuracy at") else " (best test)"
        rows.append(
            f"| {config}{sel} | {dataset} | {paper_count} | {done[0]['num_params_paper']:,} | "
            f"{done[0]['num_params']:,} | {len(done)} of {len(runs)} | "
            f"{np.mean(tests):.1f} ± {np.std(tests):.1f} | "
            f"{np.mean([100 * s['dev_accuracy'] for s in done]):.1f} | "
            f"{_paper(config, dataset)} | {', '.join(f'{r:g}' for r in lrs)} | "
            f"{', '.join(f'{r[0]}/{r[1]}' for r in map(_epochs, done))} | "
            f"{np.mean([s['wall_seconds'] for s in done]) / 60:.1f} | {done[0]['device']} |")
    return "\n".join(rows) + "\n"


def _epochs(s: dict) -> tuple[int, int]:
    r = next(iter(s["folds"].values())) if "folds" in s else s
    return r["best_dev_epoch"], r["epochs"]


def _metrics(root: str, name: str) -> list[dict]:
    """Per-epoch records of a run (of its chosen rate for a sweep, of its fold for CV)."""
    s = _summary(root, name)
    sub = os.path.join(root, name)
    if "learning_rate_chosen" in s:
        sub = os.path.join(sub, f"lr_{s['learning_rate_chosen']:g}")
    if "folds" in s:
        sub = os.path.join(sub, f"fold_{next(iter(s['folds']))}")
    with open(os.path.join(sub, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(jobs: list[Job], out: str) -> None:
    """One panel per (config, dataset): dev (solid) and test (dashed) accuracy of each run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[str]] = collections.defaultdict(list)
    for job in jobs:
        if _summary(FLAGS.root, job.name) is not None:
            groups[f"{_arg(job, 'config')} {_arg(job, 'dataset')}"].append(job.name)
    cols, n = 4, max(len(groups), 1)
    fig, axes = plt.subplots(-(-n // cols), cols, figsize=(3.6 * cols, 2.6 * -(-n // cols)),
                             squeeze=False)
    for ax, (title, names) in zip(axes.flat, groups.items(), strict=False):
        for i, name in enumerate(names):
            recs = _metrics(FLAGS.root, name)
            epochs = [r["epoch"] for r in recs]
            ax.plot(epochs, [r["dev_accuracy"] for r in recs], color=f"C{i}", lw=1)
            ax.plot(epochs, [r["test_accuracy"] for r in recs], color=f"C{i}", lw=1, ls="--")
        ax.set_title(f"{title} ({len(names)} runs)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    fig.suptitle("dev (solid) and test (dashed) accuracy per epoch, one colour per run",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main(argv: list[str]) -> None:
    del argv
    jobs = suite_jobs(FLAGS.suite)
    if not FLAGS.report_only:
        run_all(jobs)
    if FLAGS.record:
        record(jobs, FLAGS.record)
    table = report(jobs)
    if not FLAGS.report_only:
        with open(os.path.join(FLAGS.root, f"{FLAGS.suite}.md"), "w") as f:
            f.write(table)
    if FLAGS.plot:
        plot(jobs, FLAGS.plot)
    print(table)


if __name__ == "__main__":
    app.run(main)
