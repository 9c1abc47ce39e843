"""Graded checks of 05_compile: the student's ``compile_inference`` and ``break_even_steps``, measured now.

- ``05-compile-speedup``: what ``compile_inference`` returns was really compiled (Dynamo captured
  a graph on its first call), matches eager within 2%, and is faster where compiling pays. It
  infers in the student's own 03 precision (carried forward).
- ``05-break-even``: the break-even formula is right on the compile time measured now.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .. import hardware, measure, train
from . import CheckResult, StudentCodeError, carried, judge, one_batch, register, speed, student
from .g03_amp import precision


@register("05-compile-speedup", "05-break-even")
def compile_inference(namespace, lab):
    """The student's compiled inference matches eager, is faster where compile pays, and their
    break-even formula is right on the compile time measured now."""
    from torch._dynamo.utils import counters  # Dynamo's own count of the graphs it captured

    compile_fn = student(namespace, "compile_inference", "05")
    break_even = student(namespace, "break_even_steps", "05")
    machine = lab.machine.as_dict()
    cannot = hardware.compile_problem(lab.machine)
    if cannot:  # an older GPU: nothing to compile with; the formula is checked on crafted cases
        wrong = _break_even_errors(break_even, [(20.0, 100.0, 60.0), (30.0, 50.0, 55.0)])
        return [CheckResult("05-compile-speedup", None, None, "higher", lab.machine.device_class, "n/a", cannot),
                judge("05-break-even", float(not wrong), machine, correct=not wrong,
                      why_incorrect="; ".join(wrong), note="two crafted cases (no compile time to measure here)")]
    # Inference in the student's own 03 precision, carried forward: bf16 where they chose it. Without
    # it, float32, said in the note (the break-even check does not depend on it).
    try:
        dtype, _ = precision(carried("03", lab).choose_precision, lab.machine)
        precision_note = f"inference in {dtype or 'float32'} (your 03 choice)"
    except StudentCodeError as err:
        dtype, precision_note = None, f"inference in float32: {err}"
    model, images, autocast = train.inference_setup(lab.device, one_batch(lab)[0], dtype, seed=lab.seed)
    torch.compiler.reset()
    compiled = compile_fn(model)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad(), autocast:
        compile_s = measure.cold_compile_s(compiled, images, device=lab.device)
        graphs = counters["stats"]["unique_graphs"] - graphs  # what Dynamo captured on the first call
        # The timed calls must run the model's compiled graph: a hook added to the model now is not
        # in that graph (Dynamo does not guard on hooks), so it fires only where the model itself
        # still runs eagerly (a wrapper that compiled something else and calls the eager model).
        eager_calls = []
        hook = model.conv1.register_forward_hook(lambda *args: eager_calls.append(1))
        compiled_out = compiled(images).float()
        hook.remove()
        eager_out = model(images).float()
        rel_err = float((compiled_out - eager_out).norm() / eager_out.norm())
        correct = rel_err <= 0.02
        why = f"compiled logits differ from eager by {rel_err:.1%} (relative L2; 2% allowed)"
        cmp = measure.compare(lambda: model(images), lambda: compiled(images), lab.device,
                              rounds=lab.profile.rounds, steps_per_round=4 * lab.profile.steps_per_round)
    summary = cmp.summary()
    fast = speed(lab, "05-compile-speedup", cmp.speedup.median, correct=correct, why_incorrect=why,
                   optimised=graphs > 0 and not eager_calls,
                   why_not_optimised="torch.compile captured no graph on the first call of what "
                   "compile_inference returned: it runs eagerly" if graphs == 0 else
                   "what compile_inference returned runs the model eagerly (its layers ran outside the "
                   "compiled graph): compile the model itself and return that")
    fast = dataclasses.replace(fast, note=(fast.note + "; " if fast.note else "") +
                                f"{cmp}; outputs within {rel_err:.2%} of eager; {precision_note}",
                                details={"compile_s": compile_s, "graphs": graphs, **summary})
    eager_ms, compiled_ms = summary["baseline_ms"], summary["candidate_ms"]
    cases = [(compile_s, eager_ms, compiled_ms), (20.0, 100.0, 60.0), (30.0, 50.0, 55.0)]
    wrong = _break_even_errors(break_even, cases)
    even = judge("05-break-even", float(not wrong), machine, correct=not wrong,
                         why_incorrect="; ".join(wrong),
                         note=f"compile took {compile_s:.1f} s (measured now, graph caches off); "
                              f"pays after {cases[0][0] * 1000 / max(eager_ms - compiled_ms, 1e-9):.0f} steps"
                         if compiled_ms < eager_ms else f"compile took {compile_s:.1f} s and never pays here")
    return [fast, even]




def _break_even_errors(break_even, cases) -> list[str]:
    """What ``break_even`` gets wrong on ``cases`` of (compile s, eager ms, compiled ms).

    Every answer is taken before any expected one is computed: no frame the student's function
    can read holds the expected answer."""
    answers = [float(break_even(c, e, k)) for c, e, k in cases]
    wrong = []
    for (c, e, k), got in zip(cases, answers):
        want = math.inf if k >= e else c * 1000 / (e - k)
        if not (got == want or (math.isfinite(want) and abs(got - want) <= 0.01 * want + 1)):
            wrong.append(f"break_even_steps({c:.1f}, {e:.1f}, {k:.1f}) = {got:.4g}, expected {want:.4g}")
    return wrong
