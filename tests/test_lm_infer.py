"""Sampling and scoring with a trained LM: step-by-step vs one pass, seeds, the binary."""

import json
import math
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from dense_rnn.configs import dc_bilstm
from dense_rnn.data import ptb
from dense_rnn.errors import UserError
from dense_rnn.train import classify_infer, lm, lm_infer
from tests.test_ptb_lm_binary import corpus_dir, one_line_error, run_binary, tiny  # noqa: F401

SENTENCES = ["w1 w2 w3", "w4 w0 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19", "w3"]


@pytest.fixture(scope="module")
def workdir(corpus_dir, tmp_path_factory):  # noqa: F811
    d = str(tmp_path_factory.mktemp("lm") / "w")
    lm.train_and_evaluate(tiny(max_steps=60), corpus_dir, d, log=lambda s: None)
    return d


@pytest.fixture(scope="module")
def trained(workdir):
    return lm_infer.load(workdir)


def test_vocab_saved_by_training(workdir, corpus_dir):  # noqa: F811
    vocab = ptb.read_vocab(f"{workdir}/{ptb.VOCAB_FILE}")
    assert vocab == ptb.load_ptb(corpus_dir).vocab


def test_vocabulary_is_indexed_once(trained):
    assert trained.word_to_id is trained.word_to_id
    assert trained.vocab[trained.eos] == ptb.EOS
    assert all(trained.vocab[i] == w for w, i in trained.word_to_id.items())


def test_step_by_step_matches_one_pass(trained):
    sentences = [lm_infer.encode_words(s.split(), trained.word_to_id)[0] for s in SENTENCES]
    one_pass = lm_infer.sentence_log_probs(trained, sentences, batch_size=2)
    step = lm_infer.make_step(trained.model)
    for s, expected in zip(sentences, one_pass, strict=True):
        carries, total = trained.model.zero_carries(1), 0.0
        for prev, target in zip([trained.eos, *s], [*s, trained.eos], strict=True):
            log_probs, carries = step(trained.params, carries, jnp.asarray([prev]))
            total += float(log_probs[0, target])
        np.testing.assert_allclose(total, expected, rtol=1e-5, atol=1e-4)
    assert np.all(one_pass < 0)


def test_a_long_sentence_scored_in_windows_matches_one_pass(trained):
    """A sentence longer than the window carries its state across windows (and pads to a
    whole number of windows): the same log-probability as in one pass."""
    long = [lm_infer.encode_words(f"w{i % 19} w{(i * 7) % 19}".split(), trained.word_to_id)[0]
            for i in range(30)]
    sentences = [sum(long, []), long[0]]  # 61 and 3 tokens with <eos>
    one_pass = lm_infer.sentence_log_probs(trained, sentences, window=64)
    windowed = lm_infer.sentence_log_probs(trained, sentences, window=16)
    np.testing.assert_allclose(windowed, one_pass, rtol=1e-5)


def test_sampling_is_reproducible_by_seed(trained):
    a = lm_infer.sample(trained, "w1 w2", num_words=20, seed=3)
    assert a == lm_infer.sample(trained, "w1 w2", num_words=20, seed=3)
    assert a != lm_infer.sample(trained, "w1 w2", num_words=20, seed=4)
    assert len(a) == 20 and set(a) <= set(trained.vocab)
    greedy = lm_infer.sample(trained, "w1", num_words=5, temperature=0.0, seed=0)
    assert greedy == lm_infer.sample(trained, "w1", num_words=5, temperature=0.0, seed=1)
    for bad in ("nan", "inf"):  # inf would draw every word alike
        with pytest.raises(UserError, match=rf"temperature \({bad}\) must be finite and >= 0"):
            lm_infer.sample(trained, "w1", temperature=float(bad))


def test_generate_yields_the_sampled_words_one_by_one(trained, monkeypatch):
    make_step, steps = lm_infer.make_step, []

    def counted(model):
        step = make_step(model)
        return lambda *args: steps.append(1) or step(*args)

    monkeypatch.setattr(lm_infer, "make_step", counted)
    words = lm_infer.generate(trained, "w1 w2", num_words=20, seed=3)
    assert not steps  # nothing runs before the first word is asked for
    first = next(words)
    assert first in trained.vocab and len(steps) == 3  # <eos> and the prompt's two words
    rest = list(words)
    assert len(steps) == 3 + 19  # each later word one step; none after the last
    assert [first, *rest] == lm_infer.sample(trained, "w1 w2", num_words=20, seed=3)
    with pytest.raises(UserError, match=r"num_words \(-1\) >= 0"):  # before any word is asked
        lm_infer.generate(trained, num_words=-1)


@pytest.mark.parametrize("words, text", [
    ([], ""),
    (["a", "b"], "a b"),
    (["<eos>", "a", "<eos>", "b", "c", "<eos>"], "a\nb c"),
    (["a", "<eos>", "<eos>", "b"], "a\n\nb"),  # an empty sentence: an empty line
])
def test_render_puts_one_sentence_on_a_line(words, text):
    assert lm_infer.render(words) == text
    assert "".join(lm_infer.stream_text(iter(words))) == text


def test_score_file_maps_unknown_words(trained, tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("w1 w2 w3\n\n  w1 zzz w2  \n")
    scores = lm_infer.score_file(trained, str(path))
    assert scores.sentences == ["w1 w2 w3", "w1 zzz w2"]
    assert scores.num_unknown == 1 and scores.num_tokens == 8
    unk = lm_infer.sentence_log_probs(trained, [lm_infer.encode_words(
        ["w1", ptb.UNK, "w2"], trained.word_to_id)[0]])
    np.testing.assert_allclose(scores.log_probs[1], unk[0], rtol=1e-6)
    assert scores.perplexity == pytest.approx(math.exp(-scores.log_probs.sum() / 8))
    with pytest.raises(UserError, match="missing.txt does not exist; pass --text_file"):
        lm_infer.score_file(trained, str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="is a directory, not a file; pass --text_file"):
        lm_infer.score_file(trained, str(tmp_path))
    (tmp_path / "bom.txt").write_bytes("\ufeffw1 w2 w3\n".encode())  # as Notepad saves
    bom = lm_infer.score_file(trained, str(tmp_path / "bom.txt"))
    assert bom.num_unknown == 0 and bom.log_probs[0] == pytest.approx(scores.log_probs[0])
    (tmp_path / "binary.txt").write_bytes(b"w1 w2\n\xff\xfe\x00\x81\n")
    with pytest.raises(UserError, match="is not UTF-8 text"):
        lm_infer.score_file(trained, str(tmp_path / "binary.txt"))


def test_workdir_without_checkpoint(workdir, tmp_path):
    for name in ["run_identity.json", ptb.VOCAB_FILE]:
        shutil.copy(f"{workdir}/{name}", tmp_path / name)
    with pytest.raises(UserError, match="no checkpoint in"):
        lm_infer.load(str(tmp_path))


def test_binary_sample_score_and_bad_inputs(workdir, tmp_path):
    r = run_binary("--mode=sample", f"--workdir={workdir}", "--prompt=w1 w2 W3",
                   "--num_words=7", "--seed=5")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["w1", "w2", "W3"]
    assert "note: the model reads 1 prompt word(s) as <unk>, not in its vocabulary: W3" in (
        r.stderr)
    text = tmp_path / "t.txt"
    text.write_text("w1 w2\nw3 qqq\n")
    r = run_binary("--mode=score", f"--workdir={workdir}", f"--text_file={text}")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 and lines[1].endswith("\tw3 qqq")
    assert "(1 unknown -> <unk>)" in lines[2] and "perplexity" in lines[2]
    assert r.stderr.startswith("note: 1 word(s) scored as <unk>")
    one_line_error(run_binary("--mode=sample", f"--workdir={tmp_path / 'none'}"),
                   "no training run")
    one_line_error(run_binary("--mode=sample", f"--workdir={workdir}", "--seed=-1"),
                   "error: --seed=-1 must be in [0, 2**63)")  # no config named: the run's own
    one_line_error(run_binary("--mode=sample", "--config=nope"), "unknown config 'nope'")
    one_line_error(run_binary("--mode=score", f"--workdir={workdir}",
                              f"--text_file={tmp_path / 'missing.txt'}"), "does not exist")


def test_workdirs_of_the_other_binary_are_refused(workdir, tmp_path):
    """A classifier's workdir given to sampling, and this LM's to the classifier."""
    identity = {**dc_bilstm.CONFIGS["dc_bilstm_t4_dl0_dh10"].to_dict(), "dataset": "trec",
                "embeddings": "", "oov": "drop"}  # as experiments.classify writes it
    (tmp_path / "run_identity.json").write_text(json.dumps(identity))
    one_line_error(run_binary("--mode=sample", f"--workdir={tmp_path}"),
                   "holds no experiments.ptb_lm run")
    with pytest.raises(UserError, match="holds no experiments.classify run"):
        classify_infer.load(workdir)


def test_workdir_without_vocab_file(workdir, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(workdir, old, ignore=shutil.ignore_patterns(ptb.VOCAB_FILE))
    with pytest.raises(UserError, match=f"has no {ptb.VOCAB_FILE} .*rerun its training"):
        lm_infer.load(str(old))


def test_a_damaged_best_checkpoint_says_how_to_recover(workdir, tmp_path):
    """Inference cannot repair it; the training command can (it sets it aside)."""
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy)
    (step,) = [d for d in (copy / "best").iterdir() if d.name.isdigit()]
    for f in (step / "params" / "d").iterdir():  # the array data, cut short
        f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(UserError, match=r"^best checkpoint \S+/best/\d+ cannot be read \(.*\): "
                       r"it is damaged or .* set aside, .* by the run's training command rerun "
                       r"on this --workdir$"):
        lm_infer.load(str(copy))
