"""The PTB reproduction driver as a binary: bad input, report-only, recorded commands, a
failed run."""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from dense_rnn.data import ptb
from tests.conftest import REPO

XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def reproduce(*args, env=None):
    return subprocess.run([sys.executable, "-m", "experiments.reproduce_ptb", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def one_line_error(result, match):
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], result.stderr


def test_bad_input_is_one_error_line(tmp_path):
    one_line_error(reproduce("--parallel=0", f"--root={tmp_path}"), "--parallel=0")
    missing = tmp_path / "missing"
    one_line_error(reproduce("--report_only", f"--root={missing}"), f"--root={missing} does not")
    assert not missing.exists()
    one_line_error(reproduce("--configs=nope", f"--root={tmp_path}"), "known: zaremba_small")
    one_line_error(reproduce("--configs=tiny,tiny", f"--root={tmp_path}"),
                   "--configs=tiny,tiny names tiny twice; name each once")
    one_line_error(reproduce("--configs=", f"--root={tmp_path}"), "--configs= names nothing")
    one_line_error(reproduce("--report_only", f"--root={tmp_path}",
                             f"--report={missing}/t.md"), "directory does not exist")
    one_line_error(reproduce("stray"), "unexpected arguments 'stray'")
    one_line_error(reproduce(f"--root={tmp_path}", f"--data_dir={missing}"),
                   f"--data_dir={missing} does not exist")
    assert not missing.exists() and not (tmp_path / "zaremba_small").exists()
    one_line_error(reproduce(f"--root={tmp_path}", "--configs=zaremba_small",
                             "--extra=--config=tiny,--dry_run"),
                   "--extra=--config=tiny: the driver sets --config for each run itself")
    one_line_error(reproduce(f"--root={tmp_path}", "--configs=tiny,zaremba_small",
                             "--extra=--max_stepz=3"),  # parsed once, before any run starts
                   "--extra=--max_stepz=3: Unknown command line flag 'max_stepz'")
    assert os.listdir(tmp_path) == []
    one_line_error(reproduce("--report_only", f"--root={tmp_path}", f"--report={tmp_path}"),
                   f"--report={tmp_path} is a directory; give a file path")
    (tmp_path / "file").write_text("")
    one_line_error(reproduce(f"--root={tmp_path / 'file'}"), "is a file; give a directory")


def test_report_only_prints_the_finished_runs_and_writes_nothing(tmp_path):
    (tmp_path / "zaremba_small").mkdir()
    (tmp_path / "zaremba_small" / "summary.json").write_text(json.dumps({
        "num_params": 4651600, "epochs_completed": 13, "best_valid_ppl": 118.4,
        "test_ppl": 115.04, "train_tokens_per_second": 12345.6, "wall_seconds": 600.0,
        "device": "cpu"}))
    r = reproduce("--report_only", f"--root={tmp_path}", "--configs=zaremba_small,zaremba_medium")
    assert r.returncode == 0, r.stderr
    assert ("| zaremba_small | 4,651,600 | 5M | 13 | 118.4 | 115.0 | 120.7 | 114.5 | 12,346 "
            "| 10.0 min | cpu |") in r.stdout
    assert "| zaremba_medium | | 20M | not run |" in r.stdout
    assert os.listdir(tmp_path) == ["zaremba_small"]
    (tmp_path / "zaremba_small" / "command.txt").write_text("python -m experiments.ptb_lm\n")
    rec = tmp_path.parent / f"{tmp_path.name}_rec"
    r2 = reproduce("--report_only", f"--root={tmp_path}", "--configs=zaremba_small,zaremba_medium",
                   f"--record={rec}")
    assert sorted(os.listdir(rec / "zaremba_small")) == ["command.txt", "summary.json"]
    assert os.listdir(rec) == ["zaremba_small"]  # runs that have not finished: nothing
    again = reproduce("--report_only", f"--root={rec}", "--configs=zaremba_small,zaremba_medium")
    assert again.stdout == r2.stdout == r.stdout
    (tmp_path / "zaremba_medium" / "checkpoints" / "700").mkdir(parents=True)  # training
    r3 = reproduce("--report_only", f"--root={tmp_path}", "--configs=zaremba_medium")
    assert "| zaremba_medium | | 20M | unfinished |" in r3.stdout


def test_runs_record_a_runnable_command_line(tmp_path):
    root = tmp_path / "runs"
    r = reproduce(f"--root={root}", "--configs=tiny", "--extra=--dry_run,--hidden_size=32",
                  "--extra=--num_layers=3", env={"XLA_FLAGS": XLA_FLAGS})
    # a dry run trains nothing: exit 0 without a summary.json is not a finished run
    assert r.returncode == 2 and "tiny (exit 0 without a summary.json)" in r.stderr, r.stderr
    assert "failed tiny (exit 0 without a summary.json" in r.stdout
    command = (root / "tiny" / "command.txt").read_text()
    assert command == (f"XLA_FLAGS='{XLA_FLAGS}' python -m experiments.ptb_lm --config=tiny "
                       f"--dry_run --hidden_size=32 --num_layers=3 --workdir={root / 'tiny'}\n")
    assert shlex.split(command)[:4] == [f"XLA_FLAGS={XLA_FLAGS}", "python", "-m",
                                        "experiments.ptb_lm"]
    log = (root / "tiny" / "train.log").read_text()
    assert "num_params=" in log and "hidden_size=32" in log and "num_layers=3" in log
    assert "| tiny | |" in (root / "table1.md").read_text()


def test_a_failed_run_is_reported_with_its_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = reproduce(f"--root={tmp_path}", "--configs=tiny", f"--data_dir={empty}")
    log = tmp_path / "tiny" / "train.log"
    assert (f"failed tiny (exit 2: error: PTB file {empty}/ptb.train.txt does not exist; pass "
            f"--data_dir=DIR holding ptb.train.txt, ptb.valid.txt and ptb.test.txt "
            f"({ptb.WHERE}); its log: {log})") in r.stdout
    one_line_error(r, "1 run(s) did not finish: tiny (exit 2)")


def test_a_damaged_summary_is_one_error_line(tmp_path):
    (tmp_path / "zaremba_small").mkdir()
    (tmp_path / "zaremba_small" / "summary.json").write_text('{"num_params": 46')
    one_line_error(reproduce("--report_only", f"--root={tmp_path}", "--configs=zaremba_small"),
                   f"{tmp_path / 'zaremba_small' / 'summary.json'} is not a run summary")
    (tmp_path / "zaremba_small" / "summary.json").write_text('{"num_params": 46}')
    one_line_error(reproduce("--report_only", f"--root={tmp_path}", "--configs=zaremba_small"),
                   "summary.json is not a run summary (no epochs_completed, best_valid_ppl, ")


def test_bad_input_of_one_run_fails_that_run_alone(tmp_path):
    """A run whose start raises ``UserError`` (a sweep's damaged summary, say) is reported
    as failed; the others run."""
    from dense_rnn.errors import UserError
    from experiments import runner

    def start(name):
        if name == "bad":
            raise UserError("its sweep's summary.json is damaged")
        return None  # finished already

    failed = runner.run_all(str(tmp_path), ["bad", "good"], start, parallel=1)
    assert failed == ["bad (not started: its sweep's summary.json is damaged)"]


def test_a_run_stops_with_a_checkpoint_when_its_driver_is_killed_outright(data_dir, tmp_path):
    """SIGKILL to a driver (the OOM killer, say): its runs get SIGTERM, checkpoint and exit,
    and the driver's rerun resumes them; not orphans training on in a locked workdir."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    driver = subprocess.Popen(
        [sys.executable, "-m", "experiments.reproduce_ptb", "--configs=tiny",
         f"--root={tmp_path}", f"--data_dir={os.path.join(data_dir, 'ptb')}",
         "--extra=--max_epochs=40,--log_every_steps=100"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = tmp_path / "tiny" / "train.log"
    for _ in range(600):  # until the run has trained a few steps
        if log.exists() and " step " in log.read_text():
            break
        time.sleep(0.1)
    driver.kill()
    driver.wait()
    for _ in range(600):
        if "terminated: stopped at step" in log.read_text():
            break
        time.sleep(0.1)
    assert "terminated: stopped at step" in log.read_text(), log.read_text()[-500:]

