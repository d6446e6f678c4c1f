"""HM-DenseRNN dataset loaders on the real files (``DENSE_RNN_DATA_DIR``, default
``<repo>/../shared/data``)."""

import io
import os
import tarfile

import numpy as np
import pytest

from dense_rnn.data import hm_datasets
from dense_rnn.data.text_classification import DATASETS, batches, truncate
from dense_rnn.errors import UserError

DATA_DIR = os.environ.get(
    "DENSE_RNN_DATA_DIR",
    os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "shared", "data"))
needs_data = pytest.mark.skipif(not os.path.isdir(DATA_DIR), reason=f"no data in {DATA_DIR}")


@needs_data
def test_sst5_splits():
    assert (DATASETS["sst5"].num_classes, DATASETS["imdb"].num_classes,
            DATASETS["ag"].num_classes) == (5, 2, 4)
    splits = DATASETS["sst5"].load(DATA_DIR)
    assert {k: len(v) for k, v in splits.items()} == {"train": 8544, "dev": 1101, "test": 2210}
    assert np.bincount(splits["test"]["label"]).tolist() == [279, 633, 389, 510, 399]


@needs_data
def test_ag_test_csv_and_missing_train(tmp_path):
    texts, labels = hm_datasets.read_ag_csv(os.path.join(DATA_DIR, "ag_news", "test.csv"))
    assert len(texts) == 7600 and np.bincount(labels).tolist() == [1900] * 4
    assert texts[0].startswith("Fears for T N pension after talks Unions representing")
    with pytest.raises(UserError, match="training split missing.*train.csv"):
        hm_datasets.load_ag(DATA_DIR)


def test_ag_backslashes_separate_words(tmp_path):
    """AG News marks a line break with a bare backslash: ``social\\network`` is two words,
    whatever letter follows (an ``n`` too), as the hub copy's cleaning reads it."""
    from dense_rnn.data.text_classification import clean_str

    (tmp_path / "t.csv").write_text('"4","Nets","a social\\network gave\\no \\$5"\n')
    (text,), _ = hm_datasets.read_ag_csv(str(tmp_path / "t.csv"))
    assert text.split() == ["Nets", "a", "social", "network", "gave", "no", "$5"]
    raw = 'Nets a social\\network gave\\no \\$5'  # the hub's text of the same row
    assert clean_str(text).split() == clean_str(raw).split()


def test_ag_bad_row(tmp_path):
    (tmp_path / "ag_news").mkdir()
    for split in ("train", "test"):
        (tmp_path / "ag_news" / f"{split}.csv").write_text('"5","t","d"\n')
    with pytest.raises(UserError, match="row 1") as e:
        hm_datasets.load_ag(str(tmp_path))
    assert "header" not in str(e.value)
    (tmp_path / "ag_news" / "train.csv").write_text('"Class Index","Title","Description"\n')
    with pytest.raises(UserError, match=r"row 1 .*; a header\? remove it \(AG News files "):
        hm_datasets.load_ag(str(tmp_path))


def test_a_byte_order_mark_is_skipped(tmp_path):
    """Files saved with a UTF-8 BOM read as without one, whatever their encoding."""
    from dense_rnn.data import text_classification as tc

    (tmp_path / "ag_news").mkdir()
    for split in ("train", "test"):
        (tmp_path / "ag_news" / f"{split}.csv").write_bytes(b'\xef\xbb\xbf"3","t","d"\n')
    assert hm_datasets.read_ag_csv(str(tmp_path / "ag_news" / "test.csv"))[1] == [2]
    (tmp_path / "trec").mkdir()
    for name in ("train_5500.label", "TREC_10.label"):  # Latin-1 files
        (tmp_path / "trec" / name).write_bytes(b"\xef\xbb\xbfHUM:ind who is it ?\n")
    assert tc.load_trec(str(tmp_path))["test"]["label"] == [3]


def test_ag_not_utf8(tmp_path):
    (tmp_path / "ag_news").mkdir()
    for split in ("train", "test"):
        (tmp_path / "ag_news" / f"{split}.csv").write_bytes(b'"1","caf\xe9","d"\n')
    with pytest.raises(UserError, match="not utf-8 text"):
        hm_datasets.load_ag(str(tmp_path))


def test_imdb_damaged_mid_archive(tmp_path):
    """A damaged block in the middle used to read as the end of the archive."""
    rng = np.random.default_rng(0)
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for i in range(40):
            for split, label in (("train", "pos"), ("test", "neg")):
                data = " ".join(rng.choice(["good", "bad", "film", "plot"], 300)).encode()
                info = tarfile.TarInfo(f"aclImdb/{split}/{label}/{i}_7.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    assert len(hm_datasets.read_imdb_tar(str(path))["train"][0]) == 40
    damaged = bytearray(path.read_bytes())
    middle = len(damaged) // 2
    damaged[middle:middle + 10] = bytes(10)
    path.write_bytes(bytes(damaged))
    with pytest.raises(UserError, match="not a readable IMDB tar.gz, or is damaged"):
        hm_datasets.read_imdb_tar(str(path))


def test_imdb_review_not_utf8_is_named(tmp_path):
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("aclImdb/test/pos/2_8.txt")
        info.size = 7
        tar.addfile(info, io.BytesIO(b"caf\xe9 ok"))
    with pytest.raises(UserError, match=r"a.tar.gz: review aclImdb/test/pos/2_8.txt is not "
                                        r"UTF-8 text \(byte 3\)"):
        hm_datasets.read_imdb_tar(str(path))


def test_imdb_missing_or_corrupt(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        hm_datasets.load_imdb(str(tmp_path))
    (tmp_path / "imdb").mkdir()
    (tmp_path / hm_datasets.IMDB_TAR).write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="not a readable") as e:
        hm_datasets.load_imdb(str(tmp_path))
    assert "\n" not in str(e.value)  # tarfile's message is several lines


@needs_data
@pytest.mark.slow
def test_imdb_splits_and_bucketed_batches():
    splits = truncate(DATASETS["imdb"].load(DATA_DIR), 400)
    assert {k: len(v) for k, v in splits.items()} == {"train": 22500, "dev": 2500, "test": 25000}
    assert sum(splits["train"]["label"]) + sum(splits["dev"]["label"]) == 12500
    assert max(len(t) for t in splits["test"]["tokens"]) == 400
    assert "<br" not in splits["test"]["text"][0] and "br" not in splits["test"]["tokens"][0]
    again = hm_datasets.load_imdb(DATA_DIR)
    assert again["dev"]["text"] == splits["dev"]["text"]  # seeded hold-out
    ids = [np.arange(len(t), dtype=np.int32) + 2 for t in splits["dev"]["tokens"][:300]]
    for batch in batches(ids, np.zeros(300, np.int32), 64, np.random.default_rng(0)):
        assert batch["tokens"].shape[1] % 16 == 0
        real = np.arange(batch["tokens"].shape[1])[None] < batch["lengths"][:, None]
        assert np.all((batch["tokens"] > 0) == real)
