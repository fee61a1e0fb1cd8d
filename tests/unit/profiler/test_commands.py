"""`kubeseer profiler` refuses what it cannot run with, in one line."""

import json

from kubeseer import cli


def test_a_profiler_without_a_node_name_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    kubeconfig = tmp_path / "missing.kubeconfig"
    assert cli.main(["profiler", "--node", "", "--kubeconfig", str(kubeconfig)]) == 2
    assert "node name is required" in capsys.readouterr().err


def test_an_unreadable_scenario_is_refused(capsys, tmp_path):
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"processes": []}))  # no gpus
    assert cli.main(["profiler", "--node", "n", "--nvml-standin", str(scenario)]) == 2
    assert "scenario.json" in capsys.readouterr().err


def test_a_bad_period_is_refused(capsys, tmp_path):
    argv = ["profiler", "--node", "n", "--period", "0", "--kubeconfig", str(tmp_path / "k")]
    assert cli.main(argv) == 2
    assert "period_s must be > 0" in capsys.readouterr().err
