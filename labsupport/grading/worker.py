"""A worker: the one process where the student's graded code runs while the judge grades it.

``python -P -m labsupport.grading.worker SPEC`` is started by :mod:`.judging`, in the submission's
sandbox, and then only answers the judge's requests (:mod:`.wire`) until told to quit. Its role
is either

- ``student``: it loads the code notebook ``NN``'s checks carried forward (``code/NN.py``, copied
  from the judge's read-only ``inputs``), and builds what the judge asks for with the student's
  functions; or
- ``baseline``: it loads no student code at all, and builds the same things with labsupport's
  naive versions, so the baseline pays exactly the student's cost of being driven from outside.

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    requests, replies, buffer_fd = spec["fds"]
    # print() in the student's code must not reach the judge's channel: stdout goes to stderr.
    os.dup2(2, 1)
    results = Path(tempfile.mkdtemp(prefix="worker-results-"))
    os.environ.update({"LAB_PROFILE": spec["profile"], "LAB_DATA": spec["data"], "LAB_RESULTS": str(results),
                       "LAB_CALIBRATION": os.devnull})
    import torch

    from labsupport import carry, measure, pipeline
    from labsupport.grading import grading_lab
    from labsupport.grading import wire

    view = memoryview(mmap.mmap(buffer_fd, 0))
    lab = grading_lab()
    objects: dict[int, object] = {}
    namespace: dict = {}

    def reply(message: dict) -> None:
        wire.send(replies, message)

    while True:
        try:
            request = wire.receive(requests)
        except wire.WireError:
            return 0  # the judge went away
        op = request.get("op")
        try:
            if op == "quit":
                reply({"ok": True})
                return 0
            if op == "load":  # the student's carried code, as its checks measured it
                if spec["role"] == "student" and spec.get("inputs"):
                    (results / "code").mkdir(exist_ok=True)
                    name = f"{spec['notebook']}.py"
                    source = Path(spec["inputs"]) / "code" / name
                    if source.is_file():
                        shutil.copyfile(source, results / "code" / name)
                    namespace.update(vars(carry.load(spec["notebook"], lab=lab)))
                reply({"ok": True, "names": sorted(namespace)})
            elif op == "loader":  # a loader for the profile: the student's, or the naive one
                size = request.get("batch_size") or lab.profile.batch_size
                if spec["role"] == "student":
                    make = namespace.get("make_fast_loader")
                    if not callable(make):
                        raise NameError("`make_fast_loader` is not defined in the code carried from 02")
                    import dataclasses
                    here = lab if size == lab.profile.batch_size else dataclasses.replace(
                        lab, profile=dataclasses.replace(lab.profile, batch_size=size))
                    loader = make(here, **{k: request[k] for k in ("split", "augment") if k in request})
                else:
                    import dataclasses
                    profile = dataclasses.replace(lab.profile, batch_size=size)
                    loader = pipeline.naive_loader(profile, seed=request.get("seed", lab.seed),
                                                   **{k: request[k] for k in ("split", "augment") if k in request})
                try:
                    length = int(len(loader))
                except TypeError:
                    length = None
                objects[len(objects)] = loader
                reply({"handle": len(objects) - 1, "len": length})
            elif op == "iter":
                objects[len(objects)] = iter(objects[int(request["handle"])])
                reply({"handle": len(objects) - 1})
            elif op == "next":  # one batch, finished on its device, then copied for the judge
                try:
                    batch = next(objects[int(request["handle"])])
                except StopIteration:
                    reply({"stop": True})
                    continue
                images, labels = batch
                measure.sync(lab.device)
                if not (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)):
                    raise TypeError(f"a batch must be (images, labels) tensors, not ({type(images).__name__}, "
                                    f"{type(labels).__name__})")
                reply({"tensors": wire.put(view, [images, labels]), "device": images.device.type})
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as err:  # the student's code raised: the judge fails the check with it
            reply({"error": f"{type(err).__name__}: {str(err)[:500]}"})


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
