"""Atomic orbax checkpoints with exact resume, tied to the config that wrote them.

A workdir holds ``checkpoints/<step>/`` (the latest training states, for resume) and
``best/<step>/`` (the parameters with the best validation metric). Orbax writes each
checkpoint to a temporary directory and renames it when complete, so a run killed while
saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from dense_rnn.errors import UserError


def _manager(path: str, max_to_keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True)
    return ocp.CheckpointManager(os.path.abspath(path), options=options)


class Checkpointer:
    """Latest and best checkpoints of one run.

    ``identity`` is the part of the config that must not change across a resume (the
    model and its data); a workdir written under another identity is refused.
    """

    def __init__(self, workdir: str, identity: dict[str, Any], max_to_keep: int = 2):
        self.workdir = workdir
        self.identity = identity
        os.makedirs(workdir, exist_ok=True)
        self._check_identity()
        self._latest = _manager(os.path.join(workdir, "checkpoints"), max_to_keep)
        self._best = _manager(os.path.join(workdir, "best"), 1)

    def _check_identity(self) -> None:
        path = os.path.join(self.workdir, "run_identity.json")
        if os.path.exists(path):
            with open(path) as f:
                stored = json.load(f)
            diff = sorted(k for k in set(stored) | set(self.identity)
                          if stored.get(k) != self.identity.get(k))
            if diff:
                shown = ", ".join(f"{k}: {stored.get(k)!r} -> {self.identity.get(k)!r}"
                                  for k in diff[:4])
                raise UserError(
                    f"workdir {self.workdir} holds a run of another config ({shown}); "
                    "use a new --workdir, or the same config to resume"
                )
        else:
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.identity, f, indent=1, sort_keys=True)
            os.replace(tmp, path)

    def latest_step(self) -> int | None:
        return self._latest.latest_step()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        self._latest.save(
            step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                          meta=ocp.args.JsonSave(meta)), force=True)

    def restore(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
        """The latest state (structured like ``like``) and its metadata, or None."""
        step = self._latest.latest_step()
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            out = self._latest.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                              meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise UserError(
                f"checkpoint {self.workdir}/checkpoints/{step} does not fit this config "
                f"({type(e).__name__}); use a new --workdir"
            ) from None
        return out.state, out.meta

    def save_best(self, step: int, params: Any, meta: dict[str, Any]) -> None:
        self._best.save(
            step, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                          meta=ocp.args.JsonSave(meta)), force=True)

    def restore_best(self, like: Any) -> tuple[Any, dict[str, Any]] | None:
        step = self._best.latest_step()
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self._best.restore(
            step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract),
                                          meta=ocp.args.JsonRestore()))
        return out.params, out.meta

    def wait(self) -> None:
        self._latest.wait_until_finished()
        self._best.wait_until_finished()

    def close(self) -> None:
        self._latest.close()
        self._best.close()
