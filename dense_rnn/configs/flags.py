"""absl flags that override any scalar field of a config dataclass."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable

from absl import flags

# The absl ``DEFINE_*`` function of each scalar flag type.
DEFINE_BY_TYPE: dict[type, Callable[..., typing.Any]] = {
    bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
    str: flags.DEFINE_string}
_Config = typing.TypeVar("_Config")


def define_override_flags(cls: type, skip: tuple[str, ...] = ("name",)) -> list[str]:
    """Defines ``--<field>`` for each scalar field of ``cls``, with no default: only the
    flags given on the command line override the config's values."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        define = DEFINE_BY_TYPE.get(hints[f.name])
        if define is None or f.name in skip:
            continue
        define(f.name, None, f"Override the config's {f.name}.")
        names.append(f.name)
    return names


def apply_overrides(config: _Config, names: list[str], values: flags.FlagValues) -> _Config:
    """``config`` with every flag in ``names`` that was given on the command line."""
    given = {n: values[n].value for n in names if values[n].present}
    return dataclasses.replace(config, **given)
