"""Datasets from the Hugging Face hub, or from a local dataset directory, by name.

``load(name)`` is ``datasets.load_dataset(name)`` with the hub's retry warnings silenced
and its failures (no connection, unknown name, no data files) as one-line ``UserError``s.
"""

from __future__ import annotations

from types import ModuleType

import datasets
from huggingface_hub.utils import logging as hub_logging

from dense_rnn.errors import UserError


def quiet() -> ModuleType:
    """``datasets``, with its progress bars off and its logging at errors only."""
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def load(name: str) -> datasets.DatasetDict:
    """Every split of the dataset ``name``: a hub name such as ``fancyzhx/ag_news``, with
    ``:CONFIG`` for a dataset of several configs (``nyu-mll/glue:sst2``), or a directory of
    ``train``/``validation``/``test`` data files."""
    quiet()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # failures come as UserError
    hub_logging.set_verbosity_error()
    try:
        ds = datasets.load_dataset(*name.split(":", 1))
    except (OSError, ValueError, RuntimeError, datasets.exceptions.DatasetsError) as e:
        # RuntimeError: datasets refuses a repository with a loading script
        reason = "; ".join(str(x).strip().splitlines()[0] for x in (e, e.__cause__)
                           if x is not None and str(x).strip()) or type(e).__name__
        raise UserError(f"--hf_dataset={name} could not be loaded ({reason}); check the name "
                        "and the connection, or use the local files (--data_dir)") from None
    if not isinstance(ds, datasets.DatasetDict):
        raise UserError(f"--hf_dataset={name} is not a dataset with named splits")
    return ds
