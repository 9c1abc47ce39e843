"""The report of notebook 06: the ladder from the results store (missing and foreign stages named,
never raised), and the exported HTML, rendered in a real headless browser (Debian's chromium)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from labsupport import report, results
from labsupport.grading import paired


def _assemble():
    """The reference's assemble_ladder (06's master): the report shows whatever table it is given."""
    from autograder import reference

    return reference.solutions("06").assemble_ladder

MACHINE = {"device_class": "cpu-bf16", "device_name": "Test CPU"}
RATES = {"01-baseline": 40.0, "02-data": 44.0, "03-amp": 70.0, "04-memory": 72.0, "05-compile": 66.0}


def _record(folder, stages, machine=MACHINE):
    for stage in stages:
        metrics = {"samples_per_s": RATES[stage], "peak_bytes": 200 * 2**20}
        if stage == "03-amp":
            metrics["accuracy"] = 0.95
        results.record(stage, metrics, machine=machine, profile={"batch_size": 32}, directory=folder)


def test_ladder_orders_rungs_and_computes_speedups(tmp_path):
    _record(tmp_path, RATES)
    lad = report.ladder(tmp_path, assemble=_assemble())
    assert list(lad.table.index) == [label for _, label in report.RUNGS] and not lad.missing
    assert lad.table["speedup (cumulative)"].round(3).tolist() == [1.0, 1.1, 1.75, 1.8, 1.65]
    assert lad.table["speedup (this rung)"].iloc[2] == pytest.approx(70 / 44)
    # +compile builds on +AMP (compile cannot trace 04's checkpointing), not on the row above it
    assert lad.table["speedup (this rung)"].iloc[4] == pytest.approx(66 / 70)
    assert lad.table["accuracy %"].iloc[2] == pytest.approx(95.0)


def test_missing_and_foreign_stages_are_listed_with_the_notebook_to_run(tmp_path):
    _record(tmp_path, ["01-baseline", "02-data"])
    _record(tmp_path, ["03-amp"], machine={"device_class": "cuda-tensorcore", "device_name": "A GPU"})
    lad = report.ladder(tmp_path, assemble=_assemble())
    assert len(lad.table) == 2
    text = "\n".join(lad.missing)
    assert "03-amp" in text and "not on this machine" in text and "03_amp.ipynb" in text
    assert "04-memory" in text and "04_checkpointing.ipynb" in text


def test_empty_store_gives_a_report_not_a_stack_trace(tmp_path):
    page = report.export_html(tmp_path / "r.html", report.ladder(tmp_path / "nothing", assemble=_assemble())).read_text()
    assert "No stage has been recorded yet" in page and "01_profile.ipynb" in page


chromium = shutil.which("chromium") or shutil.which("chromium-browser")
SECTIONS = ("machine", "ladder", "rungs", "plots", "case-study", "checks", "inference", "analysis")


def _full_report(tmp_path):
    """A report of every rung with phases, spread, checks and an analysis, as 06 exports it."""
    from labsupport import grading

    folder = tmp_path / "results"
    for stage in RATES:
        metrics = {"samples_per_s": RATES[stage], "median_ms": 32_000 / RATES[stage], "iqr_ms": 40.0,
                   "peak_bytes": 200 * 2**20, "phases_ms": {"data wait": 20.0, "host to device": 1.0,
                                                              "forward": 250.0, "backward": 400.0, "optimizer": 30.0}}
        if stage == "03-amp":
            metrics["accuracy"] = 0.95
        results.record(stage, metrics, machine=MACHINE, profile={"batch_size": 32}, directory=folder)
    checks = grading.table([grading.CheckResult("02-loader-speedup", 5.1, 3.0, "higher", "cpu", "pass")])
    lad = report.ladder(folder, assemble=_assemble())
    return report.export_html(tmp_path / "report.html", lad, checks=checks,
                              analysis="Mixed precision paid most: 1.75x.")


def test_report_has_every_section_and_no_network_reference(tmp_path):
    html = _full_report(tmp_path).read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html, f"the report lacks its {section} section"
    assert "http://" not in html and "https://" not in html, "the report must not need the network"
    assert "Mixed precision paid most" in html and "published speedup" in html
    assert html.count('src="data:image/png;base64,') == 4  # ladder, breakdown, memory, case study


def test_the_inference_section_names_07_until_07_records_it(tmp_path, monkeypatch):
    """07 runs after 06: until it has recorded its table, the section says which notebook to run."""
    monkeypatch.setenv("LAB_RESULTS", str(tmp_path / "results"))
    html = _full_report(tmp_path).read_text()
    assert 'id="inference"' in html and "Run 07_compression.ipynb" in html
    rows = [{"model": "fp32, compiled", "size (MiB)": 42.7, "p50 (ms)": 15.4},
            {"model": "int8, compiled", "size (MiB)": 10.7, "p50 (ms)": 7.7}]
    results.record("07-inference", {"models": rows}, machine=MACHINE, directory=tmp_path / "results")
    html = _full_report(tmp_path).read_text()
    assert "int8, compiled" in html and "10.70" in html and "Run 07_compression.ipynb" not in html


@pytest.mark.skipif(chromium is None, reason="needs Debian's chromium (make test installs it when it can: "
                                              "apt-get install chromium)")
@pytest.mark.parametrize("width", [1280, 390], ids=["desktop", "phone"])
def test_html_report_renders_in_headless_chromium(tmp_path, width):
    """The page renders offline (every host name unresolvable) at a desktop and a phone width, with
    every section in the DOM and the embedded plots drawn in the screenshot."""
    page = _full_report(tmp_path)
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--user-data-dir=" + str(tmp_path / "profile"), f"--window-size={width},4200"]
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'class="dataframe ladder"' in dom.stdout and dom.stdout.count("<img") == 4
    assert all(f'id="{section}"' in dom.stdout for section in SECTIONS)
    assert "+compile" in dom.stdout and "1.65" in dom.stdout
    shot = tmp_path / f"report-{width}.png"
    run = subprocess.run(base + [f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = Image.open(shot).convert("RGB")
    print(f"screenshot at {width} px: {pixels.size[0]}x{pixels.size[1]}, {shot.stat().st_size / 1024:.0f} KiB")
    colours = pixels.getcolors(maxcolors=1 << 20)
    bar = (0x4C, 0x72, 0xB0)  # the ladder's bar colour: present only if the embedded PNG rendered
    near = sum(count for count, (r, g, b) in colours if abs(r - bar[0]) + abs(g - bar[1]) + abs(b - bar[2]) < 30)
    assert near > 500, f"the ladder plot did not render (only {near} pixels in its bar colour); see {shot}"
    keep = Path(os.environ.get("LAB_SCREENSHOTS", "")) if os.environ.get("LAB_SCREENSHOTS") else None
    if keep:  # for looking at: LAB_SCREENSHOTS=build/screens make test
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep / shot.name)


@pytest.mark.skipif(chromium is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_no_table_of_the_report_runs_off_the_page_at_1280_px(tmp_path):
    """Issue 63: at 1280 px the "Each rung" table was wider than the page and its last column cut
    off. Laid out by chromium, every table fits inside the page's text column (a script added to a
    copy of the page writes each table's overflow into the DOM, which --dump-dom prints)."""
    page = _full_report(tmp_path)
    probe = tmp_path / "probe.html"
    script = ("<script>window.addEventListener('load',()=>{const out=[];"
              "const edge=document.body.getBoundingClientRect().right;"
              "for(const t of document.querySelectorAll('table')){const r=t.getBoundingClientRect();"
              "const box=t.parentElement;"
              "if(r.right>edge+1||box.scrollWidth>box.clientWidth+1)out.push(t.className+':'+Math.round(r.width));}"
              "document.body.setAttribute('data-overflow',out.join(';')||'none');});</script>")
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=" + str(tmp_path / "profile"),
                          "--window-size=1280,2000", "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = dom.stdout.split('data-overflow="', 1)[1].split('"', 1)[0]
    assert found == "none", f"tables wider than the page at 1280 px: {found}"


def test_a_steps_flops_are_counted_as_a_hand_count_of_its_layers_gives():
    """FlopCounterMode on the step itself, against the multiply-adds of every convolution and the
    linear layer read from their shapes: forward once, backward twice (inputs' and weights'
    gradients), except the first convolution's gradient for the images, which nothing needs."""
    import torch
    import torchvision

    from labsupport import train

    size, macs = 64, {}
    with torch.device("meta"):
        model = torchvision.models.resnet18(num_classes=10)
    for name, layer in model.named_modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            def hook(module, args, out, name=name):
                per_output = (module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
                              if isinstance(module, torch.nn.Conv2d) else module.in_features)
                macs[name] = out[0].numel() * per_output
            layer.register_forward_hook(hook)
    with torch.device("meta"):
        model(torch.empty(1, 3, size, size))
    hand = 2 * (3 * sum(macs.values()) - macs["conv1"])
    counted = train.step_flops(size)
    assert abs(counted - hand) / hand < 0.05, (counted, hand)
    assert train.step_flops(size, batch_size=4) == 4 * counted
    assert train.step_flops(32) > 0  # one image's last feature map is 1 x 1 there (BatchNorm refuses it alone)


def test_the_peak_is_a_figure_with_its_spread_and_the_roofline_reads_a_rung_against_it():
    import torch

    from labsupport import measure, train

    peak = measure.matmul_peak("cpu", torch.float32, n=256, min_run_time_s=0.05)
    assert peak.median > 0 and peak.q1 <= peak.median <= peak.q3 and peak.n >= 1

    import pandas as pd

    rows = pd.DataFrame([{"stage": "01-baseline", "samples_per_s": 100.0},
                                {"stage": "03-amp", "samples_per_s": 300.0}])
    lad = report.Ladder(pd.DataFrame(), rows, setups={"01-baseline": {"amp_dtype": None, "image_size": 64},
                                                             "03-amp": {"amp_dtype": "bfloat16", "image_size": 64}})
    roof = report.roofline(lad, "cpu", peaks={"float32": _entry(200e9, 90.0), "bfloat16": _entry(400e9, 300.0)})
    per_image = train.step_flops(64)
    assert list(roof["dtype"]) == ["float32", "bfloat16"]
    assert roof["% of peak"].tolist() == pytest.approx([100 * per_image * 100 / 200e9, 100 * per_image * 300 / 400e9])
    assert roof["best kernel GFLOP/s"].tolist() == [90.0, 300.0]


def _entry(theoretical, best_gflops):
    """A dtype's peaks as labsupport.roofline.peaks keeps them: the theoretical one, and kernels."""
    return {"theoretical": theoretical, "how": "test", "image_size": 64, "batch_size": 32,
            "kernels": [{"kernel": "matmul 512x512", "GFLOP/s": best_gflops / 2},
                        {"kernel": "3x3 conv", "GFLOP/s": best_gflops}]}


def test_percent_of_peak_is_against_the_theoretical_peak_and_a_rung_above_it_is_explained():
    """Issue 63: `make run` printed the baseline at 132% of a measured matmul "peak". "% of peak" is
    now against the theoretical peak, the best kernel stands beside it, and a rung at or above
    the theoretical peak says what that means instead of reading as a machine beyond its limit."""
    import pandas as pd

    from labsupport import train

    per_image = train.step_flops(64)
    rows = pd.DataFrame([{"stage": "01-baseline", "samples_per_s": 100.0},
                         {"stage": "02-data", "samples_per_s": 190.0},
                         {"stage": "03-amp", "samples_per_s": 250.0}])
    setups = {s: {"amp_dtype": d, "image_size": 64} for s, d in
              (("01-baseline", None), ("02-data", None), ("03-amp", "bfloat16"))}
    theoretical = per_image * 200  # the fp32 rungs run at 50% and 95% of it; the bf16 one above it
    roof = report.roofline(report.Ladder(pd.DataFrame(), rows, setups=setups), "cpu",
                           peaks={"float32": _entry(theoretical, 1.0), "bfloat16": _entry(per_image * 240, 1.0)})
    assert roof["% of peak"].round(1).tolist() == [50.0, 95.0, pytest.approx(104.2, abs=0.1)]
    assert roof["theoretical peak GFLOP/s"].iloc[0] == pytest.approx(theoretical / 1e9)
    assert "near the theoretical peak" in roof["reading"].iloc[1]
    assert "above the theoretical peak" in roof["reading"].iloc[2] and "count" in roof["reading"].iloc[2]
    unknown = report.roofline(report.Ladder(pd.DataFrame(), rows.iloc[:1], setups=setups), "cpu",
                              peaks={"float32": {**_entry(None, 50.0), "how": "not known: no cpufreq"}})
    assert unknown["% of peak"].isna().all(), "no percentage where the theoretical peak cannot be known"


def test_the_peak_is_measured_once_per_run_and_every_reader_shows_that_value(tmp_path, monkeypatch):
    """Issue 63: the printed table (make run: report.roofline after 06) and the HTML report each
    measured the peak again (208.8 against 184.8 GFLOP/s fp32), so one rung read 119% and 134%.
    The kernels are measured once, kept in the results store, and read back by every later reader."""
    import itertools

    from labsupport import measure
    from labsupport.hardware import describe_machine

    speeds = itertools.count(1)

    class Timed:  # what measure.micro returns, a new time each call, as a busy machine gives
        def __init__(self):
            self.median = 1e-3 * next(speeds)
            self.times = [self.median]

    monkeypatch.setattr(measure, "micro", lambda *a, **k: Timed())
    here = describe_machine().as_dict()
    for stage, dtype in (("01-baseline", None), ("03-amp", "bfloat16")):
        results.record(stage, {"samples_per_s": 50.0, "median_ms": 640.0}, config={"amp_dtype": dtype},
                       machine=here, profile={"batch_size": 32, "image_size": 64}, directory=tmp_path / "results")
    lad = report.ladder(tmp_path / "results", assemble=_assemble())
    first = report.roofline(lad, "cpu")
    again = report.roofline(report.ladder(tmp_path / "results", assemble=_assemble()), "cpu")
    assert first.equals(again), "a second reader measured the peak again instead of reading the kept one"
    html = report.export_html(tmp_path / "report.html", lad, checks=_no_checks(), analysis="-").read_text()
    for value in first["best kernel GFLOP/s"]:
        assert f"{value:,.1f}" in html


def _no_checks():
    from labsupport import grading

    return grading.table([grading.CheckResult("02-loader-speedup", 5.1, 3.0, "higher", "cpu", "pass")])


def test_each_rungs_phases_add_up_to_the_step_time_the_ladder_gives_it(tmp_path):
    """Issue 63: the report drew the baseline's step at ~1,580 ms (its breakdown's stamped steps)
    while the ladder gave it a 368 ms median. Every rung's phases now add up to its timed median
    step, and a breakdown stamped that far off its step is named under the chart."""
    folder = tmp_path / "results"
    stamped = {"data wait": 40.0, "host to device": 0.0, "forward": 680.0, "backward": 780.0, "optimizer": 80.0}
    for stage, median, phases in (("01-baseline", 368.0, stamped),
                                  ("02-data", 330.0, {"data wait": 10.0, "host to device": 0.0, "forward": 130.0,
                                                      "backward": 180.0, "optimizer": 12.0}),
                                  ("03-amp", 200.0, {"data wait": 9.0})):  # timed by the judge: its wait only
        results.record(stage, {"samples_per_s": 32_000 / median, "median_ms": median, "phases_ms": phases},
                       machine=MACHINE, profile={"batch_size": 32}, directory=folder)
    lad = report.ladder(folder, assemble=_assemble())
    ph = report.phases(lad)
    assert ph.sum(axis=1).tolist() == pytest.approx([368.0, 330.0, 9.0])
    assert ph.loc["baseline", "backward"] == pytest.approx(368.0 * 780 / 1580)
    assert [m.split(":")[0] for m in report.phase_mismatches(lad)] == ["baseline"]
    html = report.export_html(tmp_path / "r.html", lad, checks=_no_checks(), analysis="-").read_text()
    assert "1,580 ms against a timed median of 368 ms" in html


def test_the_written_analysis_is_rendered_as_html_not_raw_markdown(tmp_path):
    """Issue 63: the analysis showed its asterisks and backticks. It is Markdown rendered to HTML,
    and HTML a student typed in it is shown as text, never run in an instructor's browser."""
    lad = report.ladder(tmp_path / "nothing", assemble=_assemble())
    text = "AMP paid **most**: `bf16` autocast.\n\n- one\n- two\n\n<script>alert(1)</script>"
    html = report.export_html(tmp_path / "r.html", lad, checks=_no_checks(), analysis=text).read_text()
    analysis = html.split('id="analysis"', 1)[1]
    assert "<strong>most</strong>" in analysis and "<code>bf16</code>" in analysis and "<li>two</li>" in analysis
    assert "**" not in analysis and "`" not in analysis
    assert "<script>" not in analysis and "&lt;script&gt;" in analysis


def test_the_memory_plot_names_its_rungs_in_a_legend_not_in_labels_that_overlap(tmp_path):
    """Issue 63: two rungs of close throughput and memory printed their labels over each other."""
    _record(tmp_path, RATES)
    memory = report.plots(report.ladder(tmp_path, assemble=_assemble()))["memory"]
    ax = memory.axes[0]
    assert not ax.texts, "labels written beside the points overlap where two rungs sit close"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [label for _, label in report.RUNGS]


def test_a_report_made_where_the_ladder_was_measured_reads_each_rung_against_the_peak(tmp_path):
    """The peak is measured now, so the section appears only where the rungs were measured (the
    full report above, of another machine, has none)."""
    from labsupport.hardware import describe_machine

    here = describe_machine().as_dict()
    for stage, dtype in (("01-baseline", None), ("03-amp", "bfloat16")):
        results.record(stage, {"samples_per_s": 50.0, "median_ms": 640.0}, config={"amp_dtype": dtype},
                       machine=here, profile={"batch_size": 32, "image_size": 64}, directory=tmp_path / "results")
    lad = report.ladder(tmp_path / "results", assemble=_assemble())
    from labsupport import grading

    checks = grading.table([grading.CheckResult("02-loader-speedup", 5.1, 3.0, "higher", "cpu", "pass")])
    html = report.export_html(tmp_path / "report.html", lad, checks=checks, analysis="-").read_text()
    assert 'id="roofline"' in html and "% of peak" in html and "bfloat16" in html
    assert 'id="roofline"' not in _full_report(tmp_path / "other").read_text()


def test_a_rung_record_with_a_setup_the_lab_never_runs_is_left_out_of_the_roofline(tmp_path):
    """Rung records come from stores a student's code wrote, and an instructor's report reads them:
    a dtype or image size the lab never runs is dropped, and a record whose parts are not objects
    is refused by name, never counted or raised on inside the report."""
    import pandas as pd

    from labsupport.hardware import describe_machine

    here = describe_machine().as_dict()
    forged = {"01-baseline": ({"amp_dtype": None}, {"image_size": 10**9}),
              "03-amp": ({"amp_dtype": "Tensor"}, {"image_size": 64}),
              "04-memory": ({"amp_dtype": None}, {"image_size": "64"}),
              "05-compile": ({"amp_dtype": "float16"}, {"image_size": 64})}
    for stage, (config, profile) in forged.items():
        results.record(stage, {"samples_per_s": 50.0}, config=config, machine=here,
                       profile={"batch_size": 32, **profile}, directory=tmp_path / "results")
    lad = report.ladder(tmp_path / "results")
    assert lad.setups["01-baseline"]["image_size"] is None and lad.setups["03-amp"] == {"amp_dtype": None, "image_size": None}
    assert lad.setups["04-memory"]["image_size"] is None and lad.setups["05-compile"] == {"amp_dtype": "float16", "image_size": 64}
    roof = report.roofline(lad, "cpu", peaks={"float32": _entry(1e11, 1.0), "float16": _entry(2e11, 1.0)})
    assert list(roof["dtype"]) == ["float16"]
    rows = pd.DataFrame([{"stage": "01-baseline", "samples_per_s": 1.0}])
    assert report.roofline(report.Ladder(pd.DataFrame(), rows, setups={"01-baseline": {"amp_dtype": "__class__", "image_size": 64}}),
                           "cpu", peaks={}).empty
    import json

    record = json.loads((tmp_path / "results" / "01-baseline.json").read_text())
    (tmp_path / "results" / "02-data.json").write_text(json.dumps({**record, "stage": "02-data", "metrics": [1]}))
    with pytest.raises(results.ResultsError, match="metrics must be a JSON object"):
        results.load("02-data", tmp_path / "results")


def test_06_measures_again_here_the_rungs_recorded_on_another_machine(tmp_path, tiny_env):
    """Colab gives every notebook a new runtime, often another machine: 06 measures each rung
    recorded elsewhere again here (01 from nothing, 02 from the code its checks carried), keeps
    where it was first measured, and reports which rungs were measured again; a rung whose
    notebook carried no code is named with what to run."""
    from autograder import reference
    from labsupport import carry
    from labsupport.grading import grading_lab

    lab = grading_lab()
    colab = {**lab.machine.as_dict(), "device_name": "Intel(R) Xeon(R) CPU @ 2.20GHz", "device_class": "cpu"}
    for stage in ("01-baseline", "02-data", "03-amp"):
        results.record(stage, {"samples_per_s": 10.0, "median_ms": 800.0, "accuracy": 0.5}, machine=colab,
                       profile={"batch_size": 8, "image_size": 32})
    carry.keep("02", reference.namespace("02"))
    lad = report.ladder(machine=lab.machine.as_dict())
    assert set(lad.elsewhere) == {"01-baseline", "02-data", "03-amp"} and lad.table.empty
    assert "Intel(R) Xeon(R) CPU @ 2.20GHz (cpu)" in lad.elsewhere["02-data"]
    done = paired.measure_here(lab, lad.elsewhere)
    assert done["01-baseline"] == done["02-data"] == "measured again here", done
    assert done["03-amp"].startswith("not measured again") and "03" in done["03-amp"], done
    lad = report.ladder(machine=lab.machine.as_dict(), assemble=reference.solutions("06").assemble_ladder)
    assert set(lad.elsewhere) == {"03-amp"} and list(lad.table.index) == ["baseline", "+data loading"]
    again = results.load("02-data")
    assert again["machine"]["device_name"] == lab.machine.device_name and again["metrics"]["samples_per_s"] != 10.0
    assert again["metrics"]["first_measured_on"] == "Intel(R) Xeon(R) CPU @ 2.20GHz (cpu)"
    assert again["metrics"]["accuracy"] == 0.5  # 03's training run is not repeated; kept from where it ran
    measured = report.rung_details(lad)["measured"]
    assert measured.str.startswith("again in 06, here (first on Intel(R) Xeon(R) CPU").all(), measured
