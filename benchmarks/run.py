"""``python -m benchmarks.run [--quick] [--workloads a,b] [--no-isolated] [--out DIR]``: times
every implementation of each workload, each in a process of its own (PyTorch with OpenMP's
default wait policy; ``--no-isolated`` and ``--quick``: all in this process), round-robin over
repeats, and prints a Markdown table (and writes ``results.json`` / ``table.md`` under
``--out``).

Per implementation: median step time over the repeats and its spread ((max - min) /
median), items/s, ours' speed as a multiple of it (the median over repeats of the paired
ratio of the two step times of the same repeat, with its range), achieved GFLOP/s and its
fraction of the fastest roofline GEMM of the same run, JAX's compile time (tracing, lowering
and XLA compilation of every function the build and first step jit), the build and first
step's wall time, and peak RSS growth (measured in a fresh subprocess per implementation:
build + 3 steps). A second table sets ours' ratios and GEMM fraction against issue #5's
targets.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TextIO

from benchmarks import options
from dense_rnn.cli import run_script
from dense_rnn.errors import UserError
from dense_rnn.files import atomic_write
from dense_rnn.platform import ADDED_XLA_FLAGS, FAST_MALLOC_ENV, user_xla_flags

# Settings the suite adds to the environment where the user set none. Their names are listed
# in _SUITE_SET, which the fast-malloc re-exec and subprocesses inherit, so that a process
# can tell them from the user's and take them out again (``user_env``).
_SUITE_SET = "DENSE_RNN_BENCH_SET"
_OMP_DEFAULT = "DENSE_RNN_BENCH_OMP_DEFAULT"  # set for PyTorch's worker process


def _suite_set() -> set[str]:
    return set(filter(None, os.environ.get(_SUITE_SET, "").split(",")))


def _set_default(name: str, value: str) -> None:
    if name not in os.environ:
        os.environ[name] = value
        os.environ[_SUITE_SET] = ",".join(sorted(_suite_set() | {name}))


# PyTorch's OpenMP threads otherwise spin after each parallel region, competing with XLA's
# threads in one process (and with other load): 2-10x slower, erratic PyTorch steps. The
# policy slows PyTorch's own steps too, so by default PyTorch runs in a worker process of its
# own (``Workers``) with OpenMP's default policy.
if not os.environ.get(_OMP_DEFAULT):
    _set_default("OMP_WAIT_POLICY", "PASSIVE")
# On a GPU, JAX would otherwise take 75% of its memory up front, leaving PyTorch the rest.
_set_default("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def user_env(drop: set[str] | None = None) -> dict[str, str]:
    """This process's environment without the settings the suite added (``drop``: only
    those of them); what the user set stays."""
    drop = _suite_set() if drop is None else drop & _suite_set()
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if rest := _suite_set() - drop:
        env[_SUITE_SET] = ",".join(sorted(rest))
    else:
        env.pop(_SUITE_SET, None)
    return env
# Issue #5's targets: the least "ours x" against each peer, and the least fraction of the
# GEMM rate on the LM workloads. On a GPU both cuDNN LSTMs (PyTorch's nn.LSTM runs there)
# have the target of 0.8x.
MIN_WARMUP_STEPS = 5  # with a warm-up at all: at least this many steps, however slow
PEER_TARGETS = {"torch nn.LSTM": 1.0, "flax nn.RNN": 1.3, "lax.scan port": 1.5}
CUDNN_TARGETS = {"torch nn.LSTM": 0.8, "jax cuDNN rnn.lstm": 0.8}
GEMM_TARGET = 0.8


def _status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in MB."""
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _commit() -> str:
    """The repository's commit, ``+dirty`` with uncommitted changes; ``unknown`` outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain",
                                                                       "--untracked-files=no")
                                                      else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# Instruction-set extensions that decide a CPU's matrix-product speed: two machines that
# report the same model name can differ here (AMX makes bfloat16 products ~4x faster).
_CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vp2intersect",
                 "amx_tile", "amx_bf16", "amx_int8")


def cpu_info() -> tuple[str, list[str]]:
    """The CPU's model name, with its family and model numbers where given (a VM may name
    two generations alike: "AMD EPYC" is family 25 on a Zen 4, 26 on a Zen 5), and which of
    ``_CPU_FEATURES`` it has (Linux; elsewhere the processor name and no features)."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return platform.processor(), []
    field = {}
    for line in lines:
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    flags = set(field.get("flags", "").split())
    name = field.get("model name", platform.processor())
    if "cpu family" in field:
        name += f" (family {field['cpu family']}, model {field.get('model', '?')})"
    return name, [f for f in _CPU_FEATURES if f in flags]


def environment() -> dict:
    """Machine, versions, the commit and the process environment that affects speed."""
    import flax
    import jax
    import optax

    from dense_rnn import blas, dense_kernel, lstm_kernel, softmax_kernel

    try:
        import torch

        torch_info = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "torch_device": (torch.cuda.get_device_name() if torch.cuda.is_available()
                                       else "cpu")}
    except ImportError:
        torch_info = {"torch": "not installed"}
    cpu, features = cpu_info()
    return {
        "commit": _commit(), "cpu": cpu, "cpu_features": features, "cores": os.cpu_count(),
        # XLA's CPU thread pool takes every CPU this process may run on; PyTorch's default
        # is the physical cores: on a host with hyper-threads the two differ (torch_threads)
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "load_avg": os.getloadavg(),
        "python": platform.python_version(), "jax": jax.__version__, "flax": flax.__version__,
        "optax": optax.__version__, **torch_info, "jax_device": str(jax.devices()[0]),
        "env": {k: os.environ.get(k, "")
                for k in (*FAST_MALLOC_ENV, "OMP_WAIT_POLICY", "XLA_FLAGS",
                          "XLA_PYTHON_CLIENT_PREALLOCATE", "DENSE_RNN_BLAS",
                          "DENSE_RNN_LSTM_KERNEL", "DENSE_RNN_DENSE_KERNEL",
                          "DENSE_RNN_SOFTMAX_KERNEL")},
        "blas_products": blas.available(),  # ours' large float32 products: the BLAS's
        "lstm_kernel": lstm_kernel.available(),  # ours' float32 LSTM scans: the C++ kernel
        "dense_kernel": dense_kernel.available(),  # ours' float32 dense-block scans in C++
        "softmax_kernel": softmax_kernel.available(),  # ours' softmax backward in C++
    }


_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                   "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
# JAX's compile time so far in this process, per event of ``_COMPILE_EVENTS`` (filled once
# ``_count_compiles`` has registered its listener).
_compile_seconds: dict[str, float] = {}


def _count_compiles() -> None:
    """Sums JAX's tracing, lowering and XLA compile durations into ``_compile_seconds``
    (registered once)."""
    import jax

    if not _compile_seconds:
        _compile_seconds.update(dict.fromkeys(_COMPILE_EVENTS, 0.0))

        def listener(event: str, seconds: float, **_: object) -> None:
            if event in _COMPILE_EVENTS:
                _compile_seconds[event] += seconds

        jax.monitoring.register_event_duration_secs_listener(listener)


def build_first_step(name: str, build: Callable[[], Callable]) -> tuple[Callable, dict]:
    """Builds implementation ``name`` and runs its first step: the step, and the wall time
    of both (``setup_s``) with JAX's compile time and XLA's part of it (None for PyTorch's,
    which compiles nothing)."""
    _count_compiles()
    t0, c0 = time.perf_counter(), dict(_compile_seconds)
    step = build()
    step()
    times = {"setup_s": time.perf_counter() - t0, "compile_s": None, "xla_compile_s": None}
    if "torch" not in name:
        spent = {e: _compile_seconds[e] - c0[e] for e in _COMPILE_EVENTS}
        times.update(compile_s=sum(spent.values()), xla_compile_s=spent[_COMPILE_EVENTS[-1]])
    return step, times


def _not_timed(workload: str, name: str, e: BaseException) -> dict[str, str]:
    """A failed implementation's entry, ``{"error": one line}``, announced on stderr."""
    error = f"{type(e).__name__}: {(str(e).strip() or '-').splitlines()[0]}"
    print(f"{workload}: {name} not timed ({error})", file=sys.stderr, flush=True)
    return {"error": error}


def build_steps(w, min_time: float, warmup: float = 0.0
                ) -> tuple[dict[str, Callable], dict[str, dict]]:
    """Builds (and compiles) every implementation of ``w`` and runs it for ``warmup`` seconds
    (at least one step after the first); per implementation, JAX's compile time and XLA's
    part of it (None for PyTorch's), the build and first step's wall time, the warm-up
    steps, and how many steps make one timed set of about ``min_time`` seconds. A peer that
    fails to build or run (say, a cuDNN kernel this JAX lacks) is left out with its
    ``error``; ours never is."""
    from benchmarks.workloads import OURS

    steps, out = {}, {}
    for name, build in w.impls.items():
        try:
            steps[name], times = build_first_step(name, build)
            t0 = time.perf_counter()
            steps[name]()
            warm = warm_up(steps[name], warmup, t0, done=1)
        except Exception as e:  # one peer's failure must not end the run
            if name == OURS:
                raise
            steps.pop(name, None)
            out[name] = _not_timed(w.name, name, e)
            continue
        per_step = (time.perf_counter() - t0) / warm
        out[name] = {**times, "warmup_steps": warm,
                     "iters": max(1, round(min_time / max(per_step, 1e-6))), "times": []}
    return steps, out


def warm_up(step: Callable, seconds: float, start: float | None = None, done: int = 0) -> int:
    """Runs ``step`` until ``seconds`` have passed since ``start`` (default now) and it has
    run ``MIN_WARMUP_STEPS`` times, ``done`` of them already (none more for 0 seconds): the
    heap's and caches' first steps, a slow step (DC-Bi-LSTM's ~1.4 s) a few. Returns how many
    times it has run, ``done`` included."""
    start = time.perf_counter() if start is None else start
    while seconds and (time.perf_counter() - start < seconds or done < MIN_WARMUP_STEPS):
        step()
        done += 1
    return done


def time_steps(step: Callable, iters: int) -> float:
    """Seconds per step over ``iters`` consecutive steps."""
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    return (time.perf_counter() - t0) / iters


def round_robin(names: list[str], r: int) -> list[str]:
    """Repeat ``r``'s order: each implementation starts a repeat in turn."""
    return names[r % len(names):] + names[: r % len(names)]


def time_workload(w, repeats: int, min_time: float, warmup: float = 0.0) -> dict[str, dict]:
    """Builds and warms up every implementation, then times them round-robin ``repeats``
    times."""
    from benchmarks.workloads import OURS

    steps, out = build_steps(w, min_time, warmup)
    for r in range(repeats):
        for name in round_robin(list(steps), r):
            try:
                out[name]["times"].append(time_steps(steps[name], out[name]["iters"]))
            except Exception as e:  # a peer failing in a timed set is left out, as in a build
                if name == OURS:
                    raise
                del steps[name]
                out[name] = _not_timed(w.name, name, e)
    return out


def build_workload(name: str, impl: str = ""):
    """A workload of ``workloads.WORKLOADS`` by name, or the training step of any PTB config
    (``benchmarks.binary``'s); with the variant of ours ``impl`` names, if it is one."""
    from benchmarks.workloads import WORKLOADS, lm_workload

    w = WORKLOADS[name]() if name in WORKLOADS else lm_workload(name)
    return with_variant(w, impl) if impl in VARIANTS else w


def serve(workload: str, impl: str, min_time: float, warmup: float = 0.0,
          replies: TextIO | None = None) -> None:
    """Worker of ``Workers``: builds and warms up one implementation, prints its compile time
    and steps per timed set (JSON), then times one set per line read from stdin, printing
    seconds per step, to ``replies`` (default: stdout)."""
    import jax

    replies = replies or sys.stdout
    w = build_workload(workload, impl)
    jax.devices()  # the backend's start-up is not the implementation's build
    if "torch" in impl:
        import torch  # noqa: F401  (nor is PyTorch's import)
    steps, out = build_steps(dataclasses.replace(w, impls={impl: w.impls[impl]}), min_time,
                             warmup)
    print(json.dumps({k: v for k, v in out[impl].items() if k != "times"}), file=replies,
          flush=True)
    if "error" in out[impl]:
        return
    for _ in sys.stdin:
        print(time_steps(steps[impl], out[impl]["iters"]), file=replies, flush=True)


def _reply(name: str, proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()
    if not line:
        raise UserError(f"the {name} worker exited (status {proc.wait()}) before replying")
    return line


def own_stdout() -> TextIO:
    """This process's stdout for the caller alone: whatever else is printed there from now on
    (a library's message, C code's included) goes to stderr, so a worker's replies to
    ``Workers`` stay one per line."""
    sys.stdout.flush()
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


# Variants of ours, each ours' builder in a worker of its own under another environment,
# timed beside ours: --triton_peer, under XLA's default Triton GEMM, which the binaries turn
# off on a GPU (``platform.GPU_XLA_FLAGS``); --xla_products_peer, with every product XLA's
# where ours calls the BLAS (``dense_rnn/blas.py``, Intel CPUs) or the softmax layer's C++
# backward (``dense_rnn/softmax_kernel.py``, AMD's Zen 5); --xla_scans_peer, with the
# LSTM and dense-block scans XLA's where ours runs the C++ kernels (``dense_rnn/lstm_kernel.py``,
# ``dense_rnn/dense_kernel.py``).
TRITON = "ours, Triton GEMM"
_TRITON_FLAG = "--xla_gpu_enable_triton_gemm=true"
XLA_PRODUCTS = "ours, XLA products"
XLA_SCANS = "ours, XLA scans"
VARIANTS = (TRITON, XLA_PRODUCTS, XLA_SCANS)
_VARIANT_ENV = {XLA_PRODUCTS: {"DENSE_RNN_BLAS": "off", "DENSE_RNN_SOFTMAX_KERNEL": "off"},
                XLA_SCANS: {"DENSE_RNN_LSTM_KERNEL": "off", "DENSE_RNN_DENSE_KERNEL": "off"}}


def with_variant(w, impl: str):
    """``w`` with the variant ``impl`` of ``VARIANTS``: ours' builder, in another
    environment (``worker_env``)."""
    from benchmarks.workloads import OURS

    return dataclasses.replace(w, impls={**w.impls, impl: w.impls[OURS]})


def worker_env(impl: str) -> dict[str, str]:
    """A worker's environment: this process's, except that PyTorch's keeps
    OpenMP's default wait policy (unless the user set one), ``TRITON``'s XLA flags are the
    user's with Triton GEMM on, ``XLA_PRODUCTS``'s has ``DENSE_RNN_BLAS=off`` and
    ``DENSE_RNN_SOFTMAX_KERNEL=off``, and
    ``XLA_SCANS``'s ``DENSE_RNN_LSTM_KERNEL=off`` and ``DENSE_RNN_DENSE_KERNEL=off``."""
    if impl in _VARIANT_ENV:
        return {**os.environ, **_VARIANT_ENV[impl]}
    if impl == TRITON:  # the user's flags, none of the suite's: its own XLA_FLAGS
        env = {k: v for k, v in os.environ.items() if k != ADDED_XLA_FLAGS}
        return {**env, "XLA_FLAGS": f"{_TRITON_FLAG} {user_xla_flags()}".strip()}
    if "torch" not in impl or "OMP_WAIT_POLICY" not in _suite_set():
        return dict(os.environ)
    return {**user_env({"OMP_WAIT_POLICY"}), _OMP_DEFAULT: "1"}


class Workers:
    """Each implementation of a workload in a process of its own (``--serve``), built one
    after another (``parallel``: all at once); ``time(name)`` runs one timed set in that
    process while every other worker waits on its pipe. The workers share this process's
    environment (the fast-malloc settings), except that PyTorch keeps OpenMP's default wait
    policy. ``info[name]``: the worker's compile time, set-up time and steps per set, or its
    error. With ``parallel`` (``main``'s default) the workers compile and warm up side by
    side: a workload waits for its slowest build, not their sum, and no worker is built
    first (built one after another, the first ran 1-6% slower for the whole run on a VM,
    RESULTS.md). Their compile times then include that contention, and a set sized from a
    warm-up slowed by it can fall short of ``min_time``; the timed sets still run one at a
    time."""

    def __init__(self, workload: str, names: list[str], min_time: float, warmup: float = 0.0,
                 parallel: bool = False):
        self.workload = workload
        self.procs: dict[str, subprocess.Popen] = {}
        self.info: dict[str, dict] = {}
        try:
            for name in names:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "benchmarks.run", "--serve", workload, name,
                     "--min_time", str(min_time), "--warmup", str(warmup)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, text=True, env=worker_env(name))
                if not parallel:
                    self._ready(name)
            for name in names:
                if name not in self.info:
                    self._ready(name)
        except BaseException:
            for name, proc in self.procs.items():
                if name not in self.info:  # still building: not worth waiting for
                    proc.kill()
            self.close()
            raise

    def _ready(self, name: str) -> None:
        """Reads the worker's build report; a peer whose worker dies (a native crash, the
        kernel's OOM killer) is left out with its error, as a peer that raises is."""
        try:
            self.info[name] = json.loads(_reply(name, self.procs[name]))
        except (UserError, ValueError) as e:  # ValueError: a stray line on its stdout
            self.info[name] = self._lost(name, e)

    def _lost(self, name: str, e: BaseException) -> dict[str, str]:
        from benchmarks.workloads import OURS

        if name == OURS:  # ours is what the run measures: its failure ends it
            if isinstance(e, UserError):
                raise e
            raise UserError(f"the {name} worker stopped answering ({type(e).__name__}: "
                            f"{e})") from e
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:  # a broken pipe: nothing left to flush into
                pass
        return _not_timed(self.workload, name, e)

    def time(self, name: str) -> float | None:
        """Seconds per step of one timed set; None (and ``info[name]`` the error) where a
        peer's worker died."""
        try:
            self.procs[name].stdin.write("\n")
            self.procs[name].stdin.flush()
            return float(_reply(name, self.procs[name]))
        except (OSError, UserError, ValueError) as e:  # ValueError: a stray line on stdout
            self.info[name] = self._lost(name, e)
            return None

    def close(self) -> None:
        for proc in self.procs.values():
            try:
                proc.stdin.close()
            except OSError:  # a worker that died, its last request unflushed
                pass
            proc.wait()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def time_isolated(workload: str, names: list[str], repeats: int, min_time: float,
                  warmup: float = 0.0, parallel: bool = False) -> dict[str, dict]:
    """``time_workload`` with each implementation in a process of its own (``Workers``)."""
    with Workers(workload, names, min_time, warmup, parallel) as workers:
        out = {name: {**workers.info[name], "times": []} for name in names}
        timed = [name for name in names if "error" not in out[name]]
        for r in range(repeats):
            for name in round_robin(timed, r):
                if (seconds := workers.time(name)) is None:  # its worker died: left out
                    timed.remove(name)
                    out[name] = workers.info[name]
                else:
                    out[name]["times"].append(seconds)
    return out


def summarise(w, timings: dict[str, dict]) -> list[dict]:
    """One row per implementation; ``ours_x`` is the median over repeats of the paired ratio
    (its step time over ours' in the same repeat), ``ours_x_range`` its (min, max). So is
    ``gemm_frac``: its FLOP rate over the faster roofline's in the same repeat. ``times_ms``
    keeps every repeat's step time."""
    from benchmarks.workloads import GEMM, OURS

    timed = {n: t for n, t in timings.items() if "error" not in t}
    gemm_times = [t["times"] for n, t in timed.items() if n.startswith(GEMM)]
    roofs = [w.gemm_flops / min(ts) for ts in zip(*gemm_times, strict=True)]  # per repeat
    # (none where every roofline failed: then no row has a % GEMM)

    def paired(values: list[float]) -> tuple[float, tuple[float, float]]:
        return statistics.median(values), (min(values), max(values))

    rows = []
    for name, t in timed.items():
        med, roofline = statistics.median(t["times"]), name.startswith(GEMM)
        work = w.gemm_flops if roofline else w.flops
        frac = frac_range = None
        if roofs:
            frac, frac_range = paired([work / x / roof for x, roof in zip(t["times"], roofs,
                                                                        strict=True)])
        ours_x = ours_x_range = None
        if not roofline:
            ours_x, ours_x_range = paired([a / b for a, b in zip(t["times"],
                                                                 timings[OURS]["times"],
                                                                 strict=True)])
        rows.append({"impl": name, "step_ms": 1e3 * med,
                     "spread": (max(t["times"]) - min(t["times"])) / med,
                     "rate": None if roofline else w.items / med,
                     "gflops": work / med / 1e9, "gemm_frac": frac, "gemm_frac_range": frac_range,
                     "ours_x": ours_x, "ours_x_range": ours_x_range,
                     "compile_s": t["compile_s"], "xla_compile_s": t.get("xla_compile_s"),
                     "setup_s": t["setup_s"],
                     "warmup_steps": t.get("warmup_steps"),
                     "times_ms": [1e3 * x for x in t["times"]]})
    return rows


def _device_mb(impl: str) -> Callable[[], float] | None:
    """On a GPU, a function giving the accelerator memory (MB) that ``impl``'s library has
    allocated at its peak so far (PyTorch's allocator for PyTorch rows, JAX's otherwise);
    ``None`` on a CPU, where the host RSS is the whole story."""
    import jax

    if "torch" in impl:
        import torch

        if not torch.cuda.is_available():
            return None
        return lambda: torch.cuda.max_memory_allocated() / 2**20
    if jax.default_backend() != "gpu":
        return None
    device = jax.devices()[0]
    return lambda: device.memory_stats()["peak_bytes_in_use"] / 2**20


def probe(workload: str, impl: str) -> None:
    """Subprocess mode: peak RSS growth (MB) of building ``impl`` and running 3 steps, and on
    a GPU the peak of the accelerator memory it allocated; also the build's compile times
    and the wall time of the build and first step (``build_steps``' figures, here with
    nothing else running). JAX's backend and PyTorch (with its CUDA context, where it has
    one) are loaded first, so no row counts a library's own start-up."""
    import jax

    w = build_workload(workload, impl)
    jax.devices()
    if "torch" in impl:
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # creates the context, as jax.devices() did JAX's
    device_mb = _device_mb(impl)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the high-water mark VmHWM to the current RSS
    base = _status_mb("VmRSS")
    step, times = build_first_step(impl, w.impls[impl])
    for _ in range(2):
        step()
    print(json.dumps({"rss_mb": _status_mb("VmHWM") - base,
                      "device_mb": device_mb and device_mb(), **times}))


def peak_memory(workload: str, impl: str) -> dict[str, float | None]:
    """``probe``'s measurements of ``impl`` in a fresh process; empty if it failed."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--probe", workload, impl],
        capture_output=True, text=True, check=False, env=worker_env(impl))
    lines = proc.stdout.strip().splitlines()
    try:
        reply = None if proc.returncode else json.loads(lines[-1])
    except (IndexError, ValueError):  # no reply line: a failure, reported with its output
        reply = None
    if isinstance(reply, dict):
        return reply
    print(f"memory probe {workload}/{impl} failed: {(proc.stderr + proc.stdout)[-500:]}",
          file=sys.stderr)
    return {}


def _fmt(v: float | None, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def _compile(row: dict) -> str:
    """The compile cell: JAX's tracing, lowering and XLA compile time, XLA's in parentheses;
    ``*`` where it was measured with the workload's other builds running beside it."""
    side = " *" if row.get("built_alone") is False else ""
    if row.get("xla_compile_s") is None:
        return _fmt(row["compile_s"], ".1f") + side
    return f"{row['compile_s']:.1f} ({row['xla_compile_s']:.1f}){side}"


def _memory(row: dict) -> str:
    """The peak memory cell: host RSS, and the GPU's where it was measured."""
    if row.get("device_mb") is None:
        return _fmt(row.get("rss_mb"), ".0f")
    return f"{_fmt(row.get('rss_mb'), '.0f')} (GPU {row['device_mb']:,.0f})"


def markdown(results: list[dict]) -> str:
    lines = ["| workload | implementation | step ms | spread | items/s | ours × (range) "
             "| GFLOP/s | % GEMM | compile s (XLA) | build + 1st step s | peak RSS MB (GPU) |",
             "|" + " --- |" * 11]
    for res in results:
        for r in res["rows"]:
            rate = "—" if r["rate"] is None else f"{r['rate']:,.0f} {res['unit']}"
            ours_x = "—" if r["ours_x"] is None else (
                f"{r['ours_x']:.2f} ({r['ours_x_range'][0]:.2f}-{r['ours_x_range'][1]:.2f})")
            lines.append(
                f"| {res['workload']} | {r['impl']} | {r['step_ms']:.2f} | "
                f"{100 * r['spread']:.0f}% | {rate} | {ours_x} | {r['gflops']:.1f} | "
                f"{_fmt(r['gemm_frac'], '.0%')} | {_compile(r)} | "
                f"{r['setup_s']:.1f} | {_memory(r)} |")
        for name, error in res.get("not_timed", {}).items():
            lines.append(f"| {res['workload']} | {name} | not timed: {error} |" + " |" * 8)
    return "\n".join(lines)


def _bfloat16(res: dict) -> bool:
    """Whether a result is of a bfloat16 workload (``lm_workload`` names them so)."""
    return res["workload"].endswith(" bfloat16")


def targets_markdown(results: list[dict], gpu: bool, isolated: bool = True) -> str:
    """Ours against the targets, one row per workload; a bold figure meets its target (before
    rounding). The lax.scan ports' target holds on every workload, the others on the LM
    steps only: a classifier's or a bare LSTM stack's ratios to the stock peers are shown
    unmarked, and so are Flax's bfloat16 ones on a CPU, where its bfloat16 step is slower
    than its float32 one. Without ``isolated`` workers the caption says PyTorch's ratios
    flatter ours."""
    from benchmarks.workloads import FLAX, PORT

    goals = {**PEER_TARGETS, **(CUDNN_TARGETS if gpu else {})}
    peers = [p for p in goals if any(r["impl"] == p for res in results for r in res["rows"])]
    heads = [*(f"ours vs {p} (>= {goals[p]})" for p in peers),
             f"% GEMM (>= {GEMM_TARGET:.0%} on LMs)"]
    lines = ["| workload | " + " | ".join(heads) + " |", "|" + " --- |" * (len(heads) + 1)]
    for res in results:
        rows = {r["impl"]: r for r in res["rows"]}
        lm, cells = res.get("lm", res["unit"] == "tok/s"), []
        for p in peers:
            x = rows[p]["ours_x"] if p in rows else None
            cpu_bf16_flax = not gpu and p == FLAX and _bfloat16(res)
            met = (x is not None and x >= goals[p] and (lm or p == PORT)
                   and not cpu_bf16_flax)
            cells.append("" if x is None else f"**{x:.2f}**" if met else f"{x:.2f}")
        frac = rows["ours"]["gemm_frac"]
        met = lm and frac is not None and frac >= GEMM_TARGET
        cells.append(f"**{frac:.1%}**" if met else _fmt(frac, ".1%"))
        lines.append(f"| {res['workload']} | " + " | ".join(cells) + " |")
    lines.append("\nBold: meets issue #5's target (before rounding). The targets are set for "
                 "the full suite's workloads (the LM targets for its LM steps); --quick's smaller "
                 "ones only indicate."
                 + (" Flax's bfloat16 ratios are not counted: on a CPU its bfloat16 step is "
                    "slower than its float32 one." if not gpu and any(map(_bfloat16, results))
                    else "")
                 + ("" if isolated or "OMP_WAIT_POLICY" not in _suite_set()
                    or not any("torch" in r["impl"] for res in results for r in res["rows"]) else
                    " All ran in one process, where PyTorch runs under "
                    "OMP_WAIT_POLICY=PASSIVE and is slowed by it: its ratios flatter ours."))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    import jax

    from benchmarks.workloads import FULL, GEMM, OURS, QUICK, WORKLOADS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small workloads, few repeats (about a minute, mostly compiling)")
    p.add_argument("--workloads", help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    p.add_argument("--impls", help="comma-separated subset of implementation names")
    p.add_argument("--repeats", type=options.count,
                   help="round-robin repeats (default 3 quick, 5 full)")
    p.add_argument("--min_time", type=options.seconds, help="seconds per timed repeat (0.1 / 0.6)")
    p.add_argument("--warmup", type=options.seconds_or_zero,
                   help="seconds each implementation runs before it is timed, past its first "
                        "steps' page faults and cold caches (default 3; none with --quick)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None,
                   help="measure peak memory (host RSS; on a GPU also the device's) in "
                        "subprocesses (default: on, off with --quick)")
    p.add_argument("--out", help="directory for results.json and table.md")
    p.add_argument("--isolated", action=argparse.BooleanOptionalAction, default=None,
                   help="each implementation in a process of its own (PyTorch with OpenMP's "
                        "default wait policy), still timed round-robin (default: on, off "
                        "with --quick)")
    p.add_argument("--parallel_builds", action=argparse.BooleanOptionalAction, default=None,
                   help="with --isolated: start a workload's implementations at once, so "
                        "they compile side by side (default: on). One after another, the "
                        "first built runs a few %% slower on some VMs (RESULTS.md). The "
                        "compile and build times shown are then the memory probes', each "
                        "built alone; without probes (--no-memory), the side-by-side ones")
    p.add_argument("--triton_peer", action="store_true",
                   help=f"also time ours compiled under XLA's default Triton GEMM ({TRITON!r}), "
                        "which the binaries turn off on a GPU, in a worker of its own: a "
                        "paired ratio of the two flag settings (on a CPU, whose compiler "
                        "ignores the flag, an A/A run: the pairing's noise)")
    p.add_argument("--xla_products_peer", action="store_true",
                   help=f"also time ours with every product XLA's ({XLA_PRODUCTS!r}: "
                        "DENSE_RNN_BLAS=off, DENSE_RNN_SOFTMAX_KERNEL=off), in a worker of "
                        "its own: a paired ratio of ours' BLAS products (dense_rnn/blas.py, on "
                        "Intel CPUs) and C++ softmax backward (dense_rnn/softmax_kernel.py, on "
                        "AMD's Zen 5) against XLA's")
    p.add_argument("--xla_scans_peer", action="store_true",
                   help=f"also time ours with the LSTM and dense-block scans XLA's "
                        f"({XLA_SCANS!r}: DENSE_RNN_LSTM_KERNEL=off, DENSE_RNN_DENSE_KERNEL=off), "
                        "in a worker of its own: a paired ratio of ours' C++ scan kernels "
                        "(dense_rnn/lstm_kernel.py, dense_kernel.py; on AVX-512 CPUs) against "
                        "XLA's scans")
    p.add_argument("--probe", nargs=2, metavar=("WORKLOAD", "IMPL"), help=argparse.SUPPRESS)
    p.add_argument("--serve", nargs=2, metavar=("WORKLOAD", "IMPL"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.probe:
        probe(*a.probe)
        return []
    if a.serve:
        serve(*a.serve, a.min_time or 0.6, a.warmup or 0.0,  # Workers always pass both
              own_stdout())
        return []
    names = a.workloads.split(",") if a.workloads else (QUICK if a.quick else FULL)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        p.error(f"unknown workloads {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    workloads = {n: WORKLOADS[n]() for n in names}
    if a.impls:
        known = {k for w in workloads.values() for k in w.impls}
        if bad := [k for k in a.impls.split(",") if k not in known]:
            p.error(f"unknown implementations {', '.join(bad)} for these workloads; known: "
                    f"{', '.join(sorted(known))}")
    if a.out and os.path.exists(a.out) and not os.path.isdir(a.out):
        p.error(f"--out={a.out} is a file; give a directory (made if missing)")
    repeats = a.repeats or (3 if a.quick else 5)
    isolated = not a.quick if a.isolated is None else a.isolated
    if a.parallel_builds and not isolated:
        p.error("--parallel_builds starts each implementation in a process of its own: "
                "drop --no-isolated (or --quick)")
    parallel = isolated if a.parallel_builds is None else a.parallel_builds
    for peer in ("triton_peer", "xla_products_peer", "xla_scans_peer"):
        if getattr(a, peer) and not isolated:
            p.error(f"--{peer} runs ours in another environment, which needs a process of "
                    "its own: drop --no-isolated (or --quick)")
    flags = user_xla_flags().strip()
    if a.triton_peer and ("xla_gpu_enable_triton_gemm" in flags
                          or flags and not flags.startswith("-")):
        p.error("--triton_peer sets xla_gpu_enable_triton_gemm for its peer alone: XLA_FLAGS "
                "must neither set it nor name a file of flags")
    memory = not a.quick if a.memory is None else a.memory
    min_time = a.min_time or (0.1 if a.quick else 0.6)
    if (warmup := a.warmup) is None:
        # --quick, the smoke path: MIN_WARMUP_STEPS a step, so no repeat runs cold
        warmup = 0.1 if a.quick else 3.0
    env = environment()
    print(json.dumps(env), flush=True)
    if env.get("torch_threads", env["cpus_usable"]) != env["cpus_usable"]:
        print(f"note: PyTorch runs {env['torch_threads']} threads, XLA {env['cpus_usable']} "
              "(every usable CPU): set OMP_NUM_THREADS (PyTorch) or the process's CPU "
              "affinity (both) to compare them at one count", file=sys.stderr)
    has_torch = importlib.util.find_spec("torch") is not None
    if not has_torch:
        print("PyTorch is not installed (BUILD.md: the CPU build of torch 2.13.0 from "
              "PyTorch's index, then pip install -e '.[bench]'): its rows are skipped",
              flush=True)
    results = []
    for name, w in workloads.items():
        if not has_torch:
            w = dataclasses.replace(w, impls={k: v for k, v in w.impls.items()
                                              if "torch" not in k})
        for variant, wanted in ((TRITON, a.triton_peer), (XLA_PRODUCTS, a.xla_products_peer),
                                (XLA_SCANS, a.xla_scans_peer)):
            w = with_variant(w, variant) if wanted else w
        if a.impls:  # ours, the rooflines and the variants asked for are always kept
            keep = {*a.impls.split(","), OURS, *VARIANTS}
            w = dataclasses.replace(w, impls={k: v for k, v in w.impls.items()
                                              if k in keep or k.startswith(GEMM)})
        timings = (time_isolated(name, list(w.impls), repeats, min_time, warmup, parallel)
                   if isolated else time_workload(w, repeats, min_time, warmup))
        rows = summarise(w, timings)
        for r in rows:  # each probe builds alone: its build figures replace side-by-side ones
            if r["impl"] == TRITON:  # results.json's environment is the suite's, not its
                r["xla_flags"] = worker_env(TRITON)["XLA_FLAGS"]
            r.update({k.lower(): v for k, v in _VARIANT_ENV.get(r["impl"], {}).items()})
            probed = peak_memory(name, r["impl"]) if memory else {}
            r.update(probed, built_alone=not parallel or "setup_s" in probed)
        results.append({"workload": w.name, "unit": w.unit, "lm": w.lm, "flops": w.flops,
                        "rows": rows,
                        "not_timed": {k: t["error"] for k, t in timings.items() if "error" in t}})
        print(markdown(results[-1:]), flush=True)
        alone = all(r["built_alone"] for res in results for r in res["rows"])
        table = (markdown(results) + "\n\n" + (
            "" if alone else "*: compile and build times measured with the workload's other "
            "builds beside it (no memory probe, which builds alone), so with contention.\n\n")
            + targets_markdown(results, jax.default_backend() == "gpu", isolated))
        if a.out:  # after every workload: a run stopped part-way keeps what it measured
            os.makedirs(a.out, exist_ok=True)
            atomic_write(os.path.join(a.out, "results.json"), json.dumps(
                {"environment": env, "argv": sys.argv, "isolated": isolated,
                 "parallel_builds": parallel, "builds_timed_alone": alone,
                 "min_time": min_time, "warmup": warmup, "results": results}, indent=1))
            atomic_write(os.path.join(a.out, "table.md"), table + "\n")
    print("\n" + table)
    return results


if __name__ == "__main__":
    import jax

    # Compile times are measured: never loaded from a persistent compilation cache. Set for
    # this command's process (and its probes) alone: not in the environment its
    # subprocesses inherit, nor in a process that calls ``main`` (the tests).
    jax.config.update("jax_enable_compilation_cache", False)
    run_script(main)
