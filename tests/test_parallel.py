"""Data parallelism: a run on 8 virtual CPU devices against one, checkpoints across layouts.

The runs happen in a subprocess, since the virtual device count is fixed at JAX start-up.
"""

import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from dense_rnn import parallel
from dense_rnn.errors import UserError
from dense_rnn.train import checkpoint, lm
from tests.conftest import REPO
from tests.test_ptb_lm_binary import corpus_dir, one_line_error, tiny  # noqa: F401
from tests.test_ptb_lm_binary import run_binary as run_ptb_lm
from tests.test_text_classification import SMALL, _classify, _synthetic_trec, _toy_data

RUNS = r"""
import sys
import jax
from dense_rnn.train import lm
from tests.test_ptb_lm_binary import tiny

corpus, out, STEPS = sys.argv[1], sys.argv[2], int(sys.argv[3])
assert jax.device_count() == 8, jax.devices()
for name, layouts in [("one", [1]), ("eight", [8]), ("8_then_1", [8, 1]), ("1_then_8", [1, 8])]:
    for i, n in enumerate(layouts):  # the second run resumes the first's checkpoint
        steps = STEPS * (i + 1) // len(layouts)
        lm.train_and_evaluate(tiny(batch_size=8, eval_batch_size=4, num_devices=n,
                                   max_steps=steps, max_epochs=3),
                              corpus, f"{out}/{name}", log=lambda s: None)
"""
STEPS = 20
EIGHT_CPUS = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
              "JAX_PLATFORMS": "cpu"}


def records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def restore_params(workdir):
    """The latest parameters in ``workdir`` restored onto this process's one device."""
    with open(os.path.join(workdir, "run_identity.json")) as f:
        identity = json.load(f)
    c = tiny(**{k: identity[k] for k in ["batch_size", "vocab_size"]})
    params = lm.init_params(c, jax.random.key(0))
    like = {"params": params, "opt_state": lm.make_optimizer(c, 1).init(params),
            "carries": lm.make_model(c).zero_carries(c.batch_size)}
    ckpt = checkpoint.Checkpointer(str(workdir), identity)
    (state, meta), _ = ckpt.restore(like), ckpt.close()
    return meta["progress"]["global_step"], state["params"]


@pytest.mark.slow  # six short runs in a subprocess: ~90 s on two busy CPU cores
def test_eight_devices_match_one_and_checkpoints_cross_layouts(corpus_dir, tmp_path):  # noqa: F811
    r = subprocess.run([sys.executable, "-c", RUNS, corpus_dir, str(tmp_path), str(STEPS)],
                       cwd=REPO, env=EIGHT_CPUS, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    step, reference = restore_params(tmp_path / "one")
    ref_records = records(tmp_path / "one")
    for name in ["eight", "8_then_1", "1_then_8"]:
        other_step, params = restore_params(tmp_path / name)
        assert other_step == step == STEPS
        a, b = ref_records[-1], records(tmp_path / name)[-1]
        assert a["step"] == b["step"] == STEPS
        if name == "eight":  # a resumed run's train_ppl covers its own steps only
            np.testing.assert_allclose(a["train_ppl"], b["train_ppl"], rtol=1e-5)
        np.testing.assert_allclose(a["valid_ppl"], b["valid_ppl"], rtol=1e-5)
        for x, y in zip(jax.tree.leaves(reference), jax.tree.leaves(params), strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    summary = json.load(open(tmp_path / "eight" / "summary.json"))
    assert summary["data_parallel_devices"] == 8


SAVE_ON_TWO = r"""
import sys
import jax
import numpy as np
from dense_rnn import parallel
from dense_rnn.train import checkpoint

mesh = parallel.make_mesh(2)
w = jax.device_put(np.arange(6, dtype=np.float32), parallel.replicated(mesh))
with checkpoint.Checkpointer(sys.argv[1], {"model": "toy"}) as ckpt:
    ckpt.save_best(3, {"w": w}, {"dev": 0.5})
"""


def test_parameters_trained_on_two_devices_load_for_inference_on_one(tmp_path):
    env = {**EIGHT_CPUS, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    r = subprocess.run([sys.executable, "-c", SAVE_ON_TWO, str(tmp_path)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    like = {"w": jax.ShapeDtypeStruct((6,), np.float32)}
    best = checkpoint.load_best(str(tmp_path), {"model": "toy"}, like, "later")
    np.testing.assert_array_equal(best["w"], np.arange(6))
    assert best["w"].sharding.device_set == {jax.devices()[0]}


def test_batch_must_split_over_the_devices(monkeypatch):
    parallel.check_batch(3, parallel.make_mesh(1))
    with pytest.raises(UserError, match="--num_devices=5 or a --batch_size that is a multiple"):
        parallel.check_batch(20, SimpleNamespace(size=8))
    monkeypatch.setattr(jax, "process_count", lambda: 2)  # multi-host: every device is used
    with pytest.raises(UserError, match=r"over 8 devices; pass a --batch_size that is a "
                                        r"multiple of 8$"):
        parallel.check_batch(20, SimpleNamespace(size=8))


def test_a_batch_the_devices_refuse_leaves_no_workdir(corpus_dir, tmp_path,  # noqa: F811
                                                      monkeypatch):
    monkeypatch.setattr(parallel, "make_mesh", lambda n: SimpleNamespace(size=3))
    with pytest.raises(UserError, match="--batch_size=8 does not split over 3 devices"):
        lm.train_and_evaluate(tiny(batch_size=8), corpus_dir, str(tmp_path / "w"),
                              log=lambda s: None)
    assert not os.path.exists(tmp_path / "w")  # nothing written: no lock, vocabulary, folders
    from dense_rnn.configs.families import get_config
    from dense_rnn.train import classify

    _synthetic_trec(tmp_path, n_train=40, n_test=8)
    c, family = get_config("dc_bilstm")
    args = {"family": family, "dataset": "trec", "data_dir": str(tmp_path), "embeddings": None,
            "log": lambda s: None}
    for train in (lambda w: classify.run(dataclasses.replace(c, batch_size=8), workdir=w, **args),
                  lambda w: classify.run_lr_sweep(dataclasses.replace(c, batch_size=8), [1e-3],
                                                  w, **args)):  # a run, and a sweep
        with pytest.raises(UserError, match="--batch_size=8 does not split over 3 devices"):
            train(str(tmp_path / "c"))
        assert not os.path.exists(tmp_path / "c")


def test_binary_refuses_too_many_devices(corpus_dir, tmp_path):  # noqa: F811
    one_line_error(run_ptb_lm("--config=tiny", f"--data_dir={corpus_dir}", "--vocab_size=60",
                              "--num_devices=64", f"--workdir={tmp_path / 'w'}"),
                   "--num_devices=64, but")


@pytest.mark.slow  # four classifier binary runs: ~1 minute
def test_classifier_binary_eight_devices_match_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", EIGHT_CPUS["XLA_FLAGS"])
    _toy_data(tmp_path)
    base = [f"--data_dir={tmp_path}", "--dataset=trec", f"--embeddings={tmp_path}/glove.txt.gz",
            *SMALL]
    for name, n, epochs in [("one", 1, 2), ("eight", 8, 2), ("8_then_1", 8, 1),
                            ("8_then_1", 1, 2)]:
        _classify(*base, f"--workdir={tmp_path}/{name}", f"--num_devices={n}",
                  f"--max_epochs={epochs}")
    one, eight, mixed = (records(tmp_path / n) for n in ["one", "eight", "8_then_1"])
    assert len(one) == len(eight) == len(mixed) == 2
    for a, b in [*zip(one, eight, strict=True), (one[-1], mixed[-1])]:
        for key in ["train_loss", "train_accuracy", "dev_accuracy", "test_accuracy"]:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5)


def test_initialize_distributed_passes_the_environment(monkeypatch):
    seen = {}
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:1234")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "2")
    parallel.initialize_distributed()
    assert seen == {"coordinator_address": "host0:1234", "num_processes": 4, "process_id": 2}
    monkeypatch.setenv("JAX_PROCESS_ID", "two")
    with pytest.raises(UserError, match="must be integers"):
        parallel.initialize_distributed()
    monkeypatch.setenv("JAX_PROCESS_ID", "2")

    def refuse(**kw):
        raise ValueError("coordinator_address should be defined.\nmore detail")

    monkeypatch.setattr(jax.distributed, "initialize", refuse)
    with pytest.raises(UserError, match=r"^--multihost: coordinator_address should be defined; "
                                        r"set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
                                        r"JAX_PROCESS_ID on every host$"):
        parallel.initialize_distributed()


@pytest.mark.parametrize("visible,text", [(1, "1 device is visible"),
                                          (2, "2 devices are visible")])
def test_too_many_devices_says_the_fix(monkeypatch, visible, text):
    monkeypatch.setattr(jax, "devices", lambda: [SimpleNamespace(platform="cpu")] * visible)
    with pytest.raises(UserError, match=f"--num_devices=4, but {text} \\(cpu\\): pass "
                                        f"--num_devices=0 \\(all\\) or at most {visible}$"):
        parallel.make_mesh(4)


@pytest.mark.slow  # three binary runs, two of them one run in two processes: ~1 minute
def test_two_processes_of_two_devices_match_one_device(corpus_dir, tmp_path):  # noqa: F811
    """``--multihost`` on one machine: two processes (gloo collectives between them) of two
    CPU devices each train as one process on one device does, and process 0 alone writes
    the summary."""
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "experiments.ptb_lm", "--config=tiny", "--vocab_size=60",
            f"--data_dir={corpus_dir}", "--max_steps=30", "--max_epochs=1"]
    hosts = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
             "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
             "JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2"}
    procs = [subprocess.Popen([*args, f"--workdir={tmp_path / 'two'}", "--multihost"],
                              cwd=REPO, env={**hosts, "JAX_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    one = subprocess.run([*args, f"--workdir={tmp_path / 'one'}"], cwd=REPO, text=True,
                         capture_output=True, timeout=300, env={**os.environ,
                                                                "JAX_PLATFORMS": "cpu"})
    assert one.returncode == 0, one.stderr[-2000:]
    two, single = (json.loads((tmp_path / n / "summary.json").read_text())
                   for n in ("two", "one"))
    assert two["data_parallel_devices"] == 4 and single["data_parallel_devices"] == 1
    for key in ("best_valid_ppl", "test_ppl"):
        np.testing.assert_allclose(two[key], single[key], rtol=1e-5)


def test_pacer_waits_for_the_step_before_on_a_cpu_mesh_only():
    class Step:  # a dispatched step's output: records when it is waited for
        def __init__(self, name, log):
            self.name, self.log = name, log

        def block_until_ready(self):
            self.log.append(self.name)
            return self

    cpu = SimpleNamespace(platform="cpu")
    eight = SimpleNamespace(size=8, devices=np.array([cpu] * 8))
    log = []
    pace = parallel.Pacer(eight)
    assert [pace(Step(n, log)).name for n in "abc"] == ["a", "b", "c"]
    assert log == ["a", "b"]  # each step waits for the one before, so two are in flight
    tpu = SimpleNamespace(size=8, devices=np.array([SimpleNamespace(platform="tpu")] * 8))
    for mesh in (None, SimpleNamespace(size=1, devices=np.array([cpu])), tpu):
        log.clear()
        pace = parallel.Pacer(mesh)
        for n in "abc":
            pace(Step(n, log))
        assert not pace.on and log == []
