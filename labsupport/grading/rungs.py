"""Each notebook's rung of 06's ladder, measured by the grader from the student's carried code.

A notebook records its rung in a cell the student can edit; the verdict process
(:mod:`.verdict`) measures it again, from the code the notebook's checks carried forward, into
the grader's own results store. 06's checks read only that store, so a rung typed, edited or
written by hand in the student's kernel is never graded. The steps are the ones the notebooks
build (the same ``measure_rung``):

- 01: the naive baseline (naive loader, fp32 step, ``loss.item()`` every step);
- 02: the student's loader feeding the fp32 step;
- 03: their loader feeding their precision choice and mixed-precision step;
- 04: their checkpointing (``checkpointed``, ``SEGMENTS``) around their 03 step, at twice the batch;
- 05: their 03 step, compiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .. import notebooks, report, train
from . import CheckResult, carried, student
from .g03_amp import amp_step, precision


def _measured(found: dict[str, CheckResult], check: str) -> float | None:
    result = found.get(check)
    return None if result is None else result.measured


def step_03(amp_code: dict, lab, compiled: bool = False) -> train.TrainStep:
    """03's rung step, and compiled 05's: the student's 03 step (``amp_code``: 03's carried code)
    in their 03 precision."""
    update = student(amp_code, "amp_train_step", "03")
    dtype, channels_last = precision(student(amp_code, "choose_precision", "03"), lab.machine)
    return amp_step(update, dtype, channels_last, lab.device, seed=lab.seed, compiled=compiled)


def step_04(namespace: dict, amp_code: dict, lab) -> tuple[train.TrainStep, object]:
    """04's rung step: the student's checkpointing (``checkpointed``, ``SEGMENTS`` in ``namespace``)
    around their 03 step in their 03 precision, at twice the batch; and the lab at that batch."""
    update = student(amp_code, "amp_train_step", "03")
    dtype, channels_last = precision(student(amp_code, "choose_precision", "03"), lab.machine)
    wrap, segments = student(namespace, "checkpointed", "04"), namespace.get("SEGMENTS")
    batch = 2 * lab.profile.batch_size
    config = train.StepConfig(amp_dtype=str(dtype).removeprefix("torch.") if dtype else None,
                              channels_last=channels_last, checkpoint_segments=int(segments or 0), batch_size=batch)
    step = train.make_step(config, lab.device, seed=lab.seed, update=update, wrap=lambda model: wrap(model, segments))
    return step, dataclasses.replace(lab, profile=dataclasses.replace(lab.profile, batch_size=batch))


def measure_timed(number: str, step: Callable[[], object], config: train.StepConfig, lab,
                  found: dict[str, CheckResult], wait: Callable[[], object] | None = None,
                  peak: Callable[[], float] | None = None) -> dict:
    """Record notebook ``number``'s rung timed from outside (the grader's judge): ``wait()`` fetches
    the next batch from the student's loader onto the device elsewhere, ``step()`` trains on it;
    each returns when it is done. Throughput as :func:`report.measure_rung` times it, and of the
    phases only the data wait (the fetch's time), which is all a clock outside can split off.
    Peak memory only the process running the step can count: where ``peak()`` asks it for one
    step's (04's rung, whose point is its memory), it is recorded as that process's count.
    ``lab``'s profile is the rung's (04's: twice the batch)."""
    import statistics
    import time

    from .. import measure, results

    nb = notebooks.get(number)
    profile = lab.profile
    whole = step if wait is None else (lambda: (wait(), step()))
    timing = measure.time_steps(whole, lab.device, warmup=profile.warmup_steps, steps=profile.measure_steps,
                                samples_per_step=profile.batch_size, progress=False)
    metrics = {**timing.summary()}
    if wait is not None:
        waits = []
        for _ in range(max(3, profile.measure_steps // 2)):
            started = time.perf_counter()
            wait()
            waits.append(1e3 * (time.perf_counter() - started))
            step()
        metrics["phases_ms"] = {"data wait": statistics.median(waits)}
    accuracy = found["03-accuracy-gap"].details if "03-accuracy-gap" in found else {}
    extra = {"03": {"step_speedup": _measured(found, "03-amp-speedup"),
                    "activation_ratio": _measured(found, "03-activation-ratio"),
                    "accuracy_fp32": accuracy.get("accuracy_fp32"), "accuracy": accuracy.get("accuracy")},
             "04": {"batch_size": profile.batch_size, "peak_ratio": _measured(found, "04-peak-ratio")},
             "05": {"inference_speedup": _measured(found, "05-compile-speedup")}}.get(number, {})
    if peak is not None:
        metrics.update(peak_bytes=float(peak()), peak_counted_by="the worker running the student's step")
    metrics.update(**extra, timed_by="the grader's judge, from outside", change=nb.change, builds_on=nb.builds_on)
    results.record(nb.stage, metrics, config=config, machine=lab.machine, profile=profile)
    return metrics


def measure(number: str, namespace: dict, lab, found: dict[str, CheckResult]) -> dict | None:
    """Measure and record notebook ``number``'s rung with the student's code (None for 06).

    ``namespace`` holds the notebook's own graded functions; earlier notebooks' come from the
    results store (carried forward by their verdicts). ``found`` are this notebook's verdicts,
    whose measurements are recorded beside the rung. Raises whatever the student's code raises.
    """
    nb = notebooks.get(number)
    if nb.stage is None:
        return None
    device, seed, profile = lab.device, lab.seed, lab.profile
    fp32 = lambda: train.make_step(train.StepConfig(), device, seed=seed)  # noqa: E731
    if number == "01":
        from .. import pipeline

        return report.measure_rung(nb.stage, fp32(), pipeline.naive_loader(profile, seed=seed), lab,
                                   progress=False)
    loader = (student(namespace, "make_fast_loader", "02") if number == "02"
              else carried("02", lab).make_fast_loader)
    if number == "02":
        return report.measure_rung(nb.stage, fp32(), loader(lab), lab, progress=False,
                                   loader_speedup=_measured(found, "02-loader-speedup"),
                                   data_wait_share=_measured(found, "02-data-wait-share"))
    amp_code = namespace if number == "03" else vars(carried("03", lab))
    update = student(amp_code, "amp_train_step", "03")
    dtype, channels_last = precision(student(amp_code, "choose_precision", "03"), lab.machine)
    if number == "03":
        accuracy = found["03-accuracy-gap"].details if "03-accuracy-gap" in found else {}
        return report.measure_rung(nb.stage, amp_step(update, dtype, channels_last, device, seed=seed),
                                   loader(lab), lab, progress=False,
                                   step_speedup=_measured(found, "03-amp-speedup"),
                                   activation_ratio=_measured(found, "03-activation-ratio"),
                                   accuracy_fp32=accuracy.get("accuracy_fp32"), accuracy=accuracy.get("accuracy"))
    if number == "04":
        step, big = step_04(namespace, amp_code, lab)
        return report.measure_rung(nb.stage, step, loader(big), lab, profile=big.profile, progress=False,
                                   batch_size=big.profile.batch_size, peak_ratio=_measured(found, "04-peak-ratio"))
    if number == "05":
        step = step_03(amp_code, lab, compiled=True)
        return report.measure_rung(nb.stage, step, loader(lab), lab, progress=False,
                                   inference_speedup=_measured(found, "05-compile-speedup"))
    raise ValueError(f"notebook {number} records stage {nb.stage} but has no rung here")
