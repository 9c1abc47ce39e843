"""Every ``ls.`` / ``labsupport.`` name a student reads exists.

A student follows the notebooks' text and code to labsupport: a name that is not there (an old
module, a helper that was never written) is an AttributeError at best, an hour lost at worst.
Each dotted name in every released notebook, every master (text and code) and the student README
is resolved against the package as the student distribution ships it: attribute by attribute,
importing submodules as Python would.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

import labsupport
from autograder import course

NAME = re.compile(r"\b(?:ls|labsupport)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
SOURCES = sorted(course.NOTEBOOKS_DIR.glob("*.ipynb")) + course.masters()


def unresolved(chain: str) -> str | None:
    """The first prefix of ``labsupport<chain>`` that does not resolve, or None."""
    obj, parts = labsupport, chain.strip(".").split(".")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if isinstance(obj, type(labsupport)):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
                continue
            except ImportError:
                pass
        return "ls." + ".".join(parts[:i + 1])
    return None


def texts(path: Path) -> list[str]:
    if path.suffix == ".ipynb":
        return [cell.source for cell in nbformat.read(path, as_version=4).cells]
    return [path.read_text()]


@pytest.mark.parametrize("path", SOURCES + [course.COURSE_ROOT / "student_README.md"],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_labsupport_name_a_student_reads_exists(path):
    missing = sorted({m for text in texts(path) for m in map(unresolved, NAME.findall(text)) if m})
    assert not missing, f"{path.name} names what labsupport does not have: {missing}"


def test_the_check_finds_a_missing_name():
    assert unresolved(".checks.StudentAmpStep") == "ls.checks"
    assert unresolved(".train.batchnorm_stats_frozen") == "ls.train.batchnorm_stats_frozen"
    assert unresolved(".train.exact_fp32") is None and unresolved(".grading.g03_amp.amp_step") is None
