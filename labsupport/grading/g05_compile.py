"""Graded checks of 05_compile: the student's ``compile_inference`` and ``break_even_steps``, measured now.

- ``05-compile-speedup``: what ``compile_inference`` returns was really compiled (Dynamo captured
  a graph on its first call), matches eager within 2% on every timed call, each on fresh input
  (nothing remembered from an earlier call answers it), and is faster where compiling pays. It
  infers in the student's own 03 precision (carried forward).
- ``05-break-even``: the break-even formula is right on the compile time measured now.
- ``05-attention``: the student's ``attention`` computes ``softmax(q kᵀ / √d) v`` (causal where
  asked) on inputs the notebook never drew, and one call on a long sequence holds at most half the
  bytes of the L x L scores it must not write out (read from outside its process on a CPU).
"""

from __future__ import annotations

import dataclasses
import math
import torch

from .. import hardware, measure
from . import StudentCodeError, judge, register, speed, student
from .g03_amp import asked_precision
from .g05_worker import AttentionRun, Here, Inference, attention_inputs  # noqa: F401 (re-exported)
from .judge_setup import Judged, RemoteSides
from .rungs import Recipe, Rung, measured


@register("05-compile-speedup", "05-break-even")
def compile_inference(namespace, lab, sides=None):
    """The student's compiled inference matches eager, is faster where compile pays, and their
    break-even formula is right on the compile time measured now."""
    student(namespace, "compile_inference", "05")
    student(namespace, "break_even_steps", "05")
    sides = sides or Here(namespace, lab)
    cannot = hardware.compile_problem(lab.machine)
    if cannot:  # an older GPU: nothing to compile with; the formula is checked on crafted cases
        wrong = _break_even_failures(sides.break_even, [(20.0, 100.0, 60.0), (30.0, 50.0, 55.0)])
        return [judge("05-compile-speedup", None, lab, note=cannot),  # n/a on the class (thresholds.toml)
                judge("05-break-even", float(not wrong), lab, correct=not wrong,
                      why_incorrect="; ".join(wrong), note="two crafted cases (no compile time to measure here)")]
    # Inference in the student's own 03 precision, carried forward: bf16 where they chose it. Without
    # it, float32, said in the note (the break-even check does not depend on it).
    try:
        dtype, _ = sides.precision()
        precision_note = f"inference in {dtype or 'float32'} (your 03 choice)"
    except StudentCodeError as err:
        dtype, precision_note = None, f"inference in float32: {err}"
    sides.focus("baseline")
    eager = sides.inference("baseline", dtype)
    sides.focus("candidate")
    compiled = sides.inference("candidate", dtype)
    graphs = []
    compile_s = measure.one_off_s(lambda: graphs.append(compiled.cold()), lab.device)
    eager_calls = compiled.eager_calls()
    # Each timed call infers on fresh input (call k: the batch plus noise seeded k, on both sides),
    # and every timed call's logits are compared with eager's on the same input after the timing.
    outputs = {"baseline": [], "candidate": []}

    def timed(side, inference):
        return lambda: outputs[side].append(inference(len(outputs[side])))

    cmp = measure.compare(timed("baseline", eager), timed("candidate", compiled), lab.device,
                          rounds=lab.profile.rounds, steps_per_round=4 * lab.profile.steps_per_round,
                          focus=sides.focus, verify=getattr(sides, "verify", None))
    sides.focus(None)
    pairs = list(zip(outputs["candidate"], outputs["baseline"]))
    rel_err = max((_relative_error(out, ref.float()) for out, ref in pairs), default=math.inf)
    correct = rel_err <= 0.02
    why = (f"compiled logits differ from eager by {rel_err:.1%} (relative L2, the worst of the "
           f"{len(pairs)} timed calls, each on fresh input; 2% allowed)")
    summary = cmp.summary()
    fast = speed(lab, "05-compile-speedup", cmp.speedup.median, correct=correct, why_incorrect=why,
                 optimised=graphs[0] > 0 and not eager_calls,
                 why_not_optimised="torch.compile captured no graph on the first call of what "
                 "compile_inference returned: it runs eagerly" if graphs[0] == 0 else
                 "what compile_inference returned runs the model eagerly (its layers ran outside the "
                 "compiled graph): compile the model itself and return that")
    fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") +
                               f"{cmp}; every timed call (fresh input each) within {rel_err:.2%} of eager; {precision_note}",
                               details={"compile_s": compile_s, "graphs": graphs[0], **summary,
                                        "baseline_step_ms": summary["baseline_ms"]})
    eager_ms, compiled_ms = summary["baseline_ms"], summary["candidate_ms"]
    cases = [(compile_s, eager_ms, compiled_ms), (20.0, 100.0, 60.0), (30.0, 50.0, 55.0)]
    wrong = _break_even_failures(sides.break_even, cases)
    even = judge("05-break-even", float(not wrong), lab, correct=not wrong,
                 why_incorrect="; ".join(wrong),
                 note=f"compile took {compile_s:.1f} s (measured now, graph caches off); "
                      f"pays after {cases[0][0] * 1000 / max(eager_ms - compiled_ms, 1e-9):.0f} steps"
                 if compiled_ms < eager_ms else f"compile took {compile_s:.1f} s and never pays here")
    return [fast, even]


def _relative_error(out: torch.Tensor, eager: torch.Tensor) -> float:
    """Relative L2 distance of ``out`` from ``eager`` (inf where the shapes differ or it is not finite)."""
    out = out.float().to(eager.device)
    if out.shape != eager.shape:
        return math.inf
    err = float((out - eager).norm() / eager.norm())
    return err if math.isfinite(err) else math.inf


def _break_even_failures(answer, cases) -> list[str]:
    """:func:`_break_even_errors`, where ``break_even_steps`` raising (or calling what it may not:
    :mod:`.watch`) is one more failure of its own check, not of the compiled inference measured before it."""
    try:
        return _break_even_errors(answer, cases)
    except Exception as err:  # the student's function, whatever it raised, in this process or its worker
        return [f"break_even_steps raised {type(err).__name__}: {str(err)[:400]}"]


def _break_even_errors(answer, cases) -> list[str]:
    """What the student's ``break_even_steps`` gets wrong on ``cases`` of (compile s, eager ms,
    compiled ms); ``answer(cases)`` returns its answers.

    Every answer is taken before any expected one is computed: no frame the student's function
    can read holds the expected answer (and under the grader it runs in another process)."""
    answers = [float(a) for a in answer(cases)]
    wrong = []
    for (c, e, k), got in zip(cases, answers):
        want = math.inf if k >= e else c * 1000 / (e - k)
        if not (got == want or (math.isfinite(want) and abs(got - want) <= 0.01 * want + 1)):
            wrong.append(f"break_even_steps({c:.1f}, {e:.1f}, {k:.1f}) = {got:.4g}, expected {want:.4g}")
    return wrong


# --- 05-attention: attention without writing out the scores ----------------------------------

# (batch, heads, length, head dim, seed, causal): inputs 05's cells never drew, compared with the
# formula computed here in float64.
ATTENTION_CASES = ((2, 3, 37, 16, 11, False), (1, 4, 64, 32, 12, True), (3, 2, 50, 8, 13, True))
# One long sequence, whose float32 scores (batch x heads x L x L) would take 128 MiB: one call may
# allocate at most ATTENTION_HELD of that at once. A blocked attention of 256 queries at a time
# holds 1/8 of it (scores and their softmax); SDPA's kernels about 2 MiB beside the output.
ATTENTION_LARGE = (2, 4, 2048, 32, 14)
ATTENTION_HELD = 0.5


def expected_attention(batch, heads, length, dim, seed, causal, block=256) -> torch.Tensor:
    """softmax(q kᵀ / √d) v of the case's inputs (``attention_inputs``), in float64, 256 queries at a time."""
    q, k, v = (t.double() for t in attention_inputs(batch, heads, length, dim, seed))
    keys = torch.arange(length)
    out = []
    for start in range(0, length, block):
        scores = q[..., start:start + block, :] @ k.transpose(-2, -1) / math.sqrt(dim)
        if causal:
            queries = torch.arange(start, min(start + block, length))[:, None]
            scores = scores.masked_fill(keys[None, :] > queries, float("-inf"))
        out.append(scores.softmax(-1) @ v)
    return torch.cat(out, dim=-2).float()


@register("05-attention")
def attention(namespace, lab, sides=None):
    """The student's ``attention`` is right on unseen inputs and never holds the L x L scores."""
    student(namespace, "attention", "05")
    sides = sides or Here(namespace, lab)
    outputs = sides.attention([list(c) for c in ATTENTION_CASES])
    wrong = [] if len(outputs) == len(ATTENTION_CASES) else [f"{len(outputs)} outputs for {len(ATTENTION_CASES)} cases"]
    for (b, h, n, d, seed, causal), got in zip(ATTENTION_CASES, outputs):
        err = _relative_error(got, expected_attention(b, h, n, d, seed, causal))
        if not err <= 1e-3:
            wrong.append(f"on q, k, v of shape {(b, h, n, d)}{' (causal)' if causal else ''} your attention "
                         f"differs from softmax(q kᵀ / √d) v by {err:.2%} (relative L2; 0.1% allowed)")
    b, h, n, d, seed = ATTENTION_LARGE
    scores = b * h * n * n * 4
    note = f"{len(ATTENTION_CASES)} cases compared with the formula in float64"
    if not wrong:
        run = sides.attention_run(list(ATTENTION_LARGE))
        _, rest = sides.resident_peak("candidate", run.rest, lab.device)
        allocated, peak = sides.resident_peak("candidate", run.run, lab.device)
        err = _relative_error(run.output(), expected_attention(b, h, n, d, seed, False))
        resident = None if peak is None or rest is None else max(peak - rest, 0)
        held = max(float(allocated), float(resident or 0))
        seen = (f"it allocated {allocated / 2**20:.0f} MiB" + (f" and its process grew by {resident / 2**20:.0f} MiB, "
                "read from outside" if resident is not None else ""))
        if not err <= 1e-3:
            wrong.append(f"on a sequence of {n} your attention differs from the formula by {err:.2%}")
        elif lab.device.type not in ("cpu", "cuda"):
            note += f"; on {lab.device.type} what one call holds is not graded ({seen})"
        elif held > ATTENTION_HELD * scores:
            wrong.append(f"one call on q, k, v of shape {(b, h, n, d)} held {held / 2**20:.0f} MiB ({seen}), more "
                         f"than {ATTENTION_HELD:g}x the {scores / 2**20:.0f} MiB of the L x L scores: they were "
                         "written out (F.scaled_dot_product_attention computes them tile by tile)")
        else:
            note += f"; on a sequence of {n}, {seen}: the scores would take {scores / 2**20:.0f} MiB"
    return [judge("05-attention", float(not wrong), lab, correct=not wrong, why_incorrect="; ".join(wrong), note=note)]


from .g05_worker import RUNG  # noqa: E402,F401 (its rung is declared beside what its worker builds)


class RemoteInference:
    """05's :class:`~.g05_worker.Inference`, held in a worker: each call is a request, and its
    logits come back as a plain tensor."""

    def __init__(self, held):
        self.held = held

    def cold(self) -> int:
        return int(self.held.cold())

    def eager_calls(self) -> int:
        return int(self.held.eager_calls())

    def __call__(self, call: int | None = None) -> torch.Tensor:
        return self.held.infer(call=call)


class RemoteAttention:
    """05's :class:`~.g05_worker.AttentionRun`, held in the student's worker: each call a request."""

    def __init__(self, held):
        self.held = held

    def rest(self) -> int:
        return int(self.held.rest())

    def run(self) -> float:
        return float(self.held.run())

    def output(self) -> torch.Tensor:
        out = self.held.output()
        if not isinstance(out, torch.Tensor):
            raise ValueError("attention's worker answered something other than a tensor")
        return out


class Remote(RemoteSides):
    """05's judge side: each model held in its side's worker (:class:`~.g05_worker.Side`)."""

    def break_even(self, cases) -> list[float]:
        """The student's ``break_even_steps`` on each case, in their worker."""
        return self.sides.ask("candidate", "break_even", cases=[list(c) for c in cases])["value"]

    def precision(self):
        return asked_precision(self.sides)

    def attention(self, cases) -> list[torch.Tensor]:
        """The student's ``attention`` on each case's inputs, made in their worker: an output per case."""
        reply = self.sides.ask("candidate", "attention", cases=cases)
        outputs = reply.get("tensors")
        if not isinstance(outputs, list) or not all(isinstance(t, torch.Tensor) for t in outputs):
            raise ValueError("attention's worker answered something other than a tensor per case")
        return outputs

    def attention_run(self, case) -> RemoteAttention:
        return RemoteAttention(self.sides.held("candidate", "attention_run", asked=AttentionRun.ASKED, case=case))

    def inference(self, side: str, dtype) -> RemoteInference:
        """The model on one batch in ``dtype``, in ``side``'s worker: eager for the baseline, as the
        student's ``compile_inference`` returned it for the candidate (its first call compiles)."""
        name = None if dtype is None else str(dtype).removeprefix("torch.")
        return RemoteInference(self.sides.held(side, "inference", asked=Inference.ASKED, slow_asked=("cold",), dtype=name))


# How the judge sets up 05's checks: eager inference in a worker of its own; the long attention's
# output (2 MiB) crosses whole.
JUDGED = Judged(baseline=True, buffer_floor=2 * (2 * 4 * 2048 * 32 * 4) + 2**20, compared=("05-compile-speedup",),
                remote=Remote)
