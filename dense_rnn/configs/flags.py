"""absl flags shared by the binaries: path flags, and flags that override any scalar field
of a config dataclass."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Callable

from absl import flags

from dense_rnn.errors import UserError

# The absl ``DEFINE_*`` function of each scalar flag type.
DEFINE_BY_TYPE: dict[type, Callable[..., typing.Any]] = {
    bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
    str: flags.DEFINE_string}
_Config = typing.TypeVar("_Config")


class _PathParser(flags.ArgumentParser):
    """A path: ``~`` expanded (a shell leaves ``--workdir=~/x`` alone), an empty one refused
    (an unset ``$DIR`` in ``--workdir=$DIR`` would otherwise mean the default)."""

    syntactic_help = "a path (~ is expanded)"

    def parse(self, argument: str) -> str:
        if not argument:
            raise ValueError("an empty path; give one, or leave the flag out")
        return os.path.expanduser(argument)

    def flag_type(self) -> str:
        return "string"


def define_path(name: str, default: str | None, help: str,
                flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
    """``flags.DEFINE_string`` for a path (``_PathParser``)."""
    return flags.DEFINE(_PathParser(), name, default, help, flag_values=flag_values)


def define_override_flags(cls: type, skip: tuple[str, ...] = ("name",),
                          helps: dict[str, str] | None = None) -> list[str]:
    """Defines ``--<field>`` for each scalar field of ``cls``, with no default: only the
    flags given on the command line override the config's values. Fields in ``skip`` and
    the paper's numbers (``paper*``: descriptive, not settings) get no flag; ``helps`` adds
    to a field's help text. A binary lists them in its ``--help`` with
    ``flags.adopt_module_key_flags`` of this module."""
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        define = DEFINE_BY_TYPE.get(hints[f.name])
        if define is None or f.name in skip or f.name.startswith("paper"):
            continue
        define(f.name, None, f"Override the config's {f.name}."
               + (f" {helps[f.name]}" if helps and f.name in helps else ""))
        names.append(f.name)
    return names


def refuse_given(names: list[str], values: flags.FlagValues, why: str) -> None:
    """A ``UserError`` when any flag in ``names`` was given on the command line: ``why``
    says what ignores them (``--mode=predict reads the trained run's config``)."""
    given = [f"--{n}" for n in names if values[n].present]
    if given:
        raise UserError(f"{why}, so it takes no {', '.join(given)}; drop "
                        f"{'it' if len(given) == 1 else 'them'}")


def apply_overrides(config: _Config, names: list[str], values: flags.FlagValues) -> _Config:
    """``config`` with every flag in ``names`` that was given on the command line."""
    given = {n: values[n].value for n in names if values[n].present}
    return dataclasses.replace(config, **given)
