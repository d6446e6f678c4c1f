"""Run records: the non-finite loss check shared by the trainers (its advice fits what the
workdir holds) and the resume-safe metrics.jsonl."""

import json
import os
import re
import threading

import jax
import pytest

from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write
from dense_rnn.train import classify, lm
from dense_rnn.train.metrics import MetricsWriter, not_finite_error


@pytest.mark.parametrize("resumable", [lm.RESUMABLE_FIELDS, classify.RESUMABLE_FIELDS])
def test_no_checkpoint_left(resumable):
    e = not_finite_error(float("nan"), "at step 7", "w", None, resumable)
    assert str(e) == ("training loss is nan at step 7; no checkpoint from before it is left: "
                      "lower --learning_rate or clip gradients harder with --max_grad_norm "
                      "(a rerun starts over)")


def test_lm_resumes_from_the_last_good_checkpoint():
    e = not_finite_error(float("inf"), "at step 9", "w", 4, lm.RESUMABLE_FIELDS)
    assert re.fullmatch(r"training loss is inf at step 9; resume from the last good checkpoint "
                        r"\(w/checkpoints/4; any later one is removed\): lower --learning_rate "
                        r".* --max_grad_norm, or start over in a new --workdir if it diverges "
                        r"again", str(e)), str(e)


def test_classifier_cannot_resume_with_another_learning_rate():
    e = not_finite_error(float("nan"), "in epoch 3", "w", 5, classify.RESUMABLE_FIELDS)
    assert str(e) == ("training loss is nan in epoch 3; lower --learning_rate or clip "
                      "gradients harder with --max_grad_norm in a new --workdir (w "
                      "resumes only the same config)")


def _write_records(tmp_path, steps, tail=""):
    lines = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in steps)
    (tmp_path / "metrics.jsonl").write_text(lines + tail)


def test_resume_drops_records_past_the_resume_step(tmp_path):
    _write_records(tmp_path, [10, 20, 30])
    writer = MetricsWriter(str(tmp_path), resume_step=20)
    writer.write({"step": 30, "loss": 0.5})
    writer.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30] and rows[-1]["loss"] == 0.5


def test_resume_after_a_kill_mid_line_drops_the_torn_line(tmp_path):
    _write_records(tmp_path, [10, 20], tail='{"step": 30, "lo')
    writer = MetricsWriter(str(tmp_path), resume_step=30)
    writer.close()
    assert [r["step"] for r in writer.records] == [10, 20]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


@pytest.mark.parametrize("line", ["not json", "null", "[]", "{}", '{"step": "10"}'])
def test_a_malformed_line_before_the_last_is_a_user_error(tmp_path, line):
    (tmp_path / "metrics.jsonl").write_text(f'{{"step": 10}}\n{line}\n{{"step": 20}}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl line 2 is not an evaluation record; "
                                        "repair or delete"):
        MetricsWriter(str(tmp_path), resume_step=20)


def test_a_file_that_is_not_utf8_is_a_user_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 10}\n\xff\xfe\n')
    with pytest.raises(UserError, match=r"metrics.jsonl is not UTF-8 text; repair or delete"):
        MetricsWriter(str(tmp_path), resume_step=20)


def test_a_records_file_that_cannot_be_read_is_a_user_error(tmp_path):
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(UserError, match=r"cannot read .*metrics.jsonl \(Is a directory\); "
                                        "repair or delete"):
        MetricsWriter(str(tmp_path), resume_step=20)


def test_only_the_first_process_writes_the_records(tmp_path, monkeypatch):
    """In a multi-host run every process keeps the records; only process 0 writes them."""
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    writer = MetricsWriter(str(tmp_path))
    writer.write({"step": 1, "valid_ppl": 9.0})
    writer.close()
    assert writer.records == [{"step": 1, "valid_ppl": 9.0}] and not os.listdir(tmp_path)


def test_only_the_first_process_writes_the_summary_and_identity_or_locks(tmp_path, monkeypatch):
    from dense_rnn.train import checkpoint, metrics

    monkeypatch.setattr(jax, "process_index", lambda: 1)
    metrics.write_json(str(tmp_path / "summary.json"), {"a": 1})
    ckpt = checkpoint.Checkpointer(str(tmp_path / "w"), {"seed": 0})
    ckpt._write_identity()  # what the first save does
    ckpt.close()
    assert not os.path.exists(tmp_path / "summary.json")
    assert os.listdir(tmp_path / "w") == []  # (orbax makes its directories on save)


def test_processes_writing_one_file_at_once_each_replace_it_whole(tmp_path):
    path = str(tmp_path / "summary.json")

    def write(text):
        for _ in range(50):
            atomic_write(path, text)

    threads = [threading.Thread(target=write, args=(c * 1000,)) for c in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert open(path).read() in ("a" * 1000, "b" * 1000)
    assert os.listdir(tmp_path) == ["summary.json"]  # no temporary file left
