"""The judge: a notebook's verdicts decided by a process that never runs the student's code.

``python -P -m labsupport.grading.judging SPEC.json`` is what ``python -m autograder grade`` runs for
every notebook where :func:`.judge_setup.judges` says so (elsewhere a :mod:`.verdict` process
decides). It starts one or two workers (:mod:`.worker`), each in the submission's sandbox: one
that loads the student's carried code, and, where the notebook's ``JUDGED.baseline`` says so, one
that loads none and serves labsupport's baseline. Then it runs the notebook's own checks (the
same functions the self-check runs) with the notebook's judge side (``JUDGED.remote``, a
:class:`.judge_setup.RemoteSides`), which asks the workers through :class:`Sides` and checks each
reply; this module names no notebook:

- **Timed from outside.** Every timed call is a request to a worker and its reply, on the judge's
  clock. Each worker runs in a cgroup v2 group of its own from its first instruction (joined in
  its command prefix, before the sandbox: :mod:`.cgroups`); while one side is timed the other's
  group is frozen as a whole, processes it forks or hands off included, so neither slows the other
  or works ahead. Each timed block is verified: the frozen side's CPU time is read before and after
  (:meth:`Sides.verify`), and a block in which it ran is timed again, then the check fails. Where
  no group can be had (no root, no cgroup v2) the judge grades no speed that compares two sides
  (:func:`unprotected`): a SIGSTOP to the pids listed in ``/proc`` misses a process that forks
  and exits every millisecond (issue 60: a baseline's code as the answer scored 29x that way).
- **Symmetric.** The baseline is driven through the same channel as the student's code, so both
  pay the same cost of crossing it.
- **Checked as timed.** What a timed call produced comes back as plain tensors (:mod:`.wire`),
  and the correctness partners run here, on exactly those tensors: every timed batch, every
  epoch, finished or not.
- **Nothing of the student's runs here.** Not imported, not unpickled, not executed: a worker's
  reply is JSON and numbers. What a worker can still do is answer wrongly or slowly, and that
  costs its own checks.

The spec (JSON): ``notebook``, ``profile``, ``thresholds``, ``calibration``, ``data``, ``inputs``
(root's read-only folder with the carried code; where ``JUDGED.reads_ladder`` says so also the rungs
the verdict processes recorded and the report the kernel exported), ``since`` (when the kernel
started: the report must be newer), ``judged`` (root's folder for what this judge keeps: the checks
table, the rung and the carried code, for later notebooks), ``out`` (the verdict file), ``sandbox``
(the command prefix a worker runs under, empty for none) and ``env`` (the workers' environment);
optionally ``reply_timeout_s`` (:data:`REPLY_TIMEOUT_S`) and ``groups`` (``{"student": path,
"baseline": path}``: cgroup v2 groups the grader made, which ``sandboxes``, one command prefix per
worker, already join; without them a judge with no sandbox prefix makes its own, and one with a
prefix has none).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from .. import notebooks

from .judge_setup import setup_of, unprotected
from .workers import REPLY_TIMEOUT_S, RemoteHeld, Worker, WorkerError  # noqa: F401 (names tests use)


def functions_of(number: str) -> tuple[str, ...]:
    """The student's functions notebook ``number``'s checks call, by name (the registry's graded
    names less its constants): the judge asks its worker for them."""
    return tuple(name for name in notebooks.get(number).graded if not name.isupper())


# The judge's OpenMP threads sleep when their work is done rather than spin: mostly the judge waits
# for a worker, and its spinning threads took the cores from the worker computing. The reference's
# data source served a batch in 8 ms in one process, in 21 ms from a worker beside a judge with two
# spinning threads, and in 9-10 ms beside a passive judge checking with one (class cpu, 64 px).
# The workers keep the default: the student's code runs as it does in their notebook.
QUIET_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
CROSSINGS = 21  # times a batch's crossing is measured (:meth:`Sides.crossing_s`)
# CPU time a frozen side may show over one timed block and still count as not having run. Measured
# on 2 busy cores (Linux 6.18, cgroup v2 on a hybrid hierarchy): a group of a busy and a sleeping
# process, frozen, read at most 12 us over 200 blocks of 20-100 ms (0 in 192 of them: accounting
# settling after `frozen 1`); the pid hopper's worker, frozen, 0 us per 0.2 s; SIGSTOPped by its
# pid list, 38-95 ms. So a millisecond is far above what a frozen side shows, and far below work.
PAUSED_CPU_USEC = 1000


class Sides:
    """The two workers as a notebook's judge side sees them: what it asks of either (:meth:`ask`,
    :meth:`held`), and which side runs (:meth:`focus`: the other is stopped)."""

    def __init__(self, student: Worker, baseline: Worker):
        self.workers = {"candidate": student, "baseline": baseline}
        self.side: str | None = None
        self.paused_usec: list[int] = []  # the frozen side's CPU time over each verified block, in order

    def verify(self, side: str):
        """Before a block that times ``side`` (the other side frozen): a function to call after it,
        which says why the block does not count ("" if it does): the frozen side's group used more
        than :data:`PAUSED_CPU_USEC` of CPU meanwhile (:func:`labsupport.measure.compare`'s ``verify``)."""
        other = self.workers["baseline" if side == "candidate" else "candidate"]
        if not other or other.group is None:  # one side only, or no groups: :func:`unprotected` says so
            return lambda: ""
        before = other.group.cpu_usec()

        def ran() -> str:
            used = other.group.cpu_usec() - before
            self.paused_usec.append(used)
            if used <= PAUSED_CPU_USEC:
                return ""
            whose = "your code's" if other.role == "student" else "the baseline's"
            return (f"the other side ran while you were timed: {whose} worker, frozen, used {used / 1e3:.1f} ms "
                    f"of CPU in one timed block (at most {PAUSED_CPU_USEC / 1e3:g} ms allowed)")
        return ran

    def focus(self, side: str | None) -> None:
        """Let ``side`` run and stop the other ("candidate", "baseline"; None lets both run)."""
        self.side = side
        for name, worker in self.workers.items():
            if name != side and side is not None and worker:
                worker.pause(True)
        for name, worker in self.workers.items():
            if (name == side or side is None) and worker:
                worker.pause(False)

    @contextlib.contextmanager
    def checking(self):
        """While the judge only checks what a worker sends (one thread: it takes no core from the
        side being timed)."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def crossing_s(self, tensors) -> float:
        """Seconds a batch like ``tensors`` takes to cross from a worker to the judge, without the
        work of making it: a request, the copy into the shared buffer, the reply and the judge's
        copy out, for tensors the baseline's worker holds ready (its ``echo``; no student code
        ever ran there), the student's worker stopped. The median of :data:`CROSSINGS`, timed
        here. Every batch a check times crosses so, on either side, so it can take it off both:
        it then compares what the notebook's self-check compares, the two sources' own time."""
        worker, was = self.workers["baseline"], self.side
        kinds = [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors]
        self.focus("baseline")
        try:
            worker.tensors(worker.request("echo", tensors=kinds))  # the worker makes them once
            times = []
            for _ in range(CROSSINGS):
                started = time.perf_counter()
                worker.tensors(worker.request("echo", tensors=kinds))
                times.append(time.perf_counter() - started)
        finally:
            self.focus(was)
        return statistics.median(times)

    def resident_peak(self, side: str, fn, device) -> tuple[object, int | None]:
        """``fn()`` (requests to ``side``'s worker) and, on a CPU, the most memory that worker held
        resident meanwhile, read from outside (:meth:`Worker.resident_peak`); None on a GPU, whose
        memory the process's resident set does not show."""
        if str(device).startswith("cuda"):
            return fn(), None
        return self.workers[side].resident_peak(fn)

    def guard(self) -> list[str]:
        """The watched library functions the student's code replaced in its worker since the last
        time asked (put back there): what was measured meanwhile has no verdict. A worker that
        broke off says nothing more (its checks already failed)."""
        worker = self.workers["candidate"]
        try:
            return [str(name)[:200] for name in worker.request("guard").get("patched") or []]
        except WorkerError:
            return []

    def _alone(self, side: str, fn):
        """``fn()`` (a request to ``side``'s worker), that side alone running."""
        was = self.side
        self.focus(side)
        try:
            return fn()
        finally:
            self.focus(was)

    def ask(self, side: str, method: str, *, send=(), alone: bool = False, slow: bool = False, **args) -> dict:
        """Call ``method`` of the notebook's worker side (its ``Side.ASKED``) in ``side``'s worker
        with plain ``args`` and the tensors ``send``: its reply, ``value`` (plain data) and
        ``tensors`` (the judge's copies), or ``handle`` and ``len``. ``alone``: the other side
        stopped meanwhile (building something); ``slow``: a request that may take long."""
        from . import wire

        worker = self.workers[side]
        fields = {"method": method, "args": args}
        if send:
            fields["tensors"] = wire.put(worker.view, list(send))
        ask = lambda: worker.request("ask", slow=slow, **fields)  # noqa: E731
        reply = self._alone(side, ask) if alone else ask()
        return {**reply, "tensors": worker.tensors(reply)} if "tensors" in reply else reply

    def held(self, side: str, method: str, *, asked: tuple[str, ...], slow: bool = False,
             slow_asked: tuple[str, ...] = (), **args) -> RemoteHeld:
        """What ``method`` builds in ``side``'s worker (that side alone running; ``slow``: it may
        take long), held there: of it the judge may ask ``asked`` (the judge's own list),
        ``slow_asked`` of them taking long."""
        reply = self.ask(side, method, alone=True, slow=slow, **args)
        if not isinstance(reply.get("handle"), int):
            raise WorkerError(f"{method} built nothing to hold")
        return RemoteHeld(self.workers[side], reply["handle"], asked, slow=slow_asked, length=reply.get("len"))


def _stand_in(name: str):
    """What the judge's namespace holds for the student's function ``name`` (unless the notebook's
    judge side stands in for it: its ``STANDS_IN``): the checks run it only through their judge
    side, in the worker; called here, it refuses."""
    def refuse(*args, **kwargs):
        raise RuntimeError(f"`{name}` runs in the student's worker, never in the judge")
    return refuse


def buffer_bytes(profile, number: str = "") -> int:
    """The shared buffer a worker's batch crosses: twice a float32 batch of the profile, 1 MiB more,
    or notebook ``number``'s ``JUDGED.buffer_floor`` where that is more (a model's weights,
    gradients and buffers cross whole: ResNet-18's 11.2 M float32 parameters are 45 MB)."""
    batch = 2 * profile.batch_size * 3 * profile.image_size ** 2 * 4 + 2**20
    return max(batch, setup_of(number).buffer_floor if number else 0)


def _rung(number: str, namespace: dict, lab, found: dict, student: Worker, sides: Sides) -> dict | None:
    """Notebook ``number``'s rung (its grading module's ``RUNG``): one with no student code in its
    step is measured here (:func:`.rungs.measure`); one whose step is the student's is built in
    their worker and timed from here (at the rung's batch, its peak counted by the worker where
    the rung's point is memory)."""
    from labsupport import train

    from . import rungs

    rung = rungs.of(number)
    if rung is None or not rung.in_worker:
        return rungs.measure(number, namespace, lab, found)
    config = student.request("rung")["config"]
    try:  # what the worker says its step is: a description only (the timing is the judge's)
        config = train.StepConfig(**{k: v for k, v in config.items() if k != "compiled"}, compiled=rung.compiled)
    except TypeError:
        config = train.StepConfig(compiled=rung.compiled)
    return rungs.measure_timed(number, lambda: student.request("rung_step"), config, rungs.rung_lab(rung, lab), found,
                               wait=lambda: student.request("rung_batch"),
                               peak=(lambda: student.request("rung_peak")["bytes"]) if rung.counts_peak else None,
                               verify=sides.verify)


ROLES = ("student", "baseline")


def worker_groups(spec: dict) -> tuple[dict, dict[str, list[str]], str, Path | None]:
    """Each worker's cgroup v2 group and command prefix, ``(groups, prefixes, why there are none,
    the folder this judge made)``. The grader's, where the spec has them (it made them and built
    each sandbox prefix to join one: :func:`autograder.verdicts._judge`); else, with no sandbox
    prefix, groups of this judge's own, joined first thing (:meth:`.cgroups.Group.join_command`);
    else none, and why (a sandbox prefix this judge cannot put a join into: it would join before
    the memory cgroup, which on a unified machine then moves the worker out of it)."""
    from . import cgroups

    prefix = list(spec.get("sandbox") or [])
    given, boxes = spec.get("groups"), spec.get("sandboxes")
    if isinstance(given, dict) and isinstance(boxes, dict) and all(r in given and r in boxes for r in ROLES):
        return {r: cgroups.Group(Path(given[r])) for r in ROLES}, {r: list(boxes[r]) for r in ROLES}, "", None
    same = {r: prefix for r in ROLES}
    if prefix:
        return {}, same, "the grader gave its sandboxed workers no cgroup", None
    why = cgroups.problem()
    if why:
        return {}, same, why, None
    folder = cgroups.mount() / f"lab-judge-{os.getpid()}"
    try:
        groups = {r: cgroups.Group.make(folder / r) for r in ROLES}
    except cgroups.CgroupError as err:
        cgroups.Group(folder).remove()
        return {}, same, str(err), None
    return groups, {r: groups[r].join_command() for r in ROLES}, "", folder


def _decide(number: str, found: dict, out: dict) -> None:
    """Keep the checks table for later notebooks, and put it in the verdict."""
    from labsupport import grading

    grading.keep_checks(number, found.values())
    out["checks"] = grading.verdict_rows(found)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    judged = Path(spec["judged"])
    os.environ.update({"LAB_PROFILE": spec["profile"], "LAB_THRESHOLDS": spec["thresholds"],
                       "LAB_CALIBRATION": spec.get("calibration") or os.devnull,
                       "LAB_RESULTS": str(judged), "LAB_DATA": spec["data"], **QUIET_WAIT,
                       # the report: root's copy of what the kernel exported, which it must have written
                       "LAB_REPORT": str(Path(spec["inputs"]) / "report.html"),
                       "LAB_WRITTEN_SINCE": str(spec.get("since") or 0)})
    started = time.perf_counter()
    import labsupport  # noqa: F401
    from labsupport import grading, hardware, measure

    measure.steady_heap()  # as the workers' heaps, and a notebook's after ls.setup()

    number = spec["notebook"]
    lab = grading.grading_lab()
    hardware.quiet_library_logs(lab.device)
    out = {"notebook": number, "checks": {}, "rung": None, "problems": [], "judge": True}
    code = Path(spec["inputs"]) / "code" / f"{number}.pkl"
    # Root's copies, bytes only (never unpickled here): what later notebooks' workers load, and its
    # readable copy beside it (what the grader keeps in results/<student>/code for people to read).
    for kept in (code, code.with_suffix(".py")):
        if kept.is_file():
            (judged / "code").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept, judged / "code" / kept.name)
    # The rungs verdict processes recorded, as the grader took them: beside the judges' own.
    for rung in sorted((Path(spec["inputs"]) / "rungs").glob("*.json")):
        if not (judged / rung.name).exists():
            shutil.copyfile(rung, judged / rung.name)
    worker_spec = {"notebook": number, "profile": spec["profile"], "data": spec["data"],
                   "inputs": spec["inputs"]}
    groups, prefixes, ungrouped, made = worker_groups(spec)
    kw = dict(env=dict(spec["env"]), buffer_bytes=buffer_bytes(lab.profile, number),
              reply_timeout_s=float(spec.get("reply_timeout_s") or REPLY_TIMEOUT_S))
    try:
        _judge(number, spec, lab, code, out, kw, groups, prefixes, ungrouped, worker_spec)
    finally:  # whatever happened: the workers' groups, with anything left in them, go
        for group in groups.values():
            group.kill()
        if made is not None:
            from .cgroups import Group

            Group(made).remove()
    out["seconds"] = round(time.perf_counter() - started, 2)
    Path(spec["out"]).write_text(json.dumps(out, indent=1))
    return 0


def _judge(number, spec, lab, code, out, kw, groups, prefixes, ungrouped, worker_spec) -> None:
    """Notebook ``number``'s checks with its workers (:func:`main`'s body, its groups made)."""
    from labsupport import grading

    if not code.is_file():  # nothing carried: every check fails on its missing function, no worker needed
        _decide(number, grading.run(number, {}, lab=lab, keep=False), out)
    else:
        with Worker("student", worker_spec, prefix=prefixes["student"], group=groups.get("student"), **kw) as student, \
                (Worker("baseline", worker_spec, prefix=prefixes["baseline"], group=groups.get("baseline"), **kw)
                 if setup_of(number).baseline else contextlib.nullcontext()) as baseline:
            sides = Sides(student, baseline)
            remote = setup_of(number).remote
            asked = remote(sides) if remote else sides  # what the checks call: the notebook's judge side
            loaded, names, patched = "", [], []
            for worker in (student, baseline) if baseline else (student,):
                try:
                    reply = worker.request("load")
                    names += reply["names"]
                    patched += reply.get("patched") or []
                except WorkerError as err:
                    loaded = loaded or str(err)
            tampered = grading.patched_note(patched, "when it was loaded") if patched else ""
            for problem in (loaded, tampered):
                if problem:
                    out["problems"].append(problem)
            stands_in = getattr(asked, "STANDS_IN", ())
            namespace = {} if loaded else {name: getattr(asked, name) if name in stands_in else _stand_in(name)
                                           for name in functions_of(number) if name in names}
            # Code that did not load (not carried: the kernel's checks said why) fails every check with that reason.
            found = grading.run(number, namespace, lab=lab, keep=False, sides=asked, tampered=tampered or loaded)
            if baseline and not ungrouped and not all(w.group.pids() for w in (student, baseline) if not w.broken):
                ungrouped = "a worker was not in its cgroup"  # a prefix that joined none: no freeze was verified
            if baseline and ungrouped and lab.profile.grades_speed:
                out["problems"].append(unprotected(number, found, ungrouped))
            _decide(number, found, out)
            # What the frozen side used over the blocks verified so far (issue 60's figures).
            out["frozen_cpu_usec"] = {"blocks": len(sides.paused_usec), "max": max(sides.paused_usec, default=None)}
            if namespace and not tampered:
                try:
                    sides.focus("candidate")
                    rung = _rung(number, namespace, lab, found, student, sides)
                    patched = sides.guard()
                    if patched:
                        raise grading.StudentCodeError(grading.patched_note(patched, "while its rung was measured"))
                    out["rung"] = None if rung is None else round(float(rung["samples_per_s"]), 3)
                except Exception as err:
                    out["problems"].append(f"rung not measured: {type(err).__name__}: {str(err)[:300]}")


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
