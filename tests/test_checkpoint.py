"""The checkpointer: identity across a JSON round trip, re-saving a step after a kill."""

import dataclasses
import errno
import json
import os
import re
import shutil
import socket
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import orbax.checkpoint as ocp
import pytest

from dense_rnn import files
from dense_rnn.errors import UserError
from dense_rnn.train import checkpoint


def test_identity_with_tuples_resumes(tmp_path):
    identity = {"model_args": {"depths": (2, 4, 8)}, "dataset": "sst5"}
    ckpt = checkpoint.Checkpointer(str(tmp_path), identity)
    ckpt.save(1, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    ckpt.close()
    checkpoint.Checkpointer(str(tmp_path), identity).close()  # the same config resumes
    with pytest.raises(UserError, match="another config"):
        checkpoint.Checkpointer(str(tmp_path), {**identity, "dataset": "imdb"})
    # a nested field is shown by the keys that differ in it
    with pytest.raises(UserError, match=re.escape(
            "another config (model_args.cell: None -> 'lstm', model_args.depths: [2, 4, 8] -> "
            "[2, 4]); use")):
        checkpoint.Checkpointer(str(tmp_path), {**identity, "model_args": {
            "depths": (2, 4), "cell": "lstm"}})


def test_a_corrected_paper_number_leaves_the_run_resumable(tmp_path):
    identity = {"hidden_size": 200, "paper_test_ppl": 80.4}
    ckpt = checkpoint.Checkpointer(str(tmp_path), identity, descriptive=("paper_test_ppl",))
    ckpt.save(1, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    ckpt.close()
    for changed in ({"hidden_size": 200, "paper_test_ppl": 80.5}, {"hidden_size": 200}):
        checkpoint.Checkpointer(str(tmp_path), changed, descriptive=("paper_test_ppl",)).close()
    with pytest.raises(UserError, match="another config"):
        checkpoint.Checkpointer(str(tmp_path), {**identity, "hidden_size": 201},
                                descriptive=("paper_test_ppl",))


def test_an_identity_without_a_complete_checkpoint_binds_nothing(tmp_path):
    """A run killed inside its first save (its identity written, no checkpoint committed)
    leaves the workdir free for any config; the next save writes that config's identity."""
    first = checkpoint.Checkpointer(str(tmp_path), {"hidden_size": 16})
    first._write_identity()  # then killed before orbax committed the save
    first.close()
    assert checkpoint.read_identity(str(tmp_path)) == {"hidden_size": 16}
    other = checkpoint.Checkpointer(str(tmp_path), {"hidden_size": 32})
    other.save(1, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    other.close()
    assert checkpoint.read_identity(str(tmp_path)) == {"hidden_size": 32}
    with pytest.raises(UserError, match=r"another config \(hidden_size: 32 -> 16\)"):
        checkpoint.Checkpointer(str(tmp_path), {"hidden_size": 16})


def test_a_refused_run_creates_nothing_in_the_workdir(tmp_path):
    ckpt = checkpoint.Checkpointer(str(tmp_path), {"hidden_size": 16})
    ckpt.save(1, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    ckpt.close()
    shutil.rmtree(tmp_path / "best")  # a workdir with no best checkpoint yet, say
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(UserError, match="another config"):
        checkpoint.Checkpointer(str(tmp_path), {"hidden_size": 32})
    assert sorted(os.listdir(tmp_path)) == before


def test_cv_folds_and_sweeps_are_not_bound_by_an_identity_without_a_checkpoint(tmp_path):
    """``classify``'s workdir checks follow the checkpointer: a fold, or a single run, killed
    inside its first save binds neither a CV run of another config nor a sweep."""
    from dense_rnn.train import classify

    for sub in ("cv/fold_0", "single"):
        first = checkpoint.Checkpointer(str(tmp_path / sub), {"hidden": 16, "fold": 0})
        first._write_identity()
        first.close()
    classify.check_workdir(str(tmp_path / "cv"), {"hidden": 32, "fold": 0}, cv=True)
    assert checkpoint.binding_identity(str(tmp_path / "single")) is None
    (tmp_path / "cv" / "fold_0" / "checkpoints" / "7").mkdir(parents=True)  # now complete
    with pytest.raises(UserError, match=r"another config in fold_0/ \(hidden: 16 -> 32\)"):
        classify.check_workdir(str(tmp_path / "cv"), {"hidden": 32, "fold": 0}, cv=True)


def test_keep_data_digests_checks_a_resume_only_against_a_kept_file(tmp_path):
    """No checkpoint, or a run from before the file: nothing is checked and the file is
    written; then other digests are refused and an unreadable file is one line."""
    digests, fix = {"train": "a", "test": "b"}, "pass the run's data"
    ckpt = checkpoint.Checkpointer(str(tmp_path), {})
    ckpt.keep_data_digests({"train": "other"}, fix)  # no checkpoint yet: not checked
    ckpt.save(1, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    ckpt.wait()
    os.remove(tmp_path / checkpoint.DATA_FILE)  # a run from before the file
    ckpt.keep_data_digests(digests, fix)
    assert json.loads((tmp_path / checkpoint.DATA_FILE).read_text()) == digests
    with pytest.raises(UserError, match=r"other data \(its data_fingerprint.json differs in "
                       r"the test, train split\(s\)\); pass the run's data$"):
        ckpt.keep_data_digests({"train": "c", "test": "d"}, fix)
    ckpt.keep_data_digests(digests, fix)  # the same data resumes
    (tmp_path / checkpoint.DATA_FILE).write_text("{not json")
    with pytest.raises(UserError, match=r"data_fingerprint.json is unreadable \(JSONDecodeError"
                       r"\); restore it, or delete it"):
        ckpt.keep_data_digests(digests, fix)
    ckpt.close()


def test_data_digests_tell_order_and_split_apart():
    a, b = np.arange(4), np.arange(4, 6)
    digest = checkpoint.data_digests({"train": [a, b]})["train"]
    assert digest == checkpoint.data_digests({"train": [a.astype(np.int32), b]})["train"]
    for other in ([b, a], [np.arange(6)], [a, b, np.arange(0)], [a, b[::-1]]):
        assert checkpoint.data_digests({"train": other})["train"] != digest


def test_one_run_at_a_time_trains_in_a_workdir(tmp_path):
    """A second training run on a locked workdir is refused, naming the first's process;
    inference reads it meanwhile, and closing (or the process's end) frees it."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), {})
    ckpt.save_best(1, {"w": np.ones(3, np.float32)}, {"dev": 0.1})
    ckpt.wait()
    with pytest.raises(UserError, match=rf"^{tmp_path} is in use by another run \(process "
                       rf"{socket.gethostname()}:{os.getpid()}\); wait for it to finish, or "
                       "use another --workdir$"):
        checkpoint.Checkpointer(str(tmp_path), {})
    like = {"w": np.zeros(3, np.float32)}
    np.testing.assert_array_equal(checkpoint.load_best(str(tmp_path), {}, like, "")["w"], 1)
    ckpt.close()
    checkpoint.Checkpointer(str(tmp_path), {}).close()
    with pytest.raises(UserError, match="holds a run of"):  # a refused config frees it too
        checkpoint.Checkpointer(str(tmp_path), {"seed": 1})
    checkpoint.Checkpointer(str(tmp_path), {}).close()


def test_a_checkpointer_trains_under_its_runs_lock(tmp_path):
    """Inside ``locked`` (a run that writes its summary after training), a Checkpointer on
    the same workdir shares the run's lock, which holds until the block ends."""
    from dense_rnn import files

    with checkpoint.locked(str(tmp_path)):
        with checkpoint.Checkpointer(str(tmp_path), {}):
            pass
        with pytest.raises(UserError, match="is in use by another run"):
            files.lock(str(tmp_path))  # still held after the Checkpointer closed
    os.close(files.lock(str(tmp_path)))
    with checkpoint.Checkpointer(str(tmp_path), {}), pytest.raises(UserError, match="in use"):
        with checkpoint.locked(str(tmp_path)):  # a run's lock is not taken from under one
            pass


@dataclasses.dataclass
class _Progress:
    global_step: int = 0
    epoch: int = 0
    best: float = float("inf")


def test_save_progress_then_resume_gives_back_state_and_progress(tmp_path):
    like = {"w": np.zeros(3, np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        assert ckpt.resume(like, _Progress()) == (like, _Progress())  # nothing saved yet
        ckpt.save_progress({"w": np.arange(3, dtype=np.float32)}, _Progress(7, 2, 1.5), {"a": 1})
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        state, progress = ckpt.resume(like, _Progress())
        assert ckpt.latest_step() == 7
        assert ckpt.restore(like)[1]["config"] == {"a": 1}
    np.testing.assert_array_equal(state["w"], np.arange(3))
    assert progress == _Progress(7, 2, 1.5)


def test_best_step_saved_again_after_a_kill(tmp_path):
    """A kill between the best and the latest checkpoint of step S replays the epoch."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), {})
    ckpt.save_best(5, {"w": np.zeros(3, np.float32)}, {"dev": 0.1})
    ckpt.wait()
    ckpt.save_best(5, {"w": np.ones(3, np.float32)}, {"dev": 0.2})
    params, meta = ckpt.restore_best({"w": np.zeros(3, np.float32)})
    ckpt.close()
    np.testing.assert_array_equal(params["w"], np.ones(3))
    assert meta == {"dev": 0.2}


def test_a_best_saved_after_the_latest_checkpoint_is_dropped_on_resume(tmp_path):
    """Killed between its best and its latest checkpoint of step 5, a run resumes from step
    4 with the best of step 3, the one its progress records, not the abandoned step 5."""
    w = {"w": np.zeros(3, np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        ckpt.save_best(3, {"w": np.full(3, 3.0, np.float32)}, {"dev": 0.3})
        ckpt.save_progress(w, _Progress(4, 1, 0.0), {})
        ckpt.save_best(5, {"w": np.full(3, 5.0, np.float32)}, {"dev": 0.5})
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        assert ckpt.resume(w, _Progress())[1].global_step == 4
        params, meta = ckpt.restore_best(w)
    np.testing.assert_array_equal(params["w"], np.full(3, 3.0))
    assert meta == {"dev": 0.3}


def test_without_a_latest_checkpoint_a_resume_drops_every_best(tmp_path):
    w = {"w": np.zeros(3, np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        ckpt.save_best(2, w, {"dev": 0.3})
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        assert ckpt.resume(w, _Progress()) == (w, _Progress())
        assert ckpt.restore_best(w) is None


def test_a_progress_record_of_another_version_is_one_line(tmp_path):
    w = {"w": np.zeros(3, np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        ckpt.save(4, w, {"progress": {"global_step": 4, "from_a_newer_version": 1}})
    with (pytest.raises(UserError, match=r"checkpoints/4 cannot be read \(its progress record"),
          checkpoint.Checkpointer(str(tmp_path), {}) as ckpt):
        ckpt.resume(w, _Progress())


def test_a_ctrl_c_ignored_before_a_save_stays_ignored(monkeypatch):
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with checkpoint._interrupt_after():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_restore_and_restore_best_refuse_another_structure_alike(tmp_path):
    """Both restores give the same one-line error for a checkpoint of another structure."""
    ckpt = checkpoint.Checkpointer(str(tmp_path), {})
    ckpt.save(3, {"w": np.zeros(3, np.float32)}, {"epoch": 1})
    ckpt.save_best(3, {"w": np.zeros(3, np.float32)}, {"dev": 0.5})
    ckpt.close()
    other = {"w": np.zeros(3, np.float32), "b": np.zeros(2, np.float32)}
    with (pytest.raises(UserError, match=r"checkpoints/3 cannot be read .* does not fit"),
          checkpoint.Checkpointer(str(tmp_path), {}) as ckpt):
        ckpt.restore(other)
    with pytest.raises(UserError, match=r"checkpoint .*/best/3 cannot be read .* does not fit"):
        checkpoint.load_best(str(tmp_path), {}, other, "after the first epoch")


def test_resume_line_says_where_training_picks_up_or_why_there_is_nothing_to_train():
    assert checkpoint.finished_because(False, 2, 3) is None
    assert checkpoint.finished_because(True, 2, 3) == "stopped early"
    assert checkpoint.finished_because(False, 3, 3).startswith("--max_epochs=3 reached")
    assert checkpoint.finished_because(False, 1, 3, 50, 50).startswith("--max_steps=50 reached")
    assert checkpoint.resume_line("w", 70, 0, "step 70/100", None) == (
        "resumed from w/checkpoints/70 at epoch 1 step 70/100")
    assert checkpoint.resume_line("w", 300, 3, "step 0/100", "stopped early") == (
        "w holds a finished run (step 300; stopped early): nothing to train, reporting its "
        "results")


def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(tmp_path, capsys):
    """A checkpoint whose files were cut short is reported, moved aside, and the older one
    restored; with none left to fall back on, the error says the checkpoint is damaged."""
    like = {"w": np.zeros(3, np.float32)}
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        ckpt.save(1, {"w": np.ones(3, np.float32)}, {"epoch": 1})
        ckpt.save(2, {"w": np.full(3, 2, np.float32)}, {"epoch": 2})
    for f in (tmp_path / "checkpoints" / "2" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[:10])
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        state, meta = ckpt.restore(like)
        assert ckpt.latest_step() == 1
    np.testing.assert_array_equal(state["w"], np.ones(3))
    assert meta == {"epoch": 1}
    assert "checkpoints/2 cannot be read" in capsys.readouterr().err
    (aside,) = os.listdir(tmp_path / "unreadable_checkpoints")  # kept, not deleted
    assert aside.startswith("2.") and not (tmp_path / "checkpoints" / "2").exists()
    for f in (tmp_path / "checkpoints" / "1" / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[:10])
    with (pytest.raises(UserError, match=r"checkpoints/1 cannot be read .*: it is damaged or "
                        r"does not fit this config; use a new --workdir"),
          checkpoint.Checkpointer(str(tmp_path), {}) as ckpt):
        ckpt.restore(like)


def _latest_fails_with(error: Exception, tmp_path, monkeypatch) -> None:
    """Checkpoints 1 and 2 in ``tmp_path``; reading 2 raises ``error``."""
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        ckpt.save(1, {"w": np.ones(3, np.float32)}, {"epoch": 1})
        ckpt.save(2, {"w": np.full(3, 2, np.float32)}, {"epoch": 2})
    real = ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):
        if step == 2:
            raise error
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)


@pytest.mark.parametrize("error", [
    OSError(errno.EMFILE, "Too many open files"), PermissionError(errno.EACCES, "denied"),
    MemoryError(), ValueError("RESOURCE_EXHAUSTED: out of memory reading chunk")])
def test_a_restore_that_fails_for_want_of_a_resource_moves_nothing(tmp_path, monkeypatch,
                                                                   error):
    """Running out of file handles or memory, or a permission error, while reading the
    latest checkpoint says so in one line and leaves it in place, though an older one
    would restore: it is not damage, and rerunning resumes from it."""
    _latest_fails_with(error, tmp_path, monkeypatch)
    with (pytest.raises(UserError, match=r"^checkpoint .*checkpoints/2 could not be read "
                        r"\(.*\), which is no sign of damage \(nothing was moved\): fix its "
                        r"cause and rerun the same command$"),
          checkpoint.Checkpointer(str(tmp_path), {}) as ckpt):
        ckpt.restore({"w": np.zeros(3, np.float32)})
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]
    assert not (tmp_path / "unreadable_checkpoints").exists()


def test_an_io_error_reading_a_checkpoint_counts_as_damage(tmp_path, monkeypatch, capsys):
    """EIO (a bad sector) will fail again on every rerun: the checkpoint is set aside and
    the one before it restored, as for a file cut short."""
    _latest_fails_with(OSError(errno.EIO, "Input/output error"), tmp_path, monkeypatch)
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        assert ckpt.restore({"w": np.zeros(3, np.float32)})[1] == {"epoch": 1}
    assert "checkpoints/2 cannot be read (OSError: [Errno 5]" in capsys.readouterr().err


def _read_closed_half_way() -> Exception:
    """What orbax's shard read raises when closed while it waits on tensorstore."""
    try:
        try:
            raise GeneratorExit
        except BaseException as e:
            raise Exception("Encountered error while reading array index: (slice(0, 3),). "
                            "See full TensorStore details: {...}.") from e
    except Exception as e:
        return e


def test_a_failed_restores_or_saves_abandoned_work_is_dropped_and_nothing_else(monkeypatch,
                                                                              tmp_path):
    """A failed restore, or a save that fills the disk, leaves tensorstore callbacks that
    raise "Event loop is closed", and shard reads closed half way that raise an error of
    their own, into ``sys.unraisablehook`` (a dozen tracebacks, timing-dependent, above the
    one line that explains the failure): from a Checkpointer's opening on, those are
    dropped, others reported."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint.Checkpointer(str(tmp_path), {}).close()
    checkpoint._quiet_closed_loops()  # once only: no chain of hooks
    read_failed = Exception("Encountered error while reading array index: (slice(0, 3),).")
    read_failed.__cause__ = OSError("disk")  # a read that failed, not one closed half way
    dropped = [RuntimeError("Event loop is closed"), _read_closed_half_way()]
    reported = [RuntimeError("something else"), read_failed]
    for e in dropped + reported:
        sys.unraisablehook(SimpleNamespace(exc_value=e))
    assert [u.exc_value for u in seen] == reported


def test_the_abandoned_metadata_reads_warning_is_dropped_and_no_other():
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        checkpoint._quiet_closed_loops()
        for name in ("Store._get_array_metadatas", "Store._get_array_metadatas_too", "other"):
            warnings.warn(f"coroutine '{name}' was never awaited", RuntimeWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == [
        "coroutine 'Store._get_array_metadatas_too' was never awaited",
        "coroutine 'other' was never awaited"]


def test_no_checkpoint_is_moved_aside_unless_an_older_one_restores(tmp_path):
    """Checkpoints that all fail alike (of another structure here; a passing I/O error would
    do the same) stay where they are, and the latest one's error is raised."""
    with checkpoint.Checkpointer(str(tmp_path), {}) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"w": np.full(3, step, np.float32)}, {"epoch": step})
    other = {"w": np.zeros(4, np.float32)}
    with (pytest.raises(UserError, match=r"checkpoints/3 cannot be read"),
          checkpoint.Checkpointer(str(tmp_path), {}) as ckpt):
        ckpt.restore(other)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]  # max_to_keep=2
    assert not (tmp_path / "unreadable_checkpoints").exists()


def test_discard_from_removes_that_step_and_later(tmp_path):
    with checkpoint.Checkpointer(str(tmp_path), {}, max_to_keep=3) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(step, {"w": np.zeros(3, np.float32)}, {})
        assert ckpt.discard_from(2) == 1
        assert ckpt.discard_from(1) is None


def test_a_run_of_the_other_binary_is_named_so(tmp_path):
    lm_like = {f"lm_{i}": i for i in range(8)} | {"seed": 0}
    with checkpoint.Checkpointer(str(tmp_path), lm_like) as ckpt:
        ckpt.save(1, {"w": np.zeros(1)}, {})
    with pytest.raises(UserError, match=r"holds a run of another kind of model \(.* and \d+ "
                       r"more\)"):
        checkpoint.Checkpointer(str(tmp_path), {f"cls_{i}": i for i in range(8)} | {"seed": 0})


def test_loading_the_best_parameters_writes_nothing_in_the_workdir(tmp_path):
    """Inference reads a copy holding only ``best/`` and the identity without adding to it."""
    with checkpoint.Checkpointer(str(tmp_path), {"name": "x"}) as ckpt:
        ckpt.save_best(3, {"w": np.ones(3, np.float32)}, {"dev": 0.5})
    shutil.rmtree(tmp_path / "checkpoints")
    os.remove(tmp_path / files.LOCK_FILE)
    params = checkpoint.load_best(str(tmp_path), {"name": "x"}, {"w": np.zeros(3, np.float32)},
                                  "after the first epoch")
    np.testing.assert_array_equal(params["w"], np.ones(3))
    assert sorted(os.listdir(tmp_path)) == ["best", "run_identity.json"]
