r"""Tabulates DC-Bi-LSTM runs (``summary.json`` of ``experiments.classify``) as Markdown rows
for experiments/results/dc_bilstm.md: runs of one config on one dataset (seeds, or the CV
folds of MR/Subj run as separate ``--folds=K`` runs) are pooled into mean and std.

    python -m experiments.dc_bilstm_results workdirs/*/summary.json [--plot=OUT.png] [--table3]

``--plot`` also draws every run's dev and test accuracy per epoch (from ``metrics.jsonl``).
``--table3`` also prints Table 3 (parameter-matched rows, SST-1 and SST-2) with "not run"
where no run exists; its first and fourth rows are the ``bilstm`` and ``dc_bilstm`` configs.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import numpy as np

from dense_rnn.configs.dc_bilstm import TABLE_ROWS, paper_accuracy

HEADER = ("| config | data | params (paper conv., m=50) | params (ours, no emb.) | runs | "
          "test % mean ± std | dev % mean | paper % | epochs (best/ran) | wall min/run | "
          "device |\n|---|---|---|---|---|---|---|---|---|---|---|")


def rows(summaries: list[dict]) -> list[str]:
    groups = collections.defaultdict(list)
    for s in summaries:
        groups[(s["config"]["name"], s["dataset"], s["selection"])].append(s)
    out = []
    for (name, dataset, selection), runs in sorted(groups.items()):
        tests = [t for s in runs for t in s.get("fold_test_accuracies", [s["test_accuracy"]])]
        labels = sorted({f"fold {f}" for s in runs for f in s.get("folds", {})}
                        or {f"seed {s['config']['seed']}" for s in runs})
        epochs = [(r["best_dev_epoch"], r["epochs"]) for s in runs
                  for r in s.get("folds", {"": s}).values()]
        paper = paper_accuracy(name, dataset)
        flag = "" if selection.startswith("test accuracy at") else " (paper protocol)"
        out.append(
            f"| {name}{flag} | {dataset} | {runs[0]['num_params_paper']:,} | "
            f"{runs[0]['num_params']:,} | {len(tests)} ({', '.join(labels)}) | "
            f"{100 * np.mean(tests):.1f} ± {100 * np.std(tests):.1f} | "
            f"{100 * np.mean([s['dev_accuracy'] for s in runs]):.1f} | "
            f"{paper if paper is not None else '-'} | "
            f"{', '.join(f'{b}/{e}' for b, e in epochs)} | "
            f"{np.mean([s['wall_seconds'] for s in runs]) / 60:.1f} | {runs[0]['device']} |")
    return out


def table3(summaries: list[dict]) -> list[str]:
    """Table 3 rows: dev-selected test accuracy (mean over seeds) beside the paper's."""
    same = {"dc_bilstm_t3_dl0_dh10": "bilstm", "dc_bilstm_t3_dl15_dh13": "dc_bilstm"}
    out = ["| dl | dh | th | paper params (m=300) | config run | params (paper conv., m=50) | "
           "SST-1 test % (runs; epochs best/ran) | SST-1 paper % | SST-2 test % (runs; epochs) | "
           "SST-2 paper % | wall min/run |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for t, dl, dh, th, params, s1, s2 in TABLE_ROWS:
        if t != 3:
            continue
        name = f"dc_bilstm_t3_dl{dl}_dh{dh}"
        names = {name, same.get(name, name)}
        cells, walls, count = {}, [], "-"
        for ds in ("sst1", "sst2"):
            runs = [s for s in summaries if s["config"]["name"] in names and s["dataset"] == ds
                    and s["selection"].startswith("test accuracy at")]
            epochs = ", ".join(f"{s['best_dev_epoch']}/{s['epochs']}" for s in runs)
            cells[ds] = (f"{100 * np.mean([s['test_accuracy'] for s in runs]):.1f} "
                         f"({len(runs)}; {epochs})" if runs else "not run")
            walls += [s["wall_seconds"] / 60 for s in runs]
            count = f"{runs[0]['num_params_paper']:,}" if runs else count
        out.append(f"| {dl} | {dh} | {th} | {params} | {' = '.join(sorted(names))} | {count} | "
                   f"{cells['sst1']} | {s1} | {cells['sst2']} | {s2} | "
                   f"{f'{np.mean(walls):.1f}' if walls else '-'} |")
    return out


def plot(paths: list[str], out: str) -> None:
    """One panel per run: dev and test accuracy per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for path in paths:
        with open(path) as f:
            s = json.load(f)
        root = os.path.dirname(path)
        subs = [os.path.join(root, f"fold_{k}") for k in s.get("folds", {})] or [root]
        for sub in subs:
            with open(os.path.join(sub, "metrics.jsonl")) as f:
                runs.append((f"{s['config']['name']} {s['dataset']} {os.path.basename(sub)}",
                             [json.loads(line) for line in f if line.strip()]))
    cols = 3
    fig, axes = plt.subplots(-(-len(runs) // cols), cols, figsize=(4 * cols, 2.8 * (
        -(-len(runs) // cols))), squeeze=False)
    for ax, (title, recs) in zip(axes.flat, runs, strict=False):
        for key in ("train_accuracy", "dev_accuracy", "test_accuracy"):
            ax.plot([r["epoch"] for r in recs], [r[key] for r in recs], marker="o", ms=2,
                    label=key.split("_")[0])
        ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main(args: list[str]) -> None:
    paths = [a for a in args if not a.startswith("--")]
    summaries = []
    for path in paths:
        with open(path) as f:
            summaries.append(json.load(f))
    print("\n".join([HEADER, *rows(summaries)]))
    if "--table3" in args:
        print("\n" + "\n".join(table3(summaries)))
    for a in args:
        if a.startswith("--plot="):
            plot(paths, a.removeprefix("--plot="))


if __name__ == "__main__":
    main(sys.argv[1:])
