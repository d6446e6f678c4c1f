"""Sentence classification datasets, vocabulary and padded, length-bucketed batches.

Every dataset is read from its local files into Hugging Face ``datasets.Dataset`` objects
with columns ``text`` (the raw line), ``tokens`` (Kim 2014 ``clean_str`` tokens, lower-cased
for the case-insensitive GloVe) and ``label`` (int). ``DATASETS`` maps a dataset name to a
``DatasetSpec``, the HM-DenseRNN family's datasets (``hm_datasets``) among them.

Datasets without a dev split take it from their training data: a fixed, seeded slice
(``DEV_FRACTION``). MR and Subj have no test split either: 10-fold cross-validation over
fixed, seeded folds (``cv_splits``).

``load_hub`` reads them from the Hugging Face hub instead, for users online
(``DatasetSpec.hub`` names the hub dataset of each; any dataset with a text and a label
column will do).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write, not_a

if TYPE_CHECKING:
    import datasets


PAD, UNK = 0, 1
VOCAB_FILE = "vocab.json"  # a classification run's vocabulary, in its workdir
DEV_FRACTION = 0.1
SPLIT_SEED = 1234  # fixed: folds and dev slices never depend on the training seed
Splits = dict[str, "datasets.Dataset"]


def _hf() -> ModuleType:
    """Hugging Face ``datasets``, imported on first use: the models and training steps
    import this module and run without it (the GPU benchmarks do)."""
    from dense_rnn.data import hub

    return hub.quiet()


def clean_str(s: str) -> str:
    """Kim (2014) ``clean_str`` tokenisation (MR, Subj, TREC), lower-cased."""
    s = re.sub(r"[^A-Za-z0-9(),!?\'\`]", " ", s)
    for suffix in ("'s", "'ve", "n't", "'re", "'d", "'ll"):
        s = s.replace(suffix, " " + suffix)
    for p in ",!()?":
        s = s.replace(p, f" {p} ")
    return re.sub(r"\s{2,}", " ", s).strip().lower()


def clean_str_sst(s: str) -> str:
    """Kim (2014) ``clean_str_sst`` tokenisation (SST files are already tokenised)."""
    s = re.sub(r"[^A-Za-z0-9(),!?\'\`]", " ", s)
    return re.sub(r"\s{2,}", " ", s).strip().lower()


def clean_str_html(s: str) -> str:
    """``clean_str`` after HTML line breaks (IMDB's ``<br />``) become spaces."""
    return clean_str(s.replace("<br />", " "))


# The dataset directories a --data_dir holds (``../shared/data``'s layout).
DATA_DIRS = "mr/, sst/, subj/, trec/, imdb/, ag_news/"


def read_lines(path: str, encoding: str, what: str = "data file",
               hint: str = "") -> list[tuple[int, str]]:
    """``(line number, line)`` of every non-blank line of a text file, as a ``UserError``
    on failure. The file is read as UTF-8 where all of it decodes so (a copy re-saved by a
    user's editor), else as ``encoding`` (the original files' Latin-1 or cp1252). Errors
    name the file ``what`` and say ``hint`` for a missing or empty one (default: a dataset
    file, found under --data_dir)."""
    if not os.path.isfile(path):
        raise UserError(f"{what} {path} {not_a(path)}; " + (
            hint or f"pass --data_dir=DIR holding the dataset directories ({DATA_DIRS})"))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark is not text
    except UnicodeDecodeError as e:
        if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig"):
            raise UserError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); re-save "
                            "it as UTF-8") from None
        try:
            text = raw.decode(encoding).removeprefix("ï»¿")  # a mark, as Latin-1 reads it
        except UnicodeDecodeError as e:
            raise UserError(f"{path} is neither UTF-8 nor {encoding} text (byte {e.start}: "
                            f"{e.reason}); re-save it as UTF-8") from None
    if "\x00" in text:  # every byte is valid Latin-1, but text has no NULs
        raise UserError(f"{path} contains NUL characters (UTF-16 or binary?); re-save it as "
                        "UTF-8 text")
    # split("\n"), not splitlines(): that also splits at \x85 etc.
    lines = [(n, ln) for n, ln in enumerate(text.split("\n"), 1) if ln.strip()]
    if not lines:
        raise UserError(f"{what} {path} has no non-blank lines; "
                        + (hint or "restore the original file"))
    return lines


def _dataset(texts: Sequence[str], labels: Sequence[int],
             clean: Callable[[str], str]) -> datasets.Dataset:
    ds = _hf().Dataset.from_dict({"text": list(texts), "label": list(labels)})
    return ds.map(lambda b: {"tokens": [clean(t).split() for t in b["text"]]}, batched=True)


def _labelled_lines(path: str, encoding: str, num_classes: int) -> tuple[list[str], list[int]]:
    """``<label> <text>`` lines (Kim's ``stsa.*`` files; a tab after the label also does)."""
    texts, labels = [], []
    for n, line in read_lines(path, encoding):
        head, text = (line.split(maxsplit=1) + ["", ""])[:2]
        if not re.fullmatch(r"[0-9]+", head) or not 0 <= int(head) < num_classes:
            raise UserError(f"{path}: line {n} does not start with a label in "
                            f"0..{num_classes - 1}: {line[:40]!r}")
        if not text.strip():
            raise UserError(f"{path}: line {n} has a label but no text: {line[:40]!r}")
        texts.append(text)
        labels.append(int(head))
    return texts, labels


def load_polarity(data_dir: str, sub: str, files: tuple[str, str], encoding: str) -> Splits:
    """Two-file datasets (label 0: ``files[0]``, label 1: ``files[1]``): MR and Subj."""
    texts, labels = [], []
    for label, name in enumerate(files):
        lines = [ln for _, ln in read_lines(os.path.join(data_dir, sub, name), encoding)]
        texts += lines
        labels += [label] * len(lines)
    return {"all": _dataset(texts, labels, clean_str)}


def _tree_phrases(line: str) -> list[tuple[str, int]]:
    """All labelled phrases ``(text, label)`` of one PTB-style SST tree, root first. Tokens
    stay as written (``-LRB-``), so they clean as the ``stsa.*`` sentences' ``-lrb-`` do; a
    line that is not exactly one closed tree raises ``ValueError`` (``IndexError`` where a
    bracket closes nothing or a word comes before the first one)."""
    stack: list[tuple[int, list[str]]] = []
    out: list[tuple[str, int]] = []
    for tok in re.findall(r"\(|\)|[^\s()]+", line):
        if tok == "(":
            if out and not stack:
                raise ValueError("a second tree on the line")
            stack.append((-1, []))
        elif tok == ")":
            label, words = stack.pop()
            if label < 0 or not words:
                raise ValueError("a node without a label or without words")
            out.append((" ".join(words), label))
            if stack:
                stack[-1][1].extend(words)
        elif stack[-1][0] < 0:
            if tok not in ("0", "1", "2", "3", "4"):
                raise ValueError(f"sentiment label {tok!r}")
            stack[-1] = (int(tok), stack[-1][1])
        else:
            stack[-1][1].append(tok)
    if stack or not out:
        raise ValueError("an unclosed tree")
    return out[::-1]


def load_sst(data_dir: str, fine: bool, phrases: bool = False) -> Splits:
    """SST-1 (``fine``) or SST-2 sentence-level splits; ``phrases``: train on every phrase
    of ``trees/train.txt`` once (SST-2 drops neutral and maps 0,1 -> 0, 3,4 -> 1), but none
    that cleans to nothing (``--``)."""
    kind, c = ("fine", 5) if fine else ("binary", 2)
    splits = {
        split: _dataset(*_labelled_lines(os.path.join(data_dir, "sst", f"stsa.{kind}.{split}"),
                                         "utf-8", c), clean_str_sst)
        for split in ("train", "dev", "test")
    }
    if phrases:
        seen: dict[str, int] = {}
        path = os.path.join(data_dir, "sst", "trees", "train.txt")
        for n, line in read_lines(path, "utf-8"):
            try:
                tree = _tree_phrases(line)
            except (IndexError, ValueError):
                raise UserError(f"{path}: line {n} is not a labelled PTB-style tree: "
                                f"{line[:40]!r}") from None
            for text, label in tree:
                if (fine or label != 2) and clean_str_sst(text):
                    seen.setdefault(text, label if fine else int(label > 2))
        splits["train"] = _dataset(list(seen), list(seen.values()), clean_str_sst)
    return splits


TREC_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


def load_trec(data_dir: str) -> Splits:
    """TREC coarse labels (6 classes); files are Latin-1."""
    out = {}
    for split, name in (("train", "train_5500.label"), ("test", "TREC_10.label")):
        path = os.path.join(data_dir, "trec", name)
        texts, labels = [], []
        for n, line in read_lines(path, "latin-1"):
            head, text = (line.split(None, 1) + [""])[:2]  # the label, then any whitespace
            coarse = head.split(":")[0]
            if coarse not in TREC_LABELS:
                raise UserError(f"{path}: line {n} has no TREC label "
                                f"({'/'.join(TREC_LABELS)}:fine): {line[:40]!r}")
            if not text.strip():
                raise UserError(f"{path}: line {n} has a label but no text: {line[:40]!r}")
            texts.append(text)
            labels.append(TREC_LABELS.index(coarse))
        out[split] = _dataset(texts, labels, clean_str)
    return out


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """A dataset: class count, its local loader, CV folds (0: fixed test split), the
    tokeniser of its text, and the hub dataset with the same examples (``load_hub``)."""

    num_classes: int
    load: Callable[[str], Splits]
    num_folds: int = 0
    clean: Callable[[str], str] = clean_str
    hub: str = ""
    label_names: tuple[str, ...] = ()  # class ids' names, where a hub version names them
    class_names: tuple[str, ...] = ()  # what each class id means, for people (predictions)
    # The standard splits' sizes (the data README's counts), checked on local files.
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)


POLARITY = ("negative", "positive")
SENTIMENT = ("very negative", "negative", "neutral", "positive", "very positive")
SST1_SIZES = {"train": 8_544, "dev": 1_101, "test": 2_210}  # sentences, phrases not expanded
SST2_SIZES = {"train": 6_920, "dev": 872, "test": 1_821}  # neutral sentences left out

# Hub datasets (columns text and label; TREC: coarse_label) have their own train/dev/test
# splits; MR and Subj are pooled for cross-validation. The phrase sets exist only locally.
DATASETS: dict[str, DatasetSpec] = {
    "mr": DatasetSpec(2, lambda d: load_polarity(
        d, "mr", ("rt-polarity.neg", "rt-polarity.pos"), "cp1252"), 10,
        hub="cornell-movie-review-data/rotten_tomatoes", sizes={"all": 10_662},
        class_names=POLARITY),
    "subj": DatasetSpec(2, lambda d: load_polarity(
        d, "subj", ("plot.tok.gt9.5000", "quote.tok.gt9.5000"), "latin-1"), 10,
        hub="SetFit/subj", sizes={"all": 10_000}, class_names=("objective", "subjective")),
    "sst1": DatasetSpec(5, lambda d: load_sst(d, fine=True), clean=clean_str_sst,
                        hub="SetFit/sst5", sizes=SST1_SIZES, class_names=SENTIMENT),
    "sst2": DatasetSpec(2, lambda d: load_sst(d, fine=False), clean=clean_str_sst,
                        hub="SetFit/sst2", sizes=SST2_SIZES, class_names=POLARITY),
    # 159,274 distinct training phrases, less 16 that clean to nothing ("--")
    "sst1_phrases": DatasetSpec(5, lambda d: load_sst(d, fine=True, phrases=True),
                                clean=clean_str_sst, sizes={**SST1_SIZES, "train": 159_258},
                                class_names=SENTIMENT),
    "sst2_phrases": DatasetSpec(2, lambda d: load_sst(d, fine=False, phrases=True),
                                clean=clean_str_sst, sizes={**SST2_SIZES, "train": 77_616},
                                class_names=POLARITY),
    "trec": DatasetSpec(6, load_trec, hub="CogComp/trec@refs/convert/parquet",
                        label_names=TREC_LABELS, sizes={"train": 5_452, "test": 500},
                        class_names=TREC_LABELS),
    # Zhao et al. 2019 (HM-DenseRNN); dense_rnn.data.hm_datasets imports this module.
    "imdb": DatasetSpec(2, lambda d: _hm_datasets().load_imdb(d), clean=clean_str_html,
                        hub="stanfordnlp/imdb",
                        sizes={"train": 22_500, "dev": 2_500, "test": 25_000},
                        class_names=POLARITY),
    "sst5": DatasetSpec(5, lambda d: _hm_datasets().load_sst5(d), clean=clean_str_sst,
                        hub="SetFit/sst5", sizes=SST1_SIZES, class_names=SENTIMENT),
    "ag": DatasetSpec(4, lambda d: _hm_datasets().load_ag(d), hub="fancyzhx/ag_news",
                      sizes={"train": 108_000, "dev": 12_000, "test": 7_600},
                      class_names=("World", "Sports", "Business", "Sci/Tech")),
}


def size_warnings(name: str, spec: DatasetSpec, splits: Splits) -> list[str]:
    """A line for every split of local files whose example count is not the standard
    split's (a file cut short, or another version of the dataset)."""
    return [f"warning: {name} {split} has {len(splits[split]):,} examples, the standard "
            f"split {n:,}: is a file cut short, or another version of {name}?"
            for split, n in spec.sizes.items() if split in splits and len(splits[split]) != n]


def class_warnings(name: str, spec: DatasetSpec, splits: Splits) -> list[str]:
    """A line for the training data (``train``, or a CV dataset's pooled ``all``) when a
    class has no example in it: a mislabelled file trains a classifier that never says it."""
    lines, names = [], spec.class_names or tuple(map(str, range(spec.num_classes)))
    for split in ("train", "all"):
        if split in splits:
            missing = sorted(set(range(spec.num_classes)) - set(splits[split]["label"]))
            if missing:
                lines.append(f"warning: {name} {split} has no example of class "
                             f"{', '.join(names[i] for i in missing)} (of "
                             f"{spec.num_classes}); are its labels right?")
    return lines


_HUB_SPLITS = {"train": "train", "validation": "dev", "valid": "dev", "dev": "dev",
               "test": "test"}


def _column(ds: datasets.Dataset, names: tuple[str, ...], what: str, where: str) -> str:
    for name in names:
        if name in ds.column_names:
            return name
    raise UserError(f"{where} has no {what} column ({' or '.join(names)}); its columns: "
                    f"{', '.join(ds.column_names)}")


def load_hub(name: str, spec: DatasetSpec) -> Splits:
    """The splits of hub dataset ``name`` (or a local dataset directory) for ``spec``:
    ``validation`` is the dev split, other splits than train/dev/test are ignored, and a CV
    dataset pools every split; text is tokenised by ``spec.clean``."""
    from dense_rnn.data import hub

    raw = hub.load(name)
    splits, unlabelled = {}, []
    for split, ds in raw.items():
        if split not in _HUB_SPLITS:
            continue
        where = f"--hf_dataset={name} split {split}"
        text = _column(ds, ("text", "sentence"), "text", where)
        label = _column(ds, ("label", "coarse_label"), "label", where)
        labels = np.asarray(ds[label])
        if not len(labels) or (labels == -1).all():  # empty, or its labels held back (GLUE)
            unlabelled.append(split)
            continue
        if labels.dtype.kind not in "iu":
            raise UserError(f"{where}: column {label} holds {labels.dtype} values, not class "
                            f"ids 0..{spec.num_classes - 1}")
        if not (labels.min() >= 0 and labels.max() < spec.num_classes):
            raise UserError(f"{where} has labels {labels.min()}..{labels.max()}, not "
                            f"0..{spec.num_classes - 1} (an unlabelled split, or another "
                            "dataset?)")
        labels = _local_class_ids(labels, ds.features[label], spec, where)
        if "label_text" in ds.column_names:  # SetFit's copies name each row's class
            labels = _named_class_ids(labels, ds["label_text"], spec, where)
        splits[_HUB_SPLITS[split]] = _dataset(hub.texts(ds, text, where), labels.tolist(),
                                              spec.clean)
    if spec.num_folds:
        if not splits:
            raise UserError(f"--hf_dataset={name} has no train/validation/test split")
        return {"all": _hf().concatenate_datasets(list(splits.values()))}
    missing = {"train", "test"} - set(splits)
    if missing:
        raise UserError(f"--hf_dataset={name} has no labelled {' or '.join(sorted(missing))} "
                        f"split (its splits: {', '.join(raw)}"
                        + (f"; unlabelled or empty: {', '.join(unlabelled)})" if unlabelled
                           else ")"))
    return splits


def _local_class_ids(labels: np.ndarray, feature: Any, spec: DatasetSpec,
                     where: str) -> np.ndarray:
    """``labels`` as the local files' class ids, where the hub's ``ClassLabel`` names its
    classes in another order (``CogComp/trec``: ABBR, ENTY, DESC, ...)."""
    names = getattr(feature, "names", None)
    if not spec.label_names or not names or list(names) == list(spec.label_names):
        return labels
    if sorted(names) != sorted(spec.label_names):
        raise UserError(f"{where} names its classes {', '.join(names)}; expected "
                        f"{', '.join(spec.label_names)}")
    return np.asarray([spec.label_names.index(n) for n in names])[labels]


def _named_class_ids(labels: np.ndarray, names: list[str], spec: DatasetSpec,
                     where: str) -> np.ndarray:
    """``labels`` as the local files' class ids by each row's ``label_text``, where every
    name is one of ``spec.class_names`` (in any case): a copy whose ids run in another
    order (objective = 1 in SentEval's SUBJ, 0 here) is read right. Where any name is not
    one of them, the ids stay as they are; an id under two names, or a name under two
    ids, is an error."""
    local = [n.lower() for n in spec.class_names]
    pairs = set(zip(labels.tolist(), (str(n).lower() for n in names), strict=True))
    if not local or any(n not in local for _, n in pairs):
        return labels
    by_id = dict(pairs)
    if len(by_id) != len(pairs) or len(set(by_id.values())) != len(by_id):
        raise UserError(f"{where}: its label and label_text columns do not pair one id with "
                        f"one name ({', '.join(sorted(f'{i}={n}' for i, n in pairs))})")
    return np.asarray([local.index(by_id[i]) for i in labels.tolist()], labels.dtype)


KEEP = ("first", "last")  # which tokens of a text longer than ``max_len`` are kept


def cut(tokens: Sequence[str], max_len: int, keep: str = "first") -> Sequence[str]:
    """``tokens`` cut to their first (``keep="first"``) or last ``max_len`` (0: all)."""
    if not max_len or len(tokens) <= max_len:
        return tokens
    return tokens[:max_len] if keep == "first" else tokens[-max_len:]


def truncate(splits: Splits, max_len: int, keep: str = "first") -> Splits:
    """Every split with each text ``cut`` to ``max_len`` tokens (e.g. long IMDB reviews,
    whose verdict often comes last: ``keep="last"``)."""
    return {k: ds.map(lambda b: {"tokens": [cut(t, max_len, keep) for t in b["tokens"]]},
                      batched=True)
            for k, ds in splits.items()}


def _hm_datasets() -> ModuleType:
    from dense_rnn.data import hm_datasets

    return hm_datasets


def get_dataset(name: str) -> DatasetSpec:
    """The registered dataset ``name``."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; use one of {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def _split_off(ds: datasets.Dataset, fraction: float,
               seed: int) -> tuple[datasets.Dataset, datasets.Dataset]:
    """``(rest, slice)``: a fixed, seeded ``fraction`` of ``ds`` split off."""
    perm = np.random.default_rng(seed).permutation(len(ds))
    n = int(round(fraction * len(ds)))
    return ds.select(np.sort(perm[n:])), ds.select(np.sort(perm[:n]))


def cv_splits(ds: datasets.Dataset, fold: int, num_folds: int) -> Splits:
    """Fold ``fold`` of fixed, seeded ``num_folds``-fold CV: test = that fold, dev = a
    ``DEV_FRACTION`` slice of the other folds, train = the rest."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(ds))
    in_test = np.zeros(len(ds), bool)
    in_test[perm[fold::num_folds]] = True
    train, dev = _split_off(ds.select(np.flatnonzero(~in_test)), DEV_FRACTION, SPLIT_SEED + fold)
    return {"train": train, "dev": dev, "test": ds.select(np.flatnonzero(in_test))}


def make_splits(spec: DatasetSpec, raw: Splits, fold: int = 0) -> Splits:
    """Train/dev/test of a loaded dataset (``fold`` for CV datasets)."""
    if spec.num_folds:
        return cv_splits(raw["all"], fold, spec.num_folds)
    if "dev" not in raw:
        train, dev = _split_off(raw["train"], DEV_FRACTION, SPLIT_SEED)
        return {"train": train, "dev": dev, "test": raw["test"]}
    return raw


@dataclasses.dataclass(frozen=True)
class Vocab:
    """Word ids: 0 is padding, 1 the unknown word; ``drop_unknown`` removes unknown words."""

    words: tuple[str, ...]
    drop_unknown: bool

    @property
    def index(self) -> dict[str, int]:
        """Word -> id."""
        return {w: i for i, w in enumerate(self.words)}

    def save(self, path: str) -> None:
        """Writes the vocabulary as JSON, atomically."""
        atomic_write(path, json.dumps({"words": list(self.words),
                                       "drop_unknown": self.drop_unknown}))

    @classmethod
    def load(cls, path: str) -> Vocab:
        """The vocabulary ``save`` wrote to ``path``, as a ``UserError`` on failure."""
        try:
            with open(path) as f:
                stored = json.load(f)
            return cls(tuple(stored["words"]), bool(stored["drop_unknown"]))
        except FileNotFoundError:
            raise UserError(f"{path} not found (the run predates it, or its data failed to "
                            "load); rerun the training command on a new --workdir") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(f"{path} is unreadable ({type(e).__name__}); rerun the training "
                            "command on a new --workdir") from None

    def encode(self, tokens: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Word ids of each sentence (unknown words dropped or mapped to ``UNK``)."""
        index = self.index
        ids = ([index.get(w, UNK) for w in sent] for sent in tokens)
        if self.drop_unknown:
            ids = ([i for i in sent if i != UNK] for sent in ids)
        return [np.asarray(s, np.int32) for s in ids]


def build_vocab(splits: Splits, pretrained: set[str] | None, oov: str) -> Vocab:
    """Vocabulary of a run.

    Without pretrained vectors: the training words. With them (``pretrained`` = the words
    that have a vector): every word of every split that has a vector, and with
    ``oov="random"`` also the training words without one (randomly initialised);
    ``oov="drop"`` removes words without a vector from the sentences (Ding et al.).
    """
    if oov not in ("drop", "random"):
        raise UserError(f"unknown --oov={oov!r}; use drop or random")
    train_words = {w for s in splits["train"]["tokens"] for w in s}
    if pretrained is None:
        words = train_words
    else:
        words = all_words(splits) & pretrained
        if oov == "random":
            words |= train_words
    return Vocab(("<pad>", "<unk>", *sorted(words)), pretrained is not None and oov == "drop")


def all_words(splits: Splits) -> set[str]:
    """Every word of every split."""
    return {w for ds in splits.values() for s in ds["tokens"] for w in s}


def bucket_length(n: int) -> int:
    """Padded length of a batch whose longest sentence has ``n`` tokens (few distinct shapes)."""
    step = 16 if n <= 64 else 64
    return max(step, -(-n // step) * step)


def batches(ids: Sequence[np.ndarray], labels: np.ndarray, batch_size: int,
            rng: np.random.Generator | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Padded batches ``tokens[B, T]``, ``lengths[B]``, ``labels[B]``, ``weights[B]``.

    Every batch has ``batch_size`` rows (missing rows: length 0, weight 0). With ``rng``
    the data is shuffled, then sorted by length within pools of 20 batches (bucketing) and
    the batches are shuffled; without it, the order is the data order sorted by length.
    """
    lengths = np.asarray([len(s) for s in ids], np.int32)
    if rng is None:
        order = np.argsort(lengths, kind="stable")
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    else:
        perm = rng.permutation(len(ids))
        pool = 20 * batch_size
        order = np.concatenate([p[np.argsort(lengths[p], kind="stable")]
                                for p in np.split(perm, range(pool, len(perm), pool))])
        chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        chunks = [chunks[i] for i in rng.permutation(len(chunks))]
    for idx in chunks:
        t = bucket_length(int(lengths[idx].max(initial=0)))
        tokens = np.full((batch_size, t), PAD, np.int32)
        for row, i in enumerate(idx):
            tokens[row, : lengths[i]] = ids[i]
        pad = batch_size - len(idx)
        yield {
            "tokens": tokens,
            "lengths": np.pad(lengths[idx], (0, pad)),
            "labels": np.pad(np.asarray(labels)[idx], (0, pad)).astype(np.int32),
            "weights": np.pad(np.ones(len(idx), np.float32), (0, pad)),
        }
