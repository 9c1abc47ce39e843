"""06's paired ladder (labsupport/paired.py): rounds interleave every rung, the order of two rungs of
clearly different cost holds under a competing process, the spread is reported, and a slower
rung's cause is measured."""

import subprocess
import sys

import pandas as pd
import pytest
import torch

from labsupport import paired as pairing


def test_every_round_times_every_rung_once_alternating_order():
    log = []
    sides = {name: (lambda name=name: log.append(name)) for name in ("a", "b", "c")}
    seconds, orders = pairing.time_rounds(sides, "cpu", rounds=4, steps_per_round=2)
    assert orders == [("a", "b", "c"), ("c", "b", "a")] * 2
    # each block is steps_per_round calls of one side; the blocks follow each round's order
    assert log == [side for order in orders for side in order for _ in range(2)]
    assert all(len(v) == 4 and all(t >= 0 for t in v) for v in seconds.values())


def _matmuls(times: int):
    a = torch.randn(256, 256)

    def run():
        for _ in range(times):
            a @ a
    return run


def _paired(seconds, orders, steps=2):
    per_image = {s: tuple(t / steps for t in v) for s, v in seconds.items()}
    return pairing.PairedLadder(("cheap", "dear"), {"cheap": "baseline", "dear": "+dear"},
                               {"cheap": None, "dear": "cheap"}, per_image, tuple(orders), steps,
                               {"before": pairing.load_average()})


def test_order_of_two_rungs_holds_under_a_competing_process():
    """A process burning a core beside the timing (as another job on a shared machine does): the
    rung that does 4x the work reads slower in the paired median, its speedup near 1/4 with its
    quartiles reported, and the cheaper one is never read slower by more than the spread allows."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            seconds, orders = pairing.time_rounds({"cheap": _matmuls(5), "dear": _matmuls(20)}, "cpu",
                                                 rounds=7, steps_per_round=2)
        finally:
            torch.set_num_threads(threads)
        assert burner.poll() is None, "the competing process ran throughout"
    finally:
        burner.kill()
        burner.wait()
    paired = _paired(seconds, orders)
    speed = paired.speedup("dear", "cheap")
    assert speed.n == 7 and speed.q1 <= speed.median <= speed.q3
    assert speed.q3 < 0.6, f"4x the work read {speed} of the cheap rung's speed, paired"
    assert paired.slower() == ["dear"]
    table = paired.table()
    assert list(table.index) == ["baseline", "+dear"]
    assert "(" in table.loc["+dear", "this rung, paired"], "the spread is shown beside the median"
    assert paired.summary()["dear"]["this_rung"] == pytest.approx(speed.median)


def test_table_sets_paired_figures_beside_each_notebooks_own():
    paired = _paired({"cheap": [2.0, 2.0, 2.0], "dear": [4.0, 4.0, 5.0]}, [("cheap", "dear")] * 3)
    recorded = pd.DataFrame([{"stage": "cheap", "samples_per_s": 1.0}, {"stage": "dear", "samples_per_s": 0.8}])
    table = paired.table(recorded)
    assert table.loc["+dear", "this rung, paired"].startswith("0.50x")
    assert table.loc["+dear", "this rung, its notebook"] == "0.80x"
    assert table.loc["baseline", "samples/s, paired (IQR)"].startswith("1.0 ")


def test_a_slower_rung_is_explained_by_its_profile_beside_its_base():
    a = torch.randn(128, 128)
    frame = pairing.profile_side_by_side({"base": (lambda: a @ a, 1),
                                         "slower": (lambda: (a @ a, torch.sort(torch.randn(200_000))), 1)}, "cpu")
    assert frame.columns[-1] == "change, µs/image"
    top = frame.drop(index="total (every operator)")
    assert "aten::sort" in top.index[:3], f"the operator added shows among the largest changes: {list(top.index)}"
    assert frame.loc["total (every operator)", "change, µs/image"] > 0
    paired = _paired({"cheap": [1.0, 1.0], "dear": [3.0, 3.0]}, [("cheap", "dear")] * 2)
    paired.causes["dear"] = frame.rename(columns={"base, µs/image": "baseline", "slower, µs/image": "+dear"})
    paired.compiled["dear"] = {"compile_s": 1.5, "graphs": 2, "graph_breaks": 1, "reasons": ["a print"]}
    why = paired.explanation("dear")
    assert "0.33x" in why and "1 graph break" in why and "aten::sort" in why


def test_06s_paired_ladder_times_each_rung_built_from_the_carried_code_and_names_the_missing(tiny_env):
    """At the tiny profile: the baseline from nothing, 02's rung from the code its checks carried,
    timed together in alternating rounds; the rungs whose notebooks carried no code are named with
    what to run, not raised."""
    from autograder import reference
    from labsupport import carry
    from labsupport.grading import grading_lab

    lab = grading_lab()
    carry.keep("02", reference.namespace("02"))
    table = pairing.ladder(lab, rounds=3, steps_per_round=1, progress=False)
    assert table.stages == ("01-baseline", "02-data")
    assert table.orders == (("01-baseline", "02-data"), ("02-data", "01-baseline"), ("01-baseline", "02-data"))
    assert set(table.not_timed) == {"03-amp", "04-memory", "05-compile"}
    assert "03" in table.not_timed["03-amp"], table.not_timed
    assert list(table.table().index) == ["baseline", "+data loading"]
    assert table.speedup("02-data", "01-baseline").n == 3 and table.load["before"] is not None
    from labsupport import report
    assert "+data loading" in "".join(report.paired_html(tiny_env)), "kept for every report page from the store"


def test_every_report_page_from_the_store_shows_the_paired_ladder_beside_each_notebooks_figure(tmp_path):
    """06 keeps its paired ladder in the results store; every page exported from that store (06's,
    and 07's again with its inference table) shows the paired table beside each notebook's own
    figure, the load it ran under, and why a rung read slower than its base."""
    from labsupport import report

    paired = _paired({"cheap": [1.0, 1.0], "dear": [3.0, 3.0]}, [("cheap", "dear"), ("dear", "cheap")])
    paired.compiled["dear"] = {"compile_s": 1.5, "graphs": 2, "graph_breaks": 1, "reasons": []}
    rows = pd.DataFrame([{"stage": "cheap", "samples_per_s": 1.0}, {"stage": "dear", "samples_per_s": 0.8}])
    store = tmp_path / "results"
    report.keep_paired(paired.table(rows), paired.lines(), store)
    for page in ("06.html", "07.html"):
        lad = report.Ladder(table=pd.DataFrame([{"stage": "cheap", "samples/s": 1.0}]), rows=rows, directory=store)
        text = report.export_html(tmp_path / page, lad, checks=pd.DataFrame(), analysis="-").read_text()
        section = text[text.index('id="paired"'):text.index('id="paired"') + 4000]
        assert "this rung, paired" in section and "0.33x" in section and "0.80x" in section
        assert "2 rounds of 2 steps per rung" in section and "1 graph break" in section
    lad = report.Ladder(table=lad.table, rows=rows, directory=tmp_path / "another-store")
    plain = report.export_html(tmp_path / "plain.html", lad, checks=pd.DataFrame(), analysis="-").read_text()
    assert 'id="paired"' not in plain
