"""Root's decision on each check of a notebook, from what its verdict process measured
(:mod:`.verdicts` starts it), kept and recorded in the gradebook.

:func:`decide` recomputes every pass from the measurement and this machine's bar, trusting the
verdict (written in the sandbox) for nothing that could earn a point; :func:`keep` writes the
decisions beside what the process said to ``verdicts/<student>/``. :func:`record` then writes them
into the gradebook, test cell by test cell: a cell scores its points when every check it requires
passed (or does not apply here), else 0 (:func:`cell_scores`). The kernel measured nothing (its
checks were left to the grader: ``labsupport.grading.MEASURED_BY_THE_GRADER``), and whatever its
run of a test cell said is replaced.

:func:`snapshot` and :func:`restore` guard the gradebook around each submission: another
student's grades must come out as they went in, and this student's extra credit must be what
the instructor gave. Scores above a cell's maximum are cleared. Each repair is reported.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from . import course


def checks_by_cell(where: course.Course | Path) -> dict[str, dict[str, list[str]]]:
    """``{notebook: {test cell id: [check ids it grades]}}``, as the masters' test cells declare them
    (:func:`course.declared_checks`)."""
    out = {}
    for master in course.masters(course.of(where).root):
        nb = nbformat.read(master, as_version=4)
        out[master.stem] = {cell.metadata["nbgrader"]["grade_id"]: course.declared_checks(cell, master.stem)
                            for cell in course.graded_test_cells(nb)}
    return out


# --- the grader's decision -----------------------------------------------------------------------

# A speedup this many times the best the reference reached when this machine was calibrated is
# not passed: it waits for a person, with its figures (an honest solution does not beat the
# course's own by that much on the same machine; every one seen so far was a cheat).
OUTLIER = 3.0
# A pass whose baseline's own figure lies more than this factor from the median calibrate measured
# for it on this machine, either way, is held for review: the baseline runs the course's own code,
# so a figure that far off says the measurement was disturbed (the judge's freeze failed, or the
# machine was busy), not that the student was fast. Its step and 02's naive data wait: 1.5x (issue
# 60: the naive wait read 25-28 ms undisturbed on cpu-bf16, 127-1,090 ms with burners slowing it;
# at the tiny profile 18.1-21.0 ms over 4 judged runs here, 30.5 ms with burners). A batch's
# crossing is a fraction of a millisecond that honestly spreads 0.2-0.6 ms (g02's comment): 3x
# (with burners it read 1.5 ms against 0.2-0.3).
BASELINE_OFF = {"baseline_step_ms": 1.5, "baseline_wait_ms": 1.5, "crossing_ms": 3.0}
NOTE_CHARS = 500  # of the verdict process's note kept per check
# Checks the verdict process may call n/a where this machine has a bar: only where torch.compile
# cannot run here (an older GPU: nothing to compile with).
NA_WITHOUT_COMPILE = ("05-compile-speedup",)


@dataclass(frozen=True)
class Decision:
    """The grader's verdict on one check (a row of the judge's table: feedback, grades_by_check.csv)."""

    check: str
    measured: float | None  # the verdict process's measurement (None: nothing usable)
    bar: str  # this machine's bar, e.g. ">= 3" ("" where the check does not apply here)
    result: str  # "pass", "fail", "n/a" or "review" (held for a person: no points until one decides)
    # labsupport.grading.REASONS, or "far above the reference", "baseline off its calibration" or "not run"
    reason: str
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.result in ("pass", "n/a")


def finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def decide(verdict: dict, check_ids, machine) -> dict[str, Decision]:
    """The grader's decision on each of ``check_ids`` from a verdict process's ``verdict``.

    Root decides here, with its own labsupport and the batch's thresholds and calibration, and
    trusts the verdict (written in the sandbox) for nothing that could earn a point: a pass is
    recomputed from the measurement and this machine's bar; an "n/a" counts only where this
    machine has no bar for the check (or the profile grades no speed, or torch.compile cannot run
    here); a failure stands, with the verdict's reason. A speedup above OUTLIER times the
    reference's best on this machine is held for review, and so is one whose baseline's own figures
    stray more than BASELINE_OFF from calibrate's (where it calibrated them; said in the note where
    not). ``machine`` is a hardware.Machine.
    """
    from labsupport import grading, hardware

    facts = machine.as_dict()
    profile = hardware.profile_for(machine.profile)  # the grading run's (LAB_PROFILE, as the spec's)
    grades_speed = profile.grades_speed
    checks = verdict.get("checks") if isinstance(verdict.get("checks"), dict) else {}
    out = {}
    for check in check_ids:
        bar, better, why_na = grading.threshold_for(check, facts, profile.name)
        shown = "" if bar is None else f"{'>=' if better == 'higher' else '<='} {bar:.3g}"
        entry = checks.get(check)
        if not isinstance(entry, dict):
            why = verdict.get("error") or "the verdict process did not run this check"
            out[check] = Decision(check, None, shown, "fail", "not run", str(why)[:NOTE_CHARS])
            continue
        status, reason = entry.get("status"), entry.get("reason")
        measured, note = finite(entry.get("measured")), str(entry.get("note", ""))[:NOTE_CHARS]
        if status == "fail" or status not in ("pass", "n/a"):
            reason = reason if reason in grading.REASONS and reason not in ("pass", "n/a") else "error"
            out[check] = Decision(check, measured, shown, "fail", reason, note)
        elif status == "n/a":
            allowed = bar is None or not grades_speed or (
                check in NA_WITHOUT_COMPILE and hardware.compile_problem(machine))
            out[check] = (Decision(check, measured, shown, "n/a", "n/a", note or why_na) if allowed else
                          Decision(check, measured, shown, "fail", "not measured",
                                   f"the verdict process said n/a, but this machine has a bar ({shown}): "
                                   f"nothing was measured against it. {note}".strip()))
        elif bar is None:
            out[check] = Decision(check, measured, shown, "n/a", "n/a", why_na)
        elif measured is None:
            out[check] = Decision(check, None, shown, "fail", "not measured", note or "nothing measured")
        elif not grading.passes(measured, bar, better):
            out[check] = Decision(check, measured, shown, "fail", "below bar",
                                  f"measured {measured:.3g}, this machine's bar is {shown} (the verdict "
                                  f"process said pass). {note}".strip())
        else:
            calibrated = grading.reference_baseline(check, facts, profile.name)
            if entry.get("baseline") and not calibrated:
                note = ((f"{note}; " if note else "")
                        + "the baseline's own figures were not checked: nothing calibrated here")
            out[check] = (_baseline_off(check, measured, shown, entry.get("baseline"), calibrated, note)
                          or _outlier(check, measured, shown, better, note,
                                      grading.reference_runs(check, facts, profile.name)))
    return out


def _baseline_off(check: str, measured: float, shown: str, said, calibrated: dict[str, list[float]],
                  note: str) -> Decision | None:
    """A pass held for review where the baseline's own figures in the verdict (``said``) stray more
    than their :data:`BASELINE_OFF` from calibrate's (``calibrated``: none where nothing was calibrated, or
    the check has no baseline; then nothing to hold); None where they do not."""
    said = said if isinstance(said, dict) else {}
    off = []
    for figure, values in calibrated.items():
        expected, got = statistics.median(values), finite(said.get(figure))
        if got is None or expected <= 0:
            off.append(f"its {figure} was not reported" if got is None else "")
        elif not 1 / BASELINE_OFF[figure] <= got / expected <= BASELINE_OFF[figure]:
            off.append(f"its {figure} read {got:.3g}, against {expected:.3g} when this machine was calibrated "
                       f"(more than {BASELINE_OFF[figure]:g}x off)")
    off = [o for o in off if o]
    if not off:
        return None
    return Decision(check, measured, shown, "review", "baseline off its calibration",
                    f"measured {measured:.3g}, but the baseline it was compared with was not itself: "
                    f"{'; '.join(off)}: no points until a person looks. "
                    f"{note}".strip())


def _outlier(check: str, measured: float, shown: str, better: str, note: str, reference: list[float]) -> Decision:
    """A pass, unless the speedup is far beyond the reference's on this machine (then "review")."""
    best = max(reference, default=None)
    if better == "higher" and best and measured > OUTLIER * best:
        return Decision(check, measured, shown, "review", "far above the reference",
                        f"measured {measured:.3g}, {measured / best:.1f}x the reference's best ({best:.3g}) "
                        f"when this machine was calibrated: no points until a person looks (a manual score "
                        f"in nbgrader's formgrader gives them). {note}".strip())
    return Decision(check, measured, shown, "pass", "pass", note)


def cell_scores(decisions: dict[str, Decision], cells: dict[str, list[str]]) -> dict[str, bool]:
    """``{test cell: passed}``: a cell passes when every check it requires passed or is n/a."""
    return {cell: bool(ids) and all(i in decisions and decisions[i].passed for i in ids)
            for cell, ids in cells.items()}


def score(verdict: dict, cells: dict[str, list[str]], machine) -> tuple[dict[str, Decision], dict[str, bool]]:
    """:func:`decide` on every check ``cells`` require, then :func:`cell_scores`: ``(decisions, passed)``."""
    decisions = decide(verdict, sorted({i for ids in cells.values() for i in ids}), machine)
    return decisions, cell_scores(decisions, cells)


def _said(entry) -> dict:
    """What the verdict process said of one check, as plain bounded values (it wrote them in the sandbox)."""
    if not isinstance(entry, dict):
        return {"status": None}
    return {"status": str(entry.get("status"))[:16], "reason": str(entry.get("reason"))[:32],
            "measured": finite(entry.get("measured")), "threshold": finite(entry.get("threshold")),
            "note": str(entry.get("note", ""))[:NOTE_CHARS]}


def keep(where: course.Course | Path, student: str, notebook: str, verdict: dict,
         decisions: dict[str, Decision]) -> Path:
    """Write the grader's decisions, beside what the verdict process said, to
    ``verdicts/<student>/<notebook>.json`` in the course root, where they stay after the batch."""
    folder = course.of(where).verdicts(student)
    folder.mkdir(parents=True, exist_ok=True)
    said = verdict.get("checks") if isinstance(verdict.get("checks"), dict) else {}
    problems = verdict.get("problems") if isinstance(verdict.get("problems"), list) else []
    kept = {"notebook": notebook, "decided": {c: asdict(d) for c, d in decisions.items()},
            "verdict_process": {"judge": verdict.get("judge") is True,  # else the verdict process
                                "checks": {c: _said(said.get(c)) for c in decisions},
                                "rung": finite(verdict.get("rung")), "seconds": finite(verdict.get("seconds")),
                                "problems": [str(p)[:NOTE_CHARS] for p in problems[:20]],
                                "error": str(verdict.get("error") or "")[:NOTE_CHARS]}}
    path = folder / f"{notebook}.json"
    path.write_text(json.dumps(kept, indent=1))
    return path


def _kept_file(where: course.Course | Path, student: str, notebook: str) -> dict:
    """The file :func:`keep` wrote for ``notebook`` (empty where there is none, or it cannot be read)."""
    try:
        found = json.loads((course.of(where).verdicts(student) / f"{notebook}.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def noted(where: course.Course | Path, student: str, notebook: str) -> list[str]:
    """What the verdict process noted beside the decisions :func:`keep` wrote (empty if nothing)."""
    problems = _kept_file(where, student, notebook).get("verdict_process", {}).get("problems")
    return [str(p) for p in problems] if isinstance(problems, list) else []


def kept(where: course.Course | Path, student: str, notebook: str) -> dict[str, dict]:
    """The decisions :func:`keep` wrote (``{check: Decision fields}``; empty if none)."""
    decided = _kept_file(where, student, notebook).get("decided")
    return decided if isinstance(decided, dict) else {}


def record(gb, assignment: str, student: str, notebook: str, passed: dict[str, bool]) -> None:
    """Write the verdicts' scores for ``notebook``'s test cells, over whatever the kernel's run said."""
    from nbgrader.api import MissingEntry

    for cell, ok in passed.items():
        try:
            grade = gb.find_grade(cell, notebook, assignment, student)
        except MissingEntry:
            continue  # the notebook never ran far enough for nbgrader to record it: scores 0
        grade.auto_score = float(grade.max_score) if ok else 0.0
    gb.db.commit()


def snapshot(gb, assignment: str) -> dict[tuple[str, str, str], tuple]:
    """Every student's recorded grades: ``{(student, notebook, cell): (auto, manual, extra credit)}``."""
    from nbgrader.api import MissingEntry

    try:
        found = gb.find_assignment(assignment)
    except MissingEntry:
        return {}
    return {(sub.student.id, nb.name, g.name): (g.auto_score, g.manual_score, g.extra_credit)
            for sub in found.submissions for nb in sub.notebooks for g in nb.grades}


def restore(gb, assignment: str, student: str, before: dict) -> list[str]:
    """Undo what grading ``student`` must not have changed; returns what was repaired.

    Other students' grades go back to ``before``; this student's extra credit goes back to what
    it was before (an instructor's, or none); any score above its cell's maximum is cleared.
    """
    from nbgrader.api import MissingEntry

    repaired, seen = [], set()
    try:
        found = gb.find_assignment(assignment)
    except MissingEntry:
        return repaired
    for sub in found.submissions:
        for nb in sub.notebooks:
            for g in nb.grades:
                key = (sub.student.id, nb.name, g.name)
                now = (g.auto_score, g.manual_score, g.extra_credit)
                seen.add(key)
                if sub.student.id != student:
                    if key in before and now != before[key]:
                        g.auto_score, g.manual_score, g.extra_credit = before[key]
                        repaired.append(f"{key[0]}'s {key[1]} {key[2]} changed while grading {student}: restored")
                    continue
                given = before.get(key, (None, None, None))[2]
                if g.extra_credit != given:
                    repaired.append(f"{nb.name} {g.name}: extra credit {g.extra_credit} nobody gave: cleared")
                    g.extra_credit = given
                for column in ("auto_score", "manual_score"):
                    value = getattr(g, column)
                    if value is not None and (value > g.max_score or value < 0):
                        repaired.append(f"{nb.name} {g.name}: {column} {value} outside 0..{g.max_score:g}: cleared")
                        setattr(g, column, 0.0 if column == "auto_score" else None)
    gone = sorted({f"{k[0]}'s {k[1]}" for k in set(before) - seen if k[0] != student})
    repaired += [f"{g} disappeared from the gradebook while grading {student}: grade them again" for g in gone]
    gb.db.commit()
    return repaired
