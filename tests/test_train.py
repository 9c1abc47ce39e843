"""The naive pipeline and the training-step harness: its fp32 baseline, and a student's update and
network (the masters' reference solutions stand in) plugged into it, on CPU."""

import copy

import pytest
import torch
from torch import nn

from labsupport import pipeline, train
from labsupport.train import StepConfig, TrainStep, make_step


def _batch(n=8, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def test_naive_loader_yields_normalised_batches(tiny_data, tiny):
    loader = pipeline.naive_loader(tiny, root=tiny_data)
    assert loader.num_workers == 0 and not loader.pin_memory
    images, labels = next(iter(loader))
    assert images.shape == (tiny.batch_size, 3, tiny.image_size, tiny.image_size)
    assert images.dtype == torch.float32 and labels.dtype == torch.int64
    assert -3 < images.mean() < 3 and labels.max() < 10


def test_unaugmented_loader_is_deterministic(tiny_data, tiny):
    a = next(iter(pipeline.naive_loader(tiny, root=tiny_data, split="val", augment=False)))
    b = next(iter(pipeline.naive_loader(tiny, root=tiny_data, split="val", augment=False)))
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    assert torch.equal(a[1], b[1])


def test_baseline_pipeline_step_and_breakdown(tiny_data, tiny):
    batches = pipeline.forever(pipeline.naive_loader(tiny, root=tiny_data))
    step = make_step(StepConfig(), "cpu")
    loss = train.pipeline_step(batches, step)()
    assert isinstance(loss, float) and loss > 0  # the naive habit: .item() every step
    phases = train.phase_breakdown(batches, step, steps=2, warmup=0)
    assert set(phases) == set(train.PHASES)
    assert all(len(v) == 2 and min(v) > 0 for v in phases.values()), phases


def _reference(notebook):
    from autograder import reference

    return reference.solutions(notebook)


def _knobs():
    """Step builders: the lab's fp32 harness alone, and with the reference's own update and wrapper
    plugged in (the masters' solutions: the harness must run a student's code as it is)."""
    amp, ckpt = _reference("03").amp_train_step, _reference("04").checkpointed
    return {
        "fp32": dict(config=StepConfig()),
        "bf16": dict(config=StepConfig(amp_dtype="bfloat16"), update=amp),
        "bf16+channels_last": dict(config=StepConfig(amp_dtype=torch.bfloat16, channels_last=True), update=amp),
        "checkpoint-1": dict(config=StepConfig(checkpoint_segments=1), wrap=lambda m: ckpt(m, 1)),
        "checkpoint-9": dict(config=StepConfig(checkpoint_segments=9), wrap=lambda m: ckpt(m, 9)),
        "everything-but-compile": dict(config=StepConfig(amp_dtype="bfloat16", channels_last=True,
                                                         checkpoint_segments=2),
                                       update=amp, wrap=lambda m: ckpt(m, 2)),
    }


@pytest.mark.parametrize("name", ["fp32", "bf16", "bf16+channels_last", "checkpoint-1", "checkpoint-9",
                                  "everything-but-compile"])
def test_every_knob_trains(name):
    knob = _knobs()[name]
    step = make_step(knob.pop("config"), "cpu", **knob)
    before = copy.deepcopy(step.model.state_dict())
    images, labels = _batch()
    losses = [step(*step.to_device(images, labels)) for _ in range(2)]
    assert all(torch.isfinite(loss) and loss.dtype == torch.float32 for loss in losses)
    changed = [k for k, v in step.model.state_dict().items()
               if v.is_floating_point() and not torch.equal(v, before[k])]
    assert "fc.weight" in changed and "conv1.weight" in changed, f"{name}: parameters did not move"


def test_fp16_step_gets_an_enabled_scaler_that_skips_overflowing_steps():
    # fp16 autocast runs on CPU but through slow reference kernels (about 7 s per ResNet-18 step
    # at 32 px, batch 8, here), so this uses a small net. Inputs of magnitude ~100 make the
    # scaled fp16 gradients (x 2**16 at first) overflow: those steps must be skipped, with the
    # parameters untouched, and the scale halved until the gradients fit.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 10))
    step = TrainStep(net, StepConfig(amp_dtype="float16"), "cpu", update=_reference("03").amp_train_step)
    assert step.scaler.is_enabled() and not make_step(StepConfig(), "cpu").scaler.is_enabled()
    images, labels = _batch()
    images = images * 100
    start = step.scaler.get_scale()
    weights = [step.model[-1].weight.detach().clone()]
    for _ in range(20):
        assert torch.isfinite(step(images, labels))
        weights.append(step.model[-1].weight.detach().clone())
    assert step.scaler.get_scale() < start, "the scale never backed off: no overflow was seen"
    assert not torch.equal(weights[-1], weights[0]), "no step was ever applied"
    assert all(torch.isfinite(w).all() for w in weights), "an inf/NaN update was applied"


def test_a_students_update_is_broken_into_phases_by_hooks(tiny_data, tiny):
    """Hooks stamp forward, backward and optimizer inside a student's update; none are left behind."""
    batches = pipeline.forever(pipeline.naive_loader(tiny, root=tiny_data))
    step = make_step(StepConfig(amp_dtype="bfloat16"), "cpu", update=_reference("03").amp_train_step)
    phases = train.phase_breakdown(batches, step, steps=2, warmup=0)
    assert list(phases) == list(train.PHASES)
    assert all(len(v) == 2 and min(v) > 0 for v in phases.values()), phases
    assert not step.net._forward_hooks and not step.net._forward_pre_hooks


@pytest.mark.slow
@pytest.mark.long  # Inductor builds ResNet-18's training step in C++: 85 s beside make test's lanes (ci5)
def test_compiled_step_trains_and_matches_eager():
    images, labels = _batch()
    eager, compiled = make_step(StepConfig(), "cpu"), make_step(StepConfig(compiled=True), "cpu")
    loss_e = eager(*eager.to_device(images, labels))
    loss_c = compiled(*compiled.to_device(images, labels))
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-4)
    for (name, pe), pc in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(pc, pe, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_a_wrapped_network_trains_the_models_parameters():
    """``wrap`` (04's checkpointed network) is what forward calls; the optimizer updates the model."""
    images, labels = _batch(n=4)
    ckpt = _reference("04").checkpointed
    plain = make_step(StepConfig(), "cpu")
    wrapped = make_step(StepConfig(checkpoint_segments=3), "cpu", wrap=lambda m: ckpt(m, 3))
    assert wrapped.net is not wrapped.model
    plain(images, labels)
    wrapped(images, labels)
    for (name, a), b in zip(plain.model.named_parameters(), wrapped.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name} differs: {m}")


def test_bad_knobs_are_clear_errors():
    with pytest.raises(ValueError, match="amp_dtype"):
        StepConfig(amp_dtype="fp8")
    with pytest.raises(ValueError, match="amp_train_step"):
        make_step(StepConfig(amp_dtype="bfloat16"), "cpu")  # the lab's own step is float32 only


def test_evaluate_returns_accuracy(tiny_data, tiny):
    step = make_step(StepConfig(), "cpu")
    acc = train.evaluate(step, pipeline.naive_loader(tiny, root=tiny_data, split="val",
                                                     augment=False))
    assert 0.0 <= acc <= 1.0


@pytest.mark.parametrize("exported", [None, False, True], ids=["fresh", "after-torch-export", "after-strict-export"])
def test_exact_fp32_turns_tf32_off_and_restores_the_settings(exported):
    """Gradient comparisons run without TF32 (on by default for cuDNN convolutions on Ampere+),
    also after a torch.export (07's is strict), which sets cudnn.conv's own setting."""
    if exported is not None:
        torch.export.export(torch.nn.Conv2d(3, 4, 3), (torch.randn(1, 3, 8, 8),), strict=exported)
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision)
    with train.exact_fp32():
        assert (matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision) == ("ieee",) * 3
    assert (matmul.fp32_precision, cudnn.fp32_precision, cudnn.conv.fp32_precision) == before
