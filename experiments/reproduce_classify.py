r"""Reproduces the classification tables: Ding et al. 2018 (Tables 1, 3-5) and Zhao et al.
2019 (Tables 2, 3), by running ``experiments.classify`` once per (config, dataset, seed or
CV fold), ``--parallel`` at a time, each in its own workdir under ``--root``::

    python -m experiments.reproduce_classify --suite=dc_table1 --root=workdirs/cls
    python -m experiments.reproduce_classify --suite=hm_table2 --root=workdirs/cls --seeds=0,1,2
    python -m experiments.reproduce_classify --suite=dc_table1 --root=workdirs/cls --report_only

A rerun skips the runs finished under the same command and resumes the others (so
``--extra=--max_epochs=N`` extends finished runs, and the same command resumes the runs that
Ctrl-C or SIGTERM stopped, each with a checkpoint). Runs are named
``CONFIG_DATASET_sSEED`` (``_fFOLD`` for MR/Subj, one CV fold per run; ``_sweep`` for a
learning-rate sweep). Zhao et al. choose the learning rate on validation: seed 0 runs the
sweep over ``LR_SWEEP`` and the other seeds train at the rate it chose. Each run's
``command.txt`` holds its exact command. ``--record=DIR`` copies every finished run's
``command.txt``, ``summary.json`` and ``metrics.jsonl`` to ``DIR/RUN/`` (the records kept in
``experiments/results/{dc_bilstm,hm_densernn}/runs/``); the report reads either tree. The
report (Markdown, also written to ``ROOT/SUITE.md`` after running) pools the runs of each
(config, dataset) into mean ± sample std beside the accuracy the suite's paper table gives;
``--plot=PNG`` draws their dev/test curves. ``--phrases`` trains the DC suites' SST rows on
every labelled phrase of the training trees (``sst1_phrases``, ``sst2_phrases``).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from types import ModuleType

import numpy as np
from absl import flags

from dense_rnn import files
from dense_rnn.cli import run_binary
from dense_rnn.configs import dc_bilstm, hm_densernn
from dense_rnn.configs.flags import define_path
from dense_rnn.data import DEFAULT_DATA_DIR
from dense_rnn.errors import UserError
from experiments import runner

GLOVE = os.path.join(DEFAULT_DATA_DIR, "glove", "glove.6B.50d.txt.gz")
CV_DATASETS = {"mr": 10, "subj": 10}
PHRASE_LEVEL = ("sst1", "sst2")  # the datasets --phrases trains on every labelled phrase
PHRASE_SUITES = ("dc_table1", "dc_table3", "dc_table4", "dc_table5")  # which take --phrases
HM_MODELS = tuple(hm_densernn.TABLE2)
# Suite -> the paper table its targets come from (Ding et al. 1-5, Zhao et al. 2-3), and its
# jobs (built from the flags).
SUITES: dict[str, tuple[int, Callable[[], list[Job]]]] = {
    "dc_table1": (1, lambda: _dc_jobs(["dc_bilstm", "bilstm"],
                                      ["mr", "sst1", "sst2", "subj", "trec"])),
    "dc_table3": (3, lambda: _dc_jobs(dc_bilstm.table_configs(3), ["sst1", "sst2"])),
    "dc_table4": (4, lambda: _dc_jobs(dc_bilstm.table_configs(4), ["sst1", "sst2"])),
    "dc_table5": (5, lambda: _dc_jobs(dc_bilstm.table_configs(5), ["sst1", "sst2"])),
    # Table 1's SST rows trained on every labelled phrase (tested on the same sentences)
    "dc_phrases": (1, lambda: _dc_jobs(["dc_bilstm", "bilstm"],
                                       ["sst1_phrases", "sst2_phrases"])),
    "hm_table2": (2, lambda: _hm_jobs(_hm_units(HM_MODELS), "sst5")),
    # Table 3's rows as the configs whose Table 2 numbers they repeat (TABLE3_CONFIGS)
    "hm_table3": (3, lambda: _hm_jobs(list(hm_densernn.TABLE3_CONFIGS), "sst5")),
    "hm_imdb": (2, lambda: _hm_jobs(_hm_units(("gru", "lstm", "hm_densegru", "hm_denselstm")),
                                    "imdb", ("--max_len=400",))),
    # AG News: train.csv in the data dir, or --extra=--hf_dataset=fancyzhx/ag_news
    "hm_ag": (2, lambda: _hm_jobs(_hm_units(HM_MODELS), "ag")),
}

flags.DEFINE_string("suite", "dc_table1", " | ".join(SUITES) + ".")
define_path("root", "workdirs/cls", "One workdir per run under this directory.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of the non-CV datasets (Zhao et al.'s "
                  "Table 2 averages 5 runs: --seeds=0,1,2,3,4).")
flags.DEFINE_list("folds", [str(k) for k in range(10)], "CV folds of MR and Subj.")
flags.DEFINE_list("datasets", None, "Restrict the suite to these datasets.")
flags.DEFINE_list("configs", None, "Restrict the suite to these configs.")
flags.DEFINE_bool("phrases", False, "DC suites: train the SST datasets on every labelled phrase "
                  "(sst1 -> sst1_phrases, sst2 -> sst2_phrases; tested on the same sentences).")
flags.DEFINE_list("units", ["64", "128"], "HM suites: the unit counts of Table 2 to run.")
flags.DEFINE_bool("sweep", True, "HM suites: choose the learning rate on dev (seed 0 sweeps "
                  "LR_SWEEP); --nosweep trains every seed at the config's rate.")
define_path("data_dir", None, "Passed on to experiments.classify.")
flags.DEFINE_string("embeddings", GLOVE, "GloVe file passed on to experiments.classify "
                    "(default: the 50-d file of the data dir beside the checkout); empty: "
                    "randomly initialised embeddings.")
flags.DEFINE_integer("parallel", 1, "Runs at a time.")
flags.DEFINE_multi_string("extra", [], runner.EXTRA_HELP)
flags.DEFINE_bool("report_only", False, "Only print the report of the runs under --root.")
define_path("record", None, "Copy every finished run's records to DIR/RUN/.")
define_path("plot", None, "Also draw the dev/test curves of every group to this PNG.")
FLAGS = flags.FLAGS
REPORTED = ("test_accuracy", "dev_accuracy", "config", "selection", "num_params",
            "num_params_paper", "wall_seconds", "device")  # summary fields in the table


@dataclasses.dataclass(frozen=True)
class Job:
    """One ``experiments.classify`` run; ``lr_from`` names the sweep whose rate it takes."""

    name: str
    args: tuple[str, ...]
    lr_from: str | None = None


def phrase_level(dataset: str) -> str:
    """``dataset`` as the runs train on it: with ``--phrases``, SST on every phrase."""
    return f"{dataset}_phrases" if FLAGS.phrases and dataset in PHRASE_LEVEL else dataset


def _dc_jobs(configs: list[str], datasets: list[str]) -> list[Job]:
    datasets = [phrase_level(ds) for ds in datasets]
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


def _hm_units(models: tuple[str, ...]) -> list[str]:
    """``MODEL_UNITS`` config names for every ``--units``."""
    bad = [u for u in FLAGS.units if u not in [str(n) for n in hm_densernn.UNITS]]
    if bad:
        raise UserError(f"--units={','.join(bad)}: Zhao et al. use "
                        f"{', '.join(map(str, hm_densernn.UNITS))} units")
    return [f"{m}_{u}" for u in FLAGS.units for m in models]


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


def check_shared_flags(extra: list[str]) -> None:
    """The flags every run of the suite shares (``extra`` among them), checked once here
    rather than by each run it would start (and leave a workdir behind)."""
    for name, values in (("seeds", FLAGS.seeds), ("folds", FLAGS.folds)):
        if not values or not all(v.isdigit() for v in values):
            raise UserError(f"--{name}={','.join(values or [])}: give numbers like 0,1,2")
    if bad := [f for f in FLAGS.folds if int(f) >= min(CV_DATASETS.values())]:
        raise UserError(f"--folds={','.join(bad)} out of range: {', '.join(CV_DATASETS)} have "
                        f"folds 0-{min(CV_DATASETS.values()) - 1}")
    if FLAGS.embeddings and not os.path.isfile(FLAGS.embeddings):
        raise UserError(f"--embeddings={FLAGS.embeddings} {files.not_a(FLAGS.embeddings)}; "
                        "pass a GloVe text file (.txt or .txt.gz; the papers used "
                        "glove.6B.300d.txt or 42B), or --embeddings= for random embeddings")
    runner.check_data_dir(FLAGS.data_dir, extra, report_only=False)


def suite_jobs(suite: str) -> list[Job]:
    """The jobs of ``suite``, restricted to ``--datasets`` and ``--configs``."""
    if suite not in SUITES:
        raise UserError(f"unknown --suite={suite}; known suites: {', '.join(SUITES)}")
    if FLAGS.phrases and suite not in PHRASE_SUITES:
        raise UserError(f"--phrases: --suite={suite} has no sentence-level SST rows to train "
                        f"on phrases; it applies to {', '.join(PHRASE_SUITES)}")
    runner.check_lists(seeds=FLAGS.seeds, folds=FLAGS.folds, units=FLAGS.units,
                       datasets=FLAGS.datasets, configs=FLAGS.configs)
    jobs = SUITES[suite][1]()
    datasets = FLAGS.datasets and [phrase_level(d) for d in FLAGS.datasets]
    for name, keep in (("dataset", datasets), ("config", FLAGS.configs)):
        valid = list(dict.fromkeys(_arg(j, name) for j in jobs))
        unknown = [k for k in keep or () if k not in valid]
        if unknown:
            raise UserError(f"--{name}s={','.join(unknown)}: not in --suite={suite}, whose "
                            f"{name}s are {', '.join(valid)}")
        if keep:
            jobs = [j for j in jobs if _arg(j, name) in keep]
    return jobs


def _arg(job: Job, name: str) -> str:
    return next(a.split("=", 1)[1] for a in job.args if a.startswith(f"--{name}="))


def reserved(jobs: list[Job]) -> set[str]:
    """The flags this driver sets for the runs of ``jobs``, which ``--extra`` may not set."""
    names = {runner.flag_name(a) for j in jobs for a in j.args}
    return names | {"embeddings", "data_dir", "workdir", "mode"} | (
        {"learning_rate"} if any(j.lr_from for j in jobs) else set())


def run_args(job: Job) -> list[str]:
    """The flags the driver gives ``job``'s run, but a learning rate its sweep chose (no
    ``--embeddings`` for random embeddings, ``--embeddings=``)."""
    given = (("embeddings", FLAGS.embeddings), ("data_dir", FLAGS.data_dir))
    return [*job.args, *(f"--{name}={value}" for name, value in given if value)]


def start(job: Job, extra: list[str]) -> subprocess.Popen | None:
    """Launches ``job`` with the flags ``extra``, at the learning rate its sweep chose if it
    has one (None: it has finished under this command)."""
    args = run_args(job)
    if job.lr_from:
        sweep = runner.summary(FLAGS.root, job.lr_from)
        rate = sweep.get("learning_rate_chosen")
        if not isinstance(rate, int | float):
            raise UserError(f"{FLAGS.root}/{job.lr_from}/summary.json is not a learning-rate "
                            "sweep's summary (no learning_rate_chosen); delete it to rerun "
                            "the sweep")
        args.append(f"--learning_rate={rate:g}")
    return runner.launch("experiments.classify", [*args, *extra],
                         os.path.join(FLAGS.root, job.name))


def _family(name: str) -> ModuleType:
    return hm_densernn if name in hm_densernn.CONFIGS else dc_bilstm


def _paper(name: str, dataset: str, table: int) -> str:
    acc = _family(name).paper_accuracy(name, dataset, table)
    return "-" if acc is None else f"{acc}"


def report(jobs: list[Job], table: int) -> str:
    """One row per (config, dataset): test accuracy mean ± sample standard deviation
    (ddof 1; the mean alone for one run) over seeds or folds, beside the accuracy the
    paper's ``table`` gives."""
    groups: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    names: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for job in jobs:
        s = runner.summary(FLAGS.root, job.name, REPORTED)
        if s is not None and not (_epochs(s) and isinstance(s["config"], dict) and (
                "learning_rate_chosen" in s or "learning_rate" in s["config"])):
            raise UserError(f"{FLAGS.root}/{job.name}/summary.json is not a run summary (no "
                            "epochs or learning rate); delete it and rerun the command to "
                            "finish that run again")
        groups[(_arg(job, "config"), _arg(job, "dataset"))].append(s)
        names[(_arg(job, "config"), _arg(job, "dataset"))].append(job.name)
    rows = ["| config | data | params, paper's count (d=300) | params, paper's count (run's d) "
            "| params of the run (no emb.) | runs | test % mean ± sample std | dev % mean "
            "| paper % | lr | epochs best/ran | wall min/run | device |", "|" + "---|" * 13]
    for (config, dataset), runs in groups.items():
        done = [s for s in runs if s is not None]
        paper_count = f"{_family(config).paper_param_count(_family(config).CONFIGS[config]):,}"
        if not done:
            status = runner.not_finished(FLAGS.root, names[(config, dataset)])
            rows.append(f"| {config} | {dataset} | {paper_count} | | | 0 of {len(runs)} | "
                        f"{status} | | {_paper(config, dataset, table)} | | | | |")
            continue
        tests = [100 * s["test_accuracy"] for s in done]
        lrs = sorted({s.get("learning_rate_chosen", s["config"]["learning_rate"]) for s in done})
        sel = "" if done[0]["selection"].startswith("test accuracy at") else " (best test)"
        rows.append(
            f"| {config}{sel} | {dataset} | {paper_count} | {done[0]['num_params_paper']:,} | "
            f"{done[0]['num_params']:,} | {len(done)} of {len(runs)} | "
            f"{np.mean(tests):.1f}{f' ± {np.std(tests, ddof=1):.1f}' if len(tests) > 1 else ''} | "
            f"{np.mean([100 * s['dev_accuracy'] for s in done]):.1f} | "
            f"{_paper(config, dataset, table)} | {', '.join(f'{r:g}' for r in lrs)} | "
            f"{', '.join(f'{r[0]}/{r[1]}' for r in map(_epochs, done))} | "
            f"{np.mean([s['wall_seconds'] for s in done]) / 60:.1f} | {done[0]['device']} |")
    return "\n".join(rows) + "\n"


def _epochs(s: dict) -> tuple[int, int] | None:
    """A run's (best dev epoch, epochs run) (a CV run's: its fold's), None if it has none."""
    r = next(iter(s["folds"].values()), None) if isinstance(s.get("folds"), dict) else s
    if not isinstance(r, dict) or not {"best_dev_epoch", "epochs"} <= set(r):
        return None
    return r["best_dev_epoch"], r["epochs"]


def _metrics(root: str, name: str) -> list[dict]:
    """Per-epoch records of a run (of its chosen rate for a sweep, of its fold for CV)."""
    s = runner.summary(root, name)
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
        if runner.summary(FLAGS.root, job.name) is not None:
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


def run() -> None:
    """Runs the suite's unfinished jobs (unless --report_only), then prints its table."""
    jobs = suite_jobs(FLAGS.suite)
    extra = runner.extra_args(FLAGS.extra, reserved(jobs))
    runner.check(FLAGS.root, FLAGS.parallel, FLAGS.report_only, FLAGS.record)
    if not FLAGS.report_only:
        check_shared_flags(extra)
        if jobs:
            runner.check_extra("experiments.classify", run_args(jobs[0]), extra)
    runner.check_parent("plot", FLAGS.plot)
    failed: list[str] = []
    if not FLAGS.report_only:
        by_name = {j.name: j for j in jobs}
        failed = runner.run_all(FLAGS.root, list(by_name),
                                lambda name: start(by_name[name], extra), FLAGS.parallel,
                                {j.name: j.lr_from for j in jobs if j.lr_from})
    if FLAGS.record:
        runner.record(FLAGS.root, [j.name for j in jobs], FLAGS.record,
                      ("", "lr_*", "fold_*", "lr_*/fold_*"))
    table = report(jobs, SUITES[FLAGS.suite][0])
    if not FLAGS.report_only:
        name = FLAGS.suite + ("_phrases" if FLAGS.phrases else "")
        with open(os.path.join(FLAGS.root, f"{name}.md"), "w") as f:
            f.write(table)
    if FLAGS.plot:
        plot(jobs, FLAGS.plot)
    print(table)
    runner.check_all_finished(failed, FLAGS.root)


if __name__ == "__main__":
    run_binary(run)
