"""The benchmark suite runs: the --quick path on its smallest workload, FLOP counts, and the
peers compute the same function as the library models they are timed against (the lax.scan
ports, and the GPU-only cuDNN LM through JAX's reference of cuDNN's LSTM)."""

import dataclasses
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import rnn

from benchmarks import ab, binary, flops, peers, profile, run, workloads
from dense_rnn import precision, stack
from dense_rnn.configs import ptb
from dense_rnn.dense_block import DenseRecurrent
from dense_rnn.errors import UserError
from dense_rnn.train import classify, lm
from tests.conftest import REPO


def test_quick_path_runs_a_tiny_workload(capsys):
    results = run.main(["--quick", "--workloads", "tiny_lm", "--repeats", "1",
                        "--min_time", "0.01", "--impls", "flax nn.RNN"])
    (res,) = results
    impls = {r["impl"]: r for r in res["rows"]}
    assert {"ours", "flax nn.RNN", "gemm xla"} <= set(impls)
    assert impls["ours"]["ours_x"] == 1.0 and impls["ours"]["rate"] > 0
    assert impls["ours"]["warmup_steps"] >= run.MIN_WARMUP_STEPS  # no repeat runs cold
    out = capsys.readouterr().out
    assert "| tiny train" in out and "| ours vs flax nn.RNN (>= 1.3) |" in out


@pytest.mark.parametrize("parallel", [  # one after another: ~15 s, and the slower path
    pytest.param(["--no-parallel_builds"], marks=pytest.mark.slow), []])
def test_isolated_times_each_implementation_in_its_own_process(capsys, parallel):
    (res,) = run.main(["--quick", "--workloads", "tiny_lm", "--repeats", "2", "--min_time",
                       "0.01", "--impls", "flax nn.RNN", "--isolated", "--warmup", "0.05",
                       *parallel])
    impls = {r["impl"]: r for r in res["rows"]}
    assert {"ours", "flax nn.RNN", "gemm xla"} <= set(impls)
    assert impls["ours"]["ours_x"] == 1.0 and impls["flax nn.RNN"]["rate"] > 0
    assert impls["ours"]["warmup_steps"] >= 2  # the workers warmed up for 0.05 s
    for name, r in impls.items():  # JAX's compile time; PyTorch compiles nothing
        assert r["compile_s"] is None if "torch" in name else 0 < r["compile_s"] <= r["setup_s"]
        assert r["xla_compile_s"] is None if "torch" in name else (
            0 < r["xla_compile_s"] < r["compile_s"])


def run_with_variant(monkeypatch, variant, flag):
    """``run.main`` on tiny_lm with ``flag`` (timing stubbed): the variant's worker builds
    ours' step and is timed beside ours alone (``--impls ours``); its rows by impl."""
    w = run.build_workload("tiny_lm", variant)  # what its worker and probe build
    assert w.impls[variant] is w.impls["ours"]
    calls = []
    monkeypatch.setattr(run, "time_isolated", lambda *a: calls.append(a) or {
        n: {"times": [1.0], "compile_s": None, "setup_s": 0.0} for n in a[1]})
    (res,) = run.main(["--workloads", "tiny_lm", "--repeats", "1", "--impls", "ours",
                       "--no-memory", flag])
    assert variant in calls[0][1] and "flax nn.RNN" not in calls[0][1]
    assert [v for v in run.VARIANTS if v in calls[0][1]] == [variant]
    return {r["impl"]: r for r in res["rows"]}


def test_the_triton_peer_is_ours_under_xla_flags_of_its_own(monkeypatch):
    """A worker of its own, with Triton GEMM on before the user's XLA flags, timed beside
    ours (the suite's isolated timing is tested above), its flags recorded on its row."""
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false --xla_dump_to=/x")
    monkeypatch.setenv("DENSE_RNN_ADDED_XLA_FLAGS", "--xla_gpu_enable_triton_gemm=false")
    env = run.worker_env(run.TRITON)
    assert env["XLA_FLAGS"] == "--xla_gpu_enable_triton_gemm=true --xla_dump_to=/x"
    assert "DENSE_RNN_ADDED_XLA_FLAGS" not in env  # in that worker, all of them are the user's
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.delenv("DENSE_RNN_ADDED_XLA_FLAGS")
    impls = run_with_variant(monkeypatch, run.TRITON, "--triton_peer")
    assert impls[run.TRITON]["xla_flags"] == "--xla_gpu_enable_triton_gemm=true"
    assert "xla_flags" not in impls["ours"]


@pytest.mark.parametrize("variant, flag, variable", [
    (run.XLA_PRODUCTS, "--xla_products_peer", "DENSE_RNN_BLAS"),
    (run.XLA_SCANS, "--xla_scans_peer", "DENSE_RNN_LSTM_KERNEL")])
def test_the_xla_peers_are_ours_without_a_kernel(monkeypatch, variant, flag, variable):
    """``--xla_products_peer`` / ``--xla_scans_peer``: ours' builder in a worker with one
    of the C++ kernels off, recorded on its row."""
    assert run.worker_env(variant)[variable] == "off"
    impls = run_with_variant(monkeypatch, variant, flag)
    assert impls[variant][variable.lower()] == "off"
    if variant == run.XLA_SCANS:  # the dense-block kernel's scans too
        assert impls[variant]["dense_rnn_dense_kernel"] == "off"
    with pytest.raises(SystemExit):
        run.main(["--workloads", "tiny_lm", "--no-isolated", flag])


@pytest.mark.parametrize("flags", ["--xla_gpu_enable_triton_gemm=true", "/tmp/xla_flags"])
def test_the_triton_peer_refuses_xla_flags_that_set_it(monkeypatch, capsys, flags):
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.delenv("DENSE_RNN_ADDED_XLA_FLAGS", raising=False)
    with pytest.raises(SystemExit):
        run.main(["--workloads", "tiny_lm", "--triton_peer"])
    assert "must neither set it nor name a file of flags" in capsys.readouterr().err


def test_a_full_run_isolates_each_implementation_by_default(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(run, "time_isolated", lambda *a: calls.append(a) or {
        n: {"times": [1.0], "compile_s": None, "setup_s": 0.0} for n in a[1]})
    run.main(["--workloads", "tiny_lm", "--repeats", "1", "--no-memory", "--out", str(tmp_path)])
    assert calls and calls[0][0] == "tiny_lm" and calls[0][5] is True  # built side by side
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["isolated"] is res["parallel_builds"] is True
    assert res["builds_timed_alone"] is False  # no probes: the side-by-side build times
    assert "*: compile and build times measured with the workload's other builds" in (
        tmp_path / "table.md").read_text()
    run.main(["--workloads", "tiny_lm", "--repeats", "1", "--no-memory", "--no-parallel_builds",
              "--out", str(tmp_path)])
    assert calls[1][5] is False
    assert json.loads((tmp_path / "results.json").read_text())["builds_timed_alone"] is True


def test_results_record_the_cpus_matrix_extensions(monkeypatch, tmp_path):
    """Machines with one model name differ in AMX and AVX-512; results.json says which."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some Xeon\n"
                       "flags\t\t: fpu avx2 fma avx512f amx_bf16 amx_tile\n\n"
                       "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(
        cpuinfo if f == "/proc/cpuinfo" else f, *a, **k))
    assert run.cpu_info() == ("Some Xeon", ["avx2", "fma", "avx512f", "amx_tile", "amx_bf16"])
    env = run.environment()
    assert env["cpu"] == "Some Xeon" and env["cpu_features"][-1] == "amx_bf16"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
                       "model\t\t: 2\nmodel name\t: AMD EPYC\nflags\t\t: avx2 avx512f\n")
    assert run.cpu_info()[0] == "AMD EPYC (family 26, model 2)"  # the generation, by number
    assert env["cpus_usable"] == len(os.sched_getaffinity(0))  # XLA's thread count


def test_the_memory_probe_measures_a_fresh_process():
    mem = run.peak_memory("tiny_lm", "ours")
    assert mem["rss_mb"] > 0  # and the build's times, built alone
    assert 0 < mem["xla_compile_s"] < mem["compile_s"] <= mem["setup_s"]
    assert (mem["device_mb"] is None) == (jax.default_backend() != "gpu")  # a CPU: RSS only
    row = {"rss_mb": 512.4, "device_mb": 2048.0}
    assert run._memory(row) == "512 (GPU 2,048)" and run._memory({**mem, "rss_mb": 7}) == "7"


@pytest.mark.parametrize(("returncode", "stdout"), [(1, ""), (0, ""), (0, "stray\n"),
                                                    (0, "[1, 2]\n")])
def test_a_memory_probe_without_a_reply_is_a_failure_not_a_crash(monkeypatch, capsys,
                                                                  returncode, stdout):
    """A probe that fails, or exits 0 without its JSON reply line, leaves the row's memory
    empty and says so; the run (and the workload's timings) go on."""
    monkeypatch.setattr(run.subprocess, "run", lambda *a, **k: SimpleNamespace(
        returncode=returncode, stdout=stdout, stderr="some error"))
    assert run.peak_memory("tiny_lm", "ours") == {}
    assert "memory probe tiny_lm/ours failed: some error" in capsys.readouterr().err


def test_ours_x_is_the_median_paired_ratio_with_its_range():
    w = SimpleNamespace(flops=1e9, gemm_flops=1e9, items=100)
    timings = {  # a drift that slows both alike cancels in the paired ratios
        "ours": {"times": [1.0, 2.0, 1.0], "compile_s": 1.0, "setup_s": 2.0},
        "flax nn.RNN": {"times": [1.2, 2.6, 1.1], "compile_s": 1.0, "setup_s": 2.0},
        "gemm xla": {"times": [0.5, 0.5, 0.5], "compile_s": 0.1, "setup_s": 0.2},
    }
    rows = {r["impl"]: r for r in run.summarise(w, timings)}
    assert rows["flax nn.RNN"]["ours_x"] == pytest.approx(1.2)  # paired: 1.2, 1.3, 1.1
    assert rows["flax nn.RNN"]["ours_x_range"] == pytest.approx((1.1, 1.3))
    assert rows["ours"]["ours_x"] == 1.0 and rows["gemm xla"]["ours_x"] is None
    assert "| 1.20 (1.10-1.30) |" in run.markdown([{"workload": "w", "unit": "tok/s",
                                                    "rows": list(rows.values())}])
    # % GEMM pairs each repeat with the faster roofline of that repeat
    timings["gemm torch"] = {"times": [0.4, 1.0, 0.6], "compile_s": None, "setup_s": 0.1}
    rows = {r["impl"]: r for r in run.summarise(w, timings)}
    assert rows["ours"]["gemm_frac"] == pytest.approx(0.4)  # 1/2.5, 0.5/2, 1/2 (GFLOP/s)
    assert rows["ours"]["gemm_frac_range"] == pytest.approx((0.25, 0.5))
    assert rows["gemm xla"]["gemm_frac"] == pytest.approx(1.0)  # 0.8, 1, 1
    assert rows["ours"]["times_ms"] == pytest.approx([1e3, 2e3, 1e3])


def test_a_bare_lstm_stack_runs_its_peers_and_has_no_lm_targets():
    w = workloads.WORKLOADS["zaremba_small_stack"]()
    assert not w.lm and workloads.WORKLOADS["zaremba_small"]().lm
    # forward, d(input) and d(weight) of two layers' input and recurrent products (200 units)
    assert w.flops == 3 * 2 * (2 * 400 * 200 * 800 * 2) and w.items == 400
    for name in ("ours", "flax nn.RNN"):
        w.impls[name]()()  # built, and one step run
    rows = [{"impl": "ours", "ours_x": 1.0, "gemm_frac": 0.9},
            {"impl": "flax nn.RNN", "ours_x": 2.0, "gemm_frac": None}]
    table = run.targets_markdown([{"workload": w.name, "unit": w.unit, "lm": w.lm,
                                   "rows": rows}], gpu=False)
    assert table.splitlines()[2] == f"| {w.name} | 2.00 | 90.0% |"  # unmarked


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_a_dense_layer_alone_runs_its_port_which_computes_the_layer(cell):
    w = workloads.dense_layer_workload(cell, 4, 9, 12, k=2, inputs=7)
    g = {"gru": 3, "lstm": 4}[cell] * 12
    # forward, d(input) and d(weight) of the input projection and the recurrent products
    assert not w.lm and w.items == 36 and w.flops == 3 * (2 * 36 * 7 * g + 2 * 36 * 12 * g)
    for name in ("ours", workloads.PORT):
        w.impls[name]()()  # built, and one step run
    layer = DenseRecurrent(cell, 12, 2)
    x = jax.random.normal(jax.random.key(0), (4, 9, 7))
    variables = layer.init(jax.random.key(1), x)
    np.testing.assert_allclose(peers.dense_layer_port(cell, 2)(variables, x)[1],
                               layer.apply(variables, x)[1], rtol=1e-5, atol=1e-6)


def test_without_a_roofline_no_row_has_a_gemm_fraction():
    w = SimpleNamespace(flops=1e9, gemm_flops=1e9, items=100)
    rows = run.summarise(w, {"ours": {"times": [1.0, 2.0], "compile_s": 1.0, "setup_s": 1.0},
                             "gemm xla": {"error": "RuntimeError: x"}})
    assert rows[0]["gemm_frac"] is None and rows[0]["ours_x"] == 1.0
    res = {"workload": "w", "unit": "tok/s", "rows": rows}
    assert "| 1.00 (1.00-1.00) | 0.7 | — |" in run.markdown([res])
    assert run.targets_markdown([res], gpu=False).splitlines()[2] == "| w | — |"


def test_each_implementation_warms_up_before_it_is_timed():
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.005)

    w = SimpleNamespace(impls={"ours": lambda: step})
    _, out = run.build_steps(w, min_time=0.05, warmup=0.1)
    warm = out["ours"]["warmup_steps"]
    assert warm >= 10 and len(calls) == 1 + warm  # the first step builds, then >= 0.1 s
    assert 5 <= out["ours"]["iters"] <= 10  # a set of ~0.05 s of ~5-10 ms steps
    calls.clear()
    assert run.build_steps(w, min_time=0.05)[1]["ours"]["warmup_steps"] == 1 == len(calls) - 1
    # a step slower than the warm-up time still gets MIN_WARMUP_STEPS of them
    assert run.build_steps(w, min_time=0.05, warmup=1e-4)[1]["ours"]["warmup_steps"] == (
        run.MIN_WARMUP_STEPS)


def test_a_peer_that_fails_is_left_out_with_its_error_and_results_are_kept(tmp_path,
                                                                          monkeypatch):
    def broken() -> None:
        raise RuntimeError("no cuDNN kernel\ndetails")

    tiny = workloads.WORKLOADS["tiny_lm"]
    monkeypatch.setitem(workloads.WORKLOADS, "tiny_lm", lambda: dataclasses.replace(
        tiny(), impls={**tiny().impls, "jax cuDNN rnn.lstm": broken}))
    (res,) = run.main(["--workloads", "tiny_lm", "--repeats", "1", "--min_time", "0.01",
                       "--impls", "jax cuDNN rnn.lstm", "--no-memory", "--no-isolated",
                       "--out", str(tmp_path)])
    assert res["not_timed"] == {"jax cuDNN rnn.lstm": "RuntimeError: no cuDNN kernel"}
    impls = {r["impl"] for r in res["rows"]}
    assert "ours" in impls and "jax cuDNN rnn.lstm" not in impls
    assert "| jax cuDNN rnn.lstm | not timed: RuntimeError: no cuDNN kernel |" in (
        tmp_path / "table.md").read_text()
    assert (tmp_path / "results.json").exists()  # written after each workload


def test_a_peer_failing_in_a_timed_set_is_left_out_and_the_others_are_timed(capsys):
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) > 2:  # the first step and the warm-up's pass; a timed set fails
            raise RuntimeError("out of memory")

    w = SimpleNamespace(name="w", impls={"ours": lambda: lambda: None, "peer": lambda: flaky})
    out = run.time_workload(w, repeats=3, min_time=0.001)
    assert out["peer"] == {"error": "RuntimeError: out of memory"}
    assert len(out["ours"]["times"]) == 3 and "w: peer not timed" in capsys.readouterr().err


class _BrokenPipe(io.StringIO):
    """A pipe to a process that has exited: flushing or closing it with data raises."""

    def flush(self) -> None:
        if self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")

    def close(self) -> None:
        self.flush()


class _FakeWorker:
    """A ``--serve`` worker that answers its build report and ``sets`` timed sets, then
    dies (its pipe closes); with ``sets=None`` it dies while building. With ``broken``, a
    worker of ``sets=0`` has died before its first set and its stdin is broken, as a real
    pipe to a dead process is."""

    broken = False

    def __init__(self, sets: int | None):
        info = {"compile_s": None, "xla_compile_s": None, "setup_s": 0.0, "iters": 1}
        self.stdout = io.StringIO("" if sets is None else
                                  json.dumps(info) + "\n" + "0.5\n" * sets)
        self.stdin = _BrokenPipe() if self.broken and sets == 0 else io.StringIO()

    def wait(self) -> int:
        return -9

    def kill(self) -> None:
        pass


def test_a_peer_whose_worker_dies_is_left_out_and_ours_dying_is_an_error(monkeypatch, capsys):
    sets = {"ours": 3, "peer": 1}
    monkeypatch.setattr(run.subprocess, "Popen", lambda args, **_: _FakeWorker(sets[args[5]]))
    out = run.time_isolated("w", ["ours", "peer"], repeats=3, min_time=0.01)
    assert out["peer"] == {"error": "UserError: the peer worker exited (status -9) before "
                                    "replying"}
    assert out["ours"]["times"] == [0.5, 0.5, 0.5]
    assert "w: peer not timed" in capsys.readouterr().err
    sets = {"ours": 1, "peer": 3}
    with pytest.raises(UserError, match="the ours worker exited"):
        run.time_isolated("w", ["ours", "peer"], repeats=3, min_time=0.01)
    sets = {"ours": 3, "peer": None}
    for parallel in (False, True):
        out = run.time_isolated("w", ["ours", "peer"], 2, 0.01, parallel=parallel)
        assert "exited (status -9)" in out["peer"]["error"] and len(out["ours"]["times"]) == 2
    monkeypatch.setattr(_FakeWorker, "broken", True)  # its pipe breaks, as a real one does
    sets = {"ours": 3, "peer": 0}
    assert "BrokenPipeError" in run.time_isolated("w", ["ours", "peer"], 3, 0.01)["peer"][
        "error"]
    sets = {"ours": 0, "peer": 3}  # ours dies: one UserError, its pipe's error swallowed
    with pytest.raises(UserError, match="the ours worker stopped answering .BrokenPipeError"):
        run.time_isolated("w", ["ours", "peer"], 3, 0.01)


def test_a_worker_printing_to_stdout_keeps_its_replies_apart():
    """Whatever a worker's libraries print to stdout, Python's or C's, goes to stderr; its
    replies alone reach ``Workers``."""
    code = ("import os; from benchmarks import run; r = run.own_stdout(); print('stray'); "
            "os.write(1, b'from C\\n'); print('0.5', file=r, flush=True)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout == "0.5\n" and "stray\nfrom C\n" in out.stderr


def test_a_peer_whose_reply_is_not_a_number_is_left_out(monkeypatch):
    class Chatty(_FakeWorker):
        def __init__(self, sets: int | None):
            super().__init__(sets)
            self.stdout = io.StringIO(self.stdout.getvalue().replace("0.5", "hello", 1))

    sets = {"ours": 2, "peer": 2}
    monkeypatch.setattr(run.subprocess, "Popen",
                        lambda args, **_: (Chatty if args[5] == "peer" else _FakeWorker)(
                            sets[args[5]]))
    out = run.time_isolated("w", ["ours", "peer"], repeats=2, min_time=0.01)
    assert out["peer"]["error"].startswith("ValueError") and out["ours"]["times"] == [0.5, 0.5]


def test_ab_says_which_version_failed(monkeypatch):
    monkeypatch.setattr(run, "time_workload", lambda *a: {"base": {"error": "ValueError: x"},
                                                          "new": {"times": [1.0]}})
    with pytest.raises(UserError, match="tiny_lm: the base version failed .ValueError: x."):
        ab.compare("tiny_lm", {"tiny_lm": workloads.WORKLOADS["tiny_lm"]}, 1, 0.01)


def test_profiling_the_pytorch_peer_without_pytorch_is_a_usage_error(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else find_spec(name, *a))
    with pytest.raises(SystemExit) as e:
        profile.main(["tiny_lm", "--impl", "torch nn.LSTM"])
    assert e.value.code == 2 and "needs PyTorch, which is not installed" in (
        capsys.readouterr().err)


def test_an_isolated_worker_replies_with_its_peers_error(monkeypatch, capsys):
    def broken() -> None:
        raise RuntimeError("no cuDNN kernel")

    tiny = workloads.WORKLOADS["tiny_lm"]
    monkeypatch.setitem(workloads.WORKLOADS, "tiny_lm", lambda: dataclasses.replace(
        tiny(), impls={"jax cuDNN rnn.lstm": broken}))
    run.serve("tiny_lm", "jax cuDNN rnn.lstm", 0.01)  # replies, then reads no stdin
    out = capsys.readouterr()
    assert out.out == '{"error": "RuntimeError: no cuDNN kernel"}\n'
    assert "not timed" in out.err


@pytest.mark.parametrize("main, args, message", [
    (run.main, "--workloads tiny_lm --impls flax",
     "unknown implementations flax for these workloads; known: "),
    (run.main, "--workloads tiny_lm --repeats 0", "argument --repeats: 0 must be at least 1"),
    (run.main, "--workloads tiny_lm --repeats 2.5", "argument --repeats: '2.5' is not an integer"),
    (run.main, "--workloads tiny_lm --min_time -1", "argument --min_time: -1 must be a finite"),
    (run.main, "--workloads tiny_lm --min_time nan", "argument --min_time: nan must be a finite"),
    (run.main, "--workloads tiny_lm --min_time inf", "argument --min_time: inf must be a finite"),
    (run.main, "--workloads tiny_lm --min_time x", "argument --min_time: 'x' is not a number"),
    (run.main, "--workloads tiny_lm --warmup -1", "argument --warmup: -1 must be a finite number, "
                                                 "0 or above"),
    (run.main, f"--workloads tiny_lm --out {__file__}", "is a file; give a directory"),
    (run.main, "--workloads tiny_lm --parallel_builds --no-isolated", "drop --no-isolated"),
    (run.main, "--workloads tiny_lm --triton_peer --quick", "drop --no-isolated (or --quick)"),
    (binary.main, "tiny --steps 0", "argument --steps: 0 must be at least 1"),
    (binary.main, "tiny --log_every 0", "argument --log_every: 0 must be at least 1"),
    (binary.main, "tiny --binary_flags=--config=zaremba_small", "--config=zaremba_small cannot"),
    (binary.main, "tiny --binary_flags=--mode=sample", "--mode=sample cannot be given there"),
    (profile.main, "tiny_lm --top 0", "argument --top: 0 must be at least 1"),
    (profile.main, "tiny_lm --warmup -1", "argument --warmup: -1 must be a finite number"),
    (ab.main, "tiny_lm --min_time 0", "argument --min_time: 0 must be a finite number above 0"),
])
def test_bad_options_are_usage_errors(capsys, main, args, message):
    with pytest.raises(SystemExit) as e:
        main(args.split())
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_profile_runs_on_a_roofline_row():
    assert "fastest step" in profile.main(["tiny_lm", "--impl", "gemm xla", "--steps", "1",
                                                 "--warmup", "0"])


def test_trainers_and_benchmarks_import_without_datasets_or_tensorboardx():
    """A GPU image with JAX, Flax and PyTorch but neither package runs the suite as is."""
    code = ("import sys; sys.modules['datasets'] = sys.modules['tensorboardX'] = None; "
            "import benchmarks.run, benchmarks.workloads, dense_rnn.train.classify, "
            "dense_rnn.train.lm")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def _python(code: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_isolated_pytorch_worker_keeps_openmps_default_policy():
    """Also after the entry point re-executes itself (fast malloc) with the suite's settings
    in its environment; a policy the user set is kept."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", run._SUITE_SET, run._OMP_DEFAULT)}
    as_reexecuted = json.loads(_python(
        "import os, json, benchmarks.run; print(json.dumps(dict(os.environ)))", clean))
    policy = ("import json, benchmarks.run as r; print(json.dumps({i: r.worker_env(i).get("
              "'OMP_WAIT_POLICY') for i in ['torch nn.LSTM', 'flax nn.RNN']}))")
    for env in (clean, as_reexecuted):
        assert json.loads(_python(policy, env)) == {"torch nn.LSTM": None,
                                                    "flax nn.RNN": "PASSIVE"}
    worker = json.loads(_python(
        "import os, json, benchmarks.run as r; print(json.dumps(r.worker_env('torch nn.LSTM')))",
        as_reexecuted))
    assert _python("import os, benchmarks.run; print(os.environ.get('OMP_WAIT_POLICY'))",
                   worker) == "None"  # the worker does not set it again on import
    user = {**clean, "OMP_WAIT_POLICY": "ACTIVE"}
    assert json.loads(_python(policy, user)) == {"torch nn.LSTM": "ACTIVE",
                                                 "flax nn.RNN": "ACTIVE"}


def test_the_binary_runs_without_the_suites_own_settings():
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "XLA_PYTHON_CLIENT_PREALLOCATE", run._SUITE_SET)}
    code = "import json, benchmarks.run as r; print(json.dumps(r.user_env()))"
    env = json.loads(_python(code, clean))
    assert "OMP_WAIT_POLICY" not in env and "XLA_PYTHON_CLIENT_PREALLOCATE" not in env
    user = json.loads(_python(code, {**clean, "OMP_WAIT_POLICY": "ACTIVE"}))
    assert user["OMP_WAIT_POLICY"] == "ACTIVE"


def test_an_unknown_workload_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        run.main(["--workloads", "zaremba_small,zaremba_smal"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: unknown workloads zaremba_smal; known: zaremba_small," in err


def test_targets_table_marks_what_meets_issue_5s_targets(monkeypatch):
    def rows(**ratios):
        return [{"impl": "ours", "ours_x": 1.0, "gemm_frac": ratios.pop("gemm")},
                *({"impl": k.replace("_", " "), "ours_x": v} for k, v in ratios.items())]

    results = [
        {"workload": "lm", "unit": "tok/s",
         "rows": rows(gemm=0.85, **{"torch_nn.LSTM": 0.99, "flax_nn.RNN": 1.31})},
        {"workload": "clf", "unit": "ex/s",
         "rows": rows(gemm=0.9, **{"lax.scan_port": 1.6, "flax_nn.RNN": 1.8})},
    ]
    header, _, lm_row, clf_row, _, caption = run.targets_markdown(results, gpu=False).splitlines()
    assert header.split(" | ")[1:4] == ["ours vs torch nn.LSTM (>= 1.0)",
                                        "ours vs flax nn.RNN (>= 1.3)",
                                        "ours vs lax.scan port (>= 1.5)"]
    assert lm_row == "| lm | 0.99 | **1.31** |  | **85.0%** |"
    # a classifier: the port's target only; its stock-peer ratio and % GEMM are unmarked
    assert clf_row == "| clf |  | 1.80 | **1.60** | 90.0% |"
    assert caption.startswith("Bold: meets issue #5's target")
    gpu_header = run.targets_markdown(results, gpu=True).splitlines()[0]
    assert "ours vs torch nn.LSTM (>= 0.8)" in gpu_header  # cuDNN's LSTM on a GPU
    # on a CPU, Flax's bfloat16 step is slower than its float32 one: its ratio is not counted
    name = workloads.lm_workload("tiny", dtype="bfloat16").name  # "tiny train B=.. bfloat16"
    bf16 = [{"workload": name, "unit": "tok/s", "rows": rows(gemm=0.5, **{
        "torch_nn.LSTM": 1.1, "flax_nn.RNN": 2.5})}]
    cpu_table = run.targets_markdown(bf16, gpu=False).splitlines()
    assert cpu_table[2] == f"| {name} | **1.10** | 2.50 | 50.0% |"
    assert "bfloat16 ratios are not counted" in cpu_table[-1]
    assert "bfloat16 ratios" not in caption  # no bfloat16 workload in that table
    assert run.targets_markdown(bf16, gpu=True).splitlines()[2] == (
        f"| {name} | **1.10** | **2.50** | 50.0% |")
    assert "PASSIVE" not in caption
    monkeypatch.setenv(run._SUITE_SET, "OMP_WAIT_POLICY")  # the suite set PyTorch's policy
    assert "flatter ours" in run.targets_markdown(results, False, isolated=False)
    no_torch = [{**r, "rows": [x for x in r["rows"] if "torch" not in x["impl"]]}
                for r in results]  # PyTorch not installed: nothing ran under the policy
    assert "PASSIVE" not in run.targets_markdown(no_torch, False, isolated=False)
    monkeypatch.setenv(run._SUITE_SET, "")  # the user's own: nothing to say of it
    assert "flatter ours" not in run.targets_markdown(results, False, isolated=False)
    # no peer with a target (--impls ours): the GEMM column alone, under its own header
    alone = run.targets_markdown([{**results[0], "rows": rows(gemm=0.85)}], False).splitlines()
    assert alone[:3] == ["| workload | % GEMM (>= 80% on LMs) |", "| --- | --- |",
                         "| lm | **85.0%** |"]


def test_profile_reports_kernels_of_a_tiny_workload(monkeypatch):
    monkeypatch.setenv("DENSE_RNN_LSTM_KERNEL", "off")  # the scans as XLA's kernels
    monkeypatch.setenv("DENSE_RNN_SOFTMAX_KERNEL", "off")  # and the softmax layer's products
    out = profile.main(["tiny_lm", "--steps", "2", "--min_ms", "0", "--warmup", "0"])
    assert out.startswith("step ms: ") and len(out.splitlines()[0].split()) == 4
    assert "fastest step" in out and "while" in out  # the LSTM scans are kernels too
    parts = out.split("time by part")[1].split("fastest step")[0]
    for part in ("softmax backward: products", "rnn/layer_0 forward, in scan: products",
                 "rnn/layer_1 backward, in scan", "outside the model"):
        assert part in parts


def test_profile_parts_from_op_names():
    assert profile.part("jit(step)/transpose(jvp(LM))/rnn/layer_0/while/body/closed_call/"
                        "dot_general") == "rnn/layer_0 backward, in scan: products"
    assert profile.part("jit(step)/jvp(LM)/embed/jit(_take)/gather") == "embed forward"
    assert profile.part("jit(step)/add").startswith("outside the model")
    assert profile.part("jit(step)/transpose(jvp(LM))/softmax/branch_0_fun/ffi_call") == (
        "softmax backward")  # a kernel chosen by jax.lax.platform_dependent
    assert profile.part("").startswith("no op_name")


def test_profile_reports_operators_of_the_torch_peer():
    pytest.importorskip("torch")
    out = profile.main(["tiny_lm", "--impl", "torch nn.LSTM", "--steps", "2", "--top", "5",
                        "--warmup", "0"])
    assert out.startswith("step ms: ") and len(out.splitlines()[0].split()) == 4
    assert "top 5 operators" in out and len(out.splitlines()) == 3 + 5


IN_GIT_CHECKOUT = os.path.isdir(os.path.join(os.path.dirname(__file__), "..", ".git"))


@pytest.mark.skipif(not IN_GIT_CHECKOUT, reason="benchmarks.ab exports a git revision")
def test_ab_times_a_revision_against_the_working_tree(capsys):
    (row,) = ab.main(["tiny_lm", "--base", "HEAD", "--repeats", "2", "--min_time", "0.01",
                      "--warmup", "0.01"])
    assert row["base"]["step_ms"] > 0 and row["new"]["step_ms"] > 0
    assert row["speedup"]["min"] <= row["speedup"]["median"] <= row["speedup"]["max"]
    assert "base/new" in capsys.readouterr().out
    with pytest.raises(UserError, match="--base=no-such-rev: git archive failed"):
        ab.main(["tiny_lm", "--base", "no-such-rev"])


@pytest.mark.slow  # the training binary in a process of its own, beside two workers: ~25 s
def test_binary_is_timed_against_the_implementations(tmp_path, capsys):
    words = [f"w{i}" for i in range(40)] + ["<unk>"]
    rng = np.random.default_rng(0)
    for split, n in [("train", 200), ("valid", 20), ("test", 20)]:
        text = "\n".join(" ".join(rng.choice(words, 8)) for _ in range(n))
        (tmp_path / f"ptb.{split}.txt").write_text(text + "\n")
    rates = binary.main(["tiny", "--steps", "20", "--log_every", "10", "--repeats", "2",
                         "--impls", "ours", "--min_time", "0.01", "--warmup", "0.01",
                         "--data_dir", str(tmp_path),
                         "--binary_flags=--checkpoint_every_steps=5"])
    assert len(rates["binary"]) == len(rates["ours"]) == 2 and min(rates["binary"]) > 0
    assert "| median |" in capsys.readouterr().out
    with pytest.raises(UserError, match="logged no rate"):
        binary.binary_rate("tiny", 5, 10, [f"--data_dir={tmp_path}"])
    with pytest.raises(UserError, match="--binary_flags: --vocab_size=60 would change"):
        binary.main(["tiny", "--binary_flags=--vocab_size=60 --seed=3"])


def test_binary_says_which_implementation_died(monkeypatch):
    class Dead:  # ours answers; the peer's worker has died (ours dying raises in Workers)
        info = {"ours": {}, "flax nn.RNN": {}}

        def __init__(self, *a, parallel: bool):
            assert parallel  # built side by side, as the suite builds them

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def time(self, name):
            if name == "ours":
                return 0.1
            self.info[name] = {"error": "UserError: the flax nn.RNN worker exited"}

    monkeypatch.setattr(run, "Workers", Dead)
    monkeypatch.setattr(binary, "binary_rate", lambda *a: 100.0)
    with pytest.raises(UserError, match="flax nn.RNN failed: UserError: the flax nn.RNN"):
        binary.main(["tiny", "--impls", "ours,flax nn.RNN", "--repeats", "1"])


def test_lm_flops_count_every_product():
    c = ptb.CONFIGS["zaremba_small"]  # embed = hidden = 200, 2 layers, V = 10k
    rows = 20 * 20
    lstm = 2 * (2 * rows * 200 * 800 + 2 * rows * 200 * 800)
    assert flops.lm_forward(c, 20, 20) == lstm + 2 * rows * 200 * 10_000
    dense = ptb.CONFIGS["godin_dense_200x2"]  # layer 2 reads [h1; e] = 400, softmax 600
    assert flops.lm_softmax_shape(dense, 20, 35) == (700, 600, 10_000)


def _batch(vocab, batch, time):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.integers(0, vocab, (batch, time), dtype=np.int32)),
            jnp.array([time, time // 2, 1, time - 1][:batch], jnp.int32))


@pytest.mark.parametrize("config,strided", [
    ("dc_bilstm_t4_dl5_dh10", False), ("hm_densegru_64", False), ("hm_densegru_64", True),
    ("hm_densernn_64", False), ("hm_denselstm_64", False), ("hm_denselstm_64", True)])
def test_ports_compute_the_models_function(config, strided):
    c, _ = classify.get_config(config)
    model = classify.make_model(c, 50, 3)
    params = classify.init_params(model, jax.random.key(0))
    a = c.model_args
    if a.get("net") == "hm":
        port = peers.hm_port(tuple(a["depths"]), strided, a["cell"])
    else:
        port = peers.dc_bilstm_port(0.0, 0.0, a["dl"] + 1)
    tokens, lengths = _batch(50, 4, 16)
    want = jax.jit(model.apply)({"params": params}, tokens, lengths)  # not op by op
    got = jax.jit(port.apply)({"params": params}, tokens, lengths)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _cudnn_layout(ours: dict, c: ptb.LMConfig) -> dict:
    """Our LM's parameters in the cuDNN peer's layout: each call's flat cuDNN vector holds
    ``w_ih^T``, ``w_hh^T``, ``b_ih = b`` and ``b_hh = 0`` where ``rnn.unpack_lstm_weights``
    reads them (found by unpacking the vector of positions)."""
    dense = c.connectivity == "dense"
    params = {"Embed_0": ours["embed"], "Dense_0": ours["softmax"]}
    for n, layers in enumerate(peers.cudnn_calls(c.num_layers, dense, c.dropout_rate)):
        first = layers[0]
        inputs = c.embed_size + first * c.hidden_size if dense or first == 0 else c.hidden_size
        params[f"lstm_{n}"] = _cudnn_vector([ours["rnn"][f"layer_{i}"] for i in layers],
                                            inputs, c.hidden_size)
    return params


def _cudnn_vector(layers: list[dict], inputs: int, hidden: int) -> jax.Array:
    """Our LSTM layers' weights as one ``rnn.lstm`` call's flat vector."""
    args = (inputs, hidden, len(layers))
    size = rnn.get_num_params_in_lstm(*args, False)
    where = rnn.unpack_lstm_weights(jnp.arange(size, dtype=jnp.float32), *args, False)
    flat = np.zeros(size, np.float32)
    for k, p in enumerate(layers):
        for pos, value in zip(where, (p["w_ih"].T, p["w_hh"].T, p["b"], 0.0), strict=True):
            flat[np.asarray(pos[k], int)] = value
    return jnp.asarray(flat)


def test_cudnn_stack_peer_computes_our_stack():
    """The stack workloads' GPU peer, on JAX's reference of cuDNN's LSTM and given our
    weights, returns our stack's top outputs."""
    x = np.random.default_rng(0).standard_normal((3, 5, 4), np.float32)
    ours = stack.RecurrentStack("lstm", (6, 6, 6))
    params = ours.init(jax.random.key(0), x)["params"]
    vector = _cudnn_vector([params[f"layer_{i}"] for i in range(3)], 4, 6)
    peer = peers.CudnnLSTMStack(6, 3, lstm=peers.lstm_reference)
    assert jax.tree.map(jnp.shape, peer.init(jax.random.key(0), x)["params"]) == {
        "lstm": vector.shape}
    got = peer.apply({"params": {"lstm": vector}}, x)
    np.testing.assert_allclose(got, ours.apply({"params": params}, x)[1][-1], rtol=1e-5,
                               atol=1e-5)


def _tiny_lm(connectivity: str, dropout_rate: float = 0.0):
    """A 3-layer tiny LM config, our model, a (4, 6) batch of tokens and our parameters."""
    c = dataclasses.replace(ptb.CONFIGS["tiny"], connectivity=connectivity, num_layers=3,
                            vocab_size=50, dropout_rate=dropout_rate)
    model = lm.make_model(c)
    tokens, _ = _batch(50, 4, 6)
    return c, model, tokens, model.init(jax.random.key(0), tokens, model.zero_carries(4))["params"]


@pytest.mark.parametrize(("connectivity", "dropout_rate"),
                         [("stacked", 0.0), ("stacked", 0.5), ("dense", 0.5)])
def test_cudnn_peer_computes_our_language_model(connectivity, dropout_rate):
    """The GPU peer on JAX's reference of cuDNN's LSTM, given our weights, computes our LM:
    per-token NLL and carries, over two windows (the carries thread through). A stacked LM
    with dropout is called layer by layer (``peers.cudnn_calls``)."""
    c, model, tokens, ours = _tiny_lm(connectivity, dropout_rate)
    peer = peers.FlaxLSTMLM(c.vocab_size, c.embed_size, c.hidden_size, c.num_layers,
                            connectivity, c.dropout_rate, c.init_scale, peers.lstm_reference)
    theirs = _cudnn_layout(ours, c)
    assert (sum(a.size for a in jax.tree.leaves(theirs)) - sum(
        a.size for a in jax.tree.leaves(ours))) == c.num_layers * 4 * c.hidden_size  # b_hh
    want_carries = got_carries = model.zero_carries(4)
    for _ in range(2):
        want, want_carries = model.apply({"params": ours}, tokens, want_carries, tokens)
        got, got_carries = peer.apply({"params": theirs}, tokens, got_carries, tokens)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(jax.tree.leaves(got_carries), jax.tree.leaves(want_carries), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _flax_layout(ours: dict, c: ptb.LMConfig) -> dict:
    """Our LM's parameters in ``FlaxLSTMLM``'s layout (``nn.OptimizedLSTMCell``: one kernel
    per gate and input, the bias on the recurrent kernels)."""
    return {"Embed_0": ours["embed"], "Dense_0": ours["softmax"],
            **{f"OptimizedLSTMCell_{i}": peers.flax_lstm_cell(ours["rnn"][f"layer_{i}"])
               for i in range(c.num_layers)}}


def _load_torch(torch, peer, ours: dict, lstms: dict[str, dict]) -> None:
    """Copies our embedding, softmax and LSTMs (``lstms``: ``{torch name pattern: our
    w_ih, w_hh, b}``; ``b_hh`` zeroed) into a PyTorch peer."""
    t = dict(peer.named_parameters())
    with torch.no_grad():
        t["embed.weight"].copy_(torch.tensor(np.asarray(ours["embed"]["embedding"])))
        t["softmax.weight"].copy_(torch.tensor(np.asarray(ours["softmax"]["kernel"]).T))
        t["softmax.bias"].copy_(torch.tensor(np.asarray(ours["softmax"]["bias"])))
        for name, p in lstms.items():
            t[name % "weight_ih"].copy_(torch.tensor(np.asarray(p["w_ih"]).T))
            t[name % "weight_hh"].copy_(torch.tensor(np.asarray(p["w_hh"]).T))
            t[name % "bias_ih"].copy_(torch.tensor(np.asarray(p["b"])))
            t[name % "bias_hh"].zero_()


@pytest.mark.parametrize("connectivity", ["stacked", "dense"])
def test_flax_and_pytorch_peers_compute_our_language_model(connectivity):
    """The CPU peers, given our weights, compute our LM: per-token NLL over two windows (the
    carries thread through)."""
    torch = pytest.importorskip("torch")
    c, model, tokens, ours = _tiny_lm(connectivity)
    flax_peer = peers.FlaxLSTMLM(c.vocab_size, c.embed_size, c.hidden_size, c.num_layers,
                                 connectivity, c.dropout_rate, c.init_scale)
    flax_params = _flax_layout(ours, c)
    assert jax.tree.structure(flax_params) == jax.tree.structure(
        flax_peer.init(jax.random.key(1), tokens, model.zero_carries(4))["params"])
    torch_peer = peers.torch_lm(c.vocab_size, c.embed_size, c.hidden_size, c.num_layers,
                                connectivity, c.dropout_rate).eval()
    _load_torch(torch, torch_peer, ours, {
        (f"lstms.{i}.%s_l0" if connectivity == "dense" else f"lstms.0.%s_l{i}"):
        ours["rnn"][f"layer_{i}"] for i in range(c.num_layers)})
    carries = {"ours": model.zero_carries(4), "flax": model.zero_carries(4)}
    zeros = torch.zeros(1, 4, c.hidden_size)
    torch_carries = ([(zeros, zeros)] * c.num_layers if connectivity == "dense"
                     else [(zeros.repeat(c.num_layers, 1, 1),) * 2])
    for _ in range(2):
        want, carries["ours"] = model.apply({"params": ours}, tokens, carries["ours"], tokens)
        got, carries["flax"] = flax_peer.apply({"params": flax_params}, tokens, carries["flax"],
                                               tokens)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            logits, torch_carries = torch_peer(torch.tensor(np.asarray(tokens)).long(),
                                               torch_carries)
            nll = -torch.log_softmax(logits, -1).gather(
                -1, torch.tensor(np.asarray(tokens)).long()[..., None])[..., 0]
        np.testing.assert_allclose(nll.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("connectivity", ["stacked", "dense"])
def test_flax_peer_in_bfloat16_runs_every_product_in_bfloat16(connectivity):
    """Given bfloat16 parameters (the compute dtype, as the training step casts them) and
    float32 carries, every product of the Flax peer's step, forward and backward, takes
    bfloat16 operands, as ours' do; the carries come back float32."""
    c, model, tokens, ours = _tiny_lm(connectivity)
    peer = peers.FlaxLSTMLM(c.vocab_size, c.embed_size, c.hidden_size, c.num_layers,
                            connectivity, c.dropout_rate, c.init_scale)
    params = precision.cast_floating(_flax_layout(ours, c), jnp.bfloat16)

    def loss(p):
        nll, carries = peer.apply({"params": p}, tokens, model.zero_carries(4), tokens)
        return nll.sum(), carries

    jaxpr, shapes = jax.make_jaxpr(jax.grad(loss, has_aux=True), return_shape=True)(params)
    dots = [e for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) >= 3 * (2 * c.num_layers + 1)  # input, recurrent, softmax: fwd and bwd
    assert {v.aval.dtype for e in dots for v in e.invars} == {jnp.dtype(jnp.bfloat16)}
    _, carries = shapes
    assert {a.dtype for a in jax.tree.leaves(carries)} == {jnp.dtype(jnp.float32)}


def _eqns(jaxpr):
    """Every equation of ``jaxpr``, those of the jaxprs inside it (scans, jits) included."""
    for e in jaxpr.eqns:
        yield e
        for sub in jax.extend.core.jaxprs_in_params(e.params):
            yield from _eqns(sub)


def _dc_bilstm():
    """A small DC-Bi-LSTM (3 dense layers of 5 units, top 6), our parameters and its peers'
    arguments: ``(features, dropout_embed, dropout_pool)`` without dropout."""
    c, _ = classify.get_config("dc_bilstm_t4_dl5_dh10")
    c = dataclasses.replace(c, embed_size=8, model_args={**c.model_args, "dl": 3, "dh": 5,
                                                         "th": 6})
    model = classify.make_model(c, 50, 3)
    return model, classify.init_params(model, jax.random.key(0)), ((5,) * 3 + (6,), 0.0, 0.0)


def test_flax_peer_computes_our_dc_bilstm():
    model, ours, args = _dc_bilstm()
    tokens, lengths = _batch(50, 4, 16)
    want = jax.jit(model.apply)({"params": ours}, tokens, lengths)
    got = jax.jit(peers.flax_dc_bilstm_port(*args).apply)({"params": ours}, tokens, lengths)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pytorch_peer_computes_our_dc_bilstm():
    torch = pytest.importorskip("torch")
    model, ours, args = _dc_bilstm()
    peer = peers.torch_dc_bilstm(50, 3, model.embed_size, *args).eval()
    _load_torch(torch, peer, ours, {
        f"lstms.{i}.%s_l0{suffix}": ours["dense_bilstm"][f"layer_{i}"][k]
        for i in range(len(args[0])) for k, suffix in [("fwd", ""), ("bwd", "_reverse")]})
    tokens, lengths = _batch(50, 4, 16)
    with torch.no_grad():
        got = peer(torch.tensor(np.asarray(tokens)).long(), torch.tensor(np.asarray(lengths)))
    want = jax.jit(model.apply)({"params": ours}, tokens, lengths)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
