"""As root, grading without a sandbox is refused unless asked for (issue 58: a bubblewrap without
``--size`` left grading unsandboxed as root, with a warning)."""

from __future__ import annotations

import os

import pytest

from autograder import course, grade, sandbox


def test_root_without_a_sandbox_refuses_to_grade_unless_told(monkeypatch):
    monkeypatch.setattr(sandbox, "problem", lambda: "bwrap could not start: bwrap: Unknown option --size")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(course.CourseError, match="refusing to grade.*--size.*--no-sandbox"):
        grade.refuse_root_without_sandbox(True)
    grade.refuse_root_without_sandbox(False)  # --no-sandbox: on purpose
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    grade.refuse_root_without_sandbox(True)  # a normal user: the code runs with that user's rights, said up front
    monkeypatch.setattr(sandbox, "problem", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    grade.refuse_root_without_sandbox(True)
