"""PTB loading through datasets, the stream layout and truncated-BPTT windows."""

import os

import numpy as np
import pytest

from dense_rnn.data import ptb
from dense_rnn.errors import UserError


def test_real_ptb(data_dir):
    corpus = ptb.load_ptb(f"{data_dir}/ptb")
    assert len(corpus.vocab) == 10_000
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (929_589, 73_760, 82_430)
    assert corpus.vocab[corpus.train[-1]] == ptb.EOS


def test_windows_shift_targets_by_one():
    ids = np.arange(103, dtype=np.int32)
    streams = ptb.batchify(ids, 4)  # 4 streams of 25
    assert streams.shape == (4, 25)
    np.testing.assert_array_equal(streams[1], np.arange(25, 50))
    assert ptb.num_windows(streams, 5, drop_remainder=True) == 4  # (25 - 1) // 5
    assert ptb.num_windows(streams, 5, drop_remainder=False) == 5
    x, y = ptb.window(streams, 4, 5)
    assert x.shape == (4, 4)
    np.testing.assert_array_equal(y, x + 1)
    covered = np.concatenate([ptb.window(streams, i, 5)[1] for i in range(5)], axis=1)
    np.testing.assert_array_equal(covered, streams[:, 1:])


def test_vocab_order_and_unk():
    vocab = ptb.build_vocab(["b a a", "c a"])
    assert vocab == ["a", ptb.EOS, "b", "c"]
    with pytest.raises(UserError, match="'zzz' of the text is not in the training vocabulary"):
        ptb.encode(["zzz"], {w: i for i, w in enumerate(vocab)})


def write_ptb(tmp_path, **contents):
    for split in ptb.SPLITS:
        data = contents.get(split, " a b c <unk>\n b c a\n")
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(tmp_path / f"ptb.{split}.txt", mode) as f:
            f.write(data)
    return str(tmp_path)


@pytest.mark.parametrize("contents, message", [
    ({"valid": ""}, "is empty"),
    ({"test": b"\x00\x01\xff\xfe binary"}, "not UTF-8 text"),
])
def test_bad_files(tmp_path, contents, message):
    with pytest.raises(UserError, match=message):
        ptb.load_ptb(write_ptb(tmp_path, **contents))


def test_missing(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        ptb.load_ptb(str(tmp_path / "nope"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="'.*file' is a file, not a directory; pass --data_dir"):
        ptb.load_ptb(str(tmp_path / "file"))
    d = write_ptb(tmp_path)
    (tmp_path / "ptb.test.txt").unlink()
    with pytest.raises(UserError, match="ptb.test.txt does not exist; pass --data_dir"):
        ptb.load_ptb(d)
    (tmp_path / "ptb.test.txt").mkdir()
    with pytest.raises(UserError, match="ptb.test.txt is a directory, not a file; pass"):
        ptb.load_ptb(d)


def test_a_word_missing_from_training_names_its_split(tmp_path):
    d = write_ptb(tmp_path, train=" a b\n", valid=" a zzz\n")
    with pytest.raises(UserError, match=r"'zzz' of the valid split \(the files in .*\) is not "
                                        "in the training vocabulary"):
        ptb.load_ptb(d)


def test_the_files_read_are_those_named_and_as_they_are_now(tmp_path):
    """A directory name with glob characters is a name, not a pattern; a file rewritten
    under its old modification time is read afresh."""
    for name in ("ptb1", "ptb[1]"):
        (tmp_path / name).mkdir()
    write_ptb(tmp_path / "ptb1", train=" other corpus\n", valid=" other\n", test=" corpus\n")
    d = write_ptb(tmp_path / "ptb[1]")
    assert ptb.load_ptb(d).vocab == [ptb.EOS, "a", "b", "c", "<unk>"]
    path = tmp_path / "ptb[1]" / "ptb.train.txt"
    stat = path.stat()
    path.write_text(" a a b c <unk>\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert ptb.load_ptb(d).vocab == ["a", ptb.EOS, "<unk>", "b", "c"]


def test_split_sizes_other_than_mikolovs_warn(tmp_path):
    corpus = ptb.load_ptb(write_ptb(tmp_path))
    assert ptb.size_warning(corpus) == (
        f"warning: PTB tokens: train {len(corpus.train):,} (Mikolov's: 929,589), valid "
        f"{len(corpus.valid):,} (Mikolov's: 73,760), test {len(corpus.test):,} (Mikolov's: "
        "82,430); is a file cut short, or is this another corpus?")
    full = ptb.Corpus(corpus.vocab, *(np.zeros(n, np.int32) for n in ptb.SIZES.values()))
    assert ptb.size_warning(full) is None


def test_a_damaged_vocabulary_file_is_a_user_error(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"the\n\xff\xfe\n")
    with pytest.raises(UserError, match=r"vocabulary file .* is unreadable \(UnicodeDecodeError\)"):
        ptb.read_vocab(str(path))
