"""The report of notebook 06: the ladder from the results store (missing and foreign stages named,
never raised), and the exported HTML, rendered in a real headless browser (Debian's chromium)."""

import shutil
import subprocess

import pytest
from PIL import Image

from labsupport import report, results

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
    lad = report.ladder(tmp_path)
    assert list(lad.table.index) == [label for _, label in report.RUNGS] and not lad.missing
    assert lad.table["speedup (cumulative)"].round(3).tolist() == [1.0, 1.1, 1.75, 1.8, 1.65]
    assert lad.table["speedup (this rung)"].iloc[2] == pytest.approx(70 / 44)
    assert lad.table["accuracy %"].iloc[2] == pytest.approx(95.0)


def test_missing_and_foreign_stages_are_listed_with_the_notebook_to_run(tmp_path):
    _record(tmp_path, ["01-baseline", "02-data"])
    _record(tmp_path, ["03-amp"], machine={"device_class": "cuda-tensorcore", "device_name": "A GPU"})
    lad = report.ladder(tmp_path)
    assert len(lad.table) == 2
    text = "\n".join(lad.missing)
    assert "03-amp" in text and "not on this machine" in text and "03_amp.ipynb" in text
    assert "04-memory" in text and "04_checkpointing.ipynb" in text


def test_empty_store_gives_a_report_not_a_stack_trace(tmp_path):
    page = report.export_html(tmp_path / "r.html", tmp_path / "nothing").read_text()
    assert "No stage has been recorded yet" in page and "01_profile.ipynb" in page


chromium = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium is None, reason="needs Debian's chromium (make test installs it when it can: "
                                              "apt-get install chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    _record(tmp_path / "results", RATES)
    page = report.export_html(tmp_path / "report.html", tmp_path / "results")
    html = page.read_text()
    assert "http://" not in html and "https://" not in html, "the report must not need the network"
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--user-data-dir=" + str(tmp_path / "profile")]
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'class="dataframe ladder"' in dom.stdout and dom.stdout.count("<img") == 2
    assert "+compile" in dom.stdout and "1.65" in dom.stdout
    shot = tmp_path / "report.png"
    run = subprocess.run(base + [f"--screenshot={shot}", "--window-size=1100,2200", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = Image.open(shot).convert("RGB")
    colours = pixels.getcolors(maxcolors=1 << 20)
    bar = (0x4C, 0x72, 0xB0)  # the ladder's bar colour: present only if the embedded PNG rendered
    near = sum(count for count, (r, g, b) in colours if abs(r - bar[0]) + abs(g - bar[1]) + abs(b - bar[2]) < 30)
    assert near > 500, f"the ladder plot did not render (only {near} pixels in its bar colour); see {shot}"
