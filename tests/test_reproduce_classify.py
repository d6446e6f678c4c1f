"""The classification reproduction driver: its suites, run names and report."""

import json
import os

import pytest
from absl import flags

from dense_rnn.configs import dc_bilstm, hm_densernn
from dense_rnn.train import classify
from experiments import reproduce_classify as rc


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


def test_every_suite_config_exists_and_table_aliases(parsed):
    configs = classify.all_configs()
    for suite in ("dc_table1", "dc_table3", "dc_table4", "dc_table5", "hm_table2",
                  "hm_table3", "hm_imdb", "hm_ag"):
        for job in rc.suite_jobs(suite):
            assert rc._arg(job, "config") in configs, job
    t3 = {rc._arg(j, "config") for j in rc.suite_jobs("dc_table3")}
    assert {"bilstm", "dc_bilstm", "dc_bilstm_t3_dl5_dh40"} <= t3
    assert "dc_bilstm_t3_dl15_dh13" not in t3  # the Table 1 model under its own name
    t3 = {rc._arg(j, "config") for j in rc.suite_jobs("hm_table3")}
    assert "hm_densegru_64_no_hierarchy" not in t3 and "densegru_64" in t3
    assert (hm_densernn.CONFIGS["hm_densegru_64_no_hierarchy"].model_args
            == hm_densernn.CONFIGS["densegru_64"].model_args)


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
    table = rc.report(jobs)
    assert ("| bilstm | sst2 | 1,440,000 | 840,000 | 843,602 | 2 of 3 | 82.0 ± 2.0 | 80.0 | 87.5 |"
            in table)
    rc.record(jobs, str(tmp_path / "rec"))
    assert sorted(os.listdir(tmp_path / "rec" / jobs[0].name)) == [
        "command.txt", "metrics.jsonl", "summary.json"]
    rc.plot(jobs, str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 0


def test_paper_accuracy_of_both_families():
    assert dc_bilstm.paper_accuracy("dc_bilstm", "trec") == 95.6
    assert hm_densernn.paper_accuracy("hm_densegru_64", "sst5") == 46.8
    assert hm_densernn.paper_accuracy("lstm_128", "imdb") == 89.3
    assert hm_densernn.paper_accuracy("hm_densegru_64_no_dense_block", "sst5") == 46.3
    assert hm_densernn.paper_accuracy("gru_64", "mr") is None
