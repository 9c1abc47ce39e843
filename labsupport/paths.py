"""Where the lab keeps what it makes: results, the dataset, the report; Google Drive in Colab.

Outside Colab nothing moves: results go to ``./results`` beside the notebook, the dataset to the
checkout's ``data/``, the report to ``./build/report.html``. In Colab every notebook runs in a
new runtime, so :func:`use_drive_in_colab` (called by ``ls.setup()``) mounts Google Drive and puts
the results (the carried code among them) and the report in one lab folder there (``LAB_HOME``),
where 06 finds what 01-05 measured. The dataset is not on Drive in Colab: it is generated
(deterministically, the same images everywhere) on the runtime's own disk, ``/content``, since
01 and 02 time reading it, and 6,000 JPEGs read through Drive's mount would time Drive.

Environment variables, read when called: ``LAB_HOME`` (the lab folder), and ``LAB_RESULTS``,
``LAB_DATA``, ``LAB_REPORT`` for each of the three on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DRIVE_MOUNT = "/content/drive"
DRIVE_FOLDER = Path(DRIVE_MOUNT) / "MyDrive" / "pytorch-perf-lab"  # the lab folder in Colab
COLAB_DATA = Path("/content") / "lab-data" / "lab-shapes"  # the dataset in Colab: the runtime's disk


def home() -> Path | None:
    """The lab folder, ``LAB_HOME``, or None when results live beside the notebook."""
    value = os.environ.get("LAB_HOME", "").strip()
    return Path(value).expanduser() if value else None


def results_dir() -> Path:
    """``LAB_RESULTS``, else ``<lab folder>/results``, else ``./results``."""
    if os.environ.get("LAB_RESULTS"):
        return Path(os.environ["LAB_RESULTS"])
    return (home() or Path(".")) / "results"


def report_path() -> Path:
    """``LAB_REPORT``, else ``<lab folder>/report.html``, else ``./build/report.html``."""
    if os.environ.get("LAB_REPORT"):
        return Path(os.environ["LAB_REPORT"])
    return home() / "report.html" if home() else Path("build") / "report.html"


def data_root() -> Path:
    """``LAB_DATA``, else in Colab the runtime's own disk (``COLAB_DATA``), else
    ``<lab folder>/data/lab-shapes``, else the checkout's ``data/lab-shapes``, else
    ``~/.cache/pytorch-perf-lab/lab-shapes`` (an installed, non-editable labsupport)."""
    if os.environ.get("LAB_DATA"):
        return Path(os.environ["LAB_DATA"]).expanduser()
    if in_colab():
        return COLAB_DATA
    if home():
        return home() / "data" / "lab-shapes"
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "pyproject.toml").is_file():
        return checkout / "data" / "lab-shapes"
    return Path.home() / ".cache" / "pytorch-perf-lab" / "lab-shapes"


def in_colab() -> bool:
    """True in a Google Colab runtime."""
    return "google.colab" in sys.modules


def use_drive_in_colab() -> Path | None:
    """In Colab, mount Google Drive and make its lab folder ``LAB_HOME``; return it.

    Does nothing outside Colab, or where ``LAB_HOME`` is already set. A student who declines
    Drive is told that 06 needs what 01-05 recorded, and how to carry it without Drive.
    """
    if not in_colab() or home():
        return home()
    try:
        from google.colab import drive

        drive.mount(DRIVE_MOUNT)
    except Exception as err:  # declined, or no Drive for this account: work in the runtime
        print(f"Google Drive is not mounted ({type(err).__name__}: {err}). Results stay in this "
              "runtime and are lost when it ends, and 06 needs what 01-05 recorded: Colab gives "
              "each notebook its own runtime, so without Drive run this cell again and allow it, "
              "or download this runtime's results/ folder (Files pane) and upload it beside the "
              "next notebook before running it.")
        return None
    DRIVE_FOLDER.mkdir(parents=True, exist_ok=True)
    os.environ["LAB_HOME"] = str(DRIVE_FOLDER)
    print(f"Lab folder on Google Drive: {DRIVE_FOLDER} (results, your carried code and the report persist "
          f"there; the dataset is generated on this runtime's disk, {COLAB_DATA})")
    return DRIVE_FOLDER


def finish() -> bool:
    """The last cell of every notebook: in Colab, write what is pending to Google Drive; True if it did.

    Colab's Drive mount writes back in the background, so results recorded in a notebook's last
    minutes can be missing from the next notebook's runtime. ``drive.flush_and_unmount`` waits
    until every write has reached Drive; mounting again at once keeps the lab folder usable in this
    runtime (should that fail, ``LAB_HOME`` is dropped, so that nothing is written to the empty
    mount point, and the next ``ls.setup()`` mounts Drive again). Does nothing outside Colab, or
    where Drive is not the lab folder.
    """
    folder = home()
    if not in_colab() or folder is None or Path(DRIVE_MOUNT) not in folder.parents:
        return False
    from google.colab import drive

    drive.flush_and_unmount()
    try:
        drive.mount(DRIVE_MOUNT)
    except Exception as err:  # remounting asks again, and can be declined: Drive has what was written
        os.environ.pop("LAB_HOME", None)
        print(f"Google Drive has this notebook's results; it is not mounted again ({type(err).__name__}: "
              f"{err}): run the setup cell again before recording anything more in this runtime.")
        return True
    print(f"Saved to Google Drive: {folder} holds this notebook's results for the next notebook.")
    return True
