"""The scenario submissions' folders (tests/scenarios/): each builds from the masters, and a
master that no longer holds what a scenario edits fails loudly, naming it."""

import pytest

import scenarios


@pytest.mark.parametrize("scenario", scenarios.SCENARIOS)
def test_every_scenario_builds_from_the_committed_release_and_the_masters(scenario):
    built = scenarios.from_checkout(scenario)
    about = scenarios.about(scenario)
    assert built and about["about"].strip(), scenario
    assert set(about) <= {"about", "attack", "every_notebook"}, about


def test_an_edit_the_master_no_longer_matches_names_the_scenario(tmp_path, monkeypatch):
    folder = tmp_path / "changed"
    folder.mkdir()
    (folder / "scenario.toml").write_text('about = "an edit of lines the master does not hold"\n')
    (folder / "03_amp.cells").write_text("# base: reference\n\n# %% edit amp_train_step\n"
                                      "<<<<<<<\n    not in the master\n=======\n    anything\n>>>>>>>\n")
    monkeypatch.setattr(scenarios, "FOLDER", tmp_path)
    monkeypatch.setattr(scenarios, "SCENARIOS", ("changed",))
    with pytest.raises(ValueError, match="changed/03_amp.cells, amp_train_step: the master's solution changed"):
        scenarios.from_checkout("changed")
    (folder / "03_amp.cells").write_text("# %% replace amp_train_step\npass\n")
    with pytest.raises(ValueError, match="the first line must be '# base: reference'"):
        scenarios.from_checkout("changed")


def test_cells_added_after_one_cell_land_in_the_files_order():
    nb = scenarios.from_checkout("cheater")["01_profile"]
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    at = ids.index("measure_throughput")
    assert "LAB_THRESHOLDS" in nb.cells[at + 1].source and "_honest_measure_throughput" in nb.cells[at + 2].source
