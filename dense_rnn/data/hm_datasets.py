"""The HM-DenseRNN datasets (Zhao et al. 2019, Table 1): IMDB, SST-5 and AG News.

Read from the local files into Hugging Face ``datasets`` (columns ``text``, ``label``,
``tokens``, as ``text_classification``) with train/dev/test splits:

* IMDB: ``imdb/aclImdb_labeled.tar.gz`` read with ``tarfile``; 2,500 of the 25,000 training
  reviews held out for validation (seeded, ``SPLIT_SEED``); 25,000 test reviews. HTML
  ``<br />`` breaks become spaces (an optional maximum length: the binary's ``--max_len``).
* SST-5: the fine-grained sentence split ``sst/stsa.fine.{train,dev,test}`` (8,544 / 1,101 /
  2,210).
* AG News: ``ag_news/{train,test}.csv`` (class, title, description; classes 1-4), title and
  description joined; 10% of train (12,000) held out for validation. Only ``test.csv`` ships
  here: without ``train.csv`` the loader raises ``AG_TRAIN_MISSING``.
"""

from __future__ import annotations

import csv
import os
import re
import tarfile
import zlib

from dense_rnn.data.text_classification import (
    DEV_FRACTION,
    SPLIT_SEED,
    Splits,
    _dataset,
    _split_off,
    clean_str,
    load_sst,
)
from dense_rnn.errors import UserError
from dense_rnn.files import not_a

IMDB_TAR = os.path.join("imdb", "aclImdb_labeled.tar.gz")
_IMDB_MEMBER = re.compile(r"aclImdb/(train|test)/(pos|neg)/\d+_\d+\.txt$")
AG_TRAIN_MISSING = ("AG News training split missing: {path} not found (only test.csv ships "
                    "in the data dir); put AG's News train.csv (120,000 rows, "
                    '"class","title","description") there to train on --dataset=ag')


def read_imdb_tar(path: str) -> dict[str, tuple[list[str], list[int]]]:
    """``{split: (texts, labels)}`` of the IMDB tarball, label 1 = pos, in archive order."""
    if not os.path.isfile(path):
        raise UserError(f"IMDB archive {path} {not_a(path)}; pass --data_dir=DIR holding "
                        f"{IMDB_TAR}")
    out: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "test": ([], [])}
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                match = _IMDB_MEMBER.match(member.name)
                if match and member.isfile():
                    try:
                        text = tar.extractfile(member).read().decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise UserError(f"{path}: review {member.name} is not UTF-8 text "
                                        f"(byte {e.start}); restore the original "
                                        "archive") from None
                    out[match[1]][0].append(text.replace("<br />", " "))
                    out[match[1]][1].append(int(match[2] == "pos"))
            # tarfile takes a damaged header for the end of the archive: reading the
            # compressed stream to its end checks its CRC and length
            while tar.fileobj.read(1 << 20):
                pass
    except (tarfile.TarError, OSError, EOFError, UnicodeDecodeError, zlib.error) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__  # tarfile's: lines
        raise UserError(f"{path} is not a readable IMDB tar.gz, or is damaged ({why}); "
                        "restore the original archive") from None
    for split, (texts, _) in out.items():
        if not texts:
            raise UserError(f"{path} holds no aclImdb/{split}/{{pos,neg}}/*.txt reviews")
    return out


def load_imdb(data_dir: str) -> Splits:
    """IMDB train (22,500) / dev (2,500, seeded) / test (25,000); reviews are not cut here
    (``text_classification.truncate``, the binary's ``--max_len``)."""
    raw = read_imdb_tar(os.path.join(data_dir, IMDB_TAR))
    train, dev = _split_off(_dataset(*raw["train"], clean_str), DEV_FRACTION, SPLIT_SEED)
    return {"train": train, "dev": dev, "test": _dataset(*raw["test"], clean_str)}


def load_sst5(data_dir: str) -> Splits:
    """SST-5 = the fine-grained sentence-level SST splits (``stsa.fine.*``)."""
    return load_sst(data_dir, fine=True)


def read_ag_csv(path: str) -> tuple[list[str], list[int]]:
    """``(title + " " + description, class - 1)`` of every row of an AG News csv file. A
    backslash there separates lines (``social\\network``) or escapes a character (``\\$``):
    each becomes a space, as the hub copy's cleaning (``clean_str``) makes it."""
    texts, labels = [], []
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # (a BOM is skipped)
            for n, row in enumerate(csv.reader(f), 1):
                if len(row) != 3 or row[0] not in ("1", "2", "3", "4"):
                    header = n == 1 and len(row) == 3 and not row[0].strip().isdigit()
                    raise UserError(f"{path}: row {n} is not \"class(1-4)\",\"title\","
                                    f"\"description\": {str(row)[:60]}"
                                    + "; a header? remove it (AG News files have none)" * header)
                texts.append(f"{row[1]} {row[2]}".replace("\\", " "))
                labels.append(int(row[0]) - 1)
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not utf-8 text ({e.reason}); re-save it as utf-8") from None
    except csv.Error as e:
        raise UserError(f"{path} is not a csv file ({e}); restore the original file") from None
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror}); check the file") from None
    if not texts:
        raise UserError(f"{path} has no rows; restore the original file")
    return texts, labels


def load_ag(data_dir: str) -> Splits:
    """AG News train (108,000) / dev (12,000, seeded) / test (7,600)."""
    paths = {s: os.path.join(data_dir, "ag_news", f"{s}.csv") for s in ("train", "test")}
    if not os.path.isfile(paths["train"]):
        raise UserError(AG_TRAIN_MISSING.format(path=paths["train"]))
    if not os.path.isfile(paths["test"]):
        raise UserError(f"AG News test split missing: {paths['test']} not found; put "
                        "test.csv beside train.csv, or use --hf_dataset=fancyzhx/ag_news")
    train, dev = _split_off(_dataset(*read_ag_csv(paths["train"]), clean_str), DEV_FRACTION,
                            SPLIT_SEED)
    return {"train": train, "dev": dev, "test": _dataset(*read_ag_csv(paths["test"]), clean_str)}
