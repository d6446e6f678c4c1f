"""The ptb_lm binary end to end: outputs, exact resume after a kill, bad input."""

import dataclasses
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from dense_rnn import cli
from dense_rnn.configs.ptb import CONFIGS
from dense_rnn.data import ptb
from dense_rnn.errors import UserError
from dense_rnn.train import lm
from tests.conftest import REPO

TINY = dict(vocab_size=60, max_epochs=2, log_every_steps=50, checkpoint_every_steps=40)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A synthetic PTB-format corpus of 50 word types."""
    d = tmp_path_factory.mktemp("ptb")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(49)] + ["<unk>"]
    for split, n in [("train", 300), ("valid", 60), ("test", 60)]:
        lines = [" " + " ".join(rng.choice(words, rng.integers(3, 12))) + " " for _ in range(n)]
        (d / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return str(d)


def run_binary(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "experiments.ptb_lm", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def latest_params(workdir):
    mngr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
    step = mngr.latest_step()
    out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    return step, jax.tree.map(np.asarray, out.state["params"])


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


def tiny(**kw):
    return dataclasses.replace(CONFIGS["tiny"], **{**TINY, **kw})


@pytest.fixture
def scripted(monkeypatch):
    """``scripted(*ppls)``: ``lm.evaluate`` returns these perplexities in turn (validations
    and test alike); what is left of them comes back, to check they were all asked for."""
    def script(*values: float) -> list[float]:
        queue = list(values)
        monkeypatch.setattr(lm, "evaluate", lambda *a, **k: queue.pop(0))
        return queue

    return script


def test_a_mid_epoch_stop_does_not_move_early_stoppings_baseline(corpus_dir, tmp_path,
                                                                  scripted):
    """A run stopped mid-epoch by --max_steps validates there, and that validation may be
    its best; extended, the run early-stops as the run without the stop does: each epoch's
    end is compared with the epochs' ends before it."""
    c = tiny(max_epochs=5, early_stopping_patience=1)
    streams = ptb.batchify(ptb.load_ptb(corpus_dir).train, c.batch_size)
    steps = ptb.num_windows(streams, c.num_steps, drop_remainder=True)  # an epoch's
    left = scripted(10.0, 9.5, 9.6, 50.0)  # valid at each epoch's end, then test
    full = lm.train_and_evaluate(c, corpus_dir, str(tmp_path / "full"), log=lambda s: None)
    assert not left and full["epochs_completed"] == 3  # early-stopped: epoch 3 no better
    left = scripted(10.0, 9.0, 50.0)  # epoch 1's end, the stop in epoch 2, test
    first = lm.train_and_evaluate(dataclasses.replace(c, max_steps=steps + steps // 2),
                                  corpus_dir, str(tmp_path / "split"), log=lambda s: None)
    assert not left and first["best_valid_ppl"] == 9.0
    left = scripted(9.5, 9.6, 50.0)
    resumed = lm.train_and_evaluate(c, corpus_dir, str(tmp_path / "split"), log=lambda s: None)
    assert not left and resumed["epochs_completed"] == 3  # 9.5 improved on epoch 1's 10.0
    assert resumed["best_valid_ppl"] == 9.0  # the stop's validation stays a candidate


def test_the_lm_learns_what_only_its_recurrence_can_carry(tmp_path):
    """A corpus where each word is, 9 times in 10, a fixed function of the word two back:
    the current word (which the dense softmax layer reads directly) says nothing of the
    next, so a perplexity well under the vocabulary's 20 needs the LSTM's memory."""
    rng = np.random.default_rng(0)
    perm = rng.permutation(20)
    for split, n in [("train", 20000), ("valid", 2000), ("test", 2000)]:
        ids = [0, 1]
        for _ in range(n):
            ids.append(perm[ids[-2]] if rng.random() < 0.9 else rng.integers(20))
        (tmp_path / f"ptb.{split}.txt").write_text(" ".join(f"w{i}" for i in ids) + "\n")
    c = tiny(vocab_size=21, max_steps=400, max_epochs=100, checkpoint_every_steps=0)
    summary = lm.train_and_evaluate(c, str(tmp_path), str(tmp_path / "w"), log=lambda s: None,
                                    check_sizes=False)
    assert summary["test_ppl"] < 8  # a model without memory: ~20


def test_train_outputs_and_exact_resume(corpus_dir, tmp_path):
    """Stopped in epoch 1 and resumed, a run ends bit for bit where the run without the stop
    does, past a learning-rate decay (after epoch 1: the schedule's step is resumed too)."""
    c = tiny(max_steps=130, max_epochs=3, decay_after_epochs=1, lr_decay=0.5)
    steps = ptb.num_windows(ptb.batchify(ptb.load_ptb(corpus_dir).train, c.batch_size),
                            c.num_steps, drop_remainder=True)
    assert 70 < steps < 130  # the stop in epoch 1, the decay before the end
    full = lm.train_and_evaluate(c, corpus_dir, str(tmp_path / "full"), log=lambda s: None)
    lm.train_and_evaluate(dataclasses.replace(c, max_steps=70), corpus_dir,
                          str(tmp_path / "split"), log=lambda s: None)
    lines = []
    resumed = lm.train_and_evaluate(c, corpus_dir, str(tmp_path / "split"), log=lines.append)
    assert f"resumed from {tmp_path}/split/checkpoints/70 at epoch 1 step 70/" in lines[0]
    lines.clear()  # the full run again: nothing to train, says so, reports the same results
    again = lm.train_and_evaluate(c, corpus_dir, str(tmp_path / "full"), log=lines.append)
    assert lines[0] == (f"{tmp_path}/full holds a finished run (step 130; "
                        "--max_steps=130 reached; a larger value trains on): nothing to train, "
                        "reporting its results")
    assert again["test_ppl"] == full["test_ppl"] and again["steps"] == 130
    # asked again with a smaller budget, it still records the budget it trained to
    smaller = lm.train_and_evaluate(dataclasses.replace(c, max_steps=20, max_epochs=1),
                                    corpus_dir, str(tmp_path / "full"), log=lambda s: None)
    assert (smaller["config"]["max_steps"], smaller["config"]["max_epochs"]) == (130, 3)
    assert smaller["config"] == full["config"] and smaller["test_ppl"] == full["test_ppl"]
    step_a, a = latest_params(tmp_path / "full")
    step_b, b = latest_params(tmp_path / "split")
    assert step_a == step_b == 130
    assert_bitwise_equal(a, b)
    assert resumed["steps"] == full["steps"] == 130
    for key in [
        "num_params",
        "best_valid_ppl",
        "test_ppl",
        "epochs_completed",
        "steps",
        "train_tokens_per_second",
        "wall_seconds",
        "device",
        "versions",
    ]:
        assert key in full
    assert np.isfinite(full["test_ppl"]) and full["test_ppl"] < 60
    for f in ["summary.json", "metrics.jsonl", "curves.png", "tensorboard"]:
        assert os.path.exists(tmp_path / "full" / f)
    records = read_records(tmp_path / "full")
    assert records[0]["epoch"] == 1 and [r["step"] for r in records][-1] == 130
    # The split run stopped mid-epoch 1 at step 70: its epoch-1 train ppl still covers it all.
    split = read_records(tmp_path / "split")
    assert [r["step"] for r in split] == [70, *(r["step"] for r in records)]
    assert split[1]["valid_ppl"] == records[0]["valid_ppl"]
    assert split[1]["train_ppl"] == records[0]["train_ppl"]  # summed step by step, both


def test_a_mid_epoch_stop_reports_its_fractional_best_epoch(corpus_dir, tmp_path):
    lines = []
    lm.train_and_evaluate(tiny(max_steps=30), corpus_dir, str(tmp_path), log=lines.append)
    (record,) = read_records(tmp_path)
    with open(tmp_path / "summary.json") as f:
        best_epoch = json.load(f)["best_epoch"]
    assert 0 < best_epoch == record["epoch"] < 1
    assert f"epoch {best_epoch})" in lines[-1]


def read_records(workdir):
    return [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl"))]


def test_rerunning_a_finished_run_trains_no_more(corpus_dir, tmp_path):
    workdir = str(tmp_path / "w")
    first = lm.train_and_evaluate(tiny(max_steps=40), corpus_dir, workdir, log=lambda s: None)
    step, before = latest_params(workdir)
    records = read_records(workdir)
    again = lm.train_and_evaluate(tiny(max_steps=40), corpus_dir, workdir, log=lambda s: None)
    step_after, after = latest_params(workdir)
    assert step_after == step == again["steps"] == first["steps"] == 40
    assert_bitwise_equal(before, after)
    assert read_records(workdir) == records and len(records) == 1
    assert again["test_ppl"] == first["test_ppl"]


def test_binary_caches_its_compiled_steps_and_records_its_command(corpus_dir, tmp_path):
    """By default a binary writes its compiled steps to ~/.cache/dense_rnn/jax (here under
    XDG_CACHE_HOME; the tests' session cache is taken away for this run); its summary
    records the command line that reruns it, with the user's XLA_FLAGS."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    args = ["--config=tiny", "--vocab_size=60", f"--data_dir={corpus_dir}",
            f"--workdir={tmp_path / 'w'}", "--max_steps=3"]
    r = subprocess.run([sys.executable, "-m", "experiments.ptb_lm", *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert os.listdir(tmp_path / "cache" / "dense_rnn" / "jax")
    with open(tmp_path / "w" / "summary.json") as f:
        assert json.load(f)["command"] == shlex.join(
            ["XLA_FLAGS=--xla_cpu_multi_thread_eigen=false", "python", "-m",
             "experiments.ptb_lm", *args])


def test_perplexity_overflows_to_inf():
    assert lm.perplexity(1.0) == pytest.approx(np.e)
    assert lm.perplexity(800.0) == np.inf


def test_killed_run_resumes_exactly(corpus_dir, tmp_path):
    """SIGKILL in the middle of training, rerun: same parameters as an uninterrupted run."""
    args = [
        f"--data_dir={corpus_dir}",
        "--config=tiny",
        "--vocab_size=60",
        "--max_epochs=1",
        "--checkpoint_every_steps=20",
        "--log_every_steps=1000",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.ptb_lm", f"--workdir={tmp_path / 'killed'}", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpts = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (
        ckpts.exists() and any(p.name.isdigit() and int(p.name) >= 40 for p in ckpts.iterdir())
    ):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    done = run_binary(f"--workdir={tmp_path / 'killed'}", *args)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stdout
    lm.train_and_evaluate(
        tiny(max_epochs=1, checkpoint_every_steps=20, log_every_steps=1000),
        corpus_dir,
        str(tmp_path / "clean"),
        log=lambda s: None,
    )
    step_a, a = latest_params(tmp_path / "killed")
    step_b, b = latest_params(tmp_path / "clean")
    assert step_a == step_b > 40
    assert_bitwise_equal(a, b)
    assert read_records(tmp_path / "killed") == read_records(tmp_path / "clean")


@pytest.mark.parametrize("sig, said, status", [
    (signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)],
    ids=lambda v: getattr(v, "name", None))
def test_ctrl_c_checkpoints_the_step_and_says_how_to_resume(corpus_dir, tmp_path, sig, said,
                                                            status):
    """SIGINT (Ctrl-C) or SIGTERM (a preempted machine) mid-run: the run saves the step it
    is on, says so in one line (after the line that acknowledges the request), exits with
    128 + the signal's number, and resumes from that step."""
    args = [f"--workdir={tmp_path}", f"--data_dir={corpus_dir}", "--config=tiny",
            "--vocab_size=60", "--max_epochs=1", "--checkpoint_every_steps=5",
            "--log_every_steps=1000"]
    proc = subprocess.Popen([sys.executable, "-m", "experiments.ptb_lm", *args], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ckpts = tmp_path / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (
        ckpts.exists() and any(p.name.isdigit() and int(p.name) >= 10 for p in ckpts.iterdir())
    ):
        time.sleep(0.01)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == status, stderr
    acknowledged, last = stderr.strip().splitlines()
    assert acknowledged == (cli.STOPPING if sig == signal.SIGINT else cli.TERMINATING)
    step = int(last.removeprefix(f"{said}: stopped at step ").split(",")[0])
    assert last == (f"{said}: stopped at step {step}, checkpoint saved; "
                    f"{cli.RESUME_HINT} from there")
    assert str(step) in {p.name for p in ckpts.iterdir()}
    assert all(p.name.isdigit() for p in ckpts.iterdir())  # no orbax temporary left
    again = run_binary(*args)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {tmp_path}/checkpoints/{step} at epoch 1 step {step}/" in again.stdout


def one_line_error(result, match):
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], result.stderr


def test_dry_run_reads_no_data():
    r = run_binary("--config=godin_dense_200x4", "--data_dir=/nonexistent", "--dry_run")
    assert r.returncode == 0
    assert "num_params=14253200" in r.stdout.splitlines()
    assert "connectivity=dense" in r.stdout.splitlines()
    one_line_error(run_binary("--dry_run", "--compute_dtype=float16"),
                   "--compute_dtype=float16: use one of float32, bfloat16")


def test_a_bad_flag_or_value_is_one_error_line():
    one_line_error(run_binary("--max_steps=abc"), "flag --max_steps=abc: invalid literal")
    one_line_error(run_binary("--bogus=1"), "Unknown command line flag 'bogus'")
    one_line_error(run_binary("--mode=sampel"), "value should be one of <train|sample|score>")
    one_line_error(run_binary("--workdir="), "flag --workdir=: an empty path; give one")
    one_line_error(run_binary("--config=tiny", "--seed=9223372036854775808"),
                   "config tiny: seed=9223372036854775808 must be in [0, 2**63)")


def test_hub_data_and_a_data_dir_are_refused_together():
    one_line_error(run_binary("--config=tiny", "--hf_dataset=ptb_text_only", "--data_dir=x"),
                   "--hf_dataset names the data (a hub dataset or a local dataset "
                   "directory), so it takes no --data_dir")


def test_a_mode_refuses_the_flags_it_would_ignore():
    """Inference reads the trained run's config: a training flag there is an error, as is
    one mode's flag in another (``--seed`` picks the sampled words)."""
    one_line_error(run_binary("--mode=sample", "--learning_rate=1", "--seed=3", "--dry_run"),
                   "--mode=sample draws words from the trained run in --workdir, as it was "
                   "configured, so it takes no --dry_run, --learning_rate; drop them")
    one_line_error(run_binary("--mode=score", "--prompt=the", "--seed=3"),
                   "takes no --seed, --prompt; drop them")
    one_line_error(run_binary("--text_file=s.txt"), "--mode=train trains, so it takes no "
                   "--text_file; drop it")


def test_bad_inputs(corpus_dir, tmp_path):
    one_line_error(run_binary("--config=nope"), "known configs: zaremba_small")
    one_line_error(
        run_binary(
            "--config=tiny", f"--data_dir={tmp_path / 'missing'}", f"--workdir={tmp_path / 'w0'}"
        ),
        "does not exist",
    )
    one_line_error(
        run_binary(
            "--config=tiny",
            f"--data_dir={corpus_dir}",
            "--vocab_size=20",
            f"--workdir={tmp_path / 'w1'}",
        ),
        "pass --vocab_size=51",
    )


def test_a_checkpoint_cut_short_is_one_warning_line_and_the_run_resumes(tmp_path):
    """The latest checkpoint's files cut short: one warning (no tracebacks of orbax's
    callbacks left pending) and the run goes on from the checkpoint before."""
    data, workdir = tmp_path / "ptb", tmp_path / "w"
    data.mkdir()  # a vocabulary of thousands of words: arrays of several chunks each
    words = np.random.default_rng(0).integers(0, 3000, 6000).astype(str)
    for split in ("train", "valid", "test"):
        (data / f"ptb.{split}.txt").write_text(" ".join(words) + " <unk>\n")
    common = ["--config=tiny", f"--data_dir={data}", f"--workdir={workdir}",
              "--max_epochs=1", "--checkpoint_every_steps=20"]
    assert run_binary(*common, "--max_steps=40").returncode == 0
    for f in (workdir / "checkpoints" / "40" / "state" / "d").iterdir():  # the array data
        f.write_bytes(f.read_bytes()[:100])
    r = run_binary(*common, "--max_steps=60")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "Event loop is closed" not in r.stderr
    (warning,) = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert "checkpoints/40 cannot be read" in warning and "resuming from checkpoint 20" in warning


def test_other_config_and_nan_keep_the_checkpoint(corpus_dir, tmp_path):
    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_steps=40), corpus_dir, workdir, log=lambda s: None)
    step, before = latest_params(workdir)
    common = [f"--data_dir={corpus_dir}", f"--workdir={workdir}", "--vocab_size=60"]
    one_line_error(run_binary("--config=godin_dense_200x2", *common), "another config")
    one_line_error(
        run_binary(
            "--config=tiny",
            *common,
            "--max_steps=80",
            "--max_epochs=2",
            "--learning_rate=1e30",
            "--max_grad_norm=1e30",
        ),
        f"loss is nan at step {step + 2}; resume from the last good checkpoint "
        f"({workdir}/checkpoints/{step};",
    )  # step S + 1 ran on the checkpoint's weights, finite; its update made S + 2's nan
    step_after, after = latest_params(workdir)
    assert step_after == step
    assert_bitwise_equal(before, after)


def test_resume_on_other_data_of_the_same_vocabulary_refused(corpus_dir, tmp_path):
    """A corpus with the same words and training length but other text (here: the
    validation lines reversed) is refused on resume, naming the split; the run's corpus
    resumes."""
    import shutil

    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_steps=40), corpus_dir, workdir, log=lambda s: None)
    other = tmp_path / "other"
    shutil.copytree(corpus_dir, other)
    lines = (other / "ptb.valid.txt").read_text().splitlines()
    (other / "ptb.valid.txt").write_text("\n".join(lines[::-1]) + "\n")
    with pytest.raises(UserError, match=r"w was trained on other data \(its data_fingerprint"
                       r".json differs in the valid split\(s\)\); pass the run's --data_dir"):
        lm.train_and_evaluate(tiny(max_steps=80), str(other), workdir, log=lambda s: None)
    lm.train_and_evaluate(tiny(max_steps=80), corpus_dir, workdir, log=lambda s: None)


def test_an_infinite_validation_perplexity_stops_the_run(corpus_dir, tmp_path, monkeypatch):
    """A loss finite but too large for exp() (walked off to 1e11) is a diverged run too:
    no summary with an infinite perplexity, no best checkpoint of it."""
    monkeypatch.setattr(lm, "evaluate", lambda *args: float("inf"))
    with pytest.raises(UserError, match=r"^validation perplexity is inf after step 3; no "
                       r"checkpoint from before it is left"):
        lm.train_and_evaluate(tiny(max_steps=3), corpus_dir, str(tmp_path / "w"),
                              log=lambda s: None)
    assert not os.path.exists(tmp_path / "w" / "summary.json")
    assert not os.listdir(tmp_path / "w" / "best")


def test_a_loss_diverged_before_any_good_checkpoint_leaves_none(corpus_dir, tmp_path):
    """Checkpoints of weights whose loss was not finite are removed: the rerun with a lower
    learning rate starts over instead of resuming diverged weights."""
    common = ["--config=tiny", f"--data_dir={corpus_dir}", f"--workdir={tmp_path / 'w'}",
              "--vocab_size=60", "--checkpoint_every_steps=1", "--max_steps=6"]
    one_line_error(run_binary(*common, "--learning_rate=1e38", "--max_grad_norm=3e38"),
                   "at step 2; no checkpoint from before it is left")
    assert not os.listdir(tmp_path / "w" / "checkpoints")
    r = run_binary(*common)
    assert r.returncode == 0, r.stderr
    assert "resumed" not in r.stdout and "test ppl" in r.stdout


def test_bad_workdirs_and_files(corpus_dir, tmp_path):
    # A run that fails before its first checkpoint leaves its workdir free for any config.
    w = tmp_path / "w"
    one_line_error(run_binary("--config=tiny", f"--data_dir={tmp_path / 'missing'}",
                              f"--workdir={w}"), "does not exist")
    assert not (w / "run_identity.json").exists()
    (tmp_path / "file").write_text("x")
    one_line_error(run_binary("--config=tiny", f"--data_dir={corpus_dir}",
                              f"--workdir={tmp_path / 'file'}"),
                   f"--workdir={tmp_path / 'file'} is a file, not a directory; give a directory")
    cv = tmp_path / "cv"  # a classifier's CV root: the LM's summary.json would replace its
    (cv / "fold_0").mkdir(parents=True)
    (cv / "fold_0" / "run_identity.json").write_text("{}")
    one_line_error(run_binary("--config=tiny", f"--data_dir={corpus_dir}", f"--workdir={cv}"),
                   f"{cv} holds other runs in fold_0 (a classifier's folds or sweep")
    bad = tmp_path / "bad_identity"
    (bad / "checkpoints" / "40").mkdir(parents=True)  # a complete checkpoint: it binds
    (bad / "run_identity.json").write_text("{not json")
    one_line_error(run_binary("--config=tiny", f"--data_dir={corpus_dir}", f"--workdir={bad}"),
                   "run_identity.json is unreadable")
    # Binary bytes far past the start of a split file.
    data = tmp_path / "binary_tail"
    data.mkdir()
    for split in ("train", "valid", "test"):
        text = open(os.path.join(corpus_dir, f"ptb.{split}.txt"), "rb").read()
        (data / f"ptb.{split}.txt").write_bytes(text * 60 + (b"\xff\xfe\x00" * 10
                                                            if split == "test" else b""))
    one_line_error(run_binary("--config=tiny", f"--data_dir={data}",
                              f"--workdir={tmp_path / 'w2'}"), "is not UTF-8 text")


def test_resume_on_another_corpus_is_refused(corpus_dir, tmp_path):
    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_steps=40), corpus_dir, workdir, log=lambda s: None)
    other = tmp_path / "other"
    other.mkdir()
    for split in ("train", "valid", "test"):
        text = open(os.path.join(corpus_dir, f"ptb.{split}.txt")).read()
        (other / f"ptb.{split}.txt").write_text(text.replace("w1 ", "v1 "))
    one_line_error(run_binary("--config=tiny", f"--data_dir={other}", f"--workdir={workdir}",
                              "--vocab_size=60", "--max_steps=80"), "trained on another corpus")


def test_resume_on_a_shorter_training_split_is_refused(corpus_dir, tmp_path):
    """The same vocabulary from half the text (every count halved): the resumed run would
    start past the end of its epoch."""
    double = tmp_path / "double"
    double.mkdir()
    for split in ("train", "valid", "test"):
        text = open(os.path.join(corpus_dir, f"ptb.{split}.txt")).read()
        (double / f"ptb.{split}.txt").write_text(text * (2 if split == "train" else 1))
    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_steps=40), str(double), workdir, log=lambda s: None)
    with pytest.raises(UserError, match=r"trained on another training split \(\d+ steps per "
                                        r"epoch, this one gives \d+\)"):
        lm.train_and_evaluate(tiny(max_steps=80), corpus_dir, workdir, log=lambda s: None)


def test_a_changed_patience_applies_on_resume(corpus_dir, tmp_path, monkeypatch):
    ppl = iter(range(100, 1000))  # every evaluation worse than the one before
    monkeypatch.setattr(lm, "evaluate", lambda *a, **k: float(next(ppl)))
    workdir = str(tmp_path / "w")
    first = lm.train_and_evaluate(tiny(max_epochs=5, early_stopping_patience=1), corpus_dir,
                                  workdir, log=lambda s: None)
    assert first["epochs_completed"] == 2  # epoch 2 did not improve on epoch 1
    lines = []
    again = lm.train_and_evaluate(tiny(max_epochs=5, early_stopping_patience=2), corpus_dir,
                                  workdir, log=lines.append)
    assert again["epochs_completed"] == 3 and lines[0].startswith("resumed from")


def test_a_changed_eval_batch_size_is_another_config(corpus_dir, tmp_path):
    """The validation streams follow the eval batch: the resumed run's validations would be
    compared with a best measured on other streams."""
    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_steps=20), corpus_dir, workdir, log=lambda s: None)
    with pytest.raises(UserError, match=r"another config \(eval_batch_size: 2 -> 1\)"):
        lm.train_and_evaluate(tiny(max_steps=40, eval_batch_size=1), corpus_dir, workdir,
                              log=lambda s: None)
    # a run of a version that did not store it resumes, under any eval batch
    path = os.path.join(workdir, "run_identity.json")
    with open(path) as f:
        stored = json.load(f)
    del stored["eval_batch_size"]
    with open(path, "w") as f:
        json.dump(stored, f)
    resumed = lm.train_and_evaluate(tiny(max_steps=40, eval_batch_size=1), corpus_dir,
                                    workdir, log=lambda s: None)
    assert resumed["steps"] == 40


def test_an_eval_batch_too_large_for_a_split_fails_before_training(corpus_dir, tmp_path):
    with pytest.raises(UserError, match=r"^the valid split of \d+ tokens is too short for "
                       r"batch size 1000: each of the 1000 streams needs 2 tokens; lower "
                       r"--eval_batch_size$"):
        lm.train_and_evaluate(tiny(eval_batch_size=1000), corpus_dir, str(tmp_path),
                              log=lambda s: None)
    assert not os.path.exists(tmp_path / "metrics.jsonl")
    with pytest.raises(UserError, match=r"^the training split .* lower --batch_size$"):
        lm.train_and_evaluate(tiny(batch_size=100_000), corpus_dir, str(tmp_path / "b"),
                              log=lambda s: None)


@pytest.mark.parametrize("more_epochs", [True, False])
def test_unreadable_best_parameters_are_chosen_anew(corpus_dir, tmp_path, capsys, more_epochs):
    """Best parameters cut short are reported and set aside when the run resumes: a run
    with epochs to go picks its best from their validations; a finished one lets its latest
    parameters stand for the best. Either way the summary is whole and names them."""
    workdir = str(tmp_path / "w")
    lm.train_and_evaluate(tiny(max_epochs=2), corpus_dir, workdir, log=lambda s: None)
    for f in (tmp_path / "w" / "best").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(f.read_bytes()[:10])
    lines = []
    summary = lm.train_and_evaluate(tiny(max_epochs=3 if more_epochs else 2), corpus_dir,
                                    workdir, log=lines.append)
    assert "best checkpoint" in capsys.readouterr().err
    assert any(d.startswith("best.") for d in os.listdir(tmp_path / "w" / "unreadable_checkpoints"))
    assert summary["best_epoch"] == (3 if more_epochs else 2)
    assert type(summary["best_epoch"]) is int
    latest_stands = "no best checkpoint is left: the latest parameters stand for the best"
    assert (latest_stands in lines) is not more_epochs  # else epoch 3's validation chose
    assert math.isfinite(summary["best_valid_ppl"]) and math.isfinite(summary["test_ppl"])
    again = lm.train_and_evaluate(tiny(max_epochs=3 if more_epochs else 2), corpus_dir,
                                  workdir, log=lambda s: None)  # consistent from now on
    assert (again["best_epoch"], again["best_valid_ppl"], again["test_ppl"]) == (
        summary["best_epoch"], summary["best_valid_ppl"], summary["test_ppl"])


def test_a_best_that_is_gone_is_not_reported(corpus_dir, tmp_path, scripted):
    """A progress record naming a best checkpoint that is no longer there (deleted, or gone
    with a damaged latest checkpoint that saved it) does not stand: the finished run's
    latest parameters stand for the best, and the summary reports their validation."""
    import shutil

    workdir = str(tmp_path / "w")
    left = scripted(9.0, 10.0, 50.0)  # epoch 1's validation is the best, then test
    first = lm.train_and_evaluate(tiny(max_epochs=2), corpus_dir, workdir, log=lambda s: None)
    assert not left and (first["best_epoch"], first["best_valid_ppl"]) == (1, 9.0)
    shutil.rmtree(tmp_path / "w" / "best")
    lines, left = [], scripted(10.0, 51.0)  # the latest parameters' validation, then test
    summary = lm.train_and_evaluate(tiny(max_epochs=2), corpus_dir, workdir, log=lines.append)
    assert not left and "no best checkpoint is left: the latest parameters stand for the best" in (
        lines)
    assert (summary["best_epoch"], summary["best_valid_ppl"], summary["test_ppl"]) == (
        2, 10.0, 51.0)
