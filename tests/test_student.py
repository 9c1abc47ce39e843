"""The student distribution (autograder/student.py) and the setup cell (autograder/setup_cell.py):
students get the notebooks and labsupport with no answers, and the first cell installs the lab
where it is missing (Colab) from the URL the instructor released, never from this repository.

Every test works on a temporary copy of the course (nbgrader_config.py, source/, setup_cell.py),
so the real release folder, gradebook and notebooks are never touched.
"""

import fnmatch
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from datetime import datetime
from pathlib import Path

import nbformat
import pytest

from autograder import course, headless, release, student
from labsupport.hardware import describe_machine

REPO = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")


def _course_copy(dest: Path, url: str | None = None) -> tuple[Path, Path]:
    """A temporary course (config, masters, setup cell template), its masters' setup cells synced
    from its template, with ``url`` written into it first; returns (course root, template)."""
    dest.mkdir(parents=True)
    shutil.copyfile(course.COURSE_ROOT / course.CONFIG_NAME, dest / course.CONFIG_NAME)
    source = course.source_dir(course.COURSE_ROOT)
    shutil.copytree(source, dest / source.relative_to(course.COURSE_ROOT), ignore=SKIP)
    template = dest / course.SETUP_TEMPLATE.name
    shutil.copyfile(course.SETUP_TEMPLATE, template)
    if url is not None:
        student.set_student_url(template, url)
    release.sync_setup_cells(dest, template=template)
    return dest, template


@pytest.fixture(scope="module")
def distribution(tmp_path_factory):
    """The student distribution built from a fresh release of a copy of the course."""
    tmp = tmp_path_factory.mktemp("student")
    course_root, _ = _course_copy(tmp / "course")
    release_dir = release.generate(course_root)
    folder = tmp / "build" / "student"
    zip_path = student.build_student_distribution(release_dir, folder, repo_root=REPO)
    return {"folder": folder, "zip": zip_path, "release": release_dir, "course": course_root}


def _size(path: Path) -> str:
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return f"{size / 1024:.0f} KiB"


# --- a. the distribution holds no answers ------------------------------------------------------

def test_distribution_holds_only_the_student_files(distribution):
    """Exactly: the release's notebooks, labsupport's files, pyproject.toml, requirements.txt,
    README.md and data/README.md; the zip holds the same files at its top level."""
    folder, zip_path = distribution["folder"], distribution["zip"]
    print(f"student distribution: {folder} {_size(folder)}, {zip_path.name} {_size(zip_path)}")
    package = REPO / "labsupport"
    expected = {f"notebooks/{p.name}" for p in distribution["release"].glob("*.ipynb")}
    expected |= {f"labsupport/{p.relative_to(package).as_posix()}" for p in package.rglob("*")
                 if p.is_file() and not any(fnmatch.fnmatch(part, pattern) for part in p.parts
                                            for pattern in student.SKIP_PATTERNS)}
    expected |= set(student.TOP_FILES)
    files = set(student.distribution_files(folder))
    assert files == expected, (f"the student distribution's files are not the allowed set: "
                               f"unexpected {sorted(files - expected)}, missing {sorted(expected - files)}")
    for name in files:
        assert not {"autograder", "tests", "source", "release", "gradebook.db"} & set(Path(name).parts), name
    with zipfile.ZipFile(zip_path) as zf:
        in_zip = sorted(info.filename for info in zf.infolist() if not info.is_dir())
        assert in_zip == sorted(files), (f"{zip_path.name} differs from {folder.name}/: "
                                         f"{sorted(set(in_zip) ^ files)}")
        assert "pyproject.toml" in in_zip, "pip needs pyproject.toml at the zip's top level"
    for name in sorted(f for f in files if f.startswith("notebooks/")):
        released = distribution["release"] / Path(name).name
        assert (folder / name).read_bytes() == released.read_bytes(), f"{name} is not the release's"


def test_distribution_metadata_is_for_students(distribution):
    """requirements.txt is the repository's without nbgrader, pytest and pytest-xdist; pyproject.toml
    has no pytest section but still builds labsupport; the README tells how to install and submit."""
    folder = distribution["folder"]
    repo_names = {student._requirement_name(l) for l in (REPO / "requirements.txt").read_text().splitlines()} - {None}
    names = {student._requirement_name(l) for l in (folder / "requirements.txt").read_text().splitlines()} - {None}
    assert names == repo_names - {"nbgrader", "pytest", "pytest-xdist"}, f"requirements.txt installs {sorted(names)}"
    pyproject = (folder / "pyproject.toml").read_text()
    assert "[tool.pytest" not in pyproject and "testpaths" not in pyproject
    import tomllib

    meta = tomllib.loads(pyproject)
    assert meta["project"]["name"] == "labsupport" and meta["project"]["readme"] == "README.md"
    readme = (folder / "README.md").read_text()
    for needed in ("pip install -r requirements.txt -e .", "jupyter lab notebooks/", "Colab",
                   "Drive", "Check your work", 'ls.check("02", globals())', "submit",
                   # Colab: the URL that opens a notebook from the released repository, the runtime
                   # chosen before the first cell, Drive saved by every notebook's last cell
                   "https://colab.research.google.com/github/OWNER/REPOSITORY/blob/BRANCH/notebooks/",
                   "Change runtime type", "ls.paths.finish()"):
        assert needed in readme, f"the student README does not mention {needed!r}"
    assert (folder / "data" / "README.md").read_bytes() == (REPO / "data" / "README.md").read_bytes()


def test_distribution_notebooks_have_no_answer_regions(distribution):
    """No student notebook holds a solution or hidden-test marker (nbgrader cleared them all)."""
    found = []
    for path in sorted((distribution["folder"] / "notebooks").glob("*.ipynb")):
        text = path.read_text()
        found += [f"{path.name}: {marker}" for marker in student.ANSWER_MARKERS if marker in text]
        found += [f"{path.name}: {marker}" for marker in ("BEGIN HIDDEN", "END HIDDEN")
                  if marker in text.upper()]
    assert not found, "answer markers in the student distribution:\n" + "\n".join(found)


def test_distribution_holds_no_line_of_an_answer(distribution):
    """No answer of a master appears in any text file of the distribution.

    The answers are the masters' regions between ``### BEGIN SOLUTION`` and ``### END SOLUTION``
    (and hidden-test regions), and whole solution cells without markers (06's model analysis).
    Lines are compared whole after stripping blanks, comment lines and trailing ``  # comments``;
    notebooks are compared by their cells' sources. The rule (student.answer_leaks):

    - an answer line of 30 characters or more found as a line of any file is a leak: at that
      length a line is specific to its answer (``idx = order[i * b:(i + 1) * b]``);
    - 3 consecutive answer lines found as 3 consecutive lines of a file are a leak, however
      short: copied code is found even when each line is generic. Lines of keywords and
      punctuation only (``try:``, ``yield``, ``finally:``, ``else:``) are skipped when lines are
      counted as consecutive: every context manager has that run.

    Shorter lines alone are not: ``else:``, ``step()``, ``return total``,
    ``super().__init__()`` are idioms labsupport's baseline code and the notebooks' given code
    use as well.
    """
    leaks = student.answer_leaks(distribution["folder"], course.masters(distribution["course"]))
    assert not leaks, (f"{len(leaks)} answer lines of the masters are in the student distribution "
                       "(file: what matched, and where the answer is):\n" + "\n".join(leaks))


def test_answer_leaks_finds_a_copied_answer(tmp_path):
    """The leak rule finds a long answer line and a run of short ones, and ignores idioms and
    runs of keyword-only lines."""
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    y = x\n    z = y\n"
                                     "    return z\n    ### END SOLUTION\n"
                                     "def g(order, i, b):\n    ### BEGIN SOLUTION\n"
                                     "    idx = order[i * b:(i + 1) * b]  # the batch\n    ### END SOLUTION\n"
                                     "def cm():\n    ### BEGIN SOLUTION\n    try:\n        yield\n"
                                     "    finally:\n        pass\n    ### END SOLUTION\n")
    cell.metadata["nbgrader"] = {"solution": True, "grade_id": "f"}
    nb.cells.append(cell)
    master = tmp_path / "m.ipynb"
    nbformat.write(nb, master)
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "a.py").write_text("def h(x):\n    y = x\n    z = y\n    return z\n")
    (dist / "b.py").write_text("    idx = order[i * b:(i + 1) * b]\n")
    (dist / "c.py").write_text("y = x\nreturn z\n")  # short lines, not in a run: idioms
    (dist / "d.py").write_text("try:\n    yield\nfinally:\n    pass\n")  # keywords only: structure
    leaks = student.answer_leaks(dist, [master])
    assert [leak.split(":")[0] for leak in leaks] == ["a.py", "b.py"], leaks


# --- b. the setup cell -------------------------------------------------------------------------

def test_setup_cell_without_labsupport_and_url_says_what_to_do(tmp_path):
    """In a kernel where labsupport is not importable and LAB_URL is "", the setup cell stops
    with a RuntimeError naming ``--student-url``, before running pip or anything else."""
    source = re.sub(r'^LAB_URL = "[^"\n]*"', 'LAB_URL = ""', course.SETUP_TEMPLATE.read_text(),
                    count=1, flags=re.MULTILINE)
    # -S: no site-packages (no labsupport, no pip); -I: neither the working directory nor
    # PYTHONPATH on sys.path. The interpreter is this one, so the stdlib is there.
    done = subprocess.run([sys.executable, "-I", "-S", "-c", source], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, f"the setup cell ran without labsupport:\n{done.stdout}{done.stderr}"
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError:") and "--student-url" in last, done.stderr
    assert "No module named pip" not in done.stderr, f"the setup cell ran pip first:\n{done.stderr}"


def test_setup_cell_installs_only_from_lab_url():
    """The template never clones a repository; its one subprocess is pip installing LAB_URL."""
    import ast

    source = course.SETUP_TEMPLATE.read_text()
    assert "clone" not in source.lower(), "the setup cell must never clone the instructor's repository"
    calls = [ast.unparse(node) for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and ast.unparse(node.func.value) in ("subprocess", "os")]
    assert calls == ["subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet', LAB_URL], check=True)"], calls
    url = student.student_url(course.SETUP_TEMPLATE)
    assert url == "" or student.url_problem(url) is None, f"setup_cell.py's LAB_URL {url!r}: {student.url_problem(url)}"


def test_set_student_url_round_trips_and_rejects_bad_urls(tmp_path):
    template = tmp_path / "setup_cell.py"
    shutil.copyfile(course.SETUP_TEMPLATE, template)
    original = template.read_text()
    good = ["git+https://github.com/org/perf-lab-student.git@v1",
            "https://example.org/lab/student.zip", "http://example.org/student.zip?download=1",
            "file:///tmp/build/student.zip", "/content/drive/MyDrive/student.zip",
            "https://example.org/labsupport-0.1.0-py3-none-any.whl"]
    for url in good:
        assert student.set_student_url(template, url) is True, url
        assert student.student_url(template) == url
        assert student.set_student_url(template, url) is False, f"{url}: unchanged, yet rewritten"
        changed = [(a, b) for a, b in zip(original.splitlines(), template.read_text().splitlines()) if a != b]
        assert len(changed) == 1 and changed[0][1].startswith(f'LAB_URL = "{url}"  #'), changed
    before = template.read_text()
    bad = ['https://example.org/student.zip"; import os; os.system("x")  #', "https://example.org/lab",
           "https://github.com/org/lab.git", "ftp://example.org/student.zip", "student.zip\nx = 1",
           "C:\\lab\\student.zip", "", "git+https://", "https://example.org/my student.zip"]
    for url in bad:
        with pytest.raises(student.StudentDistributionError):
            student.set_student_url(template, url)
    assert template.read_text() == before, "a rejected URL changed the template"


# --- c. a Colab stand-in -----------------------------------------------------------------------

def _stand_in_drive(monkeypatch, *, remount_fails=False):
    """A google.colab stand-in whose drive module records what it is asked to do."""
    import types

    calls = []
    drive = types.ModuleType("google.colab.drive")
    drive.flush_and_unmount = lambda timeout_ms=None: calls.append("flush_and_unmount")

    def mount(mountpoint, **kwargs):
        calls.append(f"mount {mountpoint}")
        if remount_fails:
            raise ValueError("mount failed")
    drive.mount = mount
    colab = types.ModuleType("google.colab")
    colab.drive = drive
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.drive", drive)
    return calls


def test_finish_flushes_drive_in_colab_keeps_it_mounted_and_does_nothing_elsewhere(monkeypatch):
    """Every notebook's last cell, ls.paths.finish(): in Colab with the lab folder on Drive it waits
    for Drive's writes (flush_and_unmount) and mounts Drive again, so the runtime can go on; if
    mounting again fails, LAB_HOME is dropped (nothing lands in the empty mount point). Outside Colab,
    or with a lab folder elsewhere, it calls nothing."""
    from labsupport import paths

    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setenv("LAB_HOME", str(paths.DRIVE_FOLDER))
    assert paths.finish() is False  # not Colab
    calls = _stand_in_drive(monkeypatch)
    monkeypatch.setenv("LAB_HOME", "/tmp/lab")
    assert paths.finish() is False and calls == []  # a lab folder off Drive
    monkeypatch.setenv("LAB_HOME", str(paths.DRIVE_FOLDER))
    assert paths.finish() is True
    assert calls == ["flush_and_unmount", f"mount {paths.DRIVE_MOUNT}"]
    assert paths.home() == paths.DRIVE_FOLDER
    calls = _stand_in_drive(monkeypatch, remount_fails=True)
    assert paths.finish() is True and calls[0] == "flush_and_unmount"
    assert paths.home() is None, "Drive is not mounted again: results must not go to the empty mount point"


# Named in .venv's site-packages but not made visible to the stand-in: labsupport in any form
# (package, editable finder and .pth, dist-info), and the packaging tools the fresh venv has itself.
def _hidden_from_colab(name: str) -> bool:
    lower = name.lower()
    return ("labsupport" in lower or lower.endswith(".pth") or lower == "__pycache__"
            or re.match(r"(pip|setuptools|pkg_resources|_distutils_hack)([-_.].*)?$", lower) is not None)


def _run(cmd, **kwargs):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def _colab_python(tmp: Path) -> Path:
    """A fresh venv of the base interpreter that sees .venv's packages except labsupport."""
    venv = tmp / "colab-venv"
    made = _run([sys._base_executable, "-m", "venv", venv], timeout=300)
    if made.returncode != 0:
        pytest.skip(f"cannot make a virtual environment with {sys._base_executable}: {made.stderr[-500:]}")
    python = venv / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    preinstalled = tmp / "preinstalled"  # Colab's preinstalled packages: torch, torchvision, ...
    preinstalled.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(ours.iterdir()):
        if not _hidden_from_colab(entry.name):
            (preinstalled / entry.name).symlink_to(entry)
    (Path(purelib) / "preinstalled.pth").write_text(f"{preinstalled}\n")
    return python


def _errors(nb) -> list[str]:
    return [f"cell {i} ({cell.metadata.get('nbgrader', {}).get('grade_id', '')}): {out['ename']}: "
            f"{out['evalue'][:500]}" for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def _cell_seconds(cell) -> float | None:
    timing = cell.metadata.get("execution", {})
    try:
        start = datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return (end - start).total_seconds()


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/setuptools/", timeout=10).close()
        return True
    except OSError:
        return False


# Another Colab runtime: the machine 02 and 03 ran on in the stand-in, described differently
# from the one 01, 04, 05 and 06 run on (Colab hands out CPUs of several models).
OTHER_RUNTIME = "Intel(R) Xeon(R) CPU @ 2.20GHz"


def _record_02_to_05(results_dir: Path) -> None:
    """Record stages 02-05 and keep 02-05's reference code in ``results_dir``, as their notebooks do:
    02 and 03 on another runtime's machine (``OTHER_RUNTIME``), 04 and 05 on this one."""
    import dataclasses

    import labsupport as ls
    from autograder import reference

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_RESULTS", str(results_dir))
        lab = ls.grading.grading_lab()
        other = dataclasses.replace(lab, machine=dataclasses.replace(lab.machine, device_name=OTHER_RUNTIME,
                                                                     cpu_model=OTHER_RUNTIME))
        for number in ("02", "03", "04", "05"):
            ls.carry.keep(number, reference.namespace(number))
        loader, amp = reference.solutions("02").make_fast_loader, reference.solutions("03")
        precision = amp.choose_precision(lab.machine)
        config = ls.StepConfig(amp_dtype=precision["dtype"], channels_last=precision["channels_last"])
        ls.report.measure_rung("02-data", ls.make_step(ls.StepConfig(), lab.device), loader(lab), other, progress=False)
        ls.report.measure_rung("03-amp", ls.make_step(config, lab.device, update=amp.amp_train_step),
                               loader(lab), other, progress=False)
        big = dataclasses.replace(lab, profile=dataclasses.replace(lab.profile, batch_size=2 * lab.profile.batch_size))
        checkpointed = reference.solutions("04").checkpointed
        ls.report.measure_rung("04-memory", ls.make_step(dataclasses.replace(config, checkpoint_segments=3),
                                                         lab.device, update=amp.amp_train_step,
                                                         wrap=lambda m: checkpointed(m, 3)),
                               loader(big), lab, profile=big.profile, progress=False)
        # 05's rung with its step uncompiled: what this test proves is that 06 finds the rung in the
        # lab folder, and a cold compile of the training step costs a minute (test_train compiles it).
        ls.report.measure_rung("05-compile", ls.make_step(config, lab.device, update=amp.amp_train_step),
                               loader(lab), lab, progress=False)


@pytest.mark.slow
@pytest.mark.long
def test_colab_stand_in_installs_from_the_student_zip_and_runs_the_lab(tmp_path, tiny_data, monkeypatch):
    """A kernel without labsupport (torch and the rest preinstalled, as in Colab) runs the masters
    (a student who completed the lab) 01 and 06, each in a new kernel with its own working folder
    (a new runtime), with the setup cell's LAB_URL the file:// URL of the student zip: 01's setup
    cell installs labsupport from the zip and 01 records its stage in the shared lab folder
    (LAB_HOME, Drive's stand-in), 02-05's stages and code are recorded there from other runtimes
    (02 and 03 on a machine described differently), and 06, in its own kernel, measures 02 and 03
    again on its machine from their carried code, finds them all and grades them.

    pip builds labsupport from the zip in an isolated build environment, as it does in Colab, so
    it fetches setuptools from PyPI: the test skips where PyPI cannot be reached.
    """
    if not _pypi_reachable():
        pytest.skip("PyPI cannot be reached: pip needs setuptools from it to build labsupport from the zip")
    started = time.perf_counter()
    build = tmp_path / "build"
    zip_path = (build / "student").with_suffix(".zip")
    course_root, template = _course_copy(tmp_path / "course", url=zip_path.as_uri())
    folder = build / "student"
    assert student.build_student_distribution(release.generate(course_root), folder, repo_root=REPO) == zip_path
    assert student.student_url(template) == zip_path.as_uri()

    python = _colab_python(tmp_path)
    probe = _run([python, "-c", "import torch, torchvision, ipykernel; print(torch.__version__)"], cwd=tmp_path)
    assert probe.returncode == 0, f"torch is not visible in the stand-in:\n{probe.stderr[-2000:]}"
    probe = _run([python, "-c", "import labsupport"], cwd=tmp_path)
    assert probe.returncode != 0, "labsupport is importable in the stand-in before the setup cell ran"
    print(f"stand-in ready in {time.perf_counter() - started:.0f} s (torch {_run([python, '-c', 'import torch; print(torch.__version__)']).stdout.strip()})")

    kernels = tmp_path / "jupyter" / "kernels" / "colab-stand-in"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab stand-in", "language": "python"}))
    drive = tmp_path / "drive"  # stands in for the lab folder on Google Drive
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("LAB_HOME", str(drive))
    monkeypatch.setenv("LAB_PROFILE", "tiny")
    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    for name in ("PYTHONPATH", "LAB_CALIBRATION", "LAB_RESULTS", "LAB_REPORT", "LAB_THRESHOLDS"):
        monkeypatch.delenv(name, raising=False)

    masters = {p.name[:2]: p for p in course.masters(course_root)}
    assert sorted(masters) == ["01", "02", "03", "04", "05", "06", "07", "08"], sorted(masters)
    times, executed = {}, {}

    def execute(key, extra=None):
        nb = nbformat.read(masters[key], as_version=4)
        if extra:
            nb.cells.append(nbformat.v4.new_code_cell(extra))
        cwd = tmp_path / "runtime" / key  # a new runtime's own folder, as Colab's /content
        cwd.mkdir(parents=True)
        t0 = time.perf_counter()
        headless.execute(nb, cwd, timeout_s=600, kernel_name="colab-stand-in", allow_errors=True)
        times[key] = time.perf_counter() - t0
        executed[key] = nb
        nbformat.write(nb, tmp_path / "runtime" / masters[key].name)
        print(f"{masters[key].name}: {times[key]:.0f} s")
        return nb

    nb01 = execute("01")
    setup = course.first_code_cell(nb01)
    print(f"01's setup cell (pip install of the student zip, then ls.setup()): {_cell_seconds(setup):.1f} s")
    assert not [o for o in setup.outputs if o.output_type == "error"], \
        f"01's setup cell failed: {_errors(nb01)[:1]}\n" + "".join(o.get("text", "") for o in setup.outputs)[-3000:]
    where = _run([python, "-c", "import labsupport, pathlib; print(pathlib.Path(labsupport.__file__).parent)"],
                 cwd=tmp_path).stdout.strip()
    assert where and not Path(where).is_relative_to(REPO), f"labsupport imported from {where!r}, not the install"
    shipped = set(student.distribution_files(folder / "labsupport"))
    installed = {n for n in student.distribution_files(Path(where)) if "__pycache__" not in n}
    assert shipped <= installed, (f"pip install of the student zip left out {sorted(shipped - installed)}: "
                                  "package data must be listed in pyproject.toml "
                                  "([tool.setuptools.package-data])")
    # 07's int8 flow needs torchao, which Colab does not preinstall: it comes with labsupport.
    probe = _run([python, "-c", "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e"],
                 cwd=tmp_path)
    assert probe.returncode == 0, f"torchao did not come with labsupport's install:\n{probe.stderr[-2000:]}"
    # 02-05 record their rungs and keep their code in the same lab folder, from other runtimes: here,
    # this process, with the reference's code on the lab's own measure_rung (the notebooks
    # themselves run in tests/test_course.py; executing them again here would cost 3-4 minutes).
    _record_02_to_05(drive / "results")
    nb06 = execute("06", extra='import json\nprint("GRADED " + json.dumps({k: r.status for k, r in graded.items()}))')
    print("times: " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
          + f"; total with the stand-in's setup {time.perf_counter() - started:.0f} s")

    errors = {key: _errors(nb) for key, nb in executed.items()}
    assert not errors["06"], f"06 raised (executed copy in {tmp_path / 'runtime'}): {errors['06'][0]}"
    assert not any(errors.values()), "notebooks raised: " + "; ".join(
        f"{key}: {errs[0]}" for key, errs in errors.items() if errs)
    printed = "".join(o.get("text", "") for o in nb06.cells[-1].outputs if o.output_type == "stream")
    assert "GRADED " in printed, f"06's graded checks did not run: {nb06.cells[-1].outputs}"
    statuses = json.loads(printed.split("GRADED ", 1)[1].splitlines()[0])
    print(f"06's graded checks: {statuses}")
    assert statuses.get("06-stages") in ("pass", "n/a"), (
        f"06 did not find the stages of 01-05 in the shared lab folder {drive}: {statuses}")
    # 02 and 03 ran on another runtime's machine: 06 measured them again here, from their carried
    # code, and says so, in the notebook and in the record its report reads.
    said = "".join(o.get("text", "") for c in nb06.cells if c.get("id") == "cell-02" for o in c.outputs)
    there = f"{OTHER_RUNTIME} ({describe_machine().device_class})"  # the other runtime's class is this one's
    for stage in ("02-data", "03-amp"):
        assert f"{stage} (first on {there}): measured again here" in said, said
        again = json.loads((drive / "results" / f"{stage}.json").read_text())
        assert again["machine"]["device_name"] != OTHER_RUNTIME
        assert again["metrics"]["first_measured_on"] == there
    assert "04-memory (first" not in said and "01-baseline (first" not in said
    recorded = sorted(p.relative_to(drive).as_posix() for p in drive.rglob("*.json"))
    assert recorded, f"nothing was recorded under the lab folder {drive}"
