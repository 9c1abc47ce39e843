"""The naive pipeline and the training-step builder run for every knob available on CPU, and the
knobs that promise the same update (checkpointing, accumulation) really give it."""

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


KNOBS = {
    "fp32": StepConfig(),
    "bf16": StepConfig(amp_dtype="bfloat16"),
    "bf16+channels_last": StepConfig(amp_dtype="bfloat16", channels_last=True),
    "checkpoint-1": StepConfig(checkpoint_segments=1),
    "checkpoint-4": StepConfig(checkpoint_segments=4),
    "checkpoint-9": StepConfig(checkpoint_segments=9),
    "accumulate-3": StepConfig(accumulation_steps=3),
    "everything-but-compile": StepConfig(amp_dtype="bfloat16", channels_last=True,
                                         checkpoint_segments=2, accumulation_steps=2),
}


@pytest.mark.parametrize("name", KNOBS)
def test_every_knob_trains(name):
    step = make_step(KNOBS[name], "cpu")
    before = copy.deepcopy(step.model.state_dict())
    images, labels = _batch()
    losses = [step(*step.to_device(images, labels)) for _ in range(2)]
    assert all(torch.isfinite(loss) and loss.dtype == torch.float32 for loss in losses)
    changed = [k for k, v in step.model.state_dict().items()
               if v.is_floating_point() and not torch.equal(v, before[k])]
    assert "fc.weight" in changed and "conv1.weight" in changed, f"{name}: parameters did not move"


def test_fp16_with_grad_scaler_skips_overflowing_steps_then_trains():
    # fp16 autocast runs on CPU but through slow reference kernels (about 7 s per ResNet-18 step
    # at 32 px, batch 8, here), so this uses a small net. Inputs of magnitude ~100 make the
    # scaled fp16 gradients (x 2**16 at first) overflow: those steps must be skipped, with the
    # parameters untouched, and the scale halved until the gradients fit.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 10))
    step = TrainStep(net, StepConfig(amp_dtype="float16", grad_scaler=True), "cpu")
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


@pytest.mark.slow
def test_compiled_step_trains_and_matches_eager():
    images, labels = _batch()
    eager, compiled = make_step(StepConfig(), "cpu"), make_step(StepConfig(compiled=True), "cpu")
    loss_e = eager(*eager.to_device(images, labels))
    loss_c = compiled(*compiled.to_device(images, labels))
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-4)
    for (name, pe), pc in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(pc, pe, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")


def test_checkpointing_gives_the_same_gradients_and_batchnorm_stats():
    images, labels = _batch(n=4)
    plain, ckpt = make_step(StepConfig(), "cpu"), make_step(StepConfig(checkpoint_segments=3), "cpu")
    plain(images, labels)
    ckpt(images, labels)
    for (name, a), b in zip(plain.model.named_parameters(), ckpt.model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"gradient of {name} differs: {m}")
    # Recomputation must not update BatchNorm running statistics a second time.
    for (name, a), b in zip(plain.model.named_buffers(), ckpt.model.buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"buffer {name} differs: {m}")


def test_accumulation_gives_the_large_batch_update():
    # No BatchNorm here: with it, micro-batches see other batch statistics, so the update
    # legitimately differs (notebook 04 covers that case).
    def net():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(8, 10))

    images, labels = _batch(n=10)
    big = TrainStep(net(), StepConfig(), "cpu")
    acc = TrainStep(net(), StepConfig(accumulation_steps=3), "cpu")  # uneven: 4 + 3 + 3
    torch.testing.assert_close(acc(images, labels), big(images, labels), rtol=1e-5, atol=1e-6)
    for a, b in zip(big.model.parameters(), acc.model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_bad_knobs_are_clear_errors():
    with pytest.raises(ValueError, match="amp_dtype"):
        StepConfig(amp_dtype="fp8")
    with pytest.raises(ValueError, match="choose 1 to 9"):
        make_step(StepConfig(checkpoint_segments=12), "cpu")


def test_evaluate_returns_accuracy(tiny_data, tiny):
    step = make_step(StepConfig(), "cpu")
    acc = train.evaluate(step, pipeline.naive_loader(tiny, root=tiny_data, split="val",
                                                     augment=False))
    assert 0.0 <= acc <= 1.0
