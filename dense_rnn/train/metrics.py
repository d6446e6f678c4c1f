"""Run records: ``metrics.jsonl`` (one record per evaluation), ``summary.json``, a PNG of
the curves, and TensorBoard event files (``tensorboard --logdir WORKDIR/tensorboard``);
and the check that stops a run whose training loss is no longer finite."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from typing import Any

import jax

from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write


def device_description(num_devices: int = 0) -> str:
    """``"NUMx KIND (PLATFORM)"`` of the ``num_devices`` a run uses (0: every visible one);
    on CPU also the processor model and core count."""
    d = jax.devices()[0]
    text = f"{num_devices or jax.device_count()}x {d.device_kind} ({d.platform})"
    if d.platform == "cpu":
        text += f", {_cpu_model()}, {os.cpu_count()} cores"
    return text


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or "unknown processor"


def versions() -> dict[str, str]:
    """Versions of Python and of the libraries that decide a run's numbers."""
    import flax
    import optax

    return {"python": platform.python_version(), "jax": jax.__version__,
            "flax": flax.__version__, "optax": optax.__version__}


def count_params(tree: Any) -> int:
    """The number of scalars in a pytree of arrays (or of their shapes)."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def write_json(path: str, obj: Any) -> None:
    """Writes ``obj`` atomically (temporary file, then rename); in a multi-host run, only
    the first process writes (the hosts share the workdir)."""
    if jax.process_index() == 0:
        atomic_write(path, json.dumps(obj, indent=1, sort_keys=True))


def not_finite_error(loss: float, where: str, workdir: str, good_step: int | None,
                     resumable: Sequence[str], what: str = "training loss",
                     discarded: bool = True) -> UserError:
    """The error for a ``what`` (a training ``loss``) that is not finite (``where``: "at step
    40"). The advice depends on the latest checkpoint from before the loss diverged
    (``good_step``, None: none) and on whether the run may resume with another learning rate
    (one of its ``resumable`` fields); ``discarded``: the checkpoints after it were removed."""
    fix = "lower --learning_rate or clip gradients harder with --max_grad_norm"
    if good_step is None:
        advice = f"no checkpoint from before it is left: {fix} (a rerun starts over)"
    elif "learning_rate" not in resumable:
        advice = f"{fix} in a new --workdir ({workdir} resumes only the same config)"
    else:
        which = (f"the last good checkpoint ({workdir}/checkpoints/{good_step}; any later one "
                 "is removed)" if discarded
                 else f"the latest checkpoint ({workdir}/checkpoints/{good_step})")
        advice = (f"resume from {which}: {fix}, or start over in a new --workdir if it "
                  "diverges again")
    return UserError(f"{what} is {loss} {where}; {advice}")


def _record(line: str) -> dict[str, Any] | None:
    """The evaluation record on ``line`` (a JSON object with an integer ``step``), or None."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get("step"), int) else None


class MetricsWriter:
    """Appends evaluation records to ``metrics.jsonl`` (resume-safe: records past the resume
    step, and a last line cut short by a kill, are dropped first) and mirrors scalars to
    TensorBoard. In a multi-host run only the first process writes; every process keeps
    the ``records``."""

    def __init__(self, workdir: str, resume_step: int = 0):
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.records = self._read(resume_step)
        self._tb = None
        if jax.process_index() != 0:
            return
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
        from tensorboardX import SummaryWriter  # here: importing the trainers needs no writer

        # TensorBoard hides events at steps >= purge_step: the kept records end at resume_step.
        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                 purge_step=resume_step + 1)

    def _read(self, resume_step: int) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = [line for line in f if line.strip()]
        except UnicodeDecodeError:
            raise UserError(f"{self.path} is not UTF-8 text; repair or delete it to "
                            "resume") from None
        except OSError as e:  # a directory of that name, say
            raise UserError(f"cannot read {self.path} ({e.strerror}); repair or delete it to "
                            "resume") from None
        rows = []
        for n, line in enumerate(lines, 1):
            row = _record(line)
            if row is not None:
                rows.append(row)
            elif n < len(lines):  # only the last line can be torn by a kill
                raise UserError(f"{self.path} line {n} is not an evaluation record; repair "
                                "or delete that line to resume")
        return [r for r in rows if r["step"] <= resume_step]

    def write(self, record: dict[str, Any]) -> None:
        """Appends ``record`` (with its ``step``) to the file and to TensorBoard."""
        self.records.append(record)
        if self._tb is None:  # not the first process
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in record.items():
            if k != "step" and isinstance(v, int | float):
                self._tb.add_scalar(k, v, record["step"])
        self._tb.flush()

    def close(self) -> None:
        """Closes the TensorBoard writer."""
        if self._tb is not None:
            self._tb.close()


def plot_curves(records: list[dict[str, Any]], keys: list[str], path: str, title: str,
                x: str = "epoch", log_y: bool = False) -> None:
    """Line plot of ``keys`` against ``x`` over ``records`` into a PNG at ``path`` (by the
    first process of a multi-host run)."""
    if jax.process_index() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for k in keys:
        pts = [(r[x], r[k]) for r in records if r.get(k) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=k)
    ax.set_xlabel(x)
    if log_y:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
