"""``python -m benchmarks.ab WORKLOAD [WORKLOAD ...] [--base REV]``: the library at git
revision REV (default ``HEAD``) against the working tree, on each workload's ``ours`` step,
interleaved in one process. How an optimisation is measured before it is kept.

REV's ``dense_rnn`` and ``benchmarks`` packages are exported with ``git archive`` into a
temporary directory and imported under other names (``dense_rnn_base``,
``benchmarks_base``), so both versions' jitted steps live in one process and are timed
round-robin (``run.time_workload``): drift of the machine's speed hits both alike. Reported
per workload: each version's median step time and spread, and the speed-up of the working
tree as the median over repeats of the ratio ``base / new`` of the two back-to-back times
(with its range), which cancels drift slower than one repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import options
from dense_rnn.cli import run_script
from dense_rnn.errors import UserError

PACKAGES = ("dense_rnn", "benchmarks")
SUFFIX = "_base"


def export_base(rev: str, dest: str) -> None:
    """Writes REV's ``dense_rnn`` and ``benchmarks`` into ``dest`` as ``dense_rnn_base`` and
    ``benchmarks_base``, with their imports of each other renamed to match."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", root, "archive", rev, *PACKAGES],
                             capture_output=True, check=False)
    if archive.returncode:
        msg = archive.stderr.decode(errors="replace").strip().splitlines()
        raise UserError(f"--base={rev}: git archive failed ({msg[-1] if msg else 'no output'}); "
                        "give a commit of this repository (a hash, HEAD~1, a branch)")
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    pattern = re.compile(r"\b(" + "|".join(PACKAGES) + r")\b")
    for pkg in PACKAGES:
        os.rename(os.path.join(dest, pkg), os.path.join(dest, pkg + SUFFIX))
        for d, _, files in os.walk(os.path.join(dest, pkg + SUFFIX)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(d, name)
                with open(path) as f:
                    text = pattern.sub(lambda m: m.group(1) + SUFFIX, f.read())
                with open(path, "w") as f:
                    f.write(text)


def paired(base: list[float], new: list[float]) -> dict[str, float]:
    """Median, min and max over repeats of ``base[r] / new[r]`` (> 1: the new code is faster)."""
    ratios = [b / n for b, n in zip(base, new, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def compare(name: str, base_workloads: dict, repeats: int, min_time: float,
            warmup: float = 0.0) -> dict:
    """Times ``name``'s ``ours`` step of the base and of the working tree, round-robin."""
    from benchmarks import run
    from benchmarks.workloads import OURS, WORKLOADS

    if name not in base_workloads:
        raise UserError(f"workload {name!r} does not exist at the base revision; "
                        f"it has: {', '.join(sorted(base_workloads))}")
    new = WORKLOADS[name]()
    both = dataclasses.replace(new, impls={"base": base_workloads[name]().impls[OURS],
                                           "new": new.impls[OURS]})
    t = run.time_workload(both, repeats, min_time, warmup)
    for impl in ("base", "new"):
        if "error" in t[impl]:
            raise UserError(f"{name}: the {impl} version failed ({t[impl]['error']})")
    row = {"workload": new.name}
    for impl in ("base", "new"):
        times = t[impl]["times"]
        med = statistics.median(times)
        row[impl] = {"step_ms": 1e3 * med, "spread": (max(times) - min(times)) / med}
    row["speedup"] = paired(t["base"]["times"], t["new"]["times"])
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    from benchmarks.workloads import WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="+", choices=sorted(WORKLOADS), metavar="WORKLOAD")
    p.add_argument("--base", default="HEAD", help="git revision to compare against")
    p.add_argument("--repeats", type=options.count, default=15, help="round-robin repeats")
    p.add_argument("--min_time", type=options.seconds, default=0.3, help="seconds per timed repeat")
    p.add_argument("--warmup", type=options.seconds_or_zero, default=3.0,
                   help="seconds each version runs before it is timed (as benchmarks.run)")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="dense_rnn_ab_")
    try:
        export_base(a.base, tmp)
        sys.path.insert(0, tmp)
        base_workloads = importlib.import_module("benchmarks" + SUFFIX + ".workloads").WORKLOADS
        rows = []
        for name in a.workloads:
            r = compare(name, base_workloads, a.repeats, a.min_time, a.warmup)
            s = r["speedup"]
            print(f"{r['workload']}: base {r['base']['step_ms']:.2f} ms "
                  f"(spread {100 * r['base']['spread']:.0f}%), new {r['new']['step_ms']:.2f} ms "
                  f"(spread {100 * r['new']['spread']:.0f}%); base/new {s['median']:.3f}x "
                  f"(repeats {s['min']:.3f}-{s['max']:.3f})", flush=True)
            rows.append(r)
        return rows
    finally:
        if tmp in sys.path:
            sys.path.remove(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    run_script(main)
