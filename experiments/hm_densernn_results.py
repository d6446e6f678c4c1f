r"""Tabulates HM-DenseRNN runs (``summary.json`` of ``experiments.classify``) beside the
paper's Table 2 / Table 3 accuracies, as Markdown rows for experiments/results/hm_densernn.md.

    python -m experiments.hm_densernn_results workdirs/hm/*/summary.json
"""

from __future__ import annotations

import json
import sys

from dense_rnn.configs import hm_densernn as cfg

DATASET_COLUMN = {"imdb": 1, "sst5": 2, "ag": 3}


def paper_accuracy(name: str, dataset: str) -> str:
    """The paper's accuracy (%) for config ``name`` on ``dataset``, or ``-``."""
    if "_no_" in name:
        return f"{cfg.TABLE3['no_' + name.split('_no_')[1]]}" if dataset == "sst5" else "-"
    model, units = name.rsplit("_", 1)
    return f"{cfg.TABLE2[model][DATASET_COLUMN[dataset]][cfg.UNITS.index(int(units))]}"


def row(summary: dict) -> str:
    c = summary["config"]
    lr = summary.get("learning_rate_chosen", c["learning_rate"])
    sweep = summary.get("lr_sweep", {})
    sweep_txt = " ".join(f"{r}:{v['dev_accuracy'] * 100:.1f}" for r, v in sweep.items())
    table2_count = cfg.paper_param_count(cfg.CONFIGS[c["name"]])
    return (f"| {c['name']} | {summary['dataset']} | {table2_count:,} | "
            f"{summary['num_params']:,} | {lr:g} ({sweep_txt}) | "
            f"{summary['dev_accuracy'] * 100:.1f} | {summary['test_accuracy'] * 100:.1f} | "
            f"{paper_accuracy(c['name'], summary['dataset'])} | "
            f"{summary['best_dev_epoch']}/{summary['epochs']} | "
            f"{summary['wall_seconds'] / 60:.1f} | {summary.get('max_len') or '-'} |")


HEADER = ("| config | data | params (Table 2 conv., d=300) | params run (d=50, +softmax) "
          "| lr chosen (dev % per lr) | dev % | test % | paper % | best/ran epochs | wall min "
          "| max len |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(paths: list[str]) -> None:
    print(HEADER)
    for path in paths:
        with open(path) as f:
            print(row(json.load(f)))


if __name__ == "__main__":
    main(sys.argv[1:])
