"""09's worker side (the registry test's toy notebook): the student's ``double`` on plain numbers."""

from __future__ import annotations

from . import student
from .rungs import Rung


class Here:
    """In this process, as the self-check runs it."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def focus(self, side) -> None:
        pass

    def double(self, cases: list) -> list:
        fn = student(self.namespace, "double", "09")
        return [[float(v) for v in fn([float(x) for x in case])] for case in cases]


class Side:
    """09 in a worker: what the judge may ask (``ASKED``)."""

    ASKED = ("double",)

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.here = Here(namespace, lab)

    def double(self, *, cases: list) -> list:
        return self.here.double(cases)


# The rung: the step in the layout the student's CHANNELS_LAST chose (not in 06's pipeline).
RUNG = Rung(lambda code, lab, made: made.configured(channels_last=bool(code("09")["CHANNELS_LAST"])),
            in_worker=True, in_pipeline=False)
