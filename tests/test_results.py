"""The results store round-trips and fails with errors that name the notebook to run."""

import json

import pytest

from labsupport import results
from labsupport.hardware import PROFILES, describe_machine
from labsupport.train import StepConfig


def test_round_trip(tmp_path):
    machine = describe_machine()
    path = results.record("01-baseline", {"samples_per_s": 123.4, "phases": {"forward": 0.5}},
                          config=StepConfig(), machine=machine, profile=PROFILES["tiny"],
                          directory=tmp_path)
    assert path == tmp_path / "01-baseline.json"
    rec = results.load("01-baseline", tmp_path)
    assert rec["metrics"]["samples_per_s"] == 123.4
    assert rec["config"] == StepConfig().as_dict()
    assert rec["machine"] == machine.as_dict()
    assert rec["profile"]["name"] == "tiny"
    results.record("03-amp", {"samples_per_s": 200.0}, machine=machine, directory=tmp_path)
    frame = results.load_all(tmp_path, required=["01-baseline", "03-amp"])
    assert list(frame["stage"]) == ["01-baseline", "03-amp"]
    assert list(frame["samples_per_s"]) == [123.4, 200.0]
    assert set(frame["device_class"]) == {machine.device_class}


def test_results_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "r"))
    results.record("02-loader", {"x": 1}, machine={"device_class": "cpu"})
    assert (tmp_path / "r" / "02-loader.json").exists()


def test_missing_stage_names_the_notebook(tmp_path):
    with pytest.raises(results.ResultsError, match="Run 02_data_loading.ipynb"):
        results.load("02-loader", tmp_path)
    with pytest.raises(results.ResultsError, match="'05-compile' \\(run 05_compile.ipynb\\)"):
        results.load_all(tmp_path, required=["05-compile"])


def test_malformed_file_names_file_and_notebook(tmp_path):
    (tmp_path / "03-amp.json").write_text("{not json")
    with pytest.raises(results.ResultsError, match="03-amp.json.*03_amp.ipynb"):
        results.load("03-amp", tmp_path)
    (tmp_path / "04-memory.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(results.ResultsError, match="04_checkpointing.ipynb"):
        results.load("04-memory", tmp_path)


def test_bad_stage_name_and_unstorable_value(tmp_path):
    with pytest.raises(ValueError, match="01-baseline"):
        results.record("baseline", {}, machine={}, directory=tmp_path)
    with pytest.raises(TypeError, match="Cannot store object"):
        results.record("01-x", {"bad": object()}, machine={}, directory=tmp_path)
    assert not (tmp_path / "01-x.json").exists()


def test_in_colab_the_dataset_is_on_the_runtimes_disk_and_results_on_drive(monkeypatch, tmp_path):
    """Reading 6,000 JPEGs through Drive's mount would make 01 and 02 time Drive: in Colab the
    dataset is generated on the runtime's disk, while results and the report stay in the lab
    folder on Drive (LAB_HOME), and LAB_DATA still wins."""
    import sys
    import types

    from labsupport import paths

    for name in ("LAB_DATA", "LAB_RESULTS", "LAB_REPORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LAB_HOME", str(tmp_path / "drive"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    assert paths.data_root() == paths.COLAB_DATA
    assert paths.results_dir() == tmp_path / "drive" / "results"
    assert paths.report_path() == tmp_path / "drive" / "report.html"
    monkeypatch.setenv("LAB_DATA", str(tmp_path / "mine"))
    assert paths.data_root() == tmp_path / "mine"
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.delenv("LAB_DATA")
    assert paths.data_root() == tmp_path / "drive" / "data" / "lab-shapes"  # LAB_HOME outside Colab


def test_the_kept_checks_are_read_in_notebook_order_and_an_unreadable_table_is_left_out(tmp_path):
    """The report's "Graded checks" table (results.kept_checks): every notebook's kept table, 01's
    rows before 03's, and a table that is not JSON left out rather than raised."""
    folder = tmp_path / "checks"
    folder.mkdir()
    row = {"measured": 1.0, "threshold": 2.0, "result": "pass", "note": ""}
    (folder / "03.json").write_text(json.dumps([{"check": "03-amp-speedup", **row}]))
    (folder / "01.json").write_text(json.dumps([{"check": "01-timer", **row}, {"check": "01-diagnosis", **row}]))
    (folder / "02.json").write_text("{not json")
    table = results.kept_checks(tmp_path)
    assert list(table.check) == ["01-timer", "01-diagnosis", "03-amp-speedup"]
    assert list(table.columns) == ["check", "measured", "threshold", "result", "note"]
    assert results.kept_checks(tmp_path / "nowhere").empty
