"""``python -m benchmarks.profile WORKLOAD [--impl ours] [--steps 10]``: where one step's time
goes, per XLA kernel (or, for a PyTorch implementation, per operator).

Runs a workload's JAX implementation untraced for ``--warmup`` seconds (default 3, as
``benchmarks.run``: a PTB step's first ~20 steps fault in fresh pages, ~2,000 a step at
zaremba_small, which a trace of them shows as slow fills and copies), then under
``jax.profiler.trace``, and prints, from the Perfetto trace: every step's wall time, the
kernels with the most time per step (with how often they run per step: 35 means once per
time step of a scan), the same time grouped into parts of the model (each kernel's HLO
``op_name``, read from the compiled step: module path, forward or backward, inside a scan
or not, matrix products or other work), and the timeline of the fastest step (kernels above
``--min_ms``, with their start offsets and threads). Kernels on different threads overlap,
so their times do not add up to the step's. A PyTorch implementation (``--impl "torch
nn.LSTM"``) runs under ``torch.profiler`` instead: its step times and the operators with
the most self time per step.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import importlib.util
import json
import re
import tempfile
import time
from collections.abc import Callable

import jax

from benchmarks import options, run
from dense_rnn.cli import run_script

# Transformation and call frames of an op_name, left out of a kernel's part.
_WRAPPERS = ("jit(", "jvp(", "transpose(", "vmap(", "closed_call", "checkpoint", "remat",
             "body", "cond", "branch_")
# Runtime and Python frames in the trace; everything else is a kernel (thunk) or a loop.
_NOT_KERNELS = ("$", "ThunkExecutor", "SlinkyThreadPool", "PjitFunction", "PjRt", "Common",
                "step ", "Handle inputs", "ParseArguments", "AllocateOutputBuffers")


def trace_steps(step, steps: int) -> list[dict]:
    """Complete ('X') trace events of ``steps`` calls of ``step``, each call inside an
    annotation named ``step I``."""
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            for i in range(steps):
                with jax.profiler.TraceAnnotation(f"step {i}"):
                    step()
        (path,) = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def operation_names(hlo_text: str) -> dict[str, str]:
    """Each instruction's ``op_name`` (the JAX operation and module path it comes from)."""
    return dict(re.findall(r'^\s*(?:ROOT )?%(\S+) = [^\n]*?op_name="([^"]*)"', hlo_text,
                           re.MULTILINE))


def part(op_name: str) -> str:
    """A kernel's part of the step, from its ``op_name``: the module path up to any scan,
    forward or backward (``transpose(...)``), in a scan or not, products or other work."""
    if not op_name:
        return "no op_name (copies, loop state)"
    names = [n for n in op_name.split("/")  # "Module.method": a method call's frame
             if not n.startswith(_WRAPPERS) and "." not in n]
    scope = names[:-1][: names.index("while")] if "while" in names else names[:-1]
    if not scope:
        return "outside the model (loss reduction, clipping, optimizer)"
    where = "backward" if "transpose(" in op_name else "forward"
    return (f"{'/'.join(scope[:2])} {where}{', in scan' if 'while' in names else ''}"
            f"{': products' if names[-1] == 'dot_general' else ''}")


def report(events: list[dict], top: int, min_ms: float, hlo_text: str | None = None) -> str:
    steps = sorted((e for e in events if e["name"].startswith("step ")), key=lambda e: e["ts"])
    kernels = [e for e in events if not e["name"].startswith(_NOT_KERNELS)]

    def inside(s):
        return [e for e in kernels if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]]

    lines = ["step ms: " + " ".join(f"{s['dur'] / 1e3:.1f}" for s in steps)]
    total, count = collections.Counter(), collections.Counter()
    for s in steps:
        for e in inside(s):
            total[e["name"]] += e["dur"] / 1e3 / len(steps)
            count[e["name"]] += 1 / len(steps)
    lines += ["", f"top {top} kernels: ms/step  calls/step  name"]
    lines += [f"{ms:9.2f}  {count[name]:9.0f}  {name}" for name, ms in total.most_common(top)]
    if hlo_text is not None:
        ops, parts = operation_names(hlo_text), collections.Counter()
        for name, ms in total.items():
            if not name.startswith("while"):  # a loop: its kernels are counted instead
                parts[part(ops.get(name.removeprefix("end: "), ""))] += ms
        lines += ["", f"time by part (kernels grouped by the operation they come from; "
                      f"sum {sum(parts.values()):.1f}): ms/step  part"]
        lines += [f"{ms:9.2f}  {name}" for name, ms in parts.most_common(top)]
    fastest = min(steps, key=lambda s: s["dur"])
    threads = {}
    lines += ["", f"fastest step ({fastest['dur'] / 1e3:.1f} ms), kernels >= {min_ms} ms: "
                  "start ms  +ms  thread  name"]
    for e in sorted(inside(fastest), key=lambda e: e["ts"]):
        if e["dur"] >= min_ms * 1e3:
            tid = threads.setdefault(e["tid"], len(threads))
            lines.append(f"{(e['ts'] - fastest['ts']) / 1e3:8.2f} +{e['dur'] / 1e3:6.2f}  "
                         f"t{tid}  {e['name']}")
    return "\n".join(lines)


def torch_report(step: Callable[[], None], steps: int, top: int) -> str:
    """Step times and the operators with the most self CPU time per step, of ``steps``
    calls of a PyTorch ``step`` under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    times = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    lines = ["step ms: " + " ".join(f"{t * 1e3:.1f}" for t in times), "",
             f"top {top} operators: ms/step  calls/step  name"]
    lines += [f"{e.self_cpu_time_total / 1e3 / steps:9.2f}  {e.count / steps:9.0f}  {e.key}"
              for e in ops[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    from benchmarks.workloads import OURS, WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=sorted(WORKLOADS))
    p.add_argument("--impl", default=OURS, help="an implementation of the workload")
    p.add_argument("--steps", type=options.count, default=10,
                   help="traced steps (after the warm-up's untraced ones)")
    p.add_argument("--warmup", type=options.seconds_or_zero, default=3.0,
                   help="seconds of untraced steps after the first 3, past the first steps' "
                        "page faults (benchmarks.run's warm-up)")
    p.add_argument("--top", type=options.count, default=25, help="kernels listed by time per step")
    p.add_argument("--min_ms", type=float, default=0.2, help="timeline threshold")
    a = p.parse_args(argv)
    impls = WORKLOADS[a.workload]().impls
    if a.impl not in impls:
        p.error(f"--impl must be one of {', '.join(impls)}")
    if "torch" in a.impl and importlib.util.find_spec("torch") is None:
        p.error(f"--impl {a.impl!r} needs PyTorch, which is not installed (BUILD.md: the CPU "
                "build of torch 2.13.0 from PyTorch's index, then pip install -e '.[bench]')")
    step = impls[a.impl]()
    for _ in range(3):
        step()
    run.warm_up(step, a.warmup)
    if "torch" in a.impl:
        out = torch_report(step, a.steps, a.top)
    else:
        hlo = step.hlo_text() if hasattr(step, "hlo_text") else None  # not on rooflines
        out = report(trace_steps(step, a.steps), a.top, a.min_ms, hlo)
    print(out)
    return out


if __name__ == "__main__":
    run_script(main)
