"""A worker: the one process where the student's graded code runs while the judge grades it.

``python -P -m labsupport.grading.worker SPEC`` is started by :mod:`.judging`, in the submission's
sandbox, and then only answers the judge's requests (:mod:`.wire`) until told to quit. Its role
is either

- ``student``: it loads the code notebook ``NN``'s checks carried forward (``code/NN.pkl``, copied
  from the judge's read-only ``inputs``, beside the earlier notebooks' the judge handed over),
  and builds and runs what the judge asks for with the student's functions; or
- ``baseline``: it loads no student code at all, and builds the same things with labsupport's
  own versions, so the baseline pays exactly the student's cost of being driven from outside.

What either may be asked is declared by the notebook, never by the request: its worker side
(:func:`worker_side`: the module ``gNN_worker`` beside its checks, which holds no check and no
expected answer) has a class ``Side(namespace, lab, student=...)`` whose ``ASKED`` names the
methods the judge may call (``ask``); what a method returns is sent back as plain data (numbers,
text, lists, dicts), tensors copied into the judge's shared buffer, or, for anything else, a handle
to the object kept here, of which its class's ``ASKED`` may be asked in turn (``ask`` with
``handle``) and which may be iterated (``iter``, ``next``: batches, one at a time). The rest is the
same for every notebook: ``load``, ``guard``, ``echo``, the notebook's rung (``rung``,
``rung_batch``, ``rung_peak``, ``rung_step``) and ``quit``.

``guard``: before any student code loads, the worker imports every labsupport module and records the
watched library functions (:func:`labsupport.grading.library_functions`: labsupport's measurers and
partners, the torch and data functions they use); after loading and whenever the judge asks
(after each check, where no clock runs), it puts back whatever the student's code replaced and
names it, and the judge fails what was measured meanwhile.
A worker never learns which of its outputs the judge checks, and its own clock decides nothing:
the judge times each request from outside. SPEC is a JSON object: ``role``, ``notebook``,
``profile``, ``data``, ``inputs`` (the carried code's folder, or null), ``fds`` (request, reply,
buffer).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import sys
import tempfile
from pathlib import Path


def worker_side(number: str):
    """Notebook ``number``'s worker side: the module ``labsupport.grading.g<number>_worker``, which
    declares what its worker builds and may be asked (its ``Side``)."""
    import importlib

    return importlib.import_module(f"labsupport.grading.g{number}_worker")


def plain(value, depth: int = 0) -> bool:
    """Whether ``value`` is plain data the wire carries as JSON: numbers, text, None, and lists
    and string-keyed dicts of them."""
    if depth > 8:
        return False
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v, depth + 1) for k, v in value.items())
    return False


class Served:
    """What one worker holds and does: each ``op_<name>`` answers the request of that name."""

    def __init__(self, spec: dict, view: memoryview, results: Path):
        from labsupport.grading import grading_lab

        self.spec, self.view, self.results = spec, view, results
        self.student = spec["role"] == "student"
        self.lab = grading_lab()
        self.objects: dict[int, object] = {}
        self.namespace: dict = {}
        self.side = self.rung = None
        self.echoed = (None, [])

    def keep(self, thing) -> int:
        self.objects[len(self.objects)] = thing
        return len(self.objects) - 1

    def op_load(self, request) -> dict:
        """The student's carried code, as its checks measured it, and the earlier notebooks' the
        judge handed over (``inputs/code``): nothing for the baseline."""
        from labsupport import carry

        if self.student and self.spec.get("inputs"):
            (self.results / "code").mkdir(exist_ok=True)
            for source in sorted((Path(self.spec["inputs"]) / "code").glob("[0-9][0-9].pkl")):
                shutil.copyfile(source, self.results / "code" / source.name)
            if (self.results / "code" / f"{self.spec['notebook']}.pkl").is_file():
                # Unpickled here, in the sandbox, and nowhere on the judge's side: loading runs code.
                self.namespace.update(vars(carry.load(self.spec["notebook"], lab=self.lab)))
        return {"ok": True, "names": sorted(self.namespace)}

    def op_ask(self, request) -> dict:
        """A method the notebook's worker side allows (its ``Side.ASKED``), or one a kept object's
        class allows (``handle``), called with the request's plain ``args`` (and its ``tensors``,
        if it sent any, as the argument ``tensors``); what it returned, finished on its device."""
        from labsupport import measure
        from labsupport.grading import wire

        handle = request.get("handle")
        if handle is None:
            if self.side is None:
                self.side = worker_side(self.spec["notebook"]).Side(self.namespace, self.lab, student=self.student)
            target, whose = self.side, f"notebook {self.spec['notebook']}'s worker"
        else:
            target, whose = self.objects.get(int(handle)), f"object {handle}"
        method, args = request.get("method"), request.get("args") or {}
        if not isinstance(method, str) or method not in getattr(type(target), "ASKED", ()):
            raise ValueError(f"no method {method!r} to ask of {whose}")
        if not isinstance(args, dict) or not plain(args):
            raise ValueError(f"the arguments of {method!r} are not plain data")
        if request.get("tensors") is not None:
            args["tensors"] = wire.take(self.view, request["tensors"])
        value = getattr(target, method)(**args)
        measure.sync(self.lab.device)
        return self.answer(value)

    def answer(self, value) -> dict:
        """``value`` as a reply: a number (a tensor of one element), tensors copied for the judge (a
        tensor, a list of them, or a dict's ``tensors`` beside its plain values), plain data, or a
        handle to it kept here (with its length, where it has one)."""
        import torch

        from labsupport.grading import wire

        if isinstance(value, torch.Tensor):
            return {"value": float(value)} if value.dim() == 0 else \
                {"tensors": wire.put(self.view, [value]), "one": True}
        if isinstance(value, list) and value and all(isinstance(t, torch.Tensor) for t in value):
            return {"tensors": wire.put(self.view, value)}
        if isinstance(value, dict) and isinstance(value.get("tensors"), list):
            rest = {k: v for k, v in value.items() if k != "tensors"}
            if plain(rest) and all(isinstance(t, torch.Tensor) for t in value["tensors"]):
                return {"value": rest, "tensors": wire.put(self.view, value["tensors"])}
        if plain(value):
            return {"value": value}
        try:
            length = int(len(value))
        except TypeError:
            length = None
        return {"handle": self.keep(value), "len": length}

    def op_iter(self, request) -> dict:
        return {"handle": self.keep(iter(self.objects[int(request["handle"])]))}

    def op_next(self, request) -> dict:
        """One batch, finished on its device, then copied for the judge."""
        import torch

        from labsupport import measure
        from labsupport.grading import wire

        try:
            images, labels = next(self.objects[int(request["handle"])])
        except StopIteration:
            return {"stop": True}
        measure.sync(self.lab.device)
        if not (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)):
            raise TypeError(f"a batch must be (images, labels) tensors, not ({type(images).__name__}, "
                            f"{type(labels).__name__})")
        return {"tensors": wire.put(self.view, [images, labels]), "device": images.device.type}

    def op_echo(self, request) -> dict:
        """Tensors of the given dtypes and shapes, made once and sent on every request: what a
        batch's crossing to the judge costs without the work of making it (:meth:`Sides.crossing_s`).
        The baseline's worker answers it, where no student code ever ran."""
        import torch

        from labsupport.grading import wire

        if self.student:
            raise PermissionError("the judge measures a batch's crossing in the baseline's worker")
        kinds = [(str(d), tuple(int(n) for n in shape)) for d, shape in request["tensors"]]
        if self.echoed[0] != kinds:
            self.echoed = (kinds, [torch.zeros(shape, dtype=wire.DTYPES[d]) for d, shape in kinds])
        return {"tensors": wire.put(self.view, self.echoed[1])}

    def op_rung(self, request) -> dict:
        """Set up this notebook's rung (its grading module's ``RUNG``): the student's step, fed by
        the batches their rung's recipe draws (:func:`.rungs.build`), at the rung's batch."""
        import dataclasses

        from labsupport import pipeline
        from labsupport.grading import rungs

        number = self.spec["notebook"]
        rung = rungs.of(number)
        if rung is None or not rung.in_worker or not self.student:
            raise ValueError(f"no rung to set up for notebook {number} here")
        if rung.compiled:
            import torch

            # Dynamo forgets the checks' compiled graphs and what their inputs taught it: without
            # this it compiled the step with symbolic input strides, not the static graph the
            # kernel compiled, and missed the Inductor cache the kernel left (the first step took
            # 22-24 s instead of 9 with the reference on class cpu, at the tiny profile).
            torch.compiler.reset()
        source, step, _ = rungs.build(number, self.namespace, self.lab)
        self.rung = (pipeline.forever(source), step, None)
        return {"config": dataclasses.asdict(step.config)}

    def op_rung_batch(self, request) -> dict:
        """The rung's next batch from the student's source of batches, copied to the device (the judge times
        this request as the step's data wait)."""
        from labsupport import measure

        batches, step, _ = self.rung
        self.rung = (batches, step, step.to_device(*next(batches), True))
        measure.sync(self.lab.device)
        return {"ok": True}

    def op_rung_peak(self, request) -> dict:
        """The peak bytes of one rung step on the next batch, counted here (memory.TensorBytes), where
        the rung's point is memory."""
        from labsupport import memory

        batches, step, _ = self.rung
        x, y = step.to_device(*next(batches))
        return {"bytes": float(memory.peak_step_bytes(lambda: step(x, y), self.lab.device).peak_bytes)}

    def op_rung_step(self, request) -> dict:
        """One step of the rung on the batch :meth:`op_rung_batch` fetched."""
        from labsupport import measure

        batches, step, batch = self.rung
        if batch is None:
            raise ValueError("no batch fetched for this step")
        self.rung = (batches, step, None)
        step(*batch)
        measure.sync(self.lab.device)
        return {"ok": True}


def watched_libraries() -> tuple[dict, object]:
    """Every labsupport module imported, then the watched library functions as they are now, and
    the function that puts them back: taken before any student code runs, so that code can
    neither hide from the guard a module it patches nor replace the guard."""
    import importlib
    import pkgutil

    import labsupport
    from labsupport import grading

    for found in pkgutil.walk_packages(labsupport.__path__, "labsupport."):
        if not found.name.endswith("__main__"):
            importlib.import_module(found.name)
    return grading.library_functions(), grading.restore_library_functions


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    requests, replies, buffer_fd = spec["fds"]
    # print() in the student's code must not reach the judge's channel: stdout goes to stderr.
    os.dup2(2, 1)
    results = Path(tempfile.mkdtemp(prefix="worker-results-"))
    os.environ.update({"LAB_PROFILE": spec["profile"], "LAB_DATA": spec["data"], "LAB_RESULTS": str(results),
                       "LAB_CALIBRATION": os.devnull})
    from labsupport import measure
    from labsupport.grading import wire

    measure.steady_heap()  # before any of the student's code: both sides allocate as a notebook's kernel does
    served = Served(spec, memoryview(mmap.mmap(buffer_fd, 0)), results)
    libraries, restore = watched_libraries()
    restore_code = restore.__code__

    def guard() -> list[str]:
        """The watched functions the student's code replaced since the worker started, put back."""
        if restore.__code__ is not restore_code:  # the guard itself, changed inside
            restore.__code__ = restore_code
            return ["labsupport.grading.restore_library_functions", *restore(libraries)]
        return restore(libraries)

    try:
        while True:
            try:
                request = wire.receive(requests)
            except wire.WireError:
                return 0  # the judge went away
            op = request.get("op")
            if op == "quit":
                wire.send(replies, {"ok": True})
                return 0
            try:
                if op == "guard":
                    answer = {"patched": guard()}
                else:
                    handler = getattr(served, f"op_{op}", None) if isinstance(op, str) else None
                    if handler is None:
                        raise ValueError(f"unknown request {op!r}")
                    answer = handler(request)
                    if op == "load":
                        answer["patched"] = guard()
            except Exception as err:  # the student's code raised: the judge fails the check with it
                answer = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
            wire.send(replies, answer)
    finally:  # its scratch store goes with it (outside a sandbox's /tmp, nothing else removes it)
        shutil.rmtree(results, ignore_errors=True)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
