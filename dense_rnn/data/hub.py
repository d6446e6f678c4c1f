"""Datasets from the Hugging Face hub, or from a local dataset directory, by name.

``load(name)`` is ``datasets.load_dataset`` of ``NAME[:CONFIG][@REVISION]`` with the hub's
retry warnings silenced and its failures (no connection, unknown name, no data files, a
loading script) as one-line ``UserError``s.
"""

from __future__ import annotations

import os
import re
import warnings
from types import ModuleType

with warnings.catch_warnings():  # tqdm's, in a Jupyter without ipywidgets: bars are off
    warnings.filterwarnings("ignore", message="IProgress not found")
    import datasets
from huggingface_hub.utils import logging as hub_logging

from dense_rnn.errors import UserError

# The branch where the hub keeps its Parquet conversion of a dataset (one that has only a
# loading script, which datasets >= 4 no longer runs, included).
PARQUET_EXPORT = "refs/convert/parquet"


def quiet() -> ModuleType:
    """``datasets``, with its progress bars off and its logging at errors only."""
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def parse(name: str) -> tuple[str, str | None, str | None]:
    """``(path, config, revision)`` of a hub name ``NAME[:CONFIG][@REVISION]``."""
    name, _, revision = name.partition("@")
    path, _, config = name.partition(":")
    return path, config or None, revision or None


def load(name: str) -> datasets.DatasetDict:
    """Every split of the dataset ``name``: a hub name such as ``fancyzhx/ag_news``, with
    ``:CONFIG`` for a dataset of several configs (``nyu-mll/glue:sst2``) and ``@REVISION``
    for a branch or commit (``CogComp/trec@refs/convert/parquet``: the hub's Parquet export
    of a dataset that has only a loading script), or a directory of
    ``train``/``validation``/``test`` data files."""
    quiet()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # failures come as UserError
    hub_logging.set_verbosity_error()
    if os.path.isdir(name):  # a local directory is its own path, whatever characters it holds
        path, config, revision = name, None, None
    elif os.path.exists(name):
        raise UserError(f"--hf_dataset={name} is a file, not a directory: give a directory of "
                        "train/validation/test data files, or a hub name (owner/name)")
    elif name.startswith((".", "/", "~")) or "\\" in name or re.match(r"[A-Za-z]:[\\/]", name):
        raise UserError(f"--hf_dataset={name}: no such directory (a path, where a hub name "
                        "would be owner/name, e.g. fancyzhx/ag_news)")
    else:
        path, config, revision = parse(name)
    try:
        ds = datasets.load_dataset(path, config, revision=revision)
    except (OSError, ValueError, RuntimeError, datasets.exceptions.DatasetsError) as e:
        # RuntimeError: datasets refuses a repository with a loading script
        reason = "; ".join(str(x).strip().splitlines()[0] for x in (e, e.__cause__)
                           if x is not None and str(x).strip()) or type(e).__name__
        if "scripts are no longer supported" in reason and not revision:
            hint = (f"this datasets {datasets.__version__} runs no loading scripts: load the "
                    f"hub's Parquet export, --hf_dataset={name}@{PARQUET_EXPORT}")
        elif os.path.isdir(name):
            hint = ("check its data files (train/validation/test as .csv, .json or .parquet, "
                    "all of one format)")
        else:
            hint = "check the name and the connection, or use the local files (--data_dir)"
        raise UserError(f"--hf_dataset={name} could not be loaded ({reason}); {hint}") from None
    if not isinstance(ds, datasets.DatasetDict):
        raise UserError(f"--hf_dataset={name} is not a dataset with named splits")
    return ds


def texts(ds: datasets.Dataset, column: str, where: str) -> list[str]:
    """The strings of ``ds``'s ``column``; a ``UserError`` naming the first row that holds
    none (a null cell, as an empty CSV field reads, or a number)."""
    values = ds[column]
    bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
    if bad is not None:
        raise UserError(f"{where}: row {bad} of column {column} holds {values[bad]!r}, not "
                        "text; fill or drop that row")
    return values

