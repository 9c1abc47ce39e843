"""05's worker side: what a worker builds for 05's checks and may be asked (:class:`Side`), and both
sides as the notebook's self-check holds them in its own process (:class:`Here`). No check and no
expected answer: those are the judge's (:mod:`.g05_compile`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .. import measure, memory, train
from . import StudentCodeError, carried, one_batch, student
from .g03_worker import PRECISIONS, chosen_precision, precision
from .rungs import Recipe, Rung, measured
from .watch import watched


class Inference:
    """One side of 05's comparison: labsupport's seeded ResNet-18 on one batch, in the student's 03
    precision, either eager (the baseline: ``compile_fn`` None) or as the student's
    ``compile_inference`` returned it. The self-check holds both in its own process; the grader's
    judge holds each in a worker of its own (:mod:`.judging`) and times their calls from outside."""

    ASKED = ("cold", "eager_calls", "infer")

    def __init__(self, lab, dtype: torch.dtype | None, compile_fn: Callable | None = None):
        self.device = lab.device
        with torch.random.fork_rng(devices=[]):  # the same batch in every process: its augmentation seeded
            torch.manual_seed(lab.seed)
            images = one_batch(lab)[0]
        self.model, self.images, self.autocast = train.inference_setup(lab.device, images, dtype, seed=lab.seed)
        self.fn = self.model
        if compile_fn is not None:
            torch.compiler.reset()
            self.fn = watched(compile_fn, "compile_inference", "05")(self.model)

    def cold(self) -> int:
        """The first call, which compiles (graph caches off, as :func:`measure.cold_compile_s`); the
        number of graphs Dynamo captured in it."""
        from torch._dynamo.utils import counters  # Dynamo's own count of the graphs it captured
        from torch._inductor import config as inductor_config

        graphs = counters["stats"]["unique_graphs"]
        with inductor_config.patch(fx_graph_cache=False, autotune_local_cache=False):
            self()
        measure.sync(self.device)
        return counters["stats"]["unique_graphs"] - graphs

    def eager_calls(self) -> int:
        """How often the model's own first layer ran eagerly during one call. A hook added to the
        model now is not in a compiled graph (Dynamo does not guard on hooks), so it fires only
        where the model itself still runs eagerly (a wrapper that compiled something else)."""
        calls = []
        hook = self.model.conv1.register_forward_hook(lambda *args: calls.append(1))
        try:
            self()
        finally:
            hook.remove()
        return len(calls)

    def __call__(self, call: int | None = None) -> torch.Tensor:
        """One inference call: the logits of the batch, or, for timed call number ``call``, of the
        batch plus noise seeded by that number: fresh input every call, the same on both sides, so
        no call's answer can be one remembered from an earlier call."""
        images = self.images
        if call is not None:
            noise = torch.Generator(device=self.device).manual_seed(call)
            images = images + torch.randn(images.shape, generator=noise, device=self.device,
                                          dtype=images.dtype).contiguous(memory_format=torch.channels_last)
        with torch.no_grad(), self.autocast:
            if self.device.type != "cuda":
                return self.fn(images)
            # On CUDA a model compiled with mode="reduce-overhead" or "max-autotune" replays a CUDA
            # graph, whose output tensor the next call overwrites: each call starts a new step and
            # keeps a copy, on both sides alike (a few KB of logits), so every timed call's output
            # can be compared with eager's after the timing (issue 58).
            torch.compiler.cudagraph_mark_step_begin()
            return self.fn(images).clone()


    def infer(self, call: int | None = None) -> torch.Tensor:
        """One inference call (:meth:`__call__`), its logits as float32, for the judge."""
        return self(None if call is None else int(call)).detach().float()


def attention_inputs(batch: int, heads: int, length: int, dim: int, seed: int, device="cpu"):
    """``q, k, v`` of one attention case, float32, drawn from ``seed`` on the CPU (the same in every
    process), then moved to ``device``."""
    g = torch.Generator().manual_seed(int(seed))
    return [torch.randn(batch, heads, length, dim, generator=g).to(device) for _ in range(3)]


def call_attention(fn, q, k, v, causal: bool):
    """The student's ``attention(q, k, v, causal)`` as 05's cell declares it, whatever they named
    its last argument, or with ``causal`` keyword-only."""
    try:
        return fn(q, k, v, causal)
    except TypeError:
        return fn(q, k, v, causal=causal)


class AttentionRun:
    """The student's ``attention`` on one large case, held where it runs: its inputs made first, so
    that what one call holds can be read on its own (:meth:`run`, then :meth:`output`)."""

    ASKED = ("rest", "run", "output")

    def __init__(self, fn, lab, case: list):
        self.fn, self.lab = fn, lab
        self.q, self.k, self.v = attention_inputs(*case, device=lab.device)
        self.out: torch.Tensor | None = None

    def rest(self) -> int:
        """Nothing: the judge reads what the process holds at rest around this request."""
        return 0

    def run(self) -> float:
        """One call, the bytes it allocated at its peak: the count and, on a CPU, c10's allocator (the
        more of the two; on CUDA the caching allocator's peak beside the count)."""
        def call():
            with torch.no_grad():
                self.out = call_attention(self.fn, self.q, self.k, self.v, False)
        report = memory.peak_step_bytes(call, self.lab.device, cpu_allocator=True)
        return float(max(report.peak_bytes, report.allocator_peak_bytes or 0))

    def output(self) -> torch.Tensor:
        return torch.as_tensor(self.out).detach().float().cpu()


class Here:
    """Both sides in this process, as the self-check runs them. The grader's judge passes its own
    (:class:`~.g05_compile.Remote`): each side in a worker, the other one stopped."""

    def __init__(self, namespace: dict, lab):
        self.namespace, self.lab = namespace, lab

    def focus(self, side: str | None) -> None:
        pass

    def break_even(self, cases) -> list[float]:
        fn = watched(student(self.namespace, "break_even_steps", "05"), "break_even_steps", "05")
        return [float(fn(c, e, k)) for c, e, k in cases]

    def precision(self) -> tuple[torch.dtype | None, bool]:
        return precision(carried("03", self.lab).choose_precision, self.lab.machine)

    def attention(self, cases) -> list[torch.Tensor]:
        """The student's ``attention(q, k, v, causal)`` on each case's inputs (no grad), float32, on the CPU."""
        fn = watched(student(self.namespace, "attention", "05"), "attention", "05")
        outputs = []
        for *shape, seed, causal in cases:
            q, k, v = attention_inputs(*shape, seed, device=self.lab.device)
            with torch.no_grad():
                outputs.append(torch.as_tensor(call_attention(fn, q, k, v, bool(causal))).detach().float().cpu())
        return outputs

    def attention_run(self, case) -> AttentionRun:
        return AttentionRun(watched(student(self.namespace, "attention", "05"), "attention", "05"), self.lab, case)

    def resident_peak(self, side: str, fn, device) -> tuple[object, None]:
        """``fn()``: in one process there is no outside from which to read a side's memory."""
        return fn(), None

    def inference(self, side: str, dtype: torch.dtype | None) -> Inference:
        fn = student(self.namespace, "compile_inference", "05") if side == "candidate" else None
        return Inference(self.lab, dtype, fn)



class Side:
    """05 in a worker: the model eager (the baseline's) or as the student's ``compile_inference``
    returned it, held for the judge to ask :data:`Inference.ASKED` of; the student's
    ``break_even_steps`` on plain numbers; their 03 precision; their ``attention`` on the cases'
    inputs, and on one large case held (:class:`AttentionRun`)."""

    ASKED = ("inference", "break_even", "precision", "attention", "attention_run")

    def __init__(self, namespace: dict, lab, *, student: bool):
        self.here, self.student = Here(namespace, lab), student

    def inference(self, *, dtype: str | None = None) -> Inference:
        if dtype is not None and dtype not in PRECISIONS:
            raise ValueError(f"no inference precision {dtype!r}")
        return self.here.inference("candidate" if self.student else "baseline",
                                   getattr(torch, dtype) if dtype else None)

    def _student(self, name: str) -> None:
        if not self.student:
            raise PermissionError(f"the baseline's worker holds no student code ({name})")

    def break_even(self, *, cases: list) -> list[float]:
        self._student("break_even_steps")
        return self.here.break_even([[float(a) for a in case] for case in cases])

    def precision(self) -> dict:
        self._student("choose_precision")
        return chosen_precision(self.here.lab)

    def attention(self, *, cases: list) -> list[torch.Tensor]:
        self._student("attention")
        return self.here.attention([[int(b), int(h), int(n), int(d), int(seed), bool(c)] for b, h, n, d, seed, c in cases])

    def attention_run(self, *, case: list) -> AttentionRun:
        self._student("attention")
        return self.here.attention_run([int(x) for x in case])


# --- 05's rung: their 03 step, compiled, fed by their loader -----------------------------------------

def as_they_chose(code, lab, made: Recipe) -> Recipe:
    """05's change in 06's pipeline: compiled as the student's ``COMPILE_TRAINING`` chose (kept from
    05); without that choice, not compiled, and the recipe says so."""
    try:
        chosen = code("05")["COMPILE_TRAINING"]
    except (StudentCodeError, KeyError):
        return dataclasses.replace(made, notes=made.notes + (
            "not compiled: COMPILE_TRAINING was not kept from 05 (run its checks)",))
    return dataclasses.replace(made.configured(compiled=bool(chosen)), notes=made.notes + ("your 05 choice",))


RUNG = Rung(lambda code, lab, made: made.configured(compiled=True), pipeline_change=as_they_chose,
            extras=lambda found, lab: {"inference_speedup": measured(found, "05-compile-speedup")},
            in_worker=True, compiled=True)
