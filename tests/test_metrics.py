"""Run records: the non-finite loss check shared by the trainers (its advice fits what the
workdir holds) and the resume-safe metrics.jsonl."""

import json

import pytest

from dense_rnn.errors import UserError
from dense_rnn.train import classify, lm
from dense_rnn.train.metrics import MetricsWriter, check_finite


def test_finite_loss_passes():
    check_finite(2.5, "at step 1", "w", saved=False, resumable=lm.RESUMABLE_FIELDS)


@pytest.mark.parametrize("resumable", [lm.RESUMABLE_FIELDS, classify.RESUMABLE_FIELDS])
def test_nothing_saved_yet(resumable):
    with pytest.raises(UserError) as e:
        check_finite(float("nan"), "at step 7", "w", saved=False, resumable=resumable)
    assert str(e.value) == ("training loss is nan at step 7; no checkpoint was saved yet: "
                            "lower --learning_rate or clip gradients harder with --max_grad_norm")


def test_lm_checkpoint_is_kept_for_resume():
    with pytest.raises(UserError, match=r"loss is inf in epoch 2; the last good checkpoint in "
                       r"w/checkpoints is kept: lower --learning_rate .*, and resume$"):
        check_finite(float("inf"), "in epoch 2", "w", saved=True, resumable=lm.RESUMABLE_FIELDS)


def test_classifier_cannot_resume_with_another_learning_rate():
    with pytest.raises(UserError) as e:
        check_finite(float("nan"), "in epoch 3", "w", saved=True,
                     resumable=classify.RESUMABLE_FIELDS)
    assert str(e.value) == ("training loss is nan in epoch 3; lower --learning_rate or clip "
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


def test_a_malformed_line_before_the_last_is_a_user_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 10}\nnot json\n{"step": 20}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl line 2 is not JSON; repair or delete"):
        MetricsWriter(str(tmp_path), resume_step=20)
