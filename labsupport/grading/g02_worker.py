"""02's worker side: the loader a worker builds for 02's checks (:class:`Side`): the student's
``make_fast_loader`` or labsupport's naive loader, iterated by the judge batch by batch. No check
and no expected answer: those are the judge's (:mod:`.g02_data_loading`).
"""

from __future__ import annotations

import dataclasses

from .. import pipeline
from . import student
from .rungs import Recipe, Rung, measured


class Side:
    """02 in a worker: a loader for the profile, the student's (``make_fast_loader``) or the naive
    one (the baseline's), kept for the judge to iterate."""

    ASKED = ("loader",)

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.namespace, self.lab, self.student = namespace, lab, student

    def loader(self, *, batch_size: int | None = None, seed: int | None = None, **kw):
        """A loader at ``batch_size`` (the profile's by default); ``kw``: ``split`` and ``augment``,
        passed on only where the judge gave them (the student's own defaults apply to the rest)."""
        if set(kw) - {"split", "augment"}:
            raise ValueError(f"a loader takes no {sorted(set(kw) - {'split', 'augment'})}")
        size = batch_size or self.lab.profile.batch_size
        profile = dataclasses.replace(self.lab.profile, batch_size=size)
        if not self.student:
            return pipeline.naive_loader(profile, seed=self.lab.seed if seed is None else seed, **kw)
        make = self.namespace.get("make_fast_loader")
        if not callable(make):
            raise NameError("`make_fast_loader` is not defined in the code carried from 02")
        return make(self.lab if size == self.lab.profile.batch_size else dataclasses.replace(self.lab, profile=profile), **kw)


# --- 02's rung: the student's loader feeding the lab's fp32 step ------------------------------------

def their_loader(code, lab, made: Recipe) -> Recipe:
    """02's change: the student's ``make_fast_loader`` (in ``code("02")``) instead of the naive loader."""
    return dataclasses.replace(made, loader=student(code("02"), "make_fast_loader", "02"))


RUNG = Rung(their_loader, extras=lambda found, lab: {
    "loader_speedup": measured(found, "02-loader-speedup"), "data_wait_share": measured(found, "02-data-wait-share")})
