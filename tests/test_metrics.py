"""The non-finite loss check shared by the trainers: its advice fits what the workdir holds."""

import pytest

from dense_rnn.errors import UserError
from dense_rnn.train import classify, lm
from dense_rnn.train.metrics import check_finite


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
