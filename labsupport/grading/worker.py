"""A worker: the one process where the student's graded code runs while the judge grades it.

``python -P -m labsupport.grading.worker SPEC`` is started by :mod:`.judging`, in the submission's
sandbox, and then only answers the judge's requests (:mod:`.wire`) until told to quit. Its role
is either

- ``student``: it loads the code notebook ``NN``'s checks carried forward (``code/NN.pkl``, copied
  from the judge's read-only ``inputs``, beside the earlier notebooks' the judge handed over),
  and builds and runs what the judge asks for with the student's functions; or
- ``baseline``: it loads no student code at all, and builds the same things with labsupport's
  own versions (02's naive loader, 03's fp32 step, 04's plain step, 05's eager model, 06's naive
  pipeline), so the baseline pays exactly the student's cost of being driven from outside. 01
  and 07 have no baseline worker: what their checks compare with, they measure in the judge.

Each request is answered by :class:`Served`'s method of its name (``op_<name>``), except ``guard``:
before any student code loads, the worker imports every labsupport module and records the watched
library functions (:func:`labsupport.grading.library_functions`: labsupport's measurers and
partners, the torch and data functions they use); after loading and whenever the judge asks
(``guard``: after each check, where no clock runs), it puts back whatever the student's code
replaced and names it, and the judge fails what was measured meanwhile.
What a worker sends back is numbers: tensors copied into the judge's shared buffer, counts, and
error messages. It never learns which of its outputs the judge checks, and its own clock decides
nothing: the judge times each request from outside. SPEC is a JSON object: ``role``, ``notebook``,
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


PRECISIONS = ("float16", "bfloat16")  # what a request may name for 05's inference (None: float32)


# What one profile of 01's labelled_step may send back (names cut to 120 characters, convolutions'
# with their shapes; the reference's: 45 at the tiny profile, 18 of them without shapes).
MAX_EVENT_NAMES, MAX_EVENTS = 400, 100_000  # 48 KB of names (the wire takes 64), 3.2 MB of rows


class Served:
    """What one worker holds and does: each ``op_<name>`` answers the request of that name."""

    def __init__(self, spec: dict, view: memoryview, results: Path):
        from labsupport.grading import grading_lab

        self.spec, self.view, self.results = spec, view, results
        self.student = spec["role"] == "student"
        self.lab = grading_lab()
        self.objects: dict[int, object] = {}
        self.namespace: dict = {}
        self.inference = self.rung = None
        self.echoed = (None, [])

    def keep(self, thing) -> int:
        self.objects[len(self.objects)] = thing
        return len(self.objects) - 1

    def mine(self, name: str):
        """The student's function ``name`` from the carried code (a student worker's alone)."""
        from labsupport.grading import student

        if not self.student:
            raise PermissionError(f"the baseline's worker holds no student code ({name})")
        return student(self.namespace, name, self.spec["notebook"])

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

    def op_loader(self, request) -> dict:
        """A loader for the profile: the student's ``make_fast_loader``, or the naive one (02)."""
        import dataclasses

        from labsupport import pipeline

        size = request.get("batch_size") or self.lab.profile.batch_size
        kw = {k: request[k] for k in ("split", "augment") if k in request}
        if self.student:
            make = self.namespace.get("make_fast_loader")
            if not callable(make):
                raise NameError("`make_fast_loader` is not defined in the code carried from 02")
            here = self.lab if size == self.lab.profile.batch_size else dataclasses.replace(
                self.lab, profile=dataclasses.replace(self.lab.profile, batch_size=size))
            loader = make(here, **kw)
        else:
            profile = dataclasses.replace(self.lab.profile, batch_size=size)
            loader = pipeline.naive_loader(profile, seed=request.get("seed", self.lab.seed), **kw)
        try:
            length = int(len(loader))
        except TypeError:
            length = None
        return {"handle": self.keep(loader), "len": length}

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

    def op_call(self, request) -> dict:
        """The student's function ``name`` on plain numbers (05's ``break_even_steps``)."""
        from labsupport.grading.watch import watched

        fn = watched(self.mine(str(request["name"])), str(request["name"]), self.spec["notebook"])
        return {"values": [float(fn(*[float(a) for a in args])) for args in request["args"]]}

    def op_precision(self, request) -> dict:
        """The student's 03 ``choose_precision``, carried forward, checked."""
        from labsupport.grading import carried
        from labsupport.grading.g03_amp import precision

        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (choose_precision)")
        dtype, channels_last = precision(carried("03", self.lab).choose_precision, self.lab.machine)
        return {"dtype": None if dtype is None else str(dtype).removeprefix("torch."),
                "channels_last": channels_last}

    def op_inference(self, request) -> dict:
        """05's model on one batch in ``dtype``: eager (baseline), or as the student's
        ``compile_inference`` returned it."""
        import torch

        from labsupport.grading.g05_compile import Inference

        name = request.get("dtype")
        if name is not None and name not in PRECISIONS:
            raise ValueError(f"no inference precision {name!r}")
        dtype = getattr(torch, name) if name else None
        self.inference = Inference(self.lab, dtype, self.mine("compile_inference") if self.student else None)
        return {"ok": True}

    def op_cold(self, request) -> dict:
        return {"graphs": int(self.inference.cold())}

    def op_eager_calls(self, request) -> dict:
        return {"calls": int(self.inference.eager_calls())}

    def op_infer(self, request) -> dict:
        """One inference call; its logits, finished on the device, copied for the judge."""
        from labsupport import measure
        from labsupport.grading import wire

        call = request.get("call")
        out = self.inference(None if call is None else int(call))
        measure.sync(self.lab.device)
        return {"tensors": wire.put(self.view, [out.detach().float()])}

    def op_held_step(self, request) -> dict:
        """03: a training step on the naive loader's first batch, held here: fp32's (baseline), or
        the student's ``amp_train_step`` in their chosen precision or the ``dtype`` asked for."""
        from labsupport.grading import g03_amp

        if self.student and not callable(self.namespace.get("amp_train_step")):
            raise NameError("`amp_train_step` is not defined in the code carried from 03")
        here = g03_amp.Here(self.namespace, self.lab)
        kw = {k: request[k] for k in ("init_scale", "batch_size", "image_size") if request.get(k) is not None}
        dtype = request.get("dtype", "chosen")
        if dtype not in ("chosen", None, *PRECISIONS):
            raise ValueError(f"no training precision {dtype!r}")
        held = here.held_step("candidate" if self.student else "baseline", dtype=dtype, **kw)
        return {"handle": self.keep(held)}

    def _here_01(self):
        from labsupport.grading import g01_profile

        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (01)")
        return g01_profile.Here(self.namespace, self.lab)

    def op_timed_workload(self, request) -> dict:
        """01: the student's ``measure_throughput`` on a workload; what it returned, and the
        workload's record of each call (the judge times the request itself)."""
        got, took_ms, _ = self._here_01().timed_workload(
            str(request["workload"]), warmup=int(request["warmup"]), steps=int(request["steps"]),
            samples=int(request["samples"]))
        return {"got": got, "took_ms": took_ms[:1000]}

    def op_diagnose(self, request) -> dict:
        """01: the student's ``diagnose`` on each breakdown the judge sent."""
        breakdowns = [{str(k): float(v) for k, v in b.items()} for b in request["breakdowns"]]
        return {"answers": self._here_01().diagnose(breakdowns)}

    def op_top_operators(self, request) -> dict:
        """01: the student's ``top_operators`` on a profile taken here now, and that profile's table."""
        got, table = self._here_01().top_operators(str(request["case"]))
        return {"got": got[:50], "table": [(key[:120], us) for key, us in table[:400]]}

    def op_labelled_profile(self, request) -> dict:
        """01: the student's ``labelled_step`` profiled here; its events come back as one number
        table (each event: its name's index, whether it is a label, start and end in µs) and the
        names once each."""
        import torch

        from labsupport.grading import wire

        profiled = self._here_01().labelled_profile()
        names = sorted({name[:120] for name, _, _, _ in profiled["events"]})[:MAX_EVENT_NAMES]
        index = {name: i for i, name in enumerate(names)}
        rows = [(index[name[:120]], float(label), start, end) for name, label, start, end in profiled["events"]
                if name[:120] in index][:MAX_EVENTS]
        table = torch.tensor(rows, dtype=torch.float64).reshape(-1, 4)
        return {"names": names, "tensors": wire.put(self.view, [table]),
                **{key: [int(n) for n in profiled[key]] for key in ("drawn", "ran", "unchanged")},
                "parameters": int(profiled["parameters"])}

    def op_checkpoint_step(self, request) -> dict:
        """04: the plain fp32 step (baseline), or the same network wrapped by the student's
        ``checkpointed`` (:class:`~labsupport.grading.g04_checkpointing.HeldCheckpoint`)."""
        from labsupport.grading import g04_checkpointing

        side = "candidate" if self.student else "baseline"
        return {"handle": self.keep(g04_checkpointing.Here(self.namespace, self.lab).checkpoint_step(side))}

    def op_accumulate(self, request) -> dict:
        """04: the student's ``accumulate_step``, called once (:class:`~labsupport.grading.g04_checkpointing.HeldAccumulation`)."""
        from labsupport.grading import g04_checkpointing

        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (accumulate_step)")
        done = g04_checkpointing.Here(self.namespace, self.lab).accumulate(
            k=int(request["k"]), lr=float(request["lr"]), size=int(request["size"]))
        return {"handle": self.keep(done)}

    def op_pipeline(self, request) -> dict:
        """06: the naive pipeline (baseline), or the student's composed one: their 02 loader feeding
        their 03 step, compiled as their 05 chose (:class:`~labsupport.grading.g06_report.HeldPipeline`)."""
        from labsupport.grading import g06_report

        side = "candidate" if self.student else "baseline"
        return {"handle": self.keep(g06_report.Here(self.namespace, self.lab).pipeline(side))}

    def op_assemble(self, request) -> dict:
        """06: the student's ``assemble_ladder`` on the results the judge sent, its table as plain values."""
        import pandas as pd

        from labsupport.grading import g06_report

        self.mine("assemble_ladder")
        table = g06_report.Here(self.namespace, self.lab).assemble_ladder(g06_report.table_from(request.get("frame")))
        if not isinstance(table, pd.DataFrame):
            return {"type": type(table).__name__}
        return {"table": g06_report.table_message(table)}

    def op_held(self, request) -> dict:
        """One of the methods a held object offers (its class's ``ASKED``: 03's
        :class:`~labsupport.grading.g03_amp.HeldStep`, 06's :class:`~labsupport.grading.g06_report.HeldPipeline`),
        finished on its device: a number, or tensors copied for the judge."""
        import torch

        from labsupport import measure
        from labsupport.grading import g03_amp, g04_checkpointing, g06_report, wire

        held, method = self.objects.get(int(request["handle"])), request.get("method")
        kinds = (g03_amp.HeldStep, g04_checkpointing.HeldCheckpoint, g04_checkpointing.HeldAccumulation,
                 g06_report.HeldPipeline)
        if not isinstance(held, kinds) or method not in type(held).ASKED:
            raise ValueError(f"no method {method!r} to ask of object {request['handle']}")
        args = request.get("args") or {}
        value = getattr(held, method)(**{k: v for k, v in args.items() if isinstance(v, (int, float, str))})
        measure.sync(self.lab.device)
        if isinstance(value, torch.Tensor) and value.dim() == 0:  # a loss
            return {"value": float(value)}
        if isinstance(value, torch.Tensor):
            return {"tensors": wire.put(self.view, [value]), "one": True}
        if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
            return {"tensors": wire.put(self.view, value)}
        return {"value": value}

    def _here_07(self):
        from labsupport.grading import g07_compression

        if not self.student:
            raise PermissionError("the baseline's worker holds no student code (07)")
        return g07_compression.Here(self.namespace, self.lab)

    def _weights(self, request) -> dict:
        """The fp32 weights the judge sent: its names, and the tensors in the shared buffer."""
        from labsupport.grading import wire

        names, tensors = request["names"], wire.take(self.view, request["tensors"])
        if len(names) != len(tensors):
            raise ValueError("weights sent without their names")
        return dict(zip((str(n) for n in names), tensors))

    def op_pruned(self, request) -> dict:
        """07: the student's pruning, fine-tuned and made permanent, on the fp32 weights sent; the
        weights it left, named as fp32's (:class:`~labsupport.grading.g07_compression.Pruned`)."""
        from labsupport.grading import wire

        got = self._here_07().pruned(self._weights(request))
        names = list(got.state)
        return {"names": names, "tensors": wire.put(self.view, [got.state[n] for n in names]),
                "all": [n[:200] for n in got.names[:2000]], "masked": float(got.masked),
                "masks_through_tune": bool(got.masks_through_tune), "hooks": int(got.hooks)}

    def op_quantized(self, request) -> dict:
        """07: the student's ``quantize_int8`` on the fp32 weights sent, exported and described as
        data (:mod:`~labsupport.grading.exported`): its nodes as JSON bytes, then its tensors."""
        from labsupport.grading import wire

        described = self._here_07().quantized(self._weights(request))
        return {"tensors": wire.put(self.view, [described.encoded(), *described.tensors])}

    def op_distill_losses(self, request) -> dict:
        """07: the student's ``distillation_loss`` on the crafted cases sent (student and teacher
        logits, labels; a weight and a temperature each): its values and gradients."""
        import torch

        from labsupport.grading import g07_compression, wire

        students, teachers, labels = wire.take(self.view, request["tensors"])
        cases = [g07_compression.Case(s, t, y, float(a), float(temp)) for s, t, y, a, temp in
                 zip(students, teachers, labels, request["alphas"], request["temperatures"])]
        got = self._here_07().distill_losses(cases)
        return {"values": [v for v, _ in got], "tensors": wire.put(self.view, [torch.stack([g for _, g in got])])}

    def op_rung(self, request) -> dict:
        """Set up this notebook's rung (its grading module's ``RUNG``): the student's step, fed by
        their 02 loader, at the rung's batch."""
        import dataclasses

        from labsupport import pipeline
        from labsupport.grading import rungs

        number = self.spec["notebook"]
        rung = rungs.of(number)
        if rung is None or not rung.in_worker or not self.student:
            raise ValueError(f"no rung to set up for notebook {number} here")
        if rung.compiled:
            import torch

            # Dynamo forgets the inference checks' graphs and what their inputs taught it: without
            # this it compiled the step with symbolic input strides, not the static graph the
            # kernel compiled, and missed the Inductor cache the kernel left (the first step took
            # 22-24 s instead of 9 with the reference on class cpu, at the tiny profile).
            torch.compiler.reset()
        loader, step, _ = rungs.build(number, self.namespace, self.lab)
        self.rung = (pipeline.forever(loader), step, None)
        return {"config": dataclasses.asdict(step.config)}

    def op_rung_batch(self, request) -> dict:
        """The rung's next batch from the student's loader, copied to the device (the judge times
        this request as the step's data wait)."""
        from labsupport import measure

        batches, step, _ = self.rung
        self.rung = (batches, step, step.to_device(*next(batches), True))
        measure.sync(self.lab.device)
        return {"ok": True}

    def op_rung_peak(self, request) -> dict:
        """04: the peak bytes of one rung step on the loader's next batch, counted here (memory.TensorBytes)."""
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
