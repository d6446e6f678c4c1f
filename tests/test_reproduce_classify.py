"""The classification reproduction driver: its suites, run names, report and paper targets."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from absl import flags

from dense_rnn.configs import dc_bilstm, hm_densernn
from dense_rnn.data import DEFAULT_DATA_DIR
from dense_rnn.errors import UserError
from dense_rnn.train import classify
from experiments import reproduce_classify as rc
from experiments import runner
from tests.conftest import REPO

PAPERS = os.path.join(os.path.dirname(DEFAULT_DATA_DIR), "papers")

# Ding et al. 2018, transcribed from the paper. Table 1: dataset accuracies (%).
DING_TABLE1 = {
    "dc_bilstm": {"mr": 82.8, "sst1": 51.9, "sst2": 89.7, "subj": 94.5, "trec": 95.6},
    "bilstm": {"mr": 81.8, "sst1": 49.1, "sst2": 87.5, "subj": 93.0, "trec": 93.6},
}
# Tables 3-5: config of each row (the suites' names) -> (dl, dh, th, SST-1, SST-2).
DING_TABLES = {
    3: {"bilstm": (0, 10, 300, 49.2, 87.2), "dc_bilstm_t3_dl5_dh40": (5, 40, 100, 49.6, 88.4),
        "dc_bilstm_t3_dl10_dh20": (10, 20, 100, 51.0, 88.5),
        "dc_bilstm": (15, 13, 100, 51.9, 89.7),
        "dc_bilstm_t3_dl20_dh10": (20, 10, 100, 50.2, 88.8)},
    4: {"dc_bilstm_t4_dl0_dh10": (0, 10, 100, 48.5, 87.5),
        "dc_bilstm_t4_dl5_dh10": (5, 10, 100, 49.4, 88.1),
        "dc_bilstm_t4_dl10_dh10": (10, 10, 100, 49.5, 88.4),
        "dc_bilstm_t4_dl15_dh10": (15, 10, 100, 50.6, 88.8),
        "dc_bilstm_t3_dl20_dh10": (20, 10, 100, 50.2, 88.8)},
    5: {"dc_bilstm_t4_dl0_dh10": (10, 0, 100, 48.5, 87.5),
        "dc_bilstm_t5_dl10_dh5": (10, 5, 100, 49.2, 88.3),
        "dc_bilstm_t4_dl10_dh10": (10, 10, 100, 49.5, 88.4),
        "dc_bilstm_t5_dl10_dh15": (10, 15, 100, 50.2, 88.4),
        "dc_bilstm_t3_dl10_dh20": (10, 20, 100, 51.0, 88.5)},
}
# Zhao et al. 2019 Table 2: model -> accuracies at 64 / 128 units on IMDB, SST-5, AG.
ZHAO_TABLE2 = {
    "rnn": {"imdb": (81.8, 83.0), "sst5": (41.4, 40.5), "ag": (85.5, 74.7)},
    "gru": {"imdb": (90.4, 90.4), "sst5": (45.8, 46.4), "ag": (92.9, 92.5)},
    "lstm": {"imdb": (88.8, 89.3), "sst5": (44.0, 45.0), "ag": (92.8, 93.0)},
    "hornn": {"imdb": (86.0, 84.7), "sst5": (42.5, 42.2), "ag": (90.6, 90.6)},
    "stacked_rnn": {"imdb": (82.1, 82.5), "sst5": (40.0, 40.7), "ag": (89.9, 90.0)},
    "stacked_gru": {"imdb": (90.3, 90.2), "sst5": (44.5, 45.6), "ag": (91.8, 90.1)},
    "stacked_lstm": {"imdb": (88.4, 89.2), "sst5": (43.9, 41.0), "ag": (92.3, 92.3)},
    "stacked_hornn": {"imdb": (87.8, 83.9), "sst5": (39.7, 41.1), "ag": (90.6, 90.4)},
    "densernn": {"imdb": (76.1, 82.4), "sst5": (39.9, 36.3), "ag": (86.9, 83.0)},
    "densegru": {"imdb": (89.6, 89.9), "sst5": (44.9, 45.1), "ag": (92.4, 92.9)},
    "denselstm": {"imdb": (88.0, 88.2), "sst5": (44.9, 44.4), "ag": (92.5, 93.0)},
    "hm_densernn": {"imdb": (83.9, 84.3), "sst5": (41.6, 42.2), "ag": (90.5, 90.5)},
    "hm_densegru": {"imdb": (90.6, 90.4), "sst5": (46.8, 46.2), "ag": (92.7, 93.3)},
    "hm_denselstm": {"imdb": (89.6, 89.5), "sst5": (45.4, 45.3), "ag": (93.2, 93.5)},
}
# Table 3 (SST-5): GRU, stacked GRU, HM-DenseGRU and its ablations, each row the config
# whose Table 2 number it repeats ("- hierarchy" is DenseGRU 128: 45.1).
ZHAO_TABLE3 = {"gru_128": 46.4, "stacked_gru_128": 45.6, "hm_densegru_64": 46.8,
               "densegru_128": 45.1, "hm_densegru_64_no_multiscale": 46.0,
               "hm_densegru_64_no_dense_block": 46.3}


@pytest.fixture
def parsed():
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["prog"])
    yield flags.FLAGS
    flags.FLAGS.unparse_flags()


def test_dc_table1_names_every_seed_and_fold(parsed):
    jobs = rc.suite_jobs("dc_table1")
    names = {j.name for j in jobs}
    assert len(jobs) == 2 * (3 * 3 + 2 * 10)
    assert {"dc_bilstm_sst2_s2", "bilstm_trec_s0", "dc_bilstm_mr_f9", "bilstm_subj_f0"} <= names
    assert all(j.lr_from is None for j in jobs)


def test_phrases_trains_the_dc_suites_sst_rows_on_every_phrase(parsed):
    parsed(["prog", "--phrases", "--seeds=0"])
    names = {j.name for j in rc.suite_jobs("dc_table3")}
    assert "dc_bilstm_t3_dl5_dh40_sst2_phrases_s0" in names
    assert not any(n.endswith(("_sst1_s0", "_sst2_s0")) for n in names)
    assert {rc._arg(j, "dataset") for j in rc.suite_jobs("dc_table1")} == {
        "mr", "sst1_phrases", "sst2_phrases", "subj", "trec"}
    for named in ("sst2", "sst2_phrases"):  # --datasets by either name
        parsed(["prog", "--phrases", "--seeds=0,1,2", f"--datasets={named}",
                "--configs=dc_bilstm_t3_dl20_dh10"])
        assert [j.name for j in rc.suite_jobs("dc_table3")] == [
            f"dc_bilstm_t3_dl20_dh10_sst2_phrases_s{s}" for s in range(3)]
    with pytest.raises(UserError, match="--phrases: --suite=hm_table2 has no sentence-level"):
        rc.suite_jobs("hm_table2")


def test_every_suite_config_exists_and_table_aliases(parsed):
    configs = classify.all_configs()
    for suite in ("dc_table1", "dc_table3", "dc_table4", "dc_table5", "hm_table2",
                  "hm_table3", "hm_imdb", "hm_ag"):
        for job in rc.suite_jobs(suite):
            assert rc._arg(job, "config") in configs, job
    t3 = {rc._arg(j, "config") for j in rc.suite_jobs("dc_table3")}
    assert {"bilstm", "dc_bilstm", "dc_bilstm_t3_dl5_dh40"} <= t3
    assert "dc_bilstm_t3_dl15_dh13" not in t3  # the Table 1 model under its own name
    # Rows that build an earlier row's model share its runs, and its paper number is the
    # later table's own: Table 5's dl=10, dh=0 (no dense module) is Table 4's dl=0.
    assert dc_bilstm.table_configs(4) == [
        "dc_bilstm_t4_dl0_dh10", "dc_bilstm_t4_dl5_dh10", "dc_bilstm_t4_dl10_dh10",
        "dc_bilstm_t4_dl15_dh10", "dc_bilstm_t3_dl20_dh10"]
    assert dc_bilstm.table_configs(5) == [
        "dc_bilstm_t4_dl0_dh10", "dc_bilstm_t5_dl10_dh5", "dc_bilstm_t4_dl10_dh10",
        "dc_bilstm_t5_dl10_dh15", "dc_bilstm_t3_dl10_dh20"]
    assert [dc_bilstm.paper_accuracy(n, "sst1", 5) for n in dc_bilstm.table_configs(5)] == [
        48.5, 49.2, 49.5, 50.2, 51.0]
    t3 = {rc._arg(j, "config") for j in rc.suite_jobs("hm_table3")}
    assert "densegru_128" in t3  # "- hierarchy": DenseGRU, whose number Table 3 repeats


def test_hm_seeds_take_the_rate_their_sweep_chose(parsed):
    parsed.units = ["64"]
    jobs = rc.suite_jobs("hm_table2")
    assert len(jobs) == 3 * len(hm_densernn.TABLE2)
    by_name = {j.name: j for j in jobs}
    sweep = by_name["gru_64_sst5_sweep"]
    assert any(a.startswith("--lr_sweep=0.01,0.001,0.0001") for a in sweep.args)
    assert by_name["gru_64_sst5_s2"].lr_from == "gru_64_sst5_sweep"
    parsed.sweep = False
    assert [j.name for j in rc.suite_jobs("hm_imdb")][:2] == ["gru_64_imdb_s0", "gru_64_imdb_s1"]


def test_report_pools_runs_and_records(parsed, tmp_path):
    parsed.root = str(tmp_path / "runs")
    parsed.datasets = ["sst2"]
    parsed.configs = ["bilstm"]
    jobs = rc.suite_jobs("dc_table1")
    for job, acc in zip(jobs[:2], (0.80, 0.84), strict=True):
        d = tmp_path / "runs" / job.name
        os.makedirs(d)
        summary = {"config": dc_bilstm.CONFIGS["bilstm"].to_dict(), "dataset": "sst2",
                   "selection": classify.SELECTIONS["dev"], "num_params_paper": 840000,
                   "num_params": 843602, "test_accuracy": acc, "dev_accuracy": 0.8,
                   "best_dev_epoch": 3, "epochs": 8, "wall_seconds": 120.0, "device": "cpu"}
        (d / "summary.json").write_text(json.dumps(summary))
        (d / "metrics.jsonl").write_text(json.dumps(
            {"epoch": 1, "dev_accuracy": 0.8, "test_accuracy": acc}) + "\n")
        (d / "command.txt").write_text("python -m experiments.classify\n")
    table = rc.report(jobs, 1)
    assert ("| bilstm | sst2 | 1,440,000 | 840,000 | 843,602 | 2 of 3 | 82.0 ± 2.8 | 80.0 | 87.5 |"
            in table)
    assert "| 2 of 3 | 82.0 ± 2.8 | 80.0 | 87.2 |" in rc.report(jobs, 3)  # Table 3's own
    (tmp_path / "runs" / jobs[0].name / "fold_3").mkdir()  # as the driver's own call copies
    (tmp_path / "runs" / jobs[0].name / "fold_3" / "curves.png").write_bytes(b"png")
    runner.record(parsed.root, [j.name for j in jobs], str(tmp_path / "rec"),
                  ("", "lr_*", "fold_*", "lr_*/fold_*"))
    assert sorted(os.listdir(tmp_path / "rec" / jobs[0].name)) == [
        "command.txt", "fold_3", "metrics.jsonl", "summary.json"]
    assert os.listdir(tmp_path / "rec" / jobs[0].name / "fold_3") == ["curves.png"]
    rc.plot(jobs, str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 0


def test_paper_accuracy_of_both_families():
    assert dc_bilstm.paper_accuracy("dc_bilstm", "trec") == 95.6
    assert dc_bilstm.paper_accuracy("bilstm", "sst1") == 49.1
    assert dc_bilstm.paper_accuracy("bilstm", "sst1", 3) == 49.2
    assert dc_bilstm.paper_accuracy("dc_bilstm", "sst2_phrases") == 89.7
    assert dc_bilstm.paper_accuracy("bilstm", "sst1_phrases", 3) == 49.2
    assert dc_bilstm.paper_accuracy("dc_bilstm_t3_dl0_dh10", "sst2") == 87.2
    assert dc_bilstm.paper_accuracy("bilstm", "mr", 3) is None
    assert dc_bilstm.paper_accuracy("bilstm", "sst1", 4) is None  # th=300 is not in Table 4
    assert hm_densernn.paper_accuracy("hm_densegru_64", "sst5") == 46.8
    assert hm_densernn.paper_accuracy("lstm_128", "imdb") == 89.3
    assert hm_densernn.paper_accuracy("hm_densegru_64_no_dense_block", "sst5") == 46.3
    assert hm_densernn.paper_accuracy("densegru_64", "sst5") == 44.9
    assert hm_densernn.paper_accuracy("densegru_128", "sst5", 3) == 45.1
    assert hm_densernn.paper_accuracy("densegru_64", "sst5", 3) is None
    assert hm_densernn.paper_accuracy("gru_64", "sst5", 3) is None
    assert hm_densernn.paper_accuracy("gru_64", "mr") is None


def _expected(suite: str, config: str, dataset: str) -> float:
    if suite in ("dc_table1", "dc_phrases"):
        return DING_TABLE1[config][dataset.removesuffix("_phrases")]
    if suite.startswith("dc_table"):
        return DING_TABLES[int(suite[-1])][config][3 if dataset == "sst1" else 4]
    if suite == "hm_table3":
        return ZHAO_TABLE3[config]
    model, units = config.rsplit("_", 1)
    return ZHAO_TABLE2[model][dataset][hm_densernn.UNITS.index(int(units))]


def test_every_suite_row_shows_its_own_tables_number(parsed):
    """Pins every paper target of every suite to the transcribed tables above."""
    seen = set()
    for suite, (table, _) in rc.SUITES.items():
        for job in rc.suite_jobs(suite):
            config, dataset = rc._arg(job, "config"), rc._arg(job, "dataset")
            assert rc._paper(config, dataset, table) == str(_expected(suite, config, dataset)), (
                suite, config, dataset)
            seen.add((suite, config))
    assert {c for s, c in seen if s == "dc_table3"} == set(DING_TABLES[3])
    assert {c for s, c in seen if s == "dc_table4"} == set(DING_TABLES[4])
    assert {c for s, c in seen if s == "dc_table5"} == set(DING_TABLES[5])
    assert {c for s, c in seen if s == "hm_table3"} == set(ZHAO_TABLE3)
    assert {c for s, c in seen if s == "hm_table2"} == {
        f"{m}_{u}" for m in ZHAO_TABLE2 for u in hm_densernn.UNITS}
    for t, rows in DING_TABLES.items():  # the configs build the models of their rows
        for config, (dl, dh, th, _, _) in rows.items():
            args = dc_bilstm.CONFIGS[config].model_args
            assert (dc_bilstm.dense_features(args["dl"], args["dh"], args["th"])
                    == dc_bilstm.dense_features(dl, dh, th)), (t, config)


def _html_rows(text: str) -> list[list[str]]:
    """The cells of every ``<tr>`` of an HTML-table text, tags stripped."""
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", r)]
            for r in re.findall(r"<tr>(.*?)</tr>", text, re.S)]


def test_transcribed_tables_match_the_papers():
    ding = os.path.join(PAPERS, "ding2018_dc_bilstm.txt")
    zhao = os.path.join(PAPERS, "zhao2018_hm_densernn.txt")
    if not (os.path.exists(ding) and os.path.exists(zhao)):
        pytest.skip(f"no paper texts in {PAPERS}")
    with open(ding) as f:
        rows = _html_rows(f.read())
    by_model = {r[0].split(" [")[0]: r[1:] for r in rows if len(r) == 6}
    for name, label in (("bilstm", "Bi-LSTM"), ("dc_bilstm", "DC-Bi-LSTM (ours)")):
        assert [float(x) for x in by_model[label]] == list(DING_TABLE1[name].values())
    numeric = [r for r in rows if len(r) == 6 and r[3].endswith("M")]
    assert [(int(r[0]), int(r[1]), int(r[2]), float(r[4]), float(r[5])) for r in numeric] == [
        row for t in (3, 4, 5) for row in DING_TABLES[t].values()]
    with open(zhao) as f:
        text = f.read()
    for model, accs in ZHAO_TABLE2.items():
        for a, b in accs.values():
            assert f"{a} / {b}" in text, model
    assert "46.8\n45.1\n46.0\n46.3" in text


def reproduce(*args):
    return subprocess.run([sys.executable, "-m", "experiments.reproduce_classify", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, match", [
    (["--suite=nope"], "known suites: dc_table1, dc_table3"),
    (["--configs=bilstm,nope"], "--configs=nope: not in --suite=dc_table1, whose configs are "
     "dc_bilstm, bilstm"),
    (["--suite=dc_table3", "--datasets=mr"], "whose datasets are sst1, sst2"),
    (["--suite=hm_table2", "--units=32"], "--units=32"),
    (["--parallel=0"], "--parallel=0"),
    (["--seeds=0,x"], "--seeds=0,x: give numbers like 0,1,2"),
    (["--seeds=0,1,0"], "--seeds=0,1,0 names 0 twice; name each once"),
    (["--datasets="], "--datasets= names nothing; name at least one, or leave the flag out"),
    (["--folds=3,12"], "--folds=12 out of range: mr, subj have folds 0-9"),
    (["--embeddings=/nonexistent/g.txt"], "--embeddings=/nonexistent/g.txt does not exist; "
     "pass a GloVe text file"),
    (["--data_dir=/nonexistent/d"], "--data_dir=/nonexistent/d does not exist"),
    (["--data_dir=/tmp", "--extra=--hf_dataset=x/y"], "--extra=--hf_dataset names every run's "
     "data: drop --data_dir"),
    (["--extra=--max_epochs=2,--seed=3"], "--extra=--seed=3: the driver sets --seed for each "
     "run itself"),
    (["--suite=hm_table2", "--extra=--learning_rate=0.1"], "sets --learning_rate"),
    # --extra parsed once, by the binary's --dry_run, before any run starts
    (["--extra=--max_epochz=3"], "--extra=--max_epochz=3: Unknown command line flag "
     "'max_epochz'. Did you mean: max_epochs ?"),
    (["--suite=hm_table3", "--extra=--max_epochs=-3"], "max_epochs=-3 must be at least 1"),
    (["--report_only", "--root=/nonexistent/cls"], "--root=/nonexistent/cls does not exist"),
    (["--root=/dev/null/cls"], "--root=/dev/null/cls cannot be made (Not a directory)"),
    (["--report_only", "--root=/tmp", "--record=/dev/null"], "--record=/dev/null is a file"),
    (["--plot=/nonexistent/curves.png", "--report_only", "--root=/tmp"],
     "--plot=/nonexistent/curves.png: its directory does not exist"),
])
def test_bad_input_is_one_error_line(args, match):
    r = reproduce(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], r.stderr


def test_a_summary_without_the_reported_fields_is_one_error_line(tmp_path):
    (tmp_path / "dc_bilstm_trec_s0").mkdir()
    (tmp_path / "dc_bilstm_trec_s0" / "summary.json").write_text('{"a": 1}')
    r = reproduce("--report_only", f"--root={tmp_path}", "--datasets=trec", "--seeds=0",
                  "--configs=dc_bilstm")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: {tmp_path}/dc_bilstm_trec_s0/summary.json is not a run summary (no "
        "test_accuracy, dev_accuracy, config, selection, num_params, num_params_paper, "
        "wall_seconds, device); delete it and rerun the command to finish that run again"]
    fields = dict.fromkeys(rc.REPORTED, 1) | {"config": {}}  # every field but epochs and rate
    (tmp_path / "dc_bilstm_trec_s0" / "summary.json").write_text(json.dumps(fields))
    r = reproduce("--report_only", f"--root={tmp_path}", "--datasets=trec", "--seeds=0",
                  "--configs=dc_bilstm")
    assert r.returncode == 2 and "summary.json is not a run summary (no epochs or learning "\
        "rate)" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_run_waits_for_its_sweep_and_is_skipped_if_it_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    started = []

    def start(name):
        if (tmp_path / name / "summary.json").exists():
            return None  # as runner.launch says of a run finished under the same command
        started.append(name)
        if name != "bad":  # bad exits 0 without a summary: it did not train
            (tmp_path / name).mkdir()
            (tmp_path / name / "summary.json").write_text("{}")
        return subprocess.Popen([sys.executable, "-c", ""])

    failed = runner.run_all(str(tmp_path), ["ok", "after_ok", "bad", "after_bad", "ok"], start,
                            1, {"after_ok": "ok", "after_bad": "bad"})
    assert started == ["ok", "after_ok", "bad"]  # ok, named twice, ran once
    assert failed == ["bad (exit 0 without a summary.json)", "after_bad (skipped: bad failed)"]
    assert "skipped after_bad: bad failed" in capsys.readouterr().out
    started.clear()
    runner.run_all(str(tmp_path), ["ok"], start, 1)  # finished runs are not started again
    assert started == []


@pytest.mark.parametrize(("parallel", "given", "seen"),
                         [(1, None, None), (2, None, "false"), (2, "true", "true")])
def test_runs_started_several_at_a_time_share_the_gpus_memory(tmp_path, monkeypatch, parallel,
                                                             given, seen):
    """With ``--parallel`` above 1 each run takes GPU memory as it needs it (on an H200,
    runs that each took 75% up front failed at their first step); a value the user set is
    kept."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "")  # restored after the test
    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
    if given:
        monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", given)
    code = "import os; print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))"

    def start(name):
        with open(tmp_path / f"{name}.out", "w") as out:
            return subprocess.Popen([sys.executable, "-c", code], stdout=out)

    runner.run_all(str(tmp_path / "runs"), ["a"], start, parallel)
    assert (tmp_path / "a.out").read_text() == f"{seen}\n"


def test_a_finished_run_is_launched_again_only_under_another_command(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(runner.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd))
    workdir = tmp_path / "run"
    runner.launch("experiments.ptb_lm", ["--config=tiny"], str(workdir))
    (workdir / "summary.json").write_text('{"epochs": 5}')  # the binary finished it
    assert runner.launch("experiments.ptb_lm", ["--config=tiny"], str(workdir)) is None
    runner.launch("experiments.ptb_lm", ["--config=tiny", "--max_epochs=9"], str(workdir))
    assert len(launched) == 2 and "--max_epochs=9" in launched[1]
    assert "--max_epochs=9" in (workdir / "command.txt").read_text()
    assert not (workdir / "summary.json").exists()  # not finished under the new command
    assert (workdir / "summary.previous.json").read_text() == '{"epochs": 5}'
    (workdir / "summary.json").write_text('{"epochs": 9}')  # finished under it: the results
    assert runner._ended(str(tmp_path), "run", 0, 0, "failed") is None  # it replaced go
    assert not {"summary.previous.json", "command.previous.txt"} & set(os.listdir(workdir))


def test_a_relaunch_that_cannot_start_puts_the_finished_runs_files_back(tmp_path, monkeypatch):
    def popen(cmd, **kw):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "summary.json").write_text('{"epochs": 5}')
    (workdir / "command.txt").write_text("python -m experiments.ptb_lm --config=tiny\n")
    failed = runner.run_all(str(tmp_path), ["run"], lambda name: runner.launch(
        "experiments.ptb_lm", ["--config=tiny", "--max_epochs=9"], str(workdir)), 1)
    assert len(failed) == 1 and "not started: [Errno 24] Too many open files" in failed[0]
    assert (workdir / "summary.json").read_text() == '{"epochs": 5}'
    assert (workdir / "command.txt").read_text() == "python -m experiments.ptb_lm --config=tiny\n"
    assert not (workdir / "summary.previous.json").exists()


def test_a_run_going_in_a_workdir_fails_its_launch_and_keeps_its_records(tmp_path, monkeypatch):
    """Another driver's run training in the workdir: this launch touches nothing there."""
    from dense_rnn import files

    monkeypatch.setattr(runner.subprocess, "Popen", lambda cmd, **kw: pytest.fail("launched"))
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "summary.json").write_text('{"epochs": 5}')
    (workdir / "command.txt").write_text("python -m experiments.ptb_lm --config=tiny\n")
    fd = files.lock(str(workdir))
    try:
        failed = runner.run_all(str(tmp_path), ["run"], lambda name: runner.launch(
            "experiments.ptb_lm", ["--config=tiny", "--max_epochs=9"], str(workdir)), 1)
    finally:
        os.close(fd)
    assert len(failed) == 1 and "is in use by another run" in failed[0]
    assert (workdir / "command.txt").read_text() == "python -m experiments.ptb_lm --config=tiny\n"
    assert sorted(os.listdir(workdir)) == ["command.txt", "run.lock", "summary.json"]


def test_record_refuses_to_copy_the_runs_onto_themselves(tmp_path):
    with pytest.raises(UserError, match="--record=.* is --root itself; give another directory"):
        runner.check(str(tmp_path), 1, True, str(tmp_path) + "/")


@pytest.fixture
def finished_run_whose_relaunch_fails(tmp_path, monkeypatch):
    """A workdir holding a finished run's summary; every launched binary exits 2 with a
    one-line error."""
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    popen = subprocess.Popen
    monkeypatch.setattr(runner.subprocess, "Popen", lambda cmd, **kw: popen(
        [sys.executable, "-c", "import sys; sys.exit(print('error: --hidden_size=32 does not "
         "fit', file=sys.stderr) or 2)"], **kw))
    workdir = tmp_path / "tiny"
    workdir.mkdir()
    (workdir / "summary.json").write_text('{"epochs": 5}')
    return workdir


def test_a_failed_relaunch_keeps_the_previous_results_and_is_reported(
        tmp_path, finished_run_whose_relaunch_fails, capsys):
    """A finished run relaunched under another command that fails (a config the checkpoint
    refuses, say) gets its summary and command back, and the driver's exit says so."""
    workdir = finished_run_whose_relaunch_fails
    (workdir / "command.txt").write_text("python -m experiments.ptb_lm --config=tiny\n")
    failed = runner.run_all(str(tmp_path), ["tiny"], lambda name: runner.launch(
        "experiments.ptb_lm", ["--config=tiny", "--hidden_size=32"], str(workdir)), 1)
    assert failed == ["tiny (exit 2)"]
    assert (workdir / "summary.json").read_text() == '{"epochs": 5}'
    assert (workdir / "command.txt").read_text() == "python -m experiments.ptb_lm --config=tiny\n"
    assert not (workdir / "summary.previous.json").exists()
    assert (f"failed tiny (exit 2: error: --hidden_size=32 does not fit; its log: "
            f"{workdir / 'train.log'}); its previous results are kept") in capsys.readouterr().out
    with pytest.raises(UserError, match=r"1 run\(s\) did not finish: tiny \(exit 2\)"):
        runner.check_all_finished(failed, str(tmp_path))


def test_extra_splits_only_at_commas_that_start_a_flag():
    assert runner.extra_args(["--depths=2,4,--dry_run", "--lr_sweep=1e-2,1e-3"], ()) == [
        "--depths=2,4", "--dry_run", "--lr_sweep=1e-2,1e-3"]
    assert runner.extra_args(["--scan_unroll=5,--log_every_steps=400"], ()) == [
        "--scan_unroll=5", "--log_every_steps=400"]
    assert runner.extra_args([], ()) == []


@pytest.mark.parametrize("extra", ["--config=tiny", "--max_epochs=2,--dataset=mr",
                                   "--nosweep", "--workdir=/tmp/x"])
def test_extra_may_not_set_what_the_driver_sets_for_each_run(extra):
    """Else the binary takes the last value given, and a table row reports another run."""
    with pytest.raises(UserError, match=r"the driver sets --(config|dataset|sweep|workdir) "
                       r"for each run itself"):
        runner.extra_args([extra], ("config", "dataset", "sweep", "workdir"))


def test_the_flags_a_suite_reserves_are_those_of_its_runs():
    dc = [rc.Job("a", ("--config=x", "--dataset=mr", "--folds=0"))]
    assert rc.reserved(dc) == {"config", "dataset", "folds", "embeddings",
                                              "data_dir", "workdir", "mode"}
    hm = [rc.Job("s", ("--config=x", "--seed=0", "--lr_sweep=1,2")),
          rc.Job("b", ("--config=x", "--seed=1"), lr_from="s")]
    assert {"lr_sweep", "learning_rate", "seed"} <= rc.reserved(hm)


def test_a_failed_relaunch_of_a_run_without_a_recorded_command_is_not_finished_later(
        tmp_path, finished_run_whose_relaunch_fails):
    """A summary written without command.txt (the binary run by hand) is put back after a
    failed relaunch, without the failed command: the next driver run launches it again."""
    workdir = finished_run_whose_relaunch_fails
    relaunch = lambda name: runner.launch("experiments.ptb_lm", ["--config=tiny"], str(workdir))  # noqa: E731
    assert runner.run_all(str(tmp_path), ["tiny"], relaunch, 1) == ["tiny (exit 2)"]
    assert sorted(os.listdir(workdir)) == ["run.lock", "summary.json", "train.log"]
    assert relaunch("tiny") is not None


def test_a_failed_run_is_reported_with_the_last_line_it_wrote(tmp_path, monkeypatch, capsys):
    """Only this run's own output is quoted: not a line an earlier run left in its log."""
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    code = {"loud": "print('step 1'); print('error: out of memory'); print(); exit(1)",
            "quiet": "exit(3)"}
    (tmp_path / "quiet").mkdir()
    (tmp_path / "quiet" / "train.log").write_text("interrupted: stopped at step 9\n")

    def start(name):
        os.makedirs(tmp_path / name, exist_ok=True)
        with open(tmp_path / name / "train.log", "a") as log:
            return subprocess.Popen([sys.executable, "-c", code[name]], stdout=log)

    assert sorted(runner.run_all(str(tmp_path), ["loud", "quiet"], start, 2)) == [
        "loud (exit 1)", "quiet (exit 3)"]
    out = capsys.readouterr().out
    assert f"failed loud (exit 1: error: out of memory; its log: {tmp_path}/loud/train.log)" in out
    assert f"failed quiet (exit 3; its log: {tmp_path}/quiet/train.log)" in out


# A training binary as the drivers see it: SIGTERM or a first Ctrl-C asks it to stop, which it
# does with a checkpoint (here: after 0.3 s, unless --stuck); a second Ctrl-C stops it at once.
FAKE_RUN = """
import os, signal, sys, time

def stop(signum, frame):
    print("stopping after this step", flush=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if "--stuck" not in sys.argv:
        time.sleep(0.3)
        word = "terminated" if signum == signal.SIGTERM else "interrupted"
        print(f"{word}: stopped at step 3, checkpoint saved", flush=True)
        sys.exit(128 + signum)

signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print("training", os.getpid(), flush=True)
time.sleep(60)
"""
# A driver: run_all of runs a and b at once, as the reproduce binaries run it.
DRIVER = """
import os, sys
from dense_rnn.cli import run_script
from experiments import runner
root = sys.argv[1]
run_script(lambda: runner.run_all(root, ["a", "b"], lambda name: runner.launch(
    "fake_run", sys.argv[2:], os.path.join(root, name)), 2))
"""


def interrupted_driver(tmp_path, signals, *args):
    """Starts DRIVER, sends it each of ``signals`` once both runs train (the next once both
    have been asked to stop), and returns its exit status, output and error output; checks
    that no run outlives it."""
    (tmp_path / "fake_run.py").write_text(FAKE_RUN)
    root = tmp_path / "root"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(root), *args], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])})
    logs = [root / name / "train.log" for name in ("a", "b")]

    def wait_for(line):
        deadline = time.monotonic() + 30
        while not all(log.exists() and line in log.read_text() for log in logs):
            assert time.monotonic() < deadline and driver.poll() is None, driver.stderr.read()
            time.sleep(0.05)

    pids = []
    try:
        wait_for("training")
        pids = [int(log.read_text().split()[1]) for log in logs]
        for sig in signals:
            driver.send_signal(sig)
            wait_for("stopping")
        out, err = driver.communicate(timeout=120)
        for pid in pids:  # the driver waited for its runs (one not waited for: a zombie)
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        for pid in [driver.pid, *pids]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return driver.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_an_interrupted_driver_stops_its_runs_and_waits_for_them(tmp_path, sig):
    """The driver passes SIGTERM on (the runs exit 143) and exits as the signal it got
    asks: 130 and ``interrupted`` for Ctrl-C, 143 for SIGTERM."""
    returncode, out, err = interrupted_driver(tmp_path, [sig])
    assert (returncode, err.strip()) == ((130, "interrupted") if sig == signal.SIGINT
                                         else (143, "")), err
    assert f"{sig.name}: stopping a, b, each with a checkpoint" in out
    for name in ("a", "b"):
        assert (f"stopped {name} (exit 143: terminated: stopped at step 3, checkpoint saved; "
                f"its log: {tmp_path}/root/{name}/train.log)") in out


def test_a_second_interrupt_stops_the_runs_at_once(tmp_path):
    returncode, out, err = interrupted_driver(tmp_path, [signal.SIGINT, signal.SIGINT],
                                              "--stuck")
    assert returncode == 130 and err.strip() == "interrupted", err
    assert "stopped a (killed by SIGINT: KeyboardInterrupt; its log:" in out
    assert "stopped b (killed by SIGINT: KeyboardInterrupt; its log:" in out

