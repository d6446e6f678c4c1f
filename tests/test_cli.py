"""The binaries' shared entry point: one-line errors, and Ctrl-C / SIGTERM as a request to
stop that the training loops answer with a checkpoint."""

import gc
import logging
import os
import signal
import subprocess
import sys

import jax
import pytest

from dense_rnn import cli
from dense_rnn.errors import Interrupted, UserError
from tests.conftest import REPO


def test_a_signal_asks_to_stop_and_a_second_ctrl_c_interrupts_at_once(capsys):
    """With the garbage collector off while the second Ctrl-C lands: a ``KeyboardInterrupt``
    raised inside JAX's collection callback would be swallowed (``cli._exit_at_once``)."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with cli.stop_on_signals() as should_stop:
        assert not should_stop()
        os.kill(os.getpid(), signal.SIGTERM)
        assert should_stop()
        assert capsys.readouterr().err == cli.TERMINATING + "\n"
        gc.disable()
        try:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        finally:
            gc.enable()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("sig, line, status", [
    (signal.SIGINT, "interrupted", 130), (signal.SIGTERM, "terminated", 143)],
    ids=lambda v: getattr(v, "name", None))
def test_a_loop_stopped_by_a_signal_exits_with_its_status(capsys, sig, line, status):
    """The stop the loop raises leaves ``stop_on_signals`` with the signal that asked for
    it: SIGTERM's exit status is 143 and its line says so."""
    def train():
        with cli.stop_on_signals() as should_stop:
            os.kill(os.getpid(), sig)
            assert should_stop()
            raise Interrupted(7)

    with pytest.raises(SystemExit) as e:
        cli._one_line_errors(train)
    assert e.value.code == status
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{line}: stopped at step 7, checkpoint saved; {cli.RESUME_HINT} from there")


@pytest.mark.parametrize("error, status, line", [
    (UserError("bad flag"), 2, "error: bad flag"),
    (Interrupted(40), 130,
     f"interrupted: stopped at step 40, checkpoint saved; {cli.RESUME_HINT} from there"),
    (KeyboardInterrupt(), 130, "interrupted"),
])
def test_errors_and_interrupts_end_in_one_line(capsys, error, status, line):
    def fail():
        raise error

    with pytest.raises(SystemExit) as e:
        cli._one_line_errors(fail)
    assert e.value.code == status
    assert capsys.readouterr().err == line + "\n"


def test_output_into_a_closed_pipe_ends_quietly(capsys, monkeypatch):
    """``--mode=sample | head``: stdout's reader leaves; no traceback, the shell's status,
    and stdout pointed at /dev/null for the interpreter's last flush."""
    read, write = os.pipe()
    os.close(read)
    moved = []
    monkeypatch.setattr(os, "dup2", lambda fd, to: moved.append(to))
    monkeypatch.setattr(sys.stdout, "fileno", lambda: 1, raising=False)

    def emit():
        os.write(write, b"word ")  # as print into the closed pipe raises

    with pytest.raises(SystemExit) as e:
        cli._one_line_errors(emit)
    os.close(write)
    assert e.value.code == 128 + signal.SIGPIPE
    assert capsys.readouterr().err == "" and moved == [1]


@pytest.mark.parametrize(("raise_", "where"), [
    ("raise OSError(errno.ENOSPC, 'No space left on device', '/w/run_identity.json')",
     " writing /w/run_identity.json"),
    ("raise RuntimeError('saving failed') from ValueError('RESOURCE_EXHAUSTED: Error writing "
     "in OCDBT database at local file \"/w/checkpoints/10.orbax-checkpoint-tmp/\": Failed "
     "to write 379631 bytes to file 8: No space left on device')",
     " writing /w/checkpoints/10.orbax-checkpoint-tmp/"),
])
def test_a_full_disk_is_one_line_saying_the_run_resumes(raise_, where):
    """Whether the binary's own write or the checkpoint library's fails (its error chained
    or in its message): one line, exit status 2, and nothing of the library's pending writes
    on the way out."""
    code = (f"import errno\nfrom dense_rnn import cli\ndef f():\n    {raise_}\n"
            "cli._one_line_errors(f)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"error: no space left on device{where}; free some space and rerun "
                        "the same command (a training run resumes from its last complete "
                        "checkpoint)\n")


def test_running_out_of_device_memory_is_one_line_saying_how_to_share(capsys):
    """XLA's allocation failure (seen with several training runs on one GPU, each taking 75%
    of its memory up front): one line naming the device and the fix, exit status 2."""
    def fail():
        raise jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: : CUDA_ERROR_OUT_OF_MEMORY: out of memory "
            "[executable_name='jit_init']\nmore")

    with pytest.raises(SystemExit) as e:
        cli._one_line_errors(fail)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"error: out of memory on {jax.devices()[0].device_kind}: CUDA_ERROR_OUT_OF_MEMORY: "
        "out of memory [executable_name='jit_init']; if other processes share the device, "
        "start each with XLA_PYTHON_CLIENT_PREALLOCATE=false")


def test_other_exceptions_keep_their_traceback():
    with pytest.raises(ZeroDivisionError):
        cli._one_line_errors(lambda: 1 / 0)


def test_the_checkpoint_librarys_tracebacks_are_left_out():
    """They repeat, with a traceback, an error the binary reports in one line; its other
    error lines, and everyone else's tracebacks, stay."""
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        exc_info = sys.exc_info()
    orbax = "/site-packages/orbax/checkpoint/_src/futures/future.py"
    record = logging.LogRecord("absl", logging.ERROR, orbax, 387, "raised", None, exc_info)
    assert not cli._not_the_checkpoint_library(record)
    record.exc_info = None
    assert cli._not_the_checkpoint_library(record)
    record.pathname, record.exc_info = "/site-packages/jax/_src/xla_bridge.py", exc_info
    assert cli._not_the_checkpoint_library(record)


def test_ctrl_c_before_training_exits_at_once_in_one_line():
    """Outside a training loop Ctrl-C ends the binary at once: no traceback, and not lost in
    a callback that swallows ``KeyboardInterrupt`` (JAX's garbage-collection one)."""
    code = ("import time; from dense_rnn import cli\n"
            "def run():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "cli.run_binary(run)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err == f"interrupted; {cli.INTERRUPTED_HINT}\n"


def test_path_flags_expand_home_and_refuse_an_empty_path(monkeypatch):
    """``--workdir=~/x`` is left alone by the shell; ``--workdir=$UNSET`` is empty."""
    from absl import flags

    from dense_rnn.configs.flags import define_path

    values = flags.FlagValues()
    define_path("where", None, "a path", flag_values=values)
    monkeypatch.setenv("HOME", "/home/someone")
    values(["prog", "--where=~/runs/a"])
    assert values.where == "/home/someone/runs/a"
    with pytest.raises(flags.IllegalFlagValueError, match="an empty path; give one"):
        values(["prog", "--where="])


def test_a_workdir_with_a_bracket_is_refused_before_anything_is_written(tmp_path):
    """Orbax reads '[' in a checkpoint's path as a glob pattern: its saves there could
    not be read back."""
    from dense_rnn.train import checkpoint

    with pytest.raises(UserError, match=r"reads '\[' in a path as a pattern"):
        checkpoint.Checkpointer(str(tmp_path / "run[1]"), {"config": "x"})
    assert not (tmp_path / "run[1]").exists()
