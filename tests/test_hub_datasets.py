"""Hub datasets (``--hf_dataset``): the same loader code on local dataset directories laid
out as the hub's (``train``/``validation``/``test`` parquet files), no network."""

import json
import os
import re
import subprocess
import sys

import datasets
import numpy as np
import pytest

from dense_rnn.data import hub, ptb
from dense_rnn.data.text_classification import DATASETS, TREC_LABELS, load_hub, make_splits
from dense_rnn.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = "the film was good bad dull great plot acting war sports stocks".split()


def _write(root, splits: dict[str, dict[str, list]]) -> str:
    os.makedirs(root, exist_ok=True)
    for split, columns in splits.items():
        datasets.Dataset.from_dict(columns).to_parquet(os.path.join(root, f"{split}.parquet"))
    return str(root)


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(3, 9))).capitalize() + "." for _ in range(n)]


def test_fixed_splits_dev_slice_and_ignored_splits(tmp_path):
    """AG News / IMDB layout: train and test; dev is the seeded 10% slice of train; other
    splits (IMDB's ``unsupervised``) are ignored; IMDB's <br /> breaks are spaces."""
    root = _write(tmp_path / "imdb", {
        "train": {"text": _texts(50), "label": [i % 2 for i in range(50)]},
        "test": {"text": ["Great film.<br /><br />Good plot"] * 7, "label": [1] * 7},
        "unsupervised": {"text": _texts(5), "label": [-1] * 5},
    })
    raw = load_hub(root, DATASETS["imdb"])
    assert set(raw) == {"train", "test"}
    splits = make_splits(DATASETS["imdb"], raw)
    assert {k: len(v) for k, v in splits.items()} == {"train": 45, "dev": 5, "test": 7}
    assert splits["test"]["tokens"][0] == ["great", "film", "good", "plot"]
    again = make_splits(DATASETS["imdb"], load_hub(root, DATASETS["imdb"]))
    assert again["dev"]["text"] == splits["dev"]["text"]


def test_cv_dataset_pools_every_split(tmp_path):
    """MR on the hub has train/validation/test: pooled into one set for the 10 folds."""
    root = _write(tmp_path / "mr", {
        s: {"text": _texts(n, i), "label": [j % 2 for j in range(n)]}
        for i, (s, n) in enumerate((("train", 80), ("validation", 10), ("test", 10)))})
    raw = load_hub(root, DATASETS["mr"])
    assert list(raw) == ["all"] and len(raw["all"]) == 100
    fold = make_splits(DATASETS["mr"], raw, fold=3)
    assert {k: len(v) for k, v in fold.items()} == {"train": 81, "dev": 9, "test": 10}


def test_trec_coarse_label_and_sst_validation(tmp_path):
    trec = _write(tmp_path / "trec", {
        s: {"text": ["What is a cat ?"] * 4, "coarse_label": [0, 5, 2, 1],
            "fine_label": [0, 40, 7, 3]} for s in ("train", "test")})
    assert load_hub(trec, DATASETS["trec"])["test"]["label"] == [0, 5, 2, 1]
    sst = _write(tmp_path / "sst", {
        s: {"text": ["a -LRB- good -RRB- film"] * 3, "label": [0, 4, 2],
            "label_text": ["very negative", "very positive", "neutral"]}
        for s in ("train", "validation", "test")})
    raw = load_hub(sst, DATASETS["sst1"])
    assert set(raw) == {"train", "dev", "test"}
    assert raw["dev"]["tokens"][0] == ["a", "lrb", "good", "rrb", "film"]


def test_hub_class_names_in_another_order_map_to_the_local_ids(tmp_path):
    """CogComp/trec's ClassLabel lists ABBR, ENTY, DESC, ...: ids follow TREC_LABELS."""
    hub_names = ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"]
    features = datasets.Features({"text": datasets.Value("string"),
                                  "coarse_label": datasets.ClassLabel(names=hub_names)})
    root = tmp_path / "trec"
    root.mkdir()
    for split in ("train", "test"):
        datasets.Dataset.from_dict({"text": ["What is it ?"] * 3, "coarse_label": [1, 2, 5]},
                                   features=features).to_parquet(root / f"{split}.parquet")
    labels = load_hub(str(root), DATASETS["trec"])["test"]["label"]
    assert [TREC_LABELS[i] for i in labels] == ["ENTY", "DESC", "NUM"]


def test_label_text_names_the_class_whatever_its_id(tmp_path):
    """SentEval's SUBJ (SetFit/subj) numbers objective 1; the local files number it 0. Each
    row's label_text decides; names that are not the dataset's leave the ids alone."""
    texts = ["a plot summary .", "a gripping film !", "the plot unfolds ."]
    root = _write(tmp_path / "subj", {s: {"text": texts, "label": [1, 0, 1],
                                          "label_text": ["objective", "subjective", "objective"]}
                                      for s in ("train", "test")})
    assert load_hub(root, DATASETS["subj"])["all"]["label"] == [0, 1, 0] * 2
    other = _write(tmp_path / "other", {s: {"text": texts, "label": [1, 0, 1],
                                            "label_text": ["obj", "subj", "obj"]}
                                        for s in ("train", "test")})
    assert load_hub(other, DATASETS["subj"])["all"]["label"] == [1, 0, 1] * 2
    bad = _write(tmp_path / "bad", {s: {"text": texts, "label": [1, 1, 0],
                                        "label_text": ["objective", "subjective", "objective"]}
                                    for s in ("train", "test")})
    merged = _write(tmp_path / "merged", {s: {"text": texts, "label": [1, 0, 1],
                                              "label_text": ["objective"] * 3}
                                          for s in ("train", "test")})
    for root in (bad, merged):  # an id under two names; a name under two ids
        with pytest.raises(UserError, match="do not pair one id with one name"):
            load_hub(root, DATASETS["subj"])


@pytest.mark.parametrize("splits,message", [
    ({s: {"sentence_text": ["a"], "label": [0]} for s in ("train", "test")},
     "split train has no text column (text or sentence); its columns: sentence_text, label"),
    ({"train": {"text": ["a"], "label": [0]}, "test": {"text": ["a", "b"], "label": [-1, 0]}},
     "split test has labels -1..0, not 0..3 (an unlabelled split"),
    ({"train": {"text": ["a"], "label": [0]}, "test": {"text": ["a"], "label": [-1]}},
     "has no labelled test split (its splits: train, test; unlabelled or empty: test)"),
    ({"train": {"text": ["a"], "label": [0]}, "validation": {"text": ["a"], "label": [0]}},
     "has no labelled test split (its splits: train, validation)"),
    ({"train": {"text": ["a"], "label": [7]}, "test": {"text": ["a"], "label": [0]}},
     "split train has labels 7..7, not 0..3"),
    ({s: {"text": ["a"], "label": ["World"]} for s in ("train", "test")},
     "split train: column label holds <U5 values, not class ids 0..3"),
    ({"train": {"text": ["a", None], "label": [0, 1]}, "test": {"text": ["a"], "label": [0]}},
     "split train: row 1 of column text holds None, not text; fill or drop that row"),
])
def test_bad_hub_datasets(tmp_path, splits, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_hub(_write(tmp_path / "ag", splits), DATASETS["ag"])


def test_missing_or_inconsistent_dataset_one_line(tmp_path):
    for path in (str(tmp_path / "nothing_here"), "./nothing_here", r"C:\data\ag"):
        with pytest.raises(UserError, match=f"^--hf_dataset={re.escape(path)}: no such "
                           "directory"):
            load_hub(path, DATASETS["ag"])
    root = _write(tmp_path / "ag", {"train": {"text": ["a"], "label": [0]},
                                    "test": {"words": ["a"], "label": [0]}})
    with pytest.raises(UserError, match="could not be loaded .*; check its data files"):
        load_hub(root, DATASETS["ag"])
    with pytest.raises(UserError, match="train.parquet is a file, not a directory: give a "
                       "directory of train/validation/test data files"):
        load_hub(os.path.join(root, "train.parquet"), DATASETS["ag"])


@pytest.mark.parametrize("name, parsed", [
    ("fancyzhx/ag_news", ("fancyzhx/ag_news", None, None)),
    ("nyu-mll/glue:sst2", ("nyu-mll/glue", "sst2", None)),
    ("CogComp/trec@refs/convert/parquet", ("CogComp/trec", None, "refs/convert/parquet")),
    ("ptb_text_only:penn_treebank@abc123", ("ptb_text_only", "penn_treebank", "abc123")),
])
def test_hub_names_take_a_config_and_a_revision(name, parsed):
    assert hub.parse(name) == parsed


def test_a_local_directory_is_its_own_name_and_scripts_get_the_parquet_hint(tmp_path,
                                                                             monkeypatch):
    texts = {s: {"text": _texts(4, i), "label": [0, 1, 2, 3]}
             for i, s in enumerate(("train", "test"))}
    root = _write(tmp_path / "copy@v2:ag", texts)  # "@" and ":" in a directory's name
    assert len(load_hub(root, DATASETS["ag"])["test"]) == 4
    calls = []

    def load_dataset(path, config=None, revision=None):
        calls.append((path, config, revision))
        raise RuntimeError("Dataset scripts are no longer supported, but found trec.py")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(UserError, match=r"^--hf_dataset=CogComp/trec could not be loaded "
                       r"\(Dataset scripts .*\); this datasets .* runs no loading scripts: "
                       r"load the hub's Parquet export, "
                       r"--hf_dataset=CogComp/trec@refs/convert/parquet$"):
        hub.load("CogComp/trec")
    with pytest.raises(UserError, match="check the name and the connection"):
        hub.load("CogComp/trec@refs/convert/parquet")
    assert calls == [("CogComp/trec", None, None), ("CogComp/trec", None, "refs/convert/parquet")]


def test_ptb_from_a_hub_layout(tmp_path):
    root = _write(tmp_path / "ptb", {
        s: {"sentence": [" the cat sat ", " a dog <unk> "]}
        for s in ("train", "validation", "test")})
    corpus = ptb.load_ptb(None, root)
    assert len(corpus.vocab) == 7 and len(corpus.train) == 8
    bad = _write(tmp_path / "bad", {"train": {"sentence": ["a"]}})
    with pytest.raises(UserError, match="needs train/validation/test splits"):
        ptb.load_ptb(None, bad)
    empty = _write(tmp_path / "empty", {  # a blank test split
        "train": {"sentence": [" the cat sat "]}, "validation": {"sentence": [" the cat "]},
        "test": {"sentence": [" "]}})
    with pytest.raises(UserError, match=f"split 'test' holds no text; check --hf_dataset={empty}$"):
        ptb.load_ptb(None, empty)
    null = _write(tmp_path / "null", {  # an empty CSV field reads as a null cell
        "train": {"sentence": [" the cat ", None]}, "validation": {"sentence": [" the cat "]},
        "test": {"sentence": [" the "]}})
    with pytest.raises(UserError, match=f"^--hf_dataset={null} split train: row 1 of column "
                       "sentence holds None, not text; fill or drop that row$"):
        ptb.load_ptb(None, null)


def _classify(*args):
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "experiments.classify", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_binary_trains_ag_news_from_the_hub_layout(tmp_path):
    """The AG News training split missing locally is one --hf_dataset away."""
    root = _write(tmp_path / "ag", {
        s: {"text": _texts(n, i), "label": [j % 4 for j in range(n)]}
        for i, (s, n) in enumerate((("train", 60), ("test", 20)))})
    r = _classify("--config=gru_64", "--features=4", "--embed_size=8", "--batch_size=16",
                  "--max_epochs=1", "--dataset=ag", f"--hf_dataset={root}",
                  f"--workdir={tmp_path}/w")
    assert r.returncode == 0, r.stderr
    summary = json.load(open(f"{tmp_path}/w/summary.json"))
    assert summary["hf_dataset"] == root and summary["dataset"] == "ag"
    for args, message in (
            (["--dataset=sst1_phrases", f"--hf_dataset={root}"],
             "--dataset=sst1_phrases has no hub version"),
            (["--dataset=ag", "--hf_dataset=nobody/no-such-dataset"],
             "--hf_dataset=nobody/no-such-dataset could not be loaded")):
        r = _classify("--config=gru_64", *args, f"--workdir={tmp_path}/bad")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
