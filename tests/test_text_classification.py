"""Sentence classification data (MR, Subj, SST-1/2, TREC), GloVe, batching and the binary."""

import dataclasses
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import datasets
import numpy as np
import pytest

from dense_rnn.data import text_classification as tc
from dense_rnn.data.glove import glove_dim, load_glove
from dense_rnn.errors import UserError
from dense_rnn.train import checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("DENSE_RNN_DATA_DIR", os.path.join(REPO, "..", "shared", "data"))
needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(DATA, "sst")),
                                reason=f"no data in {DATA} (set DENSE_RNN_DATA_DIR)")


def test_clean_str_kim():
    assert tc.clean_str("Isn't it great?! (yes)") == "is n't it great ? ! ( yes )"
    assert tc.clean_str("What's the U.S. capital ,") == "what 's the u s capital ,"
    assert tc.clean_str_sst("a -LRB- b  c") == "a lrb b c"


def test_tree_phrases():
    phrases = tc._tree_phrases("(3 (2 (2 The) (2 Rock)) (4 (3 rocks) (2 -LRB-)))")
    assert phrases[0] == ("The Rock rocks -LRB-", 3)
    assert sorted(phrases[1:]) == sorted([("The Rock", 2), ("The", 2), ("Rock", 2),
                                          ("rocks -LRB-", 4), ("rocks", 3), ("-LRB-", 2)])
    # cleaned, a tree's bracket token is the stsa.* sentences' one
    assert tc.clean_str_sst(phrases[0][0]) == tc.clean_str_sst("the rock rocks -lrb-")
    for bad in ["(3 (2 a) (2 b)", "(2 a) (2 b)", "", "(x a)", "()", "(3)", "(3 ((2 a) (2 b)))"]:
        with pytest.raises((ValueError, IndexError)):
            tc._tree_phrases(bad)


@needs_data
@pytest.mark.parametrize("name,sizes,classes", [
    ("sst1", {"train": 8544, "dev": 1101, "test": 2210}, 5),
    ("sst2", {"train": 6920, "dev": 872, "test": 1821}, 2),
    ("trec", {"train": 4907, "dev": 545, "test": 500}, 6),
])
def test_fixed_split_datasets(name, sizes, classes):
    spec = tc.get_dataset(name)
    splits = tc.make_splits(spec, spec.load(DATA))
    assert {k: len(v) for k, v in splits.items()} == sizes
    assert spec.num_classes == classes
    assert set(splits["train"]["label"]) == set(range(classes))
    assert all(t == t.lower() for s in splits["train"]["tokens"][:200] for t in s)


@needs_data
def test_trec_labels_and_latin1():
    raw = tc.load_trec(DATA)
    assert np.bincount(raw["train"]["label"]).tolist() == [86, 1162, 1250, 1223, 835, 896]
    assert np.bincount(raw["test"]["label"]).tolist() == [9, 138, 94, 65, 81, 113]
    assert "sister\xf0city" in raw["train"][65]["text"]


@needs_data
@pytest.mark.parametrize("name", ["mr", "subj"])
def test_cv_folds_fixed_disjoint_and_covering(name):
    spec = tc.get_dataset(name)
    raw = spec.load(DATA)
    assert len(raw["all"]) == (10662 if name == "mr" else 10000)
    assert np.bincount(raw["all"]["label"]).tolist() == ([5331] * 2 if name == "mr" else [5000] * 2)
    tests = []
    for fold in (0, 9):
        s = tc.make_splits(spec, raw, fold)
        texts = {k: set(v["text"]) for k, v in s.items()}
        assert not (texts["train"] & texts["test"]) and not (texts["dev"] & texts["test"])
        assert not (texts["train"] & texts["dev"])
        assert sum(len(v) for v in s.values()) == len(raw["all"])
        tests.append(texts["test"])
    assert not (tests[0] & tests[1])
    again = tc.make_splits(spec, spec.load(DATA), 0)
    assert again["test"]["text"] == tc.make_splits(spec, raw, 0)["test"]["text"]


@needs_data
def test_sst_phrases():
    splits = tc.load_sst(DATA, fine=False, phrases=True)
    assert len(splits["train"]) > 70000 and set(splits["train"]["label"]) == {0, 1}
    assert all(splits["train"]["tokens"])  # none cleans to nothing
    assert len(tc.load_sst(DATA, fine=True, phrases=True)["train"]) == 159_258


def test_phrases_that_clean_to_nothing_are_left_out_and_sst_files_may_start_with_a_bom(tmp_path):
    for split in ("train", "dev", "test"):
        _write(f"{tmp_path}/sst/stsa.fine.{split}", "\ufeff1 good film\n".encode())
    _write(f"{tmp_path}/sst/trees/train.txt", b"(3 (3 (2 Good) (2 --)) (3 film))\n"
           b"(1 (2 good) (1 film))\n")
    splits = tc.load_sst(str(tmp_path), fine=True, phrases=True)
    assert splits["dev"]["label"] == [1]
    pairs = dict(zip(splits["train"]["text"], splits["train"]["label"], strict=True))
    assert pairs == {"Good -- film": 3, "Good --": 3, "Good": 2, "film": 3, "good film": 1,
                     "good": 2}


def _write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def test_a_split_cut_short_is_warned_about(data_dir, tmp_path):
    """Local files holding another number of examples than the standard split (an SST dev
    file cut short) load, with a warning line naming the split and both counts."""
    spec = tc.DATASETS["sst2"]
    assert tc.size_warnings("sst2", spec, spec.load(data_dir)) == []
    shutil.copytree(os.path.join(data_dir, "sst"), tmp_path / "sst")
    dev = tmp_path / "sst" / "stsa.binary.dev"
    dev.write_text("".join(dev.read_text().splitlines(keepends=True)[:449]))
    (warning,) = tc.size_warnings("sst2", spec, spec.load(str(tmp_path)))
    assert warning == ("warning: sst2 dev has 449 examples, the standard split 872: is a file "
                       "cut short, or another version of sst2?")


def test_a_trec_label_may_be_followed_by_a_tab(tmp_path):
    _write(f"{tmp_path}/trec/train_5500.label", b"DESC:manner\tHow did it end ?\n")
    _write(f"{tmp_path}/trec/TREC_10.label", b"HUM:ind  Who  won ?\n")
    raw = tc.load_trec(str(tmp_path))
    assert raw["train"]["tokens"] == [["how", "did", "it", "end", "?"]]
    assert raw["test"]["tokens"] == [["who", "won", "?"]]


def test_bad_files(tmp_path):
    d = str(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        tc.load_trec(d)
    os.makedirs(f"{d}/trec/train_5500.label")
    with pytest.raises(UserError, match="train_5500.label is a directory, not a file"):
        tc.load_trec(d)
    os.rmdir(f"{d}/trec/train_5500.label")
    for split in ("train", "dev", "test"):
        _write(f"{d}/sst/stsa.binary.{split}", b"1 good film\n\n   \n0 bad film\n")
    assert len(tc.load_sst(d, fine=False)["train"]) == 2  # blank lines skipped
    _write(f"{d}/sst/stsa.binary.train", b"1\tgood film\n0  bad film\n")
    assert tc.load_sst(d, fine=False)["train"]["tokens"] == [["good", "film"], ["bad", "film"]]
    _write(f"{d}/sst/stsa.binary.dev", "1 caf\xe9 au lait\n".encode("cp1252"))
    with pytest.raises(UserError, match="stsa.binary.dev is not UTF-8 text"):
        tc.load_sst(d, fine=False)
    _write(f"{d}/sst/stsa.binary.dev", b"good film without label\n")
    with pytest.raises(UserError, match="does not start with a label"):
        tc.load_sst(d, fine=False)
    _write(f"{d}/trec/train_5500.label", "DESC:def what is x ?\n".encode("utf-16"))
    _write(f"{d}/trec/TREC_10.label", b"HUM:ind who ?\n")
    with pytest.raises(UserError, match="NUL characters"):
        tc.load_trec(d)
    _write(f"{d}/trec/train_5500.label", b"DESC:def what is x ?\nwhat is y ?\n")
    with pytest.raises(UserError, match="line 2 has no TREC label"):
        tc.load_trec(d)
    for empty in (b"DESC:manner", b"DESC:manner   "):
        _write(f"{d}/trec/train_5500.label", b"DESC:def what is x ?\n" + empty + b"\n")
        with pytest.raises(UserError, match="train_5500.label: line 2 has a label but no text"):
            tc.load_trec(d)
    _write(f"{d}/mr/rt-polarity.neg", b"\n\n")
    _write(f"{d}/mr/rt-polarity.pos", b"fine\n")
    with pytest.raises(UserError, match="no non-blank lines"):
        tc.get_dataset("mr").load(d)
    with pytest.raises(UserError, match="unknown dataset"):
        tc.get_dataset("imdbb")
    # a user's own file (--text_file): the caller's words, not --data_dir's
    with pytest.raises(UserError, match="^text file .*none.txt does not exist; pass --text_file"):
        tc.read_lines(f"{d}/none.txt", "utf-8", "text file", "pass --text_file=FILE")
    with pytest.raises(UserError, match="^text file .* has no non-blank lines; pass --text_"):
        tc.read_lines(f"{d}/mr/rt-polarity.neg", "utf-8", "text file", "pass --text_file=FILE")


@pytest.mark.parametrize("content,message", [
    ("1 good\n\n\xb2 odd label\n", "line 3 does not start with a label"),  # file lines
    ("1 good\n0\n", "line 2 has a label but no text"),
])
def test_bad_labelled_lines(tmp_path, content, message):
    for split in ("train", "dev", "test"):
        _write(f"{tmp_path}/sst/stsa.binary.{split}", b"1 good film\n")
    _write(f"{tmp_path}/sst/stsa.binary.train", content.encode())
    with pytest.raises(UserError, match=message):
        tc.load_sst(str(tmp_path), fine=False)


def test_legacy_files_re_saved_as_utf8_read_as_utf8(tmp_path):
    """MR's original bytes are cp1252 and TREC's Latin-1; a copy re-saved as UTF-8 (a
    user's editor) reads the same words, not "cafÃ©"."""
    for encoding in ("cp1252", "utf-8", "utf-8-sig"):
        _write(f"{tmp_path}/mr/rt-polarity.neg", "a caf\xe9 film\n".encode(encoding))
        _write(f"{tmp_path}/mr/rt-polarity.pos", "na\xefve and fine\n".encode(encoding))
        texts = tc.get_dataset("mr").load(str(tmp_path))["all"]["text"]
        assert texts == ["a caf\xe9 film", "na\xefve and fine"], encoding
    lines = [f"DESC:def what is {w} ?" for w in ("caf\xe9", "x")]
    for encoding in ("latin-1", "utf-8"):
        _write(f"{tmp_path}/trec/train_5500.label", "\n".join(lines).encode(encoding))
        assert tc.read_lines(f"{tmp_path}/trec/train_5500.label", "latin-1")[0] == (1, lines[0])
    _write(f"{tmp_path}/mr/rt-polarity.neg", b"bad \x81 film\n")  # 0x81: no cp1252 character
    with pytest.raises(UserError, match=r"rt-polarity.neg is neither UTF-8 nor cp1252 text "
                                        r"\(byte 4: .*\); re-save it as UTF-8"):
        tc.get_dataset("mr").load(str(tmp_path))


def test_utf16_polarity_files_refused(tmp_path):
    """UTF-16 bytes are valid cp1252 text: the NULs give it away."""
    _write(f"{tmp_path}/mr/rt-polarity.neg", "bad film\n".encode("utf-16"))
    _write(f"{tmp_path}/mr/rt-polarity.pos", b"fine\n")
    with pytest.raises(UserError, match="NUL characters"):
        tc.get_dataset("mr").load(str(tmp_path))


def test_bad_sst_tree(tmp_path):
    for split in ("train", "dev", "test"):
        _write(f"{tmp_path}/sst/stsa.fine.{split}", b"1 good film\n")
    _write(f"{tmp_path}/sst/trees/train.txt", b"(3 (2 good) (3 film))\n(9 (2 bad))\n")
    with pytest.raises(UserError, match="train.txt: line 2 is not a labelled PTB-style tree"):
        tc.load_sst(str(tmp_path), fine=True, phrases=True)


def test_glove_txt_and_gz(tmp_path):
    text = "the 0.1 0.2 0.3\nfilm -1 0 1\nnew york 5 6 7\n"
    (tmp_path / "g.txt").write_text(text)
    with gzip.open(tmp_path / "g.txt.gz", "wt") as f:
        f.write(text)
    for name in ("g.txt", "g.txt.gz"):
        dim, vec = load_glove(str(tmp_path / name), {"film", "new york", "absent"})
        assert dim == 3 and set(vec) == {"film", "new york"}
        np.testing.assert_array_equal(vec["film"], np.array([-1, 0, 1], np.float32))
    (tmp_path / "bad.txt").write_text("the 0.1 0.2 0.3\nfilm 1\n")
    with pytest.raises(UserError, match="1 values where the first line has 3"):
        load_glove(str(tmp_path / "bad.txt"))
    with pytest.raises(UserError, match="does not exist"):
        load_glove(str(tmp_path / "missing.txt"))
    for rows in ("the 0.1 0.2\nfilm 1 2 3\n", "the 0.1 0.2 0.3\nfilm 1 2 3 4\n"):
        (tmp_path / "dims.txt").write_text(rows)  # a short first row, a long later row
        with pytest.raises(UserError, match=":2: [34] values where the first line has"):
            load_glove(str(tmp_path / "dims.txt"))
    rows = "".join(f"w{i} {i / 10:.3f} {i / 5:.3f} {i / 3:.3f}\n" for i in range(3000))
    corrupt = bytearray(gzip.compress(rows.encode()))
    corrupt[100] ^= 0xFF  # a damaged deflate stream: zlib.error, not a gzip OSError
    (tmp_path / "corrupt.txt.gz").write_bytes(bytes(corrupt))
    with pytest.raises(UserError, match="cannot read embeddings .*corrupt.txt.gz .*error"):
        load_glove(str(tmp_path / "corrupt.txt.gz"))
    (tmp_path / "w2v.txt").write_text("2 3\n" + text)  # word2vec header line
    assert load_glove(str(tmp_path / "w2v.txt"))[0] == glove_dim(str(tmp_path / "w2v.txt")) == 3


def test_glove_refuses_non_glove_files_and_non_finite_values(tmp_path):
    (tmp_path / "notes.txt").write_text("2 3\nhello world, this is not glove\nthe 1 2 3\n")
    for load in (glove_dim, load_glove):
        with pytest.raises(UserError, match=r"notes.txt:2 is not a GloVe line .*'word v_1"):
            load(str(tmp_path / "notes.txt"))
    for value in ("nan", "inf", "-inf"):
        (tmp_path / "g.txt").write_text(f"the 0.1 0.2\nfilm 1 {value}\n")
        assert glove_dim(str(tmp_path / "g.txt")) == 2
        with pytest.raises(UserError, match=r"g.txt:2: the vector of 'film' is not finite"):
            load_glove(str(tmp_path / "g.txt"))
    (tmp_path / "g.txt").write_text("the 0.1 0.2\nfilm 1 1e39\n")  # beyond float32: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserError, match=r"g.txt:2: the vector of 'film' is not finite"):
            load_glove(str(tmp_path / "g.txt"))
    (tmp_path / "g.txt").write_text("the 0.1 0.2\nfilm 1 0x1\n")  # not a number, wanted
    with pytest.raises(UserError, match=r"g.txt:2: the vector of 'film' is not numbers"):
        load_glove(str(tmp_path / "g.txt"), {"film"})
    (tmp_path / "tabs.txt").write_text("the\t0.1\t0.2\n")
    with pytest.raises(UserError, match=r"tabs.txt:1 is not a GloVe line .*single spaces"):
        load_glove(str(tmp_path / "tabs.txt"))
    (tmp_path / "blank.txt").write_text("\n \t\n\n")
    with pytest.raises(UserError, match="blank.txt has no vector lines .*empty or blank"):
        load_glove(str(tmp_path / "blank.txt"))


def test_glove_refuses_a_row_without_values_or_with_an_empty_field(tmp_path):
    """A word alone, or two spaces after it, would otherwise lose that word's vector (the
    second stored it under "film ")."""
    for rows, error in (("the 0.1 0.2\nfilm\n", ":2: 0 values where the first line has 2"),
                        ("the 0.1 0.2\nfilm  1 2\n", ":2: an empty field .*'film  1 2"),
                        ("the 0.1 0.2\n film 1 2\n", ":2: an empty field"),
                        ("the 0.1 0.2\nfilm 1  2\n", ":2: an empty field")):
        (tmp_path / "g.txt").write_text(rows)
        with pytest.raises(UserError, match=error):
            load_glove(str(tmp_path / "g.txt"), {"the"})
    (tmp_path / "g.txt").write_text("the 0.1 0.2  \n\t\nfilm 1 2\n")  # trailing spaces, blank
    assert set(load_glove(str(tmp_path / "g.txt"))[1]) == {"the", "film"}


def _toy_splits():
    import datasets

    def ds(texts):
        return datasets.Dataset.from_dict(
            {"tokens": [t.split() for t in texts], "label": [0] * len(texts)})

    return {"train": ds(["a b zz", "b c"]), "dev": ds(["d a"]), "test": ds(["e yy"])}


def test_vocab_drop_and_random():
    splits = _toy_splits()
    pretrained = {"a", "b", "c", "d", "e"}
    drop = tc.build_vocab(splits, pretrained, "drop")
    assert drop.words == ("<pad>", "<unk>", "a", "b", "c", "d", "e")
    assert [s.tolist() for s in drop.encode([["a", "zz", "e"]])] == [[2, 6]]
    rand = tc.build_vocab(splits, pretrained, "random")
    assert "zz" in rand.words and "yy" not in rand.words
    assert rand.encode([["yy", "zz"]])[0].tolist() == [tc.UNK, rand.index["zz"]]
    plain = tc.build_vocab(splits, None, "drop")
    assert plain.words == ("<pad>", "<unk>", "a", "b", "c", "zz")
    assert plain.encode([["d"]])[0].tolist() == [tc.UNK]


def test_batches_pad_and_cover():
    ids = [np.arange(1, n + 1, dtype=np.int32) for n in (3, 20, 1, 0, 5)]
    labels = np.array([0, 1, 0, 1, 1])
    seen = []
    for b in tc.batches(ids, labels, 2, np.random.default_rng(0)):
        assert b["tokens"].shape[0] == 2 and b["tokens"].shape[1] in (16, 32)
        for row in range(2):
            n = b["lengths"][row]
            assert np.all(b["tokens"][row, n:] == tc.PAD)
            if b["weights"][row]:
                seen.append((n, b["labels"][row]))
    assert sorted(seen) == sorted(zip([3, 20, 1, 0, 5], labels.tolist(), strict=True))


# --- the binary --------------------------------------------------------------------------

TRAIN = ["DESC:def what is a cat ?", "HUM:ind who is the king ?", "LOC:city where is paris ?",
         "NUM:date when did it end ?", "ENTY:animal what animal barks ?",
         "ABBR:exp what does nasa stand for ?"]


def _toy_data(root):
    lines = [TRAIN[i % 6] for i in range(40)]
    _write(f"{root}/trec/train_5500.label", "\n".join(lines).encode("latin-1"))
    _write(f"{root}/trec/TREC_10.label", "\n".join(TRAIN).encode("latin-1"))
    with gzip.open(f"{root}/glove.txt.gz", "wt") as f:
        for i, w in enumerate("what is a cat who the king where paris when did it end".split()):
            f.write(w + " " + " ".join(str((i * 7 + j) % 5 / 10) for j in range(6)) + "\n")


SMALL = ["--config=dc_bilstm", "--dl=2", "--dh=3", "--th=4", "--batch_size=8"]


def _classify(*args, check=True):
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-m", "experiments.classify", *args], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def test_dry_run():
    out = _classify("--config=dc_bilstm", "--dataset=sst1", "--dry_run").stdout
    assert "num_params_paper=1404200\n" in out and "num_params=1407565\n" in out
    assert "model_args={'dl': 15, 'dh': 13, 'th': 100" in out
    out = _classify("--config=bilstm", "--dataset=sst2", "--th=100", "--dry_run").stdout
    assert "num_params_paper=320000\n" in out and "num_params=321202\n" in out
    out = _classify("--config=hm_densegru_64", "--dataset=sst5", "--depths=2,4",
                    "--dry_run").stdout
    assert "'depths': (2, 4)}" in out  # a tuple argument, as a list flag
    out = _classify("--config=hm_densegru_64", "--dataset=sst5", "--final_update=false",
                    "--dry_run").stdout
    assert "'final_update': False}" in out  # an argument no paper row sets (eq. 6 as printed)


def test_dataset_flag_help_names_every_dataset():
    help_text = " ".join(_classify("--helpshort", check=False).stdout.split())
    flag = help_text[help_text.index("--dataset:"):help_text.index("(default: 'sst2')")]
    assert all(re.search(rf"\b{name}\b", flag) for name in tc.DATASETS), flag


def test_dry_run_counts_at_the_embedding_files_dimension(data_dir):
    glove = os.path.join(data_dir, "glove", "glove.6B.50d.txt.gz")
    r = _classify("--config=dc_bilstm", f"--embeddings={glove}", "--dry_run")
    assert "embed_size=50\n" in r.stdout and "num_params_paper=814200\n" in r.stdout
    assert r.stderr == (  # a run unlike the paper's says so
        "note: the vectors of --embeddings have 50 dimensions, config dc_bilstm's embed_size "
        "is 300: this model reads 50-d words and has 814,200 parameters in the paper's count, "
        "against 1,404,200 at 300\n")
    r = _classify(f"--embeddings={glove}", "--embed_size=300", "--dry_run", check=False)
    assert r.returncode == 2 and r.stderr == (
        f"error: --embed_size=300, but the vectors of --embeddings={glove} have 50 dimensions; "
        "drop --embed_size (it follows the file)\n")


@pytest.mark.parametrize("args,message", [
    (["--config=nope"], "unknown config 'nope'"),
    (["--dataset=nope"], "unknown dataset 'nope'"),
    (["--data_dir=/nonexistent"], "data directory /nonexistent not found"),
    (["--embeddings=/nonexistent.txt"], "embeddings file /nonexistent.txt does not exist"),
    (["--dl=-1"], "dl=-1, dh=3, th=4: dl and dh must be >= 0"),
    (["--config=hm_densegru_64", "--cell=foo"], "unknown cell 'foo'"),
    (["--dropout_pool=1.5"], "dropout_pool=1.5 must be in [0, 1)"),
    (["--dataset=mr", "--folds=12"], "--folds [12] out of range: mr has 10 fold(s)"),
    (["--max_len=-3"], "--max_len=-3: give a positive token count"),
    (["--keep=last"], "without --max_len every token is kept, so it takes no --keep; drop it"),
    (["--lr_sweep=1e-2", "--learning_rate=0.5"], "--lr_sweep sets each run's learning rate, "
     "so it takes no --learning_rate; drop it"),
    (["--folds=0"], "--folds applies to the cross-validated datasets (mr, subj); trec has a "
     "test split"),
    (["--dataset=mr", "--folds="], "--folds=: give fold numbers like 0,1,2"),
    (["--batch_size=0"], "batch_size=0 must be at least 1"),
    (["--max_epochs=0"], "max_epochs=0 must be at least 1"),
    (["--seed=-1"], "seed=-1 must be in [0, 2**63)"),
    (["--seed=9223372036854775808"], "seed=9223372036854775808 must be in [0, 2**63)"),
    (["--l2=nan"], "l2=nan must be 0 or more"),
    (["--workdir="], "flag --workdir=: an empty path; give one, or leave the flag out"),
    (["--learning_rate=0"], "learning_rate=0.0 must be positive"),
    (["stray"], "unexpected arguments 'stray'"),
    (["--config=hm_densegru_64", "--depths=2,x"], "--depths=2,x: give integers like 2,4,8"),
    (["--text_file=t.txt"], "--mode=train trains on --dataset, so it takes no --text_file"),
    (["--hf_dataset=x/y"], "(a hub dataset or a local dataset directory), so it takes no "
     "--data_dir; drop it"),
    (["--oov=random"], "without --embeddings every word is learnt (none lacks a pretrained "
     "vector), so it takes no --oov; drop it"),
    (["--mode=predict", "--dl=3"], "--mode=predict reads the trained run's config and "
     "vocabulary from --workdir, so it takes no --data_dir, --batch_size, --dl, --dh, --th"),
])
def test_bad_flags_one_line(tmp_path, args, message):
    _toy_data(tmp_path)
    base = [f"--data_dir={tmp_path}", "--dataset=trec", f"--workdir={tmp_path}/w"]
    small = [] if any(a.startswith("--config") for a in args) else SMALL
    r = _classify(*base, *small, *args, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.exists(f"{tmp_path}/w/checkpoints")  # refused before any work


def _params(workdir):
    import orbax.checkpoint as ocp

    step = max(int(s) for s in os.listdir(f"{workdir}/checkpoints") if s.isdigit())
    with ocp.StandardCheckpointer() as c:
        return c.restore(os.path.abspath(f"{workdir}/checkpoints/{step}/state"))


@pytest.mark.slow  # about 2 minutes on a shared 2-core CPU
def test_train_resume_bitwise_and_bad_inputs(tmp_path):
    _toy_data(tmp_path)
    base = [f"--data_dir={tmp_path}", "--dataset=trec", f"--embeddings={tmp_path}/glove.txt.gz",
            *SMALL]
    _classify(*base, f"--workdir={tmp_path}/full", "--max_epochs=3")
    _classify(*base, f"--workdir={tmp_path}/resumed", "--max_epochs=1")  # "killed" after 1
    out = _classify(*base, f"--workdir={tmp_path}/resumed", "--max_epochs=3",
                    "--select=test").stdout
    assert "resumed from" in out
    a, b = _params(f"{tmp_path}/full"), _params(f"{tmp_path}/resumed")
    for x, y in zip(jax_leaves(a), jax_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    summary = json.load(open(f"{tmp_path}/full/summary.json"))
    for key in ("num_params_paper", "num_params", "dev_accuracy", "test_accuracy", "device",
                "wall_seconds"):
        assert key in summary
    assert summary["num_params_paper"] == 2 * 4 * 3 * (6 + 3) * 1 + 2 * 4 * 3 * (12 + 3) \
        + 2 * 4 * 4 * (18 + 4)
    assert "best_test_accuracy" not in summary and summary["selection"].startswith("test acc")
    assert len(open(f"{tmp_path}/full/metrics.jsonl").readlines()) == 3
    assert os.path.exists(f"{tmp_path}/full/curves.png")
    # the finished run asked again with a smaller budget: reported, with the budget it had
    out = _classify(*base, f"--workdir={tmp_path}/full", "--max_epochs=1").stdout
    assert "nothing to train" in out
    again = json.load(open(f"{tmp_path}/full/summary.json"))
    assert again["config"]["max_epochs"] == 3 and again["test_accuracy"] == summary[
        "test_accuracy"]
    # another config on that workdir: refused, checkpoint kept
    r = _classify(*base, f"--workdir={tmp_path}/full", "--th=5", check=False)
    assert r.returncode == 2 and "another config" in r.stderr and "Traceback" not in r.stderr
    assert _params(f"{tmp_path}/full") is not None
    # a non-finite loss (Adam's step of 1e30 overflows the logits): one line, nothing written
    r = _classify(*base, f"--workdir={tmp_path}/nan", "--learning_rate=1e30", check=False)
    assert r.returncode == 2 and "training loss is " in r.stderr, r.stderr
    assert "lower --learning_rate" in r.stderr and r.stderr.count("\n") == 1
    # a NaN flag value is refused before any work
    r = _classify(*base, f"--workdir={tmp_path}/nan", "--learning_rate=nan", check=False)
    assert r.returncode == 2 and "learning_rate=nan must be positive" in r.stderr
    # the paper's protocol only when asked, labelled
    s = json.load(open(f"{tmp_path}/resumed/summary.json"))
    assert "Ding et al.'s protocol" in s["selection"] and "best_test_accuracy" in s


def _synthetic_trec(root, n_train: int = 400, n_test: int = 60) -> None:
    """Random TREC-format sentences of 4-12 words: one padded length, so few compiles."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(30)]
    classes = ["DESC:def", "HUM:ind", "LOC:city", "NUM:date", "ENTY:animal", "ABBR:exp"]
    for name, n in (("train_5500.label", n_train), ("TREC_10.label", n_test)):
        lines = [f"{classes[rng.integers(6)]} {' '.join(rng.choice(words, rng.integers(4, 13)))}"
                 for _ in range(n)]
        _write(f"{root}/trec/{name}", "\n".join(lines).encode("latin-1"))


def test_killed_run_resumes_exactly(tmp_path):
    """SIGKILL the binary just after a mid-epoch checkpoint, rerun it: the same parameters,
    metrics and accuracies, bit for bit, as an uninterrupted run (random embeddings)."""
    _synthetic_trec(tmp_path)
    args = [f"--data_dir={tmp_path}", "--dataset=trec", "--config=dc_bilstm", "--dl=1",
            "--dh=4", "--th=4", "--embed_size=8", "--batch_size=8", "--max_epochs=2",
            "--checkpoint_every_steps=10"]  # 360 train sentences: 45 steps/epoch
    env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.classify", *args]
    with open(tmp_path / "clean.err", "w") as err:  # the uninterrupted run, alongside
        clean = subprocess.Popen([*cmd, f"--workdir={tmp_path}/clean"], cwd=REPO, env=env,
                                 stdout=subprocess.DEVNULL, stderr=err)
    killed = subprocess.Popen([*cmd, f"--workdir={tmp_path}/killed"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (
            ckpts.exists() and any(p.name.isdigit() for p in ckpts.iterdir())):
        time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    out = _classify(*args, f"--workdir={tmp_path}/killed").stdout
    resumed = re.search(r"resumed from .*/checkpoints/(\d+) at epoch 1 step (\d+)\b", out)
    assert resumed and int(resumed[1]) == int(resumed[2]) > 0, out  # mid-epoch 1
    assert clean.wait(timeout=300) == 0, (tmp_path / "clean.err").read_text()
    for workdir in ("clean", "killed"):
        assert max(int(s) for s in os.listdir(tmp_path / workdir / "checkpoints")
                   if s.isdigit()) == 90
    a, b = _params(f"{tmp_path}/clean"), _params(f"{tmp_path}/killed")
    for x, y in zip(jax_leaves(a), jax_leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)

    def records(workdir):
        return [{k: v for k, v in json.loads(line).items() if k != "epoch_seconds"}
                for line in open(f"{workdir}/metrics.jsonl")]

    assert records(f"{tmp_path}/clean") == records(f"{tmp_path}/killed")
    assert len(records(f"{tmp_path}/clean")) == 2
    # killed after the best checkpoint of step S but before the latest one: the rerun
    # replays the epoch up to S and saves best/S again
    shutil.copytree(tmp_path / "clean", tmp_path / "race")
    best = int(next(s for s in os.listdir(tmp_path / "race" / "best") if s.isdigit()))
    for step in os.listdir(tmp_path / "race" / "checkpoints"):
        if step.isdigit() and int(step) >= best:
            shutil.rmtree(tmp_path / "race" / "checkpoints" / step)
    os.remove(tmp_path / "race" / "summary.json")
    _classify(*args, f"--workdir={tmp_path}/race")
    assert records(f"{tmp_path}/race") == records(f"{tmp_path}/clean")


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.slow
@needs_data
def test_cv_binary_two_folds(tmp_path):
    shutil.copytree(os.path.join(DATA, "mr"), tmp_path / "mr")
    _classify(f"--data_dir={tmp_path}", "--dataset=mr", f"--workdir={tmp_path}/w", *SMALL,
              "--batch_size=200", "--max_epochs=1", "--folds=0,1")
    s = json.load(open(f"{tmp_path}/w/summary.json"))
    assert len(s["fold_test_accuracies"]) == 2
    assert s["test_accuracy_std"] == pytest.approx(np.std(s["fold_test_accuracies"], ddof=1))


def test_predict_matches_the_runs_test_accuracy(tmp_path):
    """--mode=predict on the test file reproduces the run's test accuracy (best-dev
    parameters, other batches and padding), and refuses bad workdirs in one line."""
    _synthetic_trec(tmp_path, n_train=200)
    _classify(f"--data_dir={tmp_path}", "--dataset=trec", "--config=dc_bilstm", "--dl=1",
              "--dh=4", "--th=4", "--embed_size=8", "--batch_size=8", "--max_epochs=2",
              f"--workdir={tmp_path}/w")
    lines = open(tmp_path / "trec" / "TREC_10.label", encoding="latin-1").read().splitlines()
    labels = [tc.TREC_LABELS.index(ln.split(":")[0]) for ln in lines]
    (tmp_path / "q.txt").write_text("\n".join(ln.split(" ", 1)[1] for ln in lines) + "\n\n")
    r = _classify("--mode=predict", f"--workdir={tmp_path}/w", f"--text_file={tmp_path}/q.txt")
    rows = [ln.split("\t") for ln in r.stdout.splitlines()]
    assert len(rows) == len(lines) and all(0 < float(p) <= 1 for _, _, p, _ in rows)
    assert all(name == tc.TREC_LABELS[int(label)] for label, name, _, _ in rows)
    accuracy = np.mean([int(row[0]) == y for row, y in zip(rows, labels, strict=True)])
    summary = json.load(open(f"{tmp_path}/w/summary.json"))
    assert accuracy == pytest.approx(summary["test_accuracy"])
    assert summary["command"].startswith(f"python -m experiments.classify --data_dir={tmp_path} ")
    assert f"{len(lines)} texts" in r.stderr and "warning" not in r.stderr
    (tmp_path / "e.txt").write_text(f"{lines[0].split(' ', 1)[1]}\n\n--\n* * *\n")
    r = _classify("--mode=predict", f"--workdir={tmp_path}/w", f"--text_file={tmp_path}/e.txt")
    assert ("warning: 2 text(s) hold no word the model reads (line(s) 3, 4): their label is "
            "the model's guess for an empty text") in r.stderr
    os.makedirs(tmp_path / "lm")
    (tmp_path / "lm" / "run_identity.json").write_text('{"name": "tiny", "vocab_size": 10}')
    for args, message in (
            ([f"--workdir={tmp_path}/lm", f"--text_file={tmp_path}/q.txt"],
             "holds no experiments.classify run"),
            ([f"--workdir={tmp_path}/w"], "--mode=predict needs --text_file"),
            ([f"--workdir={tmp_path}", f"--text_file={tmp_path}/q.txt"],
             "no training run in"),
            ([f"--workdir={tmp_path}/w", f"--text_file={tmp_path}/none.txt"],
             "none.txt does not exist; pass --text_file=FILE")):
        r = _classify("--mode=predict", *args, check=False)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def _tiny_run(data_dir, workdir, max_len: int = 0, dataset: str = "trec", **kwargs) -> None:
    """One epoch of a tiny DC-Bi-LSTM on ``dataset``'s files in ``data_dir``, in this
    process; ``kwargs`` go to ``classify.run`` (``log``: none by default)."""
    from dense_rnn.configs.families import get_config
    from dense_rnn.train import classify

    c, family = get_config("dc_bilstm")
    c = dataclasses.replace(c, model_args={**c.model_args, "dl": 1, "dh": 4, "th": 4},
                            embed_size=8, batch_size=8, max_epochs=1)
    kwargs.setdefault("log", lambda s: None)
    classify.run(c, family, dataset, str(data_dir), str(workdir), None, max_len=max_len,
                 **kwargs)


def _declining_run(tmp_path, monkeypatch, **overrides):
    """A tiny DC-Bi-LSTM config on synthetic TREC whose every evaluation is worse than the
    one before (``classify.accuracy`` scripted), and ``train(config)``: its record."""
    from dense_rnn.configs.families import get_config
    from dense_rnn.train import classify

    _synthetic_trec(tmp_path, n_train=80, n_test=20)
    acc = iter(np.linspace(0.9, 0.1, 100))
    monkeypatch.setattr(classify, "accuracy", lambda *a, **k: float(next(acc)))
    c, family = get_config("dc_bilstm")
    c = dataclasses.replace(c, model_args={**c.model_args, "dl": 1, "dh": 4, "th": 4},
                            embed_size=8, batch_size=8, **overrides)
    return c, lambda config: classify.run(config, family, "trec", str(tmp_path),
                                          str(tmp_path / "w"), None, log=lambda s: None)


def _cut_best_short(workdir) -> None:
    for f in (workdir / "best").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])


def test_a_changed_patience_applies_on_resume(tmp_path, monkeypatch):
    """A run stopped early trains on when resumed with a larger patience."""
    c, train = _declining_run(tmp_path, monkeypatch, max_epochs=5, early_stopping_patience=1)
    first = train(c)
    again = train(dataclasses.replace(c, early_stopping_patience=2))
    assert (first["epochs"], again["epochs"]) == (2, 3)


def test_unreadable_best_parameters_leave_early_stopping_as_it_was(tmp_path, monkeypatch):
    """A run resumed past an unreadable best checkpoint chooses its best anew (the next
    epoch's parameters) but counts its epochs without a better dev accuracy from the best
    it had: with patience 3 and two bad epochs behind it, it stops after one more."""
    c, train = _declining_run(tmp_path, monkeypatch, max_epochs=3, early_stopping_patience=3)
    first = train(c)
    assert (first["epochs"], first["best_dev_epoch"]) == (3, 1)
    _cut_best_short(tmp_path / "w")
    again = train(dataclasses.replace(c, max_epochs=10))
    assert (again["epochs"], again["best_dev_epoch"]) == (4, 4)


def _synthetic_polarity(root, dataset: str, n: int = 60) -> None:
    """``n`` random sentences of 4-12 words a class in MR's or Subj's files."""
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(30)]
    files = {"mr": ("rt-polarity.neg", "rt-polarity.pos"),
             "subj": ("plot.tok.gt9.5000", "quote.tok.gt9.5000")}[dataset]
    for name in files:
        lines = [" ".join(rng.choice(words, rng.integers(4, 13))) for _ in range(n)]
        _write(f"{root}/{dataset}/{name}", "\n".join(lines).encode("latin-1"))


def test_single_and_cv_runs_never_share_a_workdir(tmp_path):
    """A CV run (MR: folds in WORKDIR/fold_K, the summary in WORKDIR) refuses a single
    run's workdir, and a single run or a CV run of another dataset refuses a CV run's,
    before writing anything; the same CV run resumes."""
    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    for dataset in ("mr", "subj"):
        _synthetic_polarity(tmp_path, dataset)
    trec, mr = tmp_path / "trec_w", tmp_path / "mr_w"
    _tiny_run(tmp_path, trec)
    summary = (trec / "summary.json").read_text()
    with pytest.raises(UserError, match=r"^workdir \S*trec_w holds a run of another config "
                       r"\(dataset: 'trec' -> 'mr'\); use a new --workdir"):
        _tiny_run(tmp_path, trec, dataset="mr", folds=[0])
    assert not (trec / "fold_0").exists() and (trec / "summary.json").read_text() == summary
    _tiny_run(tmp_path, mr, dataset="mr", folds=[0])
    summary = (mr / "summary.json").read_text()
    for dataset, folds in (("trec", None), ("subj", [1])):
        with pytest.raises(UserError, match=r"^workdir \S*mr_w holds a run of another config "
                           rf"in fold_0/ \(dataset: 'mr' -> '{dataset}'\); use a new --workdir"):
            _tiny_run(tmp_path, mr, dataset=dataset, folds=folds)
    assert sorted(os.listdir(mr)) == ["fold_0", "run.lock", "summary.json"]
    assert (mr / "summary.json").read_text() == summary
    _tiny_run(tmp_path, mr, dataset="mr", folds=[0])  # finished: reports again


def test_a_single_run_writes_its_summary_under_its_lock(tmp_path, monkeypatch):
    from dense_rnn import files
    from dense_rnn.train import classify

    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    write, refused = classify.metrics.write_json, []

    def write_json(path, obj):
        if path.endswith("summary.json"):
            with pytest.raises(UserError, match="is in use by another run"):
                files.lock(os.path.dirname(path))
            refused.append(path)
        write(path, obj)

    monkeypatch.setattr(classify.metrics, "write_json", write_json)
    _tiny_run(tmp_path, tmp_path / "w")
    assert refused == [str(tmp_path / "w" / "summary.json")]
    os.close(files.lock(str(tmp_path / "w")))  # released at the end


def test_a_cv_summary_gives_the_sample_std_over_its_folds(tmp_path):
    _synthetic_polarity(tmp_path, "mr")
    _tiny_run(tmp_path, tmp_path / "one", dataset="mr", folds=[0])
    assert json.loads((tmp_path / "one" / "summary.json").read_text())[
        "test_accuracy_std"] is None
    _tiny_run(tmp_path, tmp_path / "two", dataset="mr", folds=[0, 1])
    s = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s["test_accuracy_std"] == pytest.approx(np.std(s["fold_test_accuracies"], ddof=1))


def test_a_cv_run_holds_its_workdir_while_its_folds_train(tmp_path):
    from dense_rnn import files

    _synthetic_polarity(tmp_path, "mr")
    (tmp_path / "w").mkdir()
    fd = files.lock(str(tmp_path / "w"))
    try:
        with pytest.raises(UserError, match=r"w is in use by another run \(process "):
            _tiny_run(tmp_path, tmp_path / "w", dataset="mr", folds=[0])
    finally:
        os.close(fd)
    assert os.listdir(tmp_path / "w") == ["run.lock"]


def test_sweeps_and_single_runs_never_share_a_workdir(tmp_path):
    """A learning-rate sweep (runs in WORKDIR/lr_RATE, the chosen one's summary in WORKDIR)
    refuses a single run's workdir, and a single run refuses a sweep's."""
    from dense_rnn.configs.families import get_config
    from dense_rnn.train import classify

    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    c, family = get_config("dc_bilstm")
    c = dataclasses.replace(c, model_args={**c.model_args, "dl": 1, "dh": 4, "th": 4},
                            embed_size=8, batch_size=8, max_epochs=1)
    single, sweep = tmp_path / "single", tmp_path / "sweep"
    _tiny_run(tmp_path, single)

    def run_sweep(workdir):
        classify.run_lr_sweep(c, [1e-3], str(workdir), log=lambda s: None, family=family,
                              dataset="trec", data_dir=str(tmp_path), embeddings=None)

    with pytest.raises(UserError, match=r"single holds a run without --lr_sweep; use a new"):
        run_sweep(single)
    run_sweep(sweep)
    with pytest.raises(UserError, match=r"sweep holds a learning-rate sweep \(lr_\*/\); use a"):
        _tiny_run(tmp_path, sweep)


def test_a_sweep_chooses_its_rate_on_dev_not_test(tmp_path, monkeypatch):
    """Zhao et al.'s protocol: each rate is a run of its own; the best dev accuracy chooses,
    whatever the test accuracies say, and the summary keeps every rate's figures."""
    from dense_rnn.configs.families import get_config
    from dense_rnn.train import classify

    accuracies = {1e-2: (0.60, 0.90), 1e-3: (0.80, 0.70), 1e-4: (0.75, 0.95)}  # dev, test
    seen = []

    def fake_run(c, workdir, log, **kwargs):
        seen.append((c.learning_rate, os.path.basename(workdir)))
        log("warning: the data's")  # every rate's run warns alike
        log(f"rate {c.learning_rate:g}")
        dev, test = accuracies[c.learning_rate]
        return {"dev_accuracy": dev, "test_accuracy": test, "wall_seconds": 2.0,
                "config": c.to_dict()}

    monkeypatch.setattr(classify, "run", fake_run)
    c, _ = get_config("hm_densegru_64")
    lines = []
    summary = classify.run_lr_sweep(c, list(accuracies), str(tmp_path), log=lines.append)
    assert seen == [(1e-2, "lr_0.01"), (1e-3, "lr_0.001"), (1e-4, "lr_0.0001")]
    assert lines[:4] == ["warning: the data's", "rate 0.01", "rate 0.001", "rate 0.0001"]
    assert summary["learning_rate_chosen"] == 1e-3 and summary["test_accuracy"] == 0.70
    assert summary["config"]["learning_rate"] == 1e-3 and summary["wall_seconds"] == 6.0
    assert summary["lr_sweep"]["0.0001"] == {"dev_accuracy": 0.75, "test_accuracy": 0.95,
                                              "wall_seconds": 2.0}
    written = json.loads((tmp_path / "summary.json").read_text())
    assert (written["learning_rate_chosen"], written["lr_sweep"]) == (1e-3, summary["lr_sweep"])
    from dense_rnn.train import classify_infer

    for rate in ("0.01", "0.001", "0.0001"):  # the rates' runs, as a real sweep leaves them
        (tmp_path / f"lr_{rate}").mkdir()
        (tmp_path / f"lr_{rate}" / "run_identity.json").write_text("{}")
    with pytest.raises(UserError, match=rf"e.g. --workdir={tmp_path}/lr_0.001 \(the rate its "
                       r"sweep chose\)$"):
        classify_infer.load(str(tmp_path))


def test_size_warnings_unless_the_data_is_an_excerpt(tmp_path):
    """Local files of other sizes than the standard splits are warned about, unless the
    caller says they are an excerpt (``check_sizes=False``, as the quickstart notebook), and
    only when a run starts (a rerun, resumed or finished, has been warned)."""
    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    for check_sizes, workdir, warned in ((True, "w", True), (True, "w", False),
                                         (False, "v", False)):
        lines = []
        _tiny_run(tmp_path, tmp_path / workdir, log=lines.append, check_sizes=check_sizes)
        warnings = [line for line in lines if line.startswith("warning:")]
        assert warnings == (["warning: trec train has 40 examples, the standard split 5,452: "
                             "is a file cut short, or another version of trec?",
                             "warning: trec test has 8 examples, the standard split 500: is a "
                             "file cut short, or another version of trec?"] if warned else [])


def test_a_class_missing_from_the_training_data_is_warned_about(tmp_path):
    """A training split (or a CV dataset's pooled data) without some class: one warning
    line naming it; a test split may lack classes."""
    spec = tc.get_dataset("trec")
    rows = lambda labels: datasets.Dataset.from_dict(  # noqa: E731
        {"tokens": [["w"]] * len(labels), "label": labels})
    assert tc.class_warnings("trec", spec, {"train": rows([0, 1, 2, 3, 4, 5]),
                                            "test": rows([0])}) == []
    assert tc.class_warnings("trec", spec, {"train": rows([0, 0, 2, 3, 3])}) == [
        "warning: trec train has no example of class DESC, LOC, NUM (of 6); are its labels "
        "right?"]
    mr = tc.get_dataset("mr")
    assert tc.class_warnings("mr", mr, {"all": rows([1, 1])}) == [
        "warning: mr all has no example of class negative (of 2); are its labels right?"]
    _write(f"{tmp_path}/trec/train_5500.label", b"\n".join(
        b"DESC:def w%d w2 w3 w4" % i for i in range(40)))
    _write(f"{tmp_path}/trec/TREC_10.label", b"DESC:def w1 w2\nHUM:ind w3 w4")
    lines = []
    _tiny_run(tmp_path, tmp_path / "w", log=lines.append, check_sizes=False)
    assert [line for line in lines if line.startswith("warning:")] == [
        "warning: trec train has no example of class ABBR, ENTY, HUM, LOC, NUM (of 6); are "
        "its labels right?"]


def test_resume_on_another_vocabulary_refused(tmp_path):
    """A workdir resumed on data with other words (same vocabulary size: the checkpoint
    fits) is refused, and its vocab.json is kept; the original data resumes."""
    _synthetic_trec(tmp_path / "a", n_train=40, n_test=8)
    _tiny_run(tmp_path / "a", tmp_path / "w")
    vocab = (tmp_path / "w" / tc.VOCAB_FILE).read_text()
    for name in ("train_5500.label", "TREC_10.label"):
        text = (tmp_path / "a" / "trec" / name).read_text(encoding="latin-1")
        _write(f"{tmp_path}/b/trec/{name}", re.sub(r"\bw1\b", "x1", text).encode("latin-1"))
    assert '"w1"' in vocab and '"x1"' not in vocab
    with pytest.raises(UserError, match="holds a run trained on another vocabulary"):
        _tiny_run(tmp_path / "b", tmp_path / "w")
    assert (tmp_path / "w" / tc.VOCAB_FILE).read_text() == vocab
    _tiny_run(tmp_path / "a", tmp_path / "w")


def test_resume_on_another_training_split_refused(tmp_path):
    """The same words in a training split of another length (the checkpoint and the
    vocabulary fit) are refused on resume, as the language model does."""
    _synthetic_trec(tmp_path / "a", n_train=40, n_test=8)
    _tiny_run(tmp_path / "a", tmp_path / "w")
    for name, times in (("train_5500.label", 2), ("TREC_10.label", 1)):
        text = (tmp_path / "a" / "trec" / name).read_text(encoding="latin-1")
        _write(f"{tmp_path}/b/trec/{name}", "\n".join([text] * times).encode("latin-1"))
    with pytest.raises(UserError, match=r"trained on another training split \(5 steps per "
                       r"epoch, this one gives 9\)"):
        _tiny_run(tmp_path / "b", tmp_path / "w")
    _tiny_run(tmp_path / "a", tmp_path / "w")


def test_resume_on_other_data_of_the_same_words_and_length_refused(tmp_path):
    """The training sentences in another order, or another test split, with the same words
    and lengths (vocabulary and steps per epoch fit) are refused on resume: the run's data
    digests differ. The original data resumes."""
    _synthetic_trec(tmp_path / "a", n_train=40, n_test=8)
    _tiny_run(tmp_path / "a", tmp_path / "w")
    digests = (tmp_path / "w" / checkpoint.DATA_FILE).read_text()
    # TREC's dev split is a fixed tenth of its training file: it changes with it
    for changed, split in (("train_5500.label", "dev, train"), ("TREC_10.label", "test")):
        for name in ("train_5500.label", "TREC_10.label"):
            lines = (tmp_path / "a" / "trec" / name).read_text(encoding="latin-1").splitlines()
            _write(f"{tmp_path}/b/trec/{name}",
                   "\n".join(lines[::-1] if name == changed else lines).encode("latin-1"))
        with pytest.raises(UserError, match=rf"w was trained on other data \(its "
                           rf"{checkpoint.DATA_FILE} differs in the {split} split\(s\)\); "
                           r"pass the run's data"):
            _tiny_run(tmp_path / "b", tmp_path / "w")
        assert (tmp_path / "w" / checkpoint.DATA_FILE).read_text() == digests
    _tiny_run(tmp_path / "a", tmp_path / "w")


def test_unreadable_best_parameters_of_a_finished_run_are_saved_anew(tmp_path, capsys):
    """A finished classifier run whose best checkpoint is cut short: its training command
    rerun sets it aside and saves the latest parameters as the best, as the error of
    ``--mode=predict`` says; prediction then works."""
    from dense_rnn.train import classify_infer

    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    _tiny_run(tmp_path, tmp_path / "w")
    _cut_best_short(tmp_path / "w")
    with pytest.raises(UserError, match="best checkpoint .* cannot be read .* rerun on this"):
        classify_infer.load(str(tmp_path / "w"))
    lines = []
    _tiny_run(tmp_path, tmp_path / "w", log=lines.append)
    assert "best checkpoint" in capsys.readouterr().err
    assert any(d.startswith("best.") for d in os.listdir(tmp_path / "w" / "unreadable_checkpoints"))
    assert any("no best checkpoint is left: the latest parameters stand" in x for x in lines)
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert summary["best_dev_epoch"] == 1 and summary["dev_accuracy"] >= 0
    trained = classify_infer.load(str(tmp_path / "w"))
    assert len(classify_infer.predict(trained, ["w1 w2"]).labels) == 1


def test_predict_keeps_the_runs_max_len(tmp_path):
    """--mode=predict cuts texts to the run's --max_len, as training and evaluation did."""
    from dense_rnn.train import classify_infer

    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    _tiny_run(tmp_path, tmp_path / "w", max_len=3)
    trained = classify_infer.load(str(tmp_path / "w"))
    assert trained.max_len == 3
    texts = ["w1 w2 w3 w4 w5 w6 w7", "w1 w2 w3"]
    out = classify_infer.predict(trained, texts)
    np.testing.assert_array_equal(out.probs[0], out.probs[1])
    assert out.num_words == 6 and not out.empty.any()
    full = classify_infer.predict(dataclasses.replace(trained, max_len=0), texts).probs
    assert not np.array_equal(full[0], full[1])  # the cut matters for these texts


def test_keep_last_cuts_every_text_to_its_tail_in_training_and_prediction(tmp_path):
    """``keep="last"``: a text longer than --max_len keeps its last tokens, in training (the
    run's data, its identity and summary) and in prediction."""
    from dense_rnn.train import classify_infer

    assert tc.cut(list("abcde"), 3, "last") == list("cde")
    assert tc.cut(list("abcde"), 3) == list("abc") and tc.cut(list("ab"), 3, "last") == list("ab")
    raw = {"train": datasets.Dataset.from_dict({"tokens": [list("abcde")], "label": [0]})}
    assert tc.truncate(raw, 2, "last")["train"]["tokens"] == [["d", "e"]]
    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    _tiny_run(tmp_path, tmp_path / "w", max_len=3, keep="last")
    summary = json.loads((tmp_path / "w" / "summary.json").read_text())
    assert (summary["max_len"], summary["keep"]) == (3, "last")
    trained = classify_infer.load(str(tmp_path / "w"))
    assert (trained.max_len, trained.keep) == (3, "last")
    out = classify_infer.predict(trained, ["w1 w2 w3 w4 w5 w6 w7", "w5 w6 w7"])
    np.testing.assert_array_equal(out.probs[0], out.probs[1])
    with pytest.raises(UserError, match=r"another config \(keep: 'last' -> None\)"):
        _tiny_run(tmp_path, tmp_path / "w", max_len=3)  # the head: another run


@pytest.mark.parametrize("name", ["mr", "subj", "sst1", "sst2", "trec", "sst5"])
def test_each_loader_tokenises_as_its_spec_says(data_dir, name):
    """A dataset's local loader and its ``DatasetSpec.clean`` (what hub loads and the
    inference binary tokenise with) give the same tokens."""
    spec = tc.get_dataset(name)
    for split, ds in spec.load(data_dir).items():
        rows = ds.select(range(min(50, len(ds))))
        assert [spec.clean(t).split() for t in rows["text"]] == rows["tokens"], split


def test_inference_on_a_workdir_that_is_a_file_says_so(tmp_path):
    from dense_rnn.train import classify_infer

    (tmp_path / "f").write_text("")
    with pytest.raises(UserError, match=r"--workdir=.*/f is a file, not a directory; pass"):
        classify_infer.load(str(tmp_path / "f"))
    with pytest.raises(UserError, match=r"--workdir=.*/missing does not exist; pass"):
        classify_infer.load(str(tmp_path / "missing"))
