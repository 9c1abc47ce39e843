"""Graded check of 09_toy, the registry test's toy notebook (tests/test_toy_notebook.py): the
student's ``double``, and a rung that puts the step in the layout their ``CHANNELS_LAST`` chose."""

from __future__ import annotations

from . import judge, register, student
from .g09_worker import RUNG, Here  # noqa: F401 (its rung is declared beside what its worker builds)
from .judge_setup import Judged, RemoteSides

CASES = ([1.0, 2.5], [-3.0], [])


@register("09-double")
def doubled(namespace, lab, sides=None):
    """The student's ``double`` doubles every value of each case."""
    student(namespace, "double", "09")
    sides = sides or Here(namespace, lab)
    got = sides.double([list(case) for case in CASES])
    want = [[2 * v for v in case] for case in CASES]
    return [judge("09-double", float(got == want), lab, correct=got == want,
                  why_incorrect=f"double gave {got} for {list(CASES)}")]


class Remote(RemoteSides):
    """09's judge side: the student's ``double`` asked of their worker."""

    def double(self, cases):
        got = self.sides.ask("candidate", "double", cases=cases)["value"]
        return [[float(v) for v in case] for case in got] if isinstance(got, list) else got


JUDGED = Judged(remote=Remote)
