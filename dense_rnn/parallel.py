"""Data parallelism over a one-axis device mesh.

Batches are split along the ``data`` axis; parameters and optimizer state are replicated
(the models here are small: replication costs less than sharding them). Under ``jax.jit``
the result does not depend on the layout, so a run on N devices matches a run on one up to
the order of floating-point reductions, and checkpoints restore onto any layout.

Arrays are built with ``jax.make_array_from_callback`` from host values that every process
holds in full (the corpus is read by every process), so the same code runs on one device,
on N local devices and on multi-host pods after ``jax.distributed.initialize()``.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dense_rnn.errors import UserError

DATA = "data"
T = TypeVar("T")


def initialize_distributed() -> None:
    """``jax.distributed.initialize()`` for a multi-host run. ``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, where set, say where the coordinator is
    and which process this is; without them JAX detects TPU pods, SLURM and Open MPI."""
    env = os.environ
    kwargs: dict[str, Any] = {}
    try:
        for var, arg, cast in (("JAX_COORDINATOR_ADDRESS", "coordinator_address", str),
                               ("JAX_NUM_PROCESSES", "num_processes", int),
                               ("JAX_PROCESS_ID", "process_id", int)):
            if env.get(var):
                kwargs[arg] = cast(env[var])
    except ValueError:
        raise UserError("JAX_NUM_PROCESSES and JAX_PROCESS_ID must be integers") from None
    try:
        jax.distributed.initialize(**kwargs)
    except (ValueError, RuntimeError) as e:
        why = (str(e).splitlines() or [type(e).__name__])[0].rstrip(".")
        raise UserError(f"--multihost: {why}; set "
                        "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID on "
                        "every host") from None


def make_mesh(num_devices: int = 0) -> Mesh:
    """A mesh over the first ``num_devices`` devices (0: all visible devices)."""
    devices = jax.devices()
    if num_devices and jax.process_count() > 1:
        raise UserError(f"--num_devices={num_devices} with {jax.process_count()} processes: "
                        "leave it 0 (every device of every host) in multi-host runs")
    if not 0 <= num_devices <= len(devices):
        n = len(devices)
        visible = "1 device is" if n == 1 else f"{n} devices are"
        raise UserError(f"--num_devices={num_devices}, but {visible} visible "
                        f"({devices[0].platform}): pass --num_devices=0 (all) or at most {n}")
    return Mesh(np.asarray(devices[: num_devices or len(devices)]), (DATA,))


def replicated(mesh: Mesh) -> NamedSharding:
    """The whole value on every device."""
    return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
    """Leading (batch) axis split over the devices."""
    return NamedSharding(mesh, PartitionSpec(DATA))


def check_batch(batch: int, mesh: Mesh, flag: str = "batch_size") -> None:
    """Refuses a batch the devices cannot split evenly."""
    n = mesh.size
    if batch % n:
        fit = max(d for d in range(1, n + 1) if batch % d == 0)
        fewer = ("" if jax.process_count() > 1  # multi-host runs use every device
                 else f"--num_devices={fit} or ")
        raise UserError(f"--{flag}={batch} does not split over {n} devices; pass "
                        f"{fewer}a --{flag} that is a multiple of {n}")


def eval_sharding(batch: int, mesh: Mesh) -> NamedSharding:
    """Batch-sharded where ``batch`` splits evenly, else replicated."""
    return batch_sharded(mesh) if batch % mesh.size == 0 else replicated(mesh)


def put(tree: Any, sharding: NamedSharding) -> Any:
    """Every leaf of ``tree`` (host or device values, the same in every process) as a
    global array laid out by ``sharding``."""

    def one(x: Any) -> jax.Array:
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree)


class Pacer:
    """Paces a loop's steps on a CPU mesh of several devices: ``pace(out)``, called with each
    step's output as it is dispatched (one that no later step donates), returns it once the
    step before has finished, so at most two are in flight.

    XLA's CPU collectives between the devices of one process (``--xla_force_host_platform_
    device_count``) can deadlock when many steps are queued: a training loop that read its
    losses back every 100 steps had 7 of 8 devices wait at a step's all-gather until XLA
    aborted the process (5 of 6 runs of a quick LM; none of 6 so paced). On one device and
    on accelerators the steps run ahead as JAX dispatches them."""

    def __init__(self, mesh: Mesh | None):
        self.on = mesh is not None and mesh.size > 1 and mesh.devices.flat[0].platform == "cpu"
        self._last: Any = None

    def __call__(self, out: T) -> T:
        """``out``, once the step dispatched before it has finished (where pacing is on)."""
        if self.on:
            if self._last is not None:
                jax.block_until_ready(self._last)
            self._last = out
        return out
