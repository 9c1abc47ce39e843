"""The graded checks of notebooks 01-07: the reference solution passes, and each check fails on a
deliberately wrong or slow answer (a loader that drops samples, a step that skips backward, an
fp16 step without a scaler, a timer without warm-up, a diagnosis that ignores the grouping,
checkpointing that updates BatchNorm twice, accumulation that steps per micro-batch, a compiled
model with other outputs, a ladder with the wrong speedups).

The reference solutions are taken from the master notebooks' solution cells, so the tests grade
exactly the code students are compared with. Runs on the tiny profile and dataset; speed is
graded there only where a test asks for it (``tiny:grades_speed=1``).
"""

import json

import pytest
import torch

import labsupport as ls
from autograder import reference
from labsupport import grading as checks
from labsupport.hardware import describe_machine
from conftest import requires_cuda



def solution(notebook: str, *cell_ids: str) -> dict:
    """A namespace holding the master notebook's code from the given cells (default: its solution cells)."""
    return reference.namespace(notebook, cell_ids=cell_ids or None)


@pytest.fixture(autouse=True)
def tiny_lab(tiny_env):
    reference.keep_all()  # the reference's code, carried forward as a student's is (05 and 06 use it)


def statuses(notebook: str, namespace: dict) -> dict[str, str]:
    return {k: r.status for k, r in checks.run(notebook, namespace, keep=False).items()}


# 01 ------------------------------------------------------------------------------------------

def test_01_reference_passes_and_missing_code_fails():
    missing = checks.run("01", {})
    assert {r.status for r in missing.values()} == {"fail"}
    assert "`measure_throughput` is not defined" in missing["01-throughput-error"].note
    assert "`labelled_step` is not defined" in missing["01-trace"].note
    assert "`top_operators` is not defined" in missing["01-top-operators"].note
    ns = solution("01", "cell-03", "measure_throughput", "diagnose", "labelled_step", "top_operators")
    found = checks.run("01", ns)
    assert {k: r.status for k, r in found.items() if k != "01-throughput-sync"} == {
        "01-throughput-error": "pass", "01-diagnose": "pass", "01-trace": "pass", "01-phases-labelled": "pass",
        "01-top-operators": "pass"}, {k: r.note for k, r in found.items()}
    assert found["01-throughput-sync"].status == ("pass" if torch.cuda.is_available() else "n/a")


def test_01_throughput_without_warmup_fails():
    ns = solution("01", "measure_throughput")
    honest = ns["measure_throughput"]
    ns["measure_throughput"] = lambda step, device, *, warmup, steps, samples_per_step: honest(
        step, device, warmup=0, steps=steps + warmup, samples_per_step=samples_per_step)
    result = checks.run("01", ns, only=("01-throughput-error",))["01-throughput-error"]
    assert result.status == "fail" and "p95" in result.note, result.note


def test_01_a_late_wake_up_moves_the_timer_and_what_it_is_judged_against_alike(monkeypatch):
    """A busy machine wakes a sleep late now and then. Two of the 20 timed calls 6 ms late move an
    honest timer's p95 by 30%, and the calls it is judged against by as much: it passes."""
    from labsupport.grading import g01_worker  # the known workload, where it runs

    sleeps, sleep = [], g01_worker._sleep

    def late_now_and_then(seconds):
        sleeps.append(seconds)
        sleep(seconds + (0.006 if len(sleeps) in (10, 15) else 0))

    monkeypatch.setattr(g01_worker, "_sleep", late_now_and_then)
    result = checks.run("01", solution("01", "measure_throughput"), only=("01-throughput-error",))["01-throughput-error"]
    assert len(sleeps) == 23 and result.status == "pass", result.note


def test_01_a_process_descheduled_between_the_calls_clock_and_the_timers_still_passes(monkeypatch):
    """On a busy machine the process can be descheduled just after the workload read its clock and
    before the timer reads its own: two of the 20 timed calls then take 30 ms longer by the timer
    than by the workload's record (an honest timer's p95 2.5 times the record's). The time between
    calls is recorded too, and bounds what a right timer may see: it passes. (CI failed this once
    as style-closures' 01, before the gaps were recorded.)"""
    import time

    from labsupport.grading import g01_worker

    sleeps, sleep, clock, late = [], g01_worker._sleep, g01_worker._clock, []

    def sleep_and_count(seconds):
        sleeps.append(seconds)
        sleep(seconds)
        if len(sleeps) in (10, 15):
            late.append(1)

    def clock_then_descheduled():
        now = clock()
        if late:  # the call's end read: descheduled for 30 ms before the timer's clock
            late.clear()
            time.sleep(0.03)
        return now

    monkeypatch.setattr(g01_worker, "_sleep", sleep_and_count)
    monkeypatch.setattr(g01_worker, "_clock", clock_then_descheduled)
    result = checks.run("01", solution("01", "measure_throughput"), only=("01-throughput-error",))["01-throughput-error"]
    assert len(sleeps) == 23 and result.status == "pass", result.note
    # The bounds are what the gaps allow, no more: a timer 20% slow everywhere still fails.
    ns = solution("01", "measure_throughput")
    honest = ns["measure_throughput"]
    ns["measure_throughput"] = lambda *a, **k: {key: v * 1.2 for key, v in honest(*a, **k).items()}
    result = checks.run("01", ns, only=("01-throughput-error",))["01-throughput-error"]
    assert result.status == "fail", result.note


def test_01_a_timer_that_calls_the_step_too_often_fails_saying_how_often():
    ns = solution("01", "measure_throughput")
    honest = ns["measure_throughput"]
    ns["measure_throughput"] = lambda step, device, *, warmup, steps, samples_per_step: honest(
        step, device, warmup=warmup + 1, steps=steps, samples_per_step=samples_per_step)
    result = checks.run("01", ns, only=("01-throughput-error",))["01-throughput-error"]
    assert result.status == "fail" and "called step 24 times" in result.note, result.note


def test_01_diagnose_by_largest_single_phase_fails():
    ns = {"diagnose": lambda b: {"data wait": "data", "host to device": "transfer", "forward": "compute",
                                 "backward": "compute", "optimizer": "optimizer"}[max(b, key=b.get)]}
    result = checks.run("01", ns, only=("01-diagnose",))["01-diagnose"]
    assert result.status == "fail" and result.measured < 1


def _top_by(rank_key: str, divisor: float = 1000):
    """A top_operators that ranks by ``rank_key`` and reports self times divided by ``divisor``."""
    def top_operators(averages, device, n=5):
        ranked = sorted(averages, key=lambda e: getattr(e, rank_key), reverse=True)[:n]
        return [(e.key, e.self_cpu_time_total / divisor) for e in ranked]
    return top_operators


@pytest.mark.parametrize("wrong", [
    _top_by("cpu_time_total"),  # an honest bug: total time, which ranks labels and wrappers first
    _top_by("self_cpu_time_total", divisor=1),  # microseconds reported as milliseconds
    lambda averages, device, n=5: [("aten::convolution_backward", 366.0), ("aten::mkldnn_convolution", 144.0),
                                   ("aten::native_batch_norm_backward", 17.0)][:n],  # this machine's table, typed
], ids=["total-time", "microseconds", "typed"])
def test_01_top_operators_by_total_time_in_the_wrong_unit_or_typed_fails(wrong):
    result = checks.run("01", {"top_operators": wrong}, only=("01-top-operators",))["01-top-operators"]
    assert result.status == "fail" and result.measured < 1, result.note


def _labelled(*edits: tuple[str, str]) -> dict:
    """A namespace holding the reference's labelled_step (its master cell, markers removed), each
    ``(old, new)`` edit made to its source."""
    import nbformat

    from autograder import course

    master = next(p for p in course.masters() if p.name.startswith("01_"))
    cell = next(c for c in nbformat.read(master, as_version=4).cells if c.get("id") == "labelled_step")
    source = reference.SOLUTION_MARKERS.sub("", cell.source)
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    namespace = {}
    exec(compile(source, "<labelled_step>", "exec"), namespace)
    return namespace


def _trace_checks(namespace: dict) -> dict:
    found = checks.run("01", namespace, only=("01-trace",))
    return {check: (found[check].status, found[check].measured, found[check].note)
            for check in ("01-trace", "01-phases-labelled")}


def test_01_labelled_step_is_profiled_by_the_check_and_a_trace_file_earns_nothing():
    """The check profiles labelled_step itself: the reference earns both points with no trace file
    written, and a trace file written by hand (every label and operator the check once read from
    it) beside a step that labels nothing earns no phase."""
    found = _trace_checks(_labelled())
    assert found["01-trace"][0] == "pass" and found["01-trace"][1] >= 80, found  # two steps' forward convs alone
    assert found["01-phases-labelled"][:2] == ("pass", 5), found
    assert not (ls.results.results_dir() / "traces").exists()
    path = ls.results.results_dir() / "traces" / "01-trace.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"traceEvents": [
        {"name": name, "cat": "user_annotation", "ts": 10 * i, "dur": 5} for i, name in enumerate(ls.train.PHASES)]}))
    unlabelled = _labelled(*[(f'    with record_function("{p}"):\n', "    if True:\n") for p in ls.train.PHASES])
    found = _trace_checks(unlabelled)
    assert found["01-trace"][0] == "pass", found  # it trains, and runs convolutions
    assert found["01-phases-labelled"][:2] == ("fail", 0), found
    assert "no record_function label for 'data wait', 'host to device', 'forward'" in found["01-phases-labelled"][2]


def test_01_labels_around_token_work_with_the_step_run_outside_them_lose_the_phases():
    """Labels that each hold a token of their work (one small convolution, its backward, a spare
    optimizer's step) while the step itself runs after them: the optimizer's label holds an update,
    the forward and the backward fewer convolutions than the network has."""
    decoy = _labelled(
        ('    with record_function("forward"):\n        loss = F.cross_entropy(step.model(images), labels)\n'
         '    with record_function("backward"):\n        loss.backward()\n'
         '    with record_function("optimizer"):\n        step.optimizer.step()\n        step.optimizer.zero_grad()\n',
         '    w = torch.zeros(1, 3, 3, 3, requires_grad=True)\n'
         '    spare = torch.optim.SGD([w], lr=0.1)\n'
         '    with record_function("forward"):\n        token = F.conv2d(images[:1], w).sum()\n'
         '    with record_function("backward"):\n        token.backward()\n'
         '    with record_function("optimizer"):\n        spare.step()\n'
         '    loss = F.cross_entropy(step.model(images), labels)\n    loss.backward()\n'
         '    step.optimizer.step()\n    step.optimizer.zero_grad()\n'))
    found = _trace_checks(decoy)
    assert found["01-trace"][0] == "pass", found
    assert found["01-phases-labelled"][:2] == ("fail", 3), found
    assert "'forward', 'backward' wrap not the work they name" in found["01-phases-labelled"][2], found


# labelled_step's last three phases, as the master writes them: what the cheats below replace.
_STEP_PHASES = ('    with record_function("forward"):\n        loss = F.cross_entropy(step.model(images), labels)\n'
                '    with record_function("backward"):\n        loss.backward()\n'
                '    with record_function("optimizer"):\n        step.optimizer.step()\n'
                '        step.optimizer.zero_grad()\n')
_NUDGE = ('    with torch.no_grad():\n        for p in step.model.parameters():\n'
          '            p.add_(1e-4 * torch.randn_like(p))\n')
LABELLED_CHEATS = {
    # a small other network on 4 images inside the labels; the step's own weights only nudged
    "other-network": (_STEP_PHASES,
                      '    net = getattr(labelled_step, "net", None) or torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), '
                      'torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))\n'
                      '    labelled_step.net = net\n    spare = torch.optim.SGD(net.parameters(), lr=0.1)\n'
                      '    with record_function("forward"):\n        loss = F.cross_entropy(net(images[:4]), labels[:4])\n'
                      '    with record_function("backward"):\n        loss.backward()\n'
                      '    with record_function("optimizer"):\n        spare.step()\n' + _NUDGE),
    # the right model, trained on 4 of the batch's images
    "smaller-batch": ("step.model(images), labels)", "step.model(images[:4]), labels[:4])"),
    # a deep copy of the model trained on the batch, its weights copied back into the step's
    "deepcopy": (_STEP_PHASES,
                 '    import copy\n    model = copy.deepcopy(step.model)\n'
                 '    optimizer = torch.optim.SGD(model.parameters(), lr=step.optimizer.param_groups[0]["lr"])\n'
                 '    with record_function("forward"):\n        loss = F.cross_entropy(model(images), labels)\n'
                 '    with record_function("backward"):\n        loss.backward()\n'
                 '    with record_function("optimizer"):\n        optimizer.step()\n'
                 '    step.model.load_state_dict(model.state_dict())\n'),
    # labels around a forward and backward whose results are thrown away; the real step runs after them
    "thrown-away": (_STEP_PHASES,
                    '    with record_function("forward"):\n        shown = F.cross_entropy(step.model(images), labels)\n'
                    '    with record_function("backward"):\n        shown.backward()\n'
                    '    with record_function("optimizer"):\n        step.optimizer.zero_grad()\n'
                    '    loss = F.cross_entropy(step.model(images), labels)\n    loss.backward()\n'
                    '    step.optimizer.step()\n    step.optimizer.zero_grad()\n'),
}


@pytest.mark.parametrize("cheat, trace, phases, why", [
    ("other-network", "fail", "fail", "ran [0, 0, 0, 0] of its 20 convolution layers"),
    ("smaller-batch", "pass", "fail", "the forward all the 20 convolutions of the step's model on the batch"),
    ("deepcopy", "fail", "fail", "ran [0, 0, 0, 0] of its 20 convolution layers"),
    ("thrown-away", "pass", "fail", "none of them outside their label"),
])
def test_01_the_labelled_work_must_be_the_model_and_batch_handed_over(cheat, trace, phases, why):
    """A labelled_step whose labels hold other work than the step it was given: another network, the
    model on part of the batch, a copy of the model, or a forward thrown away while the step runs
    outside the labels. Each loses the phases (the operators' input shapes, record_shapes); one that
    does not train the step's own model is no training step of it, and loses the trace too."""
    found = _trace_checks(_labelled(LABELLED_CHEATS[cheat]))
    assert (found["01-trace"][0], found["01-phases-labelled"][0]) == (trace, phases), found
    assert why in found["01-phases-labelled"][2], found


@pytest.mark.parametrize("edit, why", [
    (('        step.optimizer.step()\n', ''), "the weights of the step it was given did not move"),
    (('        batch = next(batches)\n', '        next(batches)\n        batch = next(batches)\n'),
     "it took [2, 2, 2, 2] batches"),
], ids=["no-update", "two-batches"])
def test_01_a_labelled_step_that_is_not_one_training_step_fails_both(edit, why):
    found = _trace_checks(_labelled(edit))
    for check in ("01-trace", "01-phases-labelled"):
        status, _, note = found[check]
        assert status == "fail" and "correctness check failed" in note and why in note, found


def _step_trace(order=("data wait", "host to device", "forward", "backward", "optimizer"), hollow=()):
    """One profiled step as ``(name, is a label, start, end)``: each phase label (in ``order``)
    around the work its phase names, except the ``hollow`` ones, which wrap nothing (their work
    runs after every label)."""
    work = {"data wait": "enumerate(DataLoader)#__next__", "host to device": "aten::to",
            "forward": "aten::conv2d", "backward": "aten::convolution_backward",
            "optimizer": "aten::_foreach_add_"}
    events = [("ProfilerStep*", True, 0, 1000)]
    for i, phase in enumerate(order):
        events.append((phase, True, 10 + 100 * i, 60 + 100 * i))
        at = 900 + i if phase in hollow else 20 + 100 * i
        events.append((work[phase], False, at, at + 1))
    return events


@pytest.mark.parametrize("case, measured, why", [
    (dict(), 5, ""),
    (dict(hollow=("forward", "backward", "optimizer")), 2, "wrap not the work"),
    (dict(hollow=("optimizer",)), 4, "'optimizer' wraps not"),
    (dict(order=("data wait", "host to device", "backward", "forward", "optimizer")), 0, "not in the step's order"),
], ids=["honest", "labels-around-nothing", "optimizer-outside", "out-of-order"])
def test_01_each_phase_label_holds_the_work_it_names_in_one_step(case, measured, why):
    from labsupport.grading.g01_profile import phases_holding_their_work

    got, note = phases_holding_their_work(_step_trace(**case))
    assert got == measured and why in note, (got, note)


def test_01_the_forward_and_backward_labels_hold_every_convolution_of_the_network():
    from labsupport.grading.g01_profile import model_convolutions, phases_holding_their_work

    expected = model_convolutions(8, 32)
    assert [sum(c.values()) for c in expected.values()] == [20, 20]  # ResNet-18's
    assert expected["forward"]["aten::conv2d [8, 3, 32, 32] [64, 3, 7, 7]"] == 1, expected
    got, note = phases_holding_their_work(_step_trace(), expected)
    assert got == 3 and "'forward', 'backward' wrap not the work they name" in note, note


# 02 ------------------------------------------------------------------------------------------

def test_02_reference_delivers_the_same_data():
    found = checks.run("02", solution("02", "make_fast_loader"))
    # tiny never grades speed (nor a step's time shares); n/a is only given to correct data
    assert found["02-loader-speedup"].status == "n/a", found["02-loader-speedup"].note
    assert found["02-data-wait-share"].status == "n/a", found["02-data-wait-share"].note


def test_02_loader_that_drops_samples_fails():
    ns = solution("02", "make_fast_loader")
    honest = ns["make_fast_loader"]

    def dropping(lab, split="train", augment=True):
        loader = honest(lab, split, augment)
        return [batch for i, batch in enumerate(loader) if i % 2 == 0] if augment else loader
    ns["make_fast_loader"] = dropping
    found = checks.run("02", ns)
    for result in found.values():
        assert result.status == "fail" and "of 40 samples" in result.note, result.note


def test_02_loader_with_other_pixels_fails():
    ns = solution("02", "make_fast_loader")
    honest = ns["make_fast_loader"]
    ns["make_fast_loader"] = lambda lab, split="train", augment=True: (
        [(x * 1.01, y) for x, y in honest(lab, split, augment)])
    result = checks.run("02", ns, only=("02-loader-speedup",))["02-loader-speedup"]
    assert result.status == "fail" and "pixel values differ" in result.note


def test_02_loader_checked_on_every_batch_it_is_timed_on():
    """Three careless or clever loaders that the first epoch's label counts and shapes let
    through: labels shuffled within each training batch, training images decoded at half the
    resolution and resized up, and a loader that behaves for one epoch and then drops batches."""
    import torch.nn.functional as F

    ns = solution("02", "make_fast_loader")
    honest = ns["make_fast_loader"]

    def wrapped(change):
        def make(lab, split="train", augment=True):
            loader = honest(lab, split, augment)

            class Changed:
                epochs = 0

                def __len__(self):
                    return len(loader)

                def __iter__(self):
                    Changed.epochs += 1
                    for i, (x, y) in enumerate(loader):
                        out = change(x, y, i, Changed.epochs) if split == "train" else (x, y)
                        if out is not None:
                            yield out
            return Changed()
        return make

    size = ls.hardware.PROFILES["tiny"].image_size
    cases = {
        "mislabelled": (lambda x, y, i, e: (x, y.roll(1)), "keep each image with its own label"),
        "upsampled": (lambda x, y, i, e: (F.interpolate(F.interpolate(x, scale_factor=0.5), size=size), y),
                      "no image of the dataset"),
        "later epochs drop batches": (lambda x, y, i, e: None if e > 1 and i % 2 else (x, y), "timed epoch"),
    }
    for name, (change, message) in cases.items():
        ns["make_fast_loader"] = wrapped(change)
        result = checks.run("02", ns, only=("02-loader-speedup",))["02-loader-speedup"]
        assert result.status == "fail" and message in result.note, (name, result.note)


def test_02_augmented_batches_are_augmented_as_the_naive_loaders():
    """Loaders exact with augmentation off whose timed, augmented training batches are not: one
    serves the plain images, one decodes the augmented ones at half resolution and scales them up,
    one augments its first epoch and replays it. Each fails both 02 checks; the honest one passes."""
    import torch.nn.functional as F

    ns = solution("02", "make_fast_loader")
    honest = ns["make_fast_loader"]
    size = ls.hardware.PROFILES["tiny"].image_size

    def skipping(lab, split="train", augment=True):
        return honest(lab, split, augment=False)

    def blurred(lab, split="train", augment=True):
        loader = honest(lab, split, augment)
        if not (augment and split == "train"):
            return loader
        small = lambda x: F.interpolate(F.interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
                                        size=size, mode="bilinear")
        return type("Blurred", (), {"__len__": lambda self: len(loader),
                                    "__iter__": lambda self: ((small(x), y) for x, y in loader)})()

    def replaying(lab, split="train", augment=True):
        loader, kept = honest(lab, split, augment), []

        class Replay:
            def __len__(self):
                return len(loader)

            def __iter__(self):
                if kept:
                    yield from kept
                    return
                for x, y in loader:
                    kept.append((x.clone(), y.clone()))
                    yield x, y
        return Replay()

    cases = {"honest": (honest, ""), "skips augmentation": (skipping, "dataset images exactly"),
             "decoded small": (blurred, "blurrier than the naive loader's"),
             "replays its first epoch": (replaying, "repeat the first epoch's exactly")}
    for name, (make, message) in cases.items():
        ns["make_fast_loader"] = make
        found = checks.run("02", ns)
        if not message:
            assert {r.status for r in found.values()} == {"n/a"}, (name, found)
            continue
        for result in found.values():
            assert result.status == "fail" and result.reason == "incorrect" and message in result.note, \
                (name, result.note)


def test_02_naive_loader_in_disguise_is_not_3x(monkeypatch):
    monkeypatch.setenv("LAB_PROFILE", "tiny:grades_speed=1")
    ns = {"make_fast_loader": lambda lab, split="train", augment=True: ls.pipeline.naive_loader(
        lab.profile, split=split, augment=augment, seed=lab.seed)}
    result = checks.run("02", ns, only=("02-loader-speedup",))["02-loader-speedup"]
    assert result.status == "fail" and result.measured < 2, result


# 03 ------------------------------------------------------------------------------------------

AMP_CELLS = ("choose_precision", "amp_train_step")


def test_03_reference_trains_and_saves_memory():
    found = checks.run("03", solution("03", *AMP_CELLS))
    # On class cpu (no bf16 units) the reference stays in float32 and the saving is not graded.
    saving = "n/a" if describe_machine().device_class == "cpu" else "pass"
    assert found["03-activation-ratio"].status == saving, found["03-activation-ratio"].note
    assert found["03-fp16-scaler"].status == "pass", found["03-fp16-scaler"].note
    assert found["03-amp-speedup"].status == "n/a" and found["03-accuracy-gap"].status == "n/a"


def test_03_step_that_skips_backward_fails():
    ns = solution("03", *AMP_CELLS)

    def no_backward(model, optimizer, scaler, images, labels, dtype):
        with torch.no_grad(), torch.autocast(images.device.type, dtype=dtype):
            return torch.nn.functional.cross_entropy(model(images), labels).float()
    ns["amp_train_step"] = no_backward
    found = checks.run("03", ns)
    for check in ("03-amp-speedup", "03-activation-ratio", "03-fp16-scaler", "03-accuracy-gap"):
        assert found[check].status == "fail", found[check]
    assert "did not change" in found["03-amp-speedup"].note


def test_03_step_that_trains_only_the_last_layer_fails():
    """Fast, and it trains: but only the classifier. The partner of 03's speed and memory checks
    (and of their points where speed is n/a) needs every layer updated."""
    ns = solution("03", *AMP_CELLS)
    honest = ns["amp_train_step"]

    def frozen_body(model, optimizer, scaler, images, labels, dtype):
        for name, p in model.named_parameters():  # backward through the classifier only: faster
            p.requires_grad_(name.startswith("fc."))
        return honest(model, optimizer, scaler, images, labels, dtype)

    ns["amp_train_step"] = frozen_body
    found = checks.run("03", ns, only=("03-amp-speedup",))["03-amp-speedup"]
    assert found.status == "fail" and "every layer" in found.note, found.note


def test_03_step_that_does_less_when_it_is_timed_loses_the_speed_check_only():
    """Honest when checked, less when timed (it finds measure.compare on its call stack, as the
    shortcuts scenario's does): every timed call is one step from the same weights, checked against
    fp32's, so the speed check fails, in float32 and in 16 bits; the checks that time nothing get
    what the honest step gets (a float32 choice saves no activation memory: n/a on class cpu, a
    fail where the lab trains in 16 bits). An honest 16-bit step passes the same partner."""
    import scenarios

    ns = solution("03", *AMP_CELLS)
    honest = ns["amp_train_step"]
    exec(scenarios.timed_from_my_stack(), ns)
    timed = ns["_timed"]

    def classifier_only(model, optimizer, scaler, images, labels, dtype):
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("fc.") or not timed())
        return honest(model, optimizer, scaler, images, labels, dtype)

    def half_resolution(model, optimizer, scaler, images, labels, dtype):
        if timed():  # a quarter of the pixels
            images = torch.nn.functional.interpolate(images, scale_factor=0.5)
        return honest(model, optimizer, scaler, images, labels, dtype)

    for dtype in (None, torch.bfloat16):
        ns["choose_precision"] = lambda machine, d=dtype: {"dtype": d, "channels_last": d is not None}
        ns["amp_train_step"] = honest
        found = checks.run("03", ns, only=("03-amp-speedup", "03-activation-ratio"))
        sixteen_bits = describe_machine().device_class != "cpu"
        # a float32 choice earns no mixed-precision speed where the lab trains in 16 bits
        assert (found["03-amp-speedup"].status, found["03-amp-speedup"].reason) == (
            ("fail", "not optimised") if sixteen_bits and not dtype else ("n/a", "n/a")), (dtype, found["03-amp-speedup"])
        memory = found["03-activation-ratio"].status
        assert memory == ("n/a" if not sixteen_bits else "pass" if dtype else "fail"), \
            (dtype, found["03-activation-ratio"])
        for step in (classifier_only, half_resolution):
            ns["amp_train_step"] = step
            found = checks.run("03", ns, only=("03-amp-speedup", "03-activation-ratio"))
            speed = found["03-amp-speedup"]
            assert speed.status == "fail" and speed.reason == "incorrect" and "timed call" in speed.note, \
                (dtype, step.__name__, speed.note)
            assert found["03-activation-ratio"].status == memory, (dtype, step.__name__, found["03-activation-ratio"])


def test_03_a_float32_step_earns_no_mixed_precision_speed():
    """bfloat16 and channels_last chosen, but the step never autocasts (the hardcoded scenario's):
    on an AVX-512 BF16 CPU channels_last alone made that float32 step 1.3x faster than fp32's, the
    class bar. Where the lab trains in 16 bits, the speed check needs the 16-bit activations seen,
    so it fails as not optimised, at every profile, and so does the saving; on class cpu both are n/a."""
    ns = solution("03", *AMP_CELLS)
    ns["choose_precision"] = lambda machine: {"dtype": torch.bfloat16, "channels_last": True}

    def float32_step(model, optimizer, scaler, images, labels, dtype):
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    ns["amp_train_step"] = float32_step
    found = checks.run("03", ns, only=("03-amp-speedup", "03-activation-ratio"))
    if describe_machine().device_class == "cpu":
        assert {r.status for r in found.values()} == {"n/a"}, found
        return
    assert (found["03-amp-speedup"].status, found["03-amp-speedup"].reason) == ("fail", "not optimised"), \
        found["03-amp-speedup"]
    assert "no 16-bit activations" in found["03-amp-speedup"].note
    assert found["03-activation-ratio"].status == "fail", found["03-activation-ratio"]


def test_03_fp16_step_without_a_scaler_fails():
    ns = solution("03", *AMP_CELLS)

    def unscaled(model, optimizer, scaler, images, labels, dtype):
        optimizer.zero_grad()
        with torch.autocast(images.device.type, dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()
    ns["amp_train_step"] = unscaled
    result = checks.run("03", ns, only=("03-fp16-scaler",))["03-fp16-scaler"]
    assert result.status == "fail" and "inf/NaN" in result.note, result.note


def test_03_fp32_in_disguise_saves_no_memory():
    if describe_machine().device_class == "cpu":
        pytest.skip("class cpu trains in float32: the 16-bit activation saving is n/a there")
    ns = solution("03", *AMP_CELLS)
    ns["choose_precision"] = lambda machine: {"dtype": None, "channels_last": False}
    result = checks.run("03", ns, only=("03-activation-ratio",))["03-activation-ratio"]
    assert result.status == "fail" and result.measured > 0.9


def test_graded_checks_ignore_a_monkeypatched_labsupport(monkeypatch):
    """A notebook cell that replaces labsupport's timing cannot change what the graded copy measures."""
    monkeypatch.setenv("LAB_PROFILE", "tiny:grades_speed=1")
    fake = ls.measure.Comparison((100.0,), (1.0,), 1)
    monkeypatch.setattr(ls.measure, "compare", lambda *a, **k: fake)
    ns = {"make_fast_loader": lambda lab, split="train", augment=True: ls.pipeline.naive_loader(
        lab.profile, split=split, augment=augment, seed=lab.seed)}
    result = ls.grading.fresh().grading.run("02", ns, only=("02-loader-speedup",))["02-loader-speedup"]
    # The patched compare says 100x. The naive loader against itself is about 1x, but 3 rounds at
    # the tiny profile beside other tests measured up to 2.5x in a fresh clone: the bar sits far
    # from both, so only the fake would cross it.
    assert result.status == "fail" and result.measured < 10


# 04 ------------------------------------------------------------------------------------------

CKPT_CELLS = ("checkpointed", "SEGMENTS", "accumulate_step", "training_bytes")


def test_04_reference_passes():
    ns = solution("04", *CKPT_CELLS)
    found = checks.run("04", ns)
    for check in ("04-grad-match", "04-activation-ratio", "04-fits-budget", "04-accum-match", "04-training-memory"):
        assert found[check].status == "pass", found[check]
    # At the tiny scale (32 px, batch 8) a step's peak is its 45 MiB of gradients, not activations,
    # so checkpointing cannot lower it: the peak check is meaningful at real profiles only.
    assert found["04-peak-ratio"].measured > 0.9
    assert found["04-time-overhead"].measured is not None  # timed and reported at any scale
    assert found["04-time-overhead"].status == "n/a", found["04-time-overhead"].note  # its timed calls checked


def _parts(weights, buffers):
    return {"weights": weights, "gradients": weights, "optimizer state": buffers * weights}


@pytest.mark.parametrize("answer, wrong", [
    (lambda n, opt, b=4: _parts(n * b, {"sgd": 0, "momentum": 1, "adam": 1}[opt]), "'adam'"),  # Adam's one buffer
    (lambda n, opt, b=4: _parts(n * 4, {"sgd": 0, "momentum": 1, "adam": 2}[opt]), ", 2)"),  # the number size forgotten
    (lambda n, opt, b=4: _parts(n * 4, 2), "'momentum'"),  # the table's 16 bytes per parameter, whatever was asked
    (lambda n, opt, b=4: _parts(n * b, {"sgd": 0, "momentum": 1, "adam": 2}[opt]) if n < 10**8 else _parts(0, 0),
     "1,500,000,000"),  # right only where a model could be counted
    (lambda n, opt, b=4: [n * b] * 3, "not a dict"),
    (lambda n, opt, b=4: 1 / 0, "ZeroDivisionError"),
], ids=["adam-one-buffer", "number-size-forgotten", "16-bytes-always", "only-countable-models", "a-list", "raises"])
def test_04_training_memory_is_judged_on_counted_optimizer_steps_it_was_not_shown(answer, wrong):
    """04-training-memory asks ``training_bytes`` about models, optimizers and number sizes 04's table
    does not show, and about models too large to count: each wrong answer fails it, saying which
    case, and costs no other check."""
    ns = solution("04", *CKPT_CELLS)
    ns["training_bytes"] = answer
    found = checks.run("04", ns, only=("04-grad-match", "04-training-memory"))
    memory = found["04-training-memory"]
    assert memory.status == "fail" and wrong in memory.note, memory.note
    assert found["04-grad-match"].status == "pass", found["04-grad-match"]


def test_04_training_memory_written_in_another_style_passes():
    """Other names, floats, a keyword-only number size and a table of optimizers: full marks."""
    ns = solution("04", *CKPT_CELLS)
    buffers = {"adam": 2.0, "momentum": 1.0, "sgd": 0.0}

    def training_bytes(n_params, opt, *, bytes_per_number=4):
        each = float(n_params) * bytes_per_number
        return {"optimizer state": buffers[opt] * each, "gradients": each, "weights": each, "activations": None}

    ns["training_bytes"] = training_bytes
    memory = checks.run("04", ns, only=("04-training-memory",))["04-training-memory"]
    assert memory.status == "pass" and "counted tensor by tensor" in memory.note, memory


def test_04_checkpointing_that_skips_its_recomputation_when_timed_loses_the_overhead_only():
    """Checkpointed when checked, the plain network when timed (measure.compare on its call stack):
    the same gradients, but fewer convolutions in every timed call than in an untimed one."""
    import scenarios

    ns = solution("04", *CKPT_CELLS)
    honest = ns["checkpointed"]
    exec(scenarios.timed_from_my_stack(), ns)
    timed = ns["_timed"]

    class Sneaky(torch.nn.Module):
        def __init__(self, model, segments):
            super().__init__()
            self.model, self.honest = model, honest(model, segments)

        def forward(self, x):
            return self.model(x) if timed() else self.honest(x)

    ns["checkpointed"] = Sneaky
    found = checks.run("04", ns, only=("04-grad-match", "04-activation-ratio", "04-time-overhead"))
    cost = found["04-time-overhead"]
    assert cost.status == "fail" and cost.reason == "incorrect" and "convolutions" in cost.note, cost.note
    assert found["04-grad-match"].status == "pass" and found["04-activation-ratio"].status == "pass", found


def test_04_checkpointing_without_frozen_batchnorm_fails():
    """Recomputing a segment in training mode updates BatchNorm's running statistics twice."""
    import torch.utils.checkpoint as cp

    ns = solution("04", *CKPT_CELLS)
    ns["checkpoint"] = lambda fn, x, use_reentrant, context_fn=None: cp.checkpoint(fn, x, use_reentrant=False)
    result = checks.run("04", ns, only=("04-grad-match",))["04-grad-match"]
    assert result.status == "fail" and "BatchNorm running statistics" in result.note, result.note


def test_04_accumulation_that_steps_every_micro_batch_or_averages_unevenly_fails():
    ns = solution("04", *CKPT_CELLS)

    def steps_each(model, optimizer, images, labels, micro_batches):
        for x, y in zip(images.tensor_split(micro_batches), labels.tensor_split(micro_batches)):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()

    def plain_mean(model, optimizer, images, labels, micro_batches):
        optimizer.zero_grad()
        for x, y in zip(images.tensor_split(micro_batches), labels.tensor_split(micro_batches)):
            (torch.nn.functional.cross_entropy(model(x), y) / micro_batches).backward()
        optimizer.step()

    for wrong in (steps_each, plain_mean):
        ns["accumulate_step"] = wrong
        result = checks.run("04", ns, only=("04-accum-match",))["04-accum-match"]
        assert result.status == "fail" and "differs" in result.note, (wrong.__name__, result.note)


def test_04_accumulation_must_show_its_micro_batches():
    """Right gradients from one full-batch forward: the memory accumulation exists to save is not
    saved. The model must see the micro-batches."""
    ns = solution("04", *CKPT_CELLS)

    def one_batch(model, optimizer, images, labels, micro_batches):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    ns["accumulate_step"] = one_batch
    result = checks.run("04", ns, only=("04-accum-match",))["04-accum-match"]
    assert result.status == "fail" and "micro-batches" in result.note, result.note
    assert checks.g04_checkpointing.micro_batch_problem([6, 5, 5], 16, 3) == ""
    assert checks.g04_checkpointing.micro_batch_problem([5, 5, 5, 1], 16, 3) == ""
    assert "not the batch's 16 once" in checks.g04_checkpointing.micro_batch_problem([6, 5], 16, 3)


def test_04_accumulation_is_judged_against_the_labs_own_one_batch_step(monkeypatch):
    """At a scale where a step's peak is graded: a step that trains on the whole batch at once
    (showing the model its micro-batches under no_grad, and calling ``forward`` past the hook that
    counts them) and, given one micro-batch, holds 48 MiB more, so that its own one-batch peak reads
    high. The one batch's peak is the lab's own step, which it does not undercut: it fails. The
    same step with its forward and backward kept from the count fails on what the CPU allocator
    held. The reference lowers the peak by both, and passes."""
    monkeypatch.setenv("LAB_PROFILE", "tiny:image_size=64,batch_size=16,grades_speed=1")
    ns = solution("04", *CKPT_CELLS)
    found = checks.run("04", ns, only=("04-accum-match",))["04-accum-match"]
    assert found.status == "pass" and "lab's one-batch step" in found.note, found.note

    def whole_batch(model, optimizer, images, labels, micro_batches):
        ballast = torch.ones(12 * 2**20) if micro_batches == 1 else None  # 48 MiB, when k = 1 only
        optimizer.zero_grad()
        with torch.no_grad():
            for x in images.tensor_split(micro_batches):
                model(x)  # shown to the model, not used
        loss = torch.nn.functional.cross_entropy(model.forward(images), labels)
        loss.backward()
        optimizer.step()
        del ballast
        return loss.detach()

    ns["accumulate_step"] = whole_batch
    found = checks.run("04", ns, only=("04-accum-match",))["04-accum-match"]
    assert found.status == "fail" and "must lower the peak" in found.note, found.note

    def hidden(model, optimizer, images, labels, micro_batches):
        """The whole batch at once, its forward and backward kept from the count (a dispatch mode
        switched off): the count reads a fall, the CPU allocator none."""
        from torch.utils._python_dispatch import _disable_current_modes

        optimizer.zero_grad()
        with torch.no_grad():
            for x in images.tensor_split(micro_batches):
                model(x)
        with _disable_current_modes():
            loss = torch.nn.functional.cross_entropy(model.forward(images), labels)
            loss.backward()
        optimizer.step()
        return loss.detach()

    ns["accumulate_step"] = hidden
    found = checks.run("04", ns, only=("04-accum-match",))["04-accum-match"]
    assert found.status == "fail" and "the count missed tensors" in found.note, found.note


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU allocator's cross-check runs where the lab runs on a CPU")
def test_04_a_network_kept_from_the_count_fails_on_what_the_cpu_allocator_held(monkeypatch):
    """A network whose forward runs with the counting dispatch mode switched off (and one
    convolution more, so backward seems to recompute): the count reads a saving, c10's CPU
    allocator none, and the memory and overhead checks fail as incorrect, naming both figures. The
    reference at the same scale passes (its allocator saving exceeds its counted one)."""
    monkeypatch.setenv("LAB_PROFILE", "tiny:image_size=64")
    ns = solution("04", *CKPT_CELLS)
    found = checks.run("04", ns, only=("04-activation-ratio",))
    assert found["04-activation-ratio"].status == "pass" and found["04-fits-budget"].status == "pass", \
        {k: r.note for k, r in found.items()}
    exec(compile("""
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes


def checkpointed(model, segments):
    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            with _disable_current_modes():
                out = self.model(x)
            with torch.no_grad():
                self.model.conv1(x)
            return out
    return Hidden()
""", "<hidden>", "exec"), ns)
    found = checks.run("04", ns, only=("04-activation-ratio",))
    assert found["04-grad-match"].status == "pass", found["04-grad-match"].note
    for check in ("04-activation-ratio", "04-fits-budget"):
        assert found[check].reason == "incorrect" and "the count missed tensors" in found[check].note, found[check]
        assert "what the CPU allocator held by 0.0 MiB" in found[check].note, found[check].note


def test_04_missing_segments_choice_is_explained():
    ns = solution("04", *CKPT_CELLS)
    ns["SEGMENTS"] = 12
    result = checks.run("04", ns, only=("04-grad-match",))["04-grad-match"]
    assert result.status == "fail" and "from 1 to 9" in result.note


@requires_cuda
@pytest.mark.parametrize("room", [True, False], ids=["split-fits-on-the-gpu", "no-room"])
def test_02_reference_copies_no_batch_where_the_split_fits_and_pinned_batches_where_not(monkeypatch, room):
    """Where the decoded split fits in a quarter of the GPU's free memory, the reference loader
    moves it there once: an epoch copies nothing to the GPU but its order. Where it does not, every
    batch is copied from page-locked memory, so the copy is asynchronous: indexing a pinned cache
    would give pageable memory (checked here too)."""
    cache = torch.zeros(8, 3, 4, 4, dtype=torch.uint8).pin_memory()
    assert not cache.index_select(0, torch.tensor([1, 2])).is_pinned()  # why the loader gathers into pinned memory
    lab = checks.grading_lab()
    assert lab.device.type == "cuda"
    if not room:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (0, 1 << 40))
    loader = solution("02")["make_fast_loader"](lab, split="train", augment=True)
    copies, original = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.device.type == "cpu" and out.device.type == "cuda":
            copies.append((self.dtype, self.is_pinned()))
        return out

    monkeypatch.setattr(torch.Tensor, "to", to)
    batches = 0
    for images, labels in loader:
        assert images.device.type == labels.device.type == "cuda"
        batches += 1
    order = [c for c in copies if c == (torch.int64, False)]
    assert len(order) <= 1, copies  # the epoch's order
    batch_copies = [pinned for dtype, pinned in copies if (dtype, pinned) != (torch.int64, False)]
    if room:
        assert batch_copies == [], f"{len(batch_copies)} copies in an epoch of {batches} batches"
    else:
        assert len(batch_copies) == 2 * batches and all(batch_copies), copies


# 05 ------------------------------------------------------------------------------------------

def test_05_break_even_and_outputs_are_checked_without_waiting_for_inductor():
    ns = solution("05", "break_even_steps")
    ns["compile_inference"] = lambda model: model  # "compiled" = eager: fast to build, same outputs
    found = checks.run("05", ns)
    assert found["05-break-even"].status == "pass", found["05-break-even"]
    # tiny never grades speed, but an eager model is caught without timing it: Dynamo captured nothing
    speed = found["05-compile-speedup"]
    assert speed.status == "fail" and "not optimised" in speed.note and speed.details["graphs"] == 0, speed
    ns["break_even_steps"] = lambda c, e, k: c / (e - k)  # forgot the ms/s conversion and the never-pays case
    assert checks.run("05", ns, only=("05-break-even",))["05-break-even"].status == "fail"


def test_05_compiled_model_with_other_outputs_fails():
    ns = solution("05", "break_even_steps")
    ns["compile_inference"] = lambda model: (lambda x: model(x) * 1.5)
    result = checks.run("05", ns, only=("05-compile-speedup",))["05-compile-speedup"]
    assert result.status == "fail" and "differ from eager" in result.note


def _by_hand(q, k, v, causal=False, *, scale=True, mask=True):
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    if causal and mask:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def _blocked(q, k, v, causal=False):
    """Another style: 256 queries at a time, each block's scores written out and dropped."""
    out = []
    for start in range(0, q.shape[-2], 256):
        scores = q[..., start:start + 256, :] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if causal:
            rows = torch.arange(start, start + scores.shape[-2])[:, None]
            scores = scores.masked_fill(torch.arange(k.shape[-2])[None, :] > rows, float("-inf"))
        out.append(scores.softmax(-1) @ v)
    return torch.cat(out, dim=-2)


@pytest.mark.parametrize("answer, status, said", [
    (lambda q, k, v, causal=False: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
     "pass", "the scores would take 128 MiB"),
    (_blocked, "pass", "the scores would take 128 MiB"),
    (lambda q, k, v, *, causal=False: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
     "pass", "the scores would take 128 MiB"),  # causal keyword-only: another style, full marks
    (_by_hand, "fail", "held"),  # right, but the L x L scores written out
    (lambda q, k, v, causal=False: _by_hand(q, k, v, causal, scale=False), "fail", "differs"),
    (lambda q, k, v, causal=False: _by_hand(q, k, v, causal, mask=False), "fail", "(causal)"),
    (lambda q, k, v, causal=False: (q + k + v)[..., :0], "fail", "differs"),
    (lambda q, k, v, causal=False: 1 / 0, "fail", "ZeroDivisionError"),
], ids=["sdpa", "blocked", "keyword-only-causal", "scores-written-out", "no-scale", "no-mask", "wrong-shape", "raises"])
def test_05_attention_is_right_on_unseen_inputs_and_holds_no_scores(answer, status, said):
    """05-attention: the formula on inputs 05 never drew, causal and not, then one call at L = 2048
    that may hold at most half the scores' 128 MiB: SDPA and a blocked attention pass, each wrong
    answer fails saying what was wrong."""
    ns = solution("05", "break_even_steps")
    ns["attention"] = answer
    found = checks.run("05", ns, only=("05-attention",))
    assert set(found) == {"05-attention"}, found
    assert found["05-attention"].status == status and said in found["05-attention"].note, found["05-attention"]


def test_05_a_compiled_model_that_remembers_its_first_answer_fails():
    """Every timed call infers on fresh input: answers remembered from an earlier call are wrong."""
    ns = solution("05", "break_even_steps")

    def remembering(model):
        compiled = torch.compile(model, backend="eager")
        remembered = {}

        def call(images):
            remembered.setdefault(tuple(images.shape), compiled(images))
            return remembered[tuple(images.shape)]
        return call

    ns["compile_inference"] = remembering
    result = checks.run("05", ns, only=("05-compile-speedup",))["05-compile-speedup"]
    assert result.status == "fail" and "differ from eager" in result.note, result.note


def test_05_the_timed_calls_must_run_the_models_compiled_graph():
    """A wrapper that compiles something else on its first call (Dynamo captures a graph) and
    then runs the eager model fails; the model itself compiled (Dynamo's eager backend, quick to
    build) passes the same test."""
    ns = solution("05", "break_even_steps")

    def decoy(model):
        def call(x):
            torch.compile(lambda t: t * 2 + 1, backend="eager")(x)  # a graph, but not the model's
            return model(x)
        return call

    ns["compile_inference"] = decoy
    result = checks.run("05", ns, only=("05-compile-speedup",))["05-compile-speedup"]
    assert result.status == "fail" and "runs the model eagerly" in result.note, result.note
    ns["compile_inference"] = lambda model: torch.compile(model, backend="eager")
    result = checks.run("05", ns, only=("05-compile-speedup",))["05-compile-speedup"]
    assert result.status == "n/a", result.note  # tiny grades no speed; compiled and correct


# 06 ------------------------------------------------------------------------------------------

def test_06_ladder_table_reference_passes_and_a_wrong_speedup_fails():
    ns = solution("06", "assemble_ladder")
    assert checks.run("06", ns, only=("06-ladder-table",))["06-ladder-table"].status == "pass"
    honest = ns["assemble_ladder"]

    def against_previous(frame):
        table = honest(frame)
        table["speedup (cumulative)"] = table["speedup (this rung)"]
        return table
    ns["assemble_ladder"] = against_previous
    result = checks.run("06", ns, only=("06-ladder-table",))["06-ladder-table"]
    assert result.status == "fail" and "crafted" in result.note


def test_06_end_to_end_needs_the_whole_ladder():
    ns = solution("06", "assemble_ladder")
    found = checks.run("06", ns, only=("06-end-to-end", "06-stages"))
    assert found["06-stages"].status == "fail" and "01_profile.ipynb" in found["06-stages"].note
    assert found["06-end-to-end"].status == "fail" and "ladder is incomplete" in found["06-end-to-end"].note


def test_06_a_carried_step_that_does_less_when_it_is_timed_fails_end_to_end(tmp_path):
    """03's step, carried into 06's pipeline, trains only the classifier when it finds the timing
    loop on its stack: three timed calls, chosen after the timing, are trained again by the lab's
    fp32 step on the batches they kept, and differ. (The reference's pass the same partner: the
    test above reaches the ladder, the partner after it.)"""
    import scenarios

    space = solution("03")  # the reference's 03, and the bent step after it in the same kernel
    exec(scenarios.timed_from_my_stack() + "\n\n\n" + (
        "_honest_step = amp_train_step\n\n\n"
        "def amp_train_step(model, optimizer, scaler, images, labels, dtype):\n"
        "    for name, p in model.named_parameters():\n"
        "        p.requires_grad_(name.startswith(\"fc.\") or not _timed())\n"
        "    return _honest_step(model, optimizer, scaler, images, labels, dtype)\n"), space)
    ls.carry.keep("03", space)
    result = checks.run("06", solution("06", "assemble_ladder"), only=("06-end-to-end",))["06-end-to-end"]
    assert result.status == "fail" and "timed call (sampled after the timing" in result.note, result.note


def test_05_on_a_gpu_older_than_compute_capability_7_compile_is_na_and_not_attempted(monkeypatch):
    """Class cuda (a P100, say): Inductor cannot build GPU kernels there. 05's speed check is n/a
    with the reason, without calling compile_inference, and break_even_steps is still checked."""
    import dataclasses

    real = checks.grading_lab()
    old_gpu = dataclasses.replace(real.machine, device="cuda", device_class="cuda", compute_capability="6.0",
                                  device_name="Tesla P100-PCIE-16GB")
    monkeypatch.setattr(checks, "grading_lab", lambda: dataclasses.replace(real, machine=old_gpu))
    ns = solution("05", "break_even_steps")
    ns["compile_inference"] = lambda model: (_ for _ in ()).throw(AssertionError("compile_inference was called"))
    found = checks.run("05", ns)
    assert found["05-compile-speedup"].status == "n/a" and "7.0 or newer" in found["05-compile-speedup"].note
    assert found["05-break-even"].status == "pass", found["05-break-even"]
    ns["break_even_steps"] = lambda c, e, k: c / (e - k)
    assert checks.run("05", ns, only=("05-break-even",))["05-break-even"].status == "fail"


def test_05_break_even_cannot_read_the_expected_answer_from_the_checker():
    """A break_even_steps that looks up the stack for the checker's expected answer finds none."""
    import sys

    from labsupport.grading import g05_compile

    def peeking(c, e, k):
        frame = sys._getframe(1)
        while frame is not None:
            found = [v for name, v in frame.f_locals.items() if name in ("want", "expected") and isinstance(v, float)]
            if found:
                return found[0]
            frame = frame.f_back
        return -1.0

    here = g05_compile.Here({"break_even_steps": peeking}, None)
    assert len(g05_compile._break_even_errors(here.break_even, [(20.0, 100.0, 60.0), (30.0, 50.0, 55.0)])) == 2


# The grader's answers and the lab's own implementations are not the student's work ---------------

DELEGATING_TIMERS = {
    "alias": "from labsupport.measure import time_steps as t\n\n"
             "def measure_throughput(step, device, *, warmup, steps, samples_per_step):\n"
             "    times = t(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)\n"
             "    return {**times.summary(), 'images_per_s': times.samples_per_s}\n",
    "importlib": "import importlib\n\n"
                 "def measure_throughput(step, device, *, warmup, steps, samples_per_step):\n"
                 "    timer = importlib.import_module('labsupport.measure').time_steps\n"
                 "    times = timer(step, device, warmup=warmup, steps=steps, samples_per_step=samples_per_step)\n"
                 "    return {**times.summary(), 'images_per_s': times.samples_per_s}\n",
    # the lab's timing path reached through another labsupport function in between
    "through-compress": "import labsupport\n\n"
                        "def measure_throughput(step, device, *, warmup, steps, samples_per_step):\n"
                        "    times = getattr(getattr(labsupport, 'compress'), 'latency')(lambda x: step(), [0] * samples_per_step, "
                        "calls=steps, warmup=warmup)\n"
                        "    return {**times.summary(), 'images_per_s': samples_per_step * 1000 / times.median_ms}\n",
}


@pytest.mark.parametrize("variant", DELEGATING_TIMERS)
def test_01_a_timer_that_delegates_to_labsupports_earns_no_timer_points(variant):
    """measure_throughput as a thin wrapper over the lab's own timer (aliased, through importlib, or
    through another labsupport function) loses both timer checks, naming what it called."""
    from labsupport.grading import g01_profile

    namespace = {}
    exec(DELEGATING_TIMERS[variant], namespace)
    got = g01_profile._timer_answer(namespace["measure_throughput"](lambda: None, "cpu", warmup=1, steps=5,
                                                                    samples_per_step=8))
    assert got["images_per_s"] > 0  # unwatched, it answers as a timer would
    found = checks.run("01", namespace, only=("01-throughput-error", "01-throughput-sync"), keep=False)
    for check in ("01-throughput-error", "01-throughput-sync"):
        assert found[check].status == "fail", found[check]
        assert "called labsupport.measure.time_steps" in found[check].note, found[check].note
        assert "write this timer yourself" in found[check].note, found[check].note


ASKING_THE_GRADER = {
    "import": "from labsupport.grading.g01_profile import _bottleneck as b\n\n"
              "def diagnose(breakdown):\n    return b(breakdown)\n",
    "importlib": "import importlib\n\ndef diagnose(breakdown):\n"
                 "    return importlib.import_module('labsupport.grading.g01_profile')._bottleneck(breakdown)\n",
    "getattr": "def diagnose(breakdown):\n"
               "    grading = getattr(__import__('labsupport'), 'grading')\n"
               "    return getattr(getattr(grading, 'g01_profile'), '_bottleneck')(breakdown)\n",
    "unhooked": "import sys\nfrom labsupport.grading.g01_profile import _bottleneck\n\n"
                "def diagnose(breakdown):\n    hook = sys.getprofile()\n    sys.setprofile(None)\n"
                "    try:\n        return _bottleneck(breakdown)\n    finally:\n        sys.setprofile(hook)\n",
}


@pytest.mark.parametrize("variant", ASKING_THE_GRADER)
def test_01_a_diagnosis_asked_of_the_grader_earns_nothing(variant):
    namespace = {}
    exec(ASKING_THE_GRADER[variant], namespace)
    result = checks.run("01", namespace, only=("01-diagnose",), keep=False)["01-diagnose"]
    assert result.status == "fail", result
    assert ("called labsupport.grading.g01_profile._bottleneck" in result.note
            or "called sys.setprofile" in result.note), result.note


BREAK_EVEN_FROM_THE_GRADER = {
    "import": "import re\nfrom labsupport.grading import g05_compile\n\n"
              "def break_even_steps(c, e, k):\n"
              "    wrong = g05_compile._break_even_errors(lambda cases: [-1.0], [(c, e, k)])\n"
              "    return float(re.search(r'expected (\\S+)', wrong[0]).group(1))\n",
    "importlib": "import importlib, re\n\n"
                 "def break_even_steps(c, e, k):\n"
                 "    helper = importlib.import_module('labsupport.grading.g05_compile')._break_even_errors\n"
                 "    return float(re.search(r'expected (\\S+)', helper(lambda cases: [-1.0], [(c, e, k)])[0]).group(1))\n",
    "getattr": "import re, sys\n\n"
               "def break_even_steps(c, e, k):\n"
               "    helper = getattr(sys.modules['labsupport.grading.g05_compile'], '_break_even_errors')\n"
               "    return float(re.search(r'expected (\\S+)', helper(lambda cases: [-1.0], [(c, e, k)])[0]).group(1))\n",
}


@pytest.mark.parametrize("variant", BREAK_EVEN_FROM_THE_GRADER)
def test_05_break_even_asked_of_the_grader_earns_nothing(variant):
    """break_even_steps that asks the check's private helper for the expected answer (imported,
    through importlib, or from sys.modules) fails, naming the helper; unwatched, the same code
    would have answered every case right."""
    from labsupport.grading import g05_compile

    namespace = {}
    exec(BREAK_EVEN_FROM_THE_GRADER[variant], namespace)
    cases = [(20.0, 100.0, 60.0), (30.0, 50.0, 55.0)]
    assert [namespace["break_even_steps"](*c) for c in cases[:1]] == [500.0]  # unwatched, it answers
    with pytest.raises(checks.StudentCodeError, match="called labsupport.grading.g05_compile._break_even_errors"):
        g05_compile.Here(namespace, None).break_even(cases)
    # as the check reads it: a failure of the break-even alone (the compiled inference was measured before)
    wrong = g05_compile._break_even_failures(g05_compile.Here(namespace, None).break_even, cases)
    assert len(wrong) == 1 and "called labsupport.grading.g05_compile._break_even_errors" in wrong[0], wrong
    reference_ns = solution("05", "break_even_steps")
    assert g05_compile._break_even_errors(g05_compile.Here(reference_ns, None).break_even, cases) == []


def test_07_a_distillation_loss_asked_of_the_grader_earns_nothing():
    from labsupport.grading import g07_compression

    namespace = {"distillation_loss": lambda *args: g07_compression.distillation_reference(*args)}
    with pytest.raises(checks.StudentCodeError, match="called labsupport.grading.g07_compression.distillation_reference"):
        g07_compression.Here(namespace, None).distill_losses(g07_compression.distill_cases()[:2])
    reference_ns = solution("07", "distillation_loss")
    assert len(g07_compression.Here(reference_ns, None).distill_losses(g07_compression.distill_cases()[:2])) == 2


# 07 ------------------------------------------------------------------------------------------

def test_07_reference_passes_and_missing_code_fails():
    missing = checks.run("07", {})
    assert {r.status for r in missing.values()} == {"fail"}
    assert "`prune_globally` is not defined" in missing["07-sparsity"].note
    assert "`quantize_int8` is not defined" in missing["07-int8-size"].note
    found = checks.run("07", solution("07"), keep=False)
    assert {k: r.status for k, r in found.items()} == {
        "07-sparsity": "pass", "07-pruned-accuracy": "n/a", "07-int8-size": "pass",
        "07-int8-speedup": "n/a", "07-int8-accuracy": "n/a", "07-distill-loss": "pass",
        "07-distill-accuracy": "n/a"}, {k: r.note for k, r in found.items()}
    assert found["07-distill-loss"].measured < 1e-5, found["07-distill-loss"]
    assert abs(found["07-sparsity"].measured - 0.5) < 0.005 and found["07-int8-size"].measured < 0.26


def test_07_masks_removed_before_the_fine_tune_lose_their_zeros():
    """The honest bug: pruning made permanent at once, so the fine-tune trains the zeros back."""
    ns = solution("07")
    prune_globally, make_permanent = ns["prune_globally"], ns["make_permanent"]
    ns["prune_globally"] = lambda model, amount: make_permanent(prune_globally(model, amount))
    found = checks.run("07", ns, only=("07-sparsity",), keep=False)
    sparse = found["07-sparsity"]
    # the tiny profile fine-tunes 2 steps: a third of the zeros are still zero (40 steps at the real profile)
    assert sparse.status == "fail" and "trained back" in sparse.note and sparse.measured < 0.45, sparse
    assert found["07-pruned-accuracy"].status == "fail"  # no accuracy earned for a model that is not pruned


def test_07_zeros_only_in_the_masks_and_layer_by_layer_pruning_fail():
    import torch.nn.utils.prune as prune

    ns = solution("07")
    ns["make_permanent"] = lambda model: model  # the masks left in place: weight_orig is dense
    sparse = checks.run("07", ns, only=("07-sparsity",), keep=False)["07-sparsity"]
    assert sparse.status == "fail" and "weight_orig and weight_mask" in sparse.note and sparse.measured == 0, sparse

    def per_layer(model, amount):  # 50% of each layer: the same count, not the smallest overall
        for _, m in ls.compress.prunable(model):
            prune.l1_unstructured(m, "weight", amount=amount)
        return model
    ns = solution("07")
    ns["prune_globally"] = per_layer
    sparse = checks.run("07", ns, only=("07-sparsity",), keep=False)["07-sparsity"]
    assert sparse.status == "fail" and "layer by layer" in sparse.note and abs(sparse.measured - 0.5) < 0.01, sparse


def test_07_a_model_that_is_not_int8_fails_size_and_its_partners():
    """fp32 returned as is; fp16 weights (half the bytes, no int8); int8 copies kept beside the fp32
    weights the model really runs on, as buffers or as plain attributes with the fp32 model hidden
    from the module tree (its state dict then holds only int8). What a model computes with is read
    from its forward: each fails all three int8 checks."""
    import torch.nn as nn

    class Beside(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model
            for i, (_, m) in enumerate(ls.compress.prunable(model)):
                self.register_buffer(f"q{i}", m.weight.detach().to(torch.int8))

        def forward(self, x):
            return self.model(x)

    class Hidden(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.__dict__["fp32"] = model  # not a submodule: no parameters, an empty state dict
            self.copies = [m.weight.detach().to(torch.int8) for _, m in ls.compress.prunable(model)]

        def forward(self, x):
            return self.__dict__["fp32"](x)

    class Half(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model.half()

        def forward(self, x):
            return self.model(x.half()).float()

    for name, cheat in (("fp32", lambda model, calibration: model), ("fp16", lambda model, calibration: Half(model)),
                        ("int8 beside", lambda model, calibration: Beside(model)),
                        ("int8 held, fp32 hidden", lambda model, calibration: Hidden(model))):
        ns = solution("07")
        ns["quantize_int8"] = cheat
        found = checks.run("07", ns, only=("07-int8-size",), keep=False)
        size = found["07-int8-size"]
        assert size.status == "fail" and "does not compute with int8 weights" in size.note, (name, size)
        assert found["07-int8-speedup"].status == found["07-int8-accuracy"].status == "fail", name
        assert size.measured > 0.45, (name, size)  # fp16's half, or all of fp32's bytes


def test_07_distillation_losses_with_the_usual_mistakes_fail_naming_them():
    """The soft term without T^2, with T, the KL the wrong way round, the teacher left out, and a
    loss that overflows on large logits: each fails the loss check, and the accuracy check
    fails with it (no accuracy earned for a loss that is not the distillation loss)."""
    import torch.nn.functional as F

    def made(scale=None, reverse=False, teacher=True, naive=False):
        def loss(s, t, y, alpha, temperature):
            if not teacher:
                return F.cross_entropy(s, y)
            if naive:  # softmax, then log: overflows where the logits are large
                p, q = torch.softmax(t / temperature, 1), torch.softmax(s / temperature, 1)
                soft = (p * (p.log() - q.log())).sum(1).mean()
            else:
                a, b = F.log_softmax(s / temperature, 1), F.log_softmax(t / temperature, 1)
                soft = F.kl_div(b, a, log_target=True, reduction="batchmean") if reverse else \
                    F.kl_div(a, b, log_target=True, reduction="batchmean")
            k = temperature ** 2 if scale is None else scale(temperature)
            return alpha * F.cross_entropy(s, y) + (1 - alpha) * k * soft
        return loss
    cases = {"not multiplied by T^2": made(scale=lambda t: 1.0), "multiplied by T, not T^2": made(scale=lambda t: t),
             "wrong way round": made(reverse=True), "teacher is left out": made(teacher=False),
             "or its gradient differs": made(naive=True)}
    for said, loss in cases.items():
        ns = solution("07")
        ns["distillation_loss"] = loss
        found = checks.run("07", ns, only=("07-distill-loss",), keep=False)
        assert found["07-distill-loss"].status == "fail" and said in found["07-distill-loss"].note, (said, found)
        assert found["07-distill-accuracy"].status == "fail", (said, found["07-distill-accuracy"])


def test_07_distillation_is_graded_where_the_profile_grades_accuracy(monkeypatch):
    """At a profile that grades speed (tiny, with a few steps), the distilled and the alone networks
    are trained, one pair per seed, and the gap is measured: the code path of the real profile."""
    monkeypatch.setenv("LAB_PROFILE", "tiny:grades_speed=1")
    monkeypatch.setattr(ls.compress, "TRAIN_STEPS", 2)
    monkeypatch.setattr(ls.compress, "DISTILL_STEPS", 3)
    found = checks.run("07", solution("07"), only=("07-distill-loss",), keep=False)
    accurate = found["07-distill-accuracy"]
    assert accurate.status in ("pass", "fail") and accurate.measured is not None, accurate
    assert len(accurate.details["alone"]) == len(ls.compress.DISTILL_SEEDS), accurate


@pytest.mark.long  # a profile that grades speed, with Inductor building int8 and fp32 models (38 s in ci5)
def test_07_int8_speed_is_graded_at_a_profile_that_grades_speed(monkeypatch):
    """Speed and accuracy, measured where the profile grades them (tiny, with a few steps only):
    the reference's int8 model, rebuilt from its export and compiled the lab's way, is compared
    paired with fp32 compiled the same way (no 05 code needed)."""
    monkeypatch.setenv("LAB_PROFILE", "tiny:grades_speed=1")
    monkeypatch.setattr(ls.compress, "TRAIN_STEPS", 2)  # a profile that grades speed trains 160 steps
    found = checks.run("07", solution("07"), only=("07-int8-speedup",), keep=False)
    fast = found["07-int8-speedup"]
    assert fast.status in ("pass", "fail") and fast.measured > 0 and "compiled the lab's way" in fast.note, fast
    assert found["07-int8-accuracy"].measured is not None


def test_07_serves_with_freezing_on_whatever_05_chose():
    """On a GPU the right 05 answer is a plain ``torch.compile(model)``, which leaves Inductor's
    freezing off; without it the int8 lowering fails. 07 compiles its CPU models the lab's way
    (``compress.compiled``) inside ``compress.serving()``, which turns freezing on (and off again after)."""
    import torch._inductor.config as inductor
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 6 * 6, 4)).eval()
    x = torch.randn(2, 3, 8, 8)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    with ls.compress.quiet():
        prepared = prepare_pt2e(torch.export.export(model, (x,), strict=True).module(), quantizer)
        prepared(x)
        int8 = convert_pt2e(prepared)
    torch.compiler.reset()
    with inductor.patch(freezing=False):  # what a plain 05 answer leaves (the reference's sets it)
        with ls.compress.serving():
            assert inductor.freezing and not torch.is_grad_enabled()
            fast = ls.compress.compiled(int8)
            got = fast(x)
        assert not inductor.freezing
    with torch.no_grad():
        want = int8(x)  # eager: float32 between its quantise and dequantise steps, not the int8 kernels
    assert got.shape == want.shape and float((got - want).norm() / want.norm()) < 0.2


def test_02_an_epoch_that_repeats_a_batch_fails_even_unfinished():
    """Honest for one epoch, then the same batch again and again: the timing never finishes the
    second epoch, and at the real profile its labels would not exceed the dataset's counts for a
    hundred batches; the batch fingerprint catches the second copy."""
    from labsupport.grading import partners

    batches = [(torch.full((2, 3, 8, 8), float(i)) + torch.rand(2, 3, 8, 8), torch.tensor([i, i + 1]))
               for i in range(4)]

    class Honest:
        def __len__(self):
            return len(batches)

        def __iter__(self):
            return iter(batches)

    class ThenForever(Honest):
        epochs = 0

        def __iter__(self):
            ThenForever.epochs += 1
            if ThenForever.epochs == 1:
                yield from batches
            while True:
                yield batches[0]

    # A large dataset's labels, as at the real profile: three copies of one batch exceed no count.
    expected, kinds = torch.arange(5).repeat_interleave(100), {((3, 8, 8), torch.float32)}
    for loader, want in ((Honest(), ""), (ThenForever(), "served more than once")):
        recorder = partners.EpochRecorder(loader)
        for _ in range(2):
            for k, _batch in enumerate(recorder):
                if k == 2:
                    break
        assert (want in recorder.problems(expected, 2, kinds)) if want else recorder.problems(expected, 2, kinds) == ""


def test_03_says_what_precision_its_fp32_baseline_ran_in_on_cuda():
    """On a GPU the speedup's fp32 step is fp32 as PyTorch runs it by default (TF32 convolutions on
    Ampere and newer); the note says which, read from torch's settings (no GPU needed to read them)."""
    from labsupport import train
    from labsupport.grading import g03_amp

    assert g03_amp.baseline_precision(torch.device("cpu")) == ""
    with train.exact_fp32():
        assert "convolutions in ieee, matmuls in ieee" in g03_amp.baseline_precision(torch.device("cuda"))
    conv = torch.backends.cudnn.conv.fp32_precision
    try:
        torch.backends.cudnn.conv.fp32_precision = "tf32"
        assert "convolutions in tf32" in g03_amp.baseline_precision(torch.device("cuda"))
    finally:
        torch.backends.cudnn.conv.fp32_precision = conv
