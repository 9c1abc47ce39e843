"""A training step timed call by call, each call from the same start: what runs where the step
runs (a worker, or the notebook's own process), and keeps what each call did for the
correctness partners (:mod:`.partners`) to check. No check and no expected answer.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch


@dataclasses.dataclass
class Call:
    """What one call of a :class:`FromOneStart` step did (tensors stay on the step's device)."""

    update: torch.Tensor | None  # the weights' change at the sampled positions: (weight tensors, SAMPLES)
    loss: torch.Tensor
    convolutions: int  # Conv2d forwards run, recomputation included (0 where not counted)
    batch: tuple | None = None  # (images, labels) it trained on, where the step was told to keep them
    scale: tuple | None = None  # a float16 GradScaler's scale before and after (a skipped step halves it)
    where: int = 0  # the seed its sampled positions were drawn from


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s weights and BatchNorm buffers now: a :class:`FromOneStart`'s start."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


class FromOneStart:
    """A training step whose every call starts from the same weights and keeps what the call did:
    its loss, and its update at a sample of every weight tensor.

    The speed checks time this step call by call, the baseline's wrapped the same way, so
    :func:`updates_alike` can check the calls that were timed, not only untimed ones before the
    timing: a step that does less when it is timed (skips backward or some layers, trains on a
    smaller image, skips its recomputation) shows in the timed calls. Before each call the
    weights and BatchNorm buffers are put back to ``start`` and SGD's momentum to zero, so an
    update is the learning rate times this call's gradient. ``batch`` is one ``(images,
    labels)`` for every call (03, 04), or a function giving the next one (06: the student's
    loader). Both sides pay the same small cost on the clock (at 64 px on 2 cores about 1% of a
    step); nothing here synchronises the device.

    Calling it runs one step (:meth:`run`) and samples its update at positions drawn from ``seed``
    and the call's number, the same for both sides. The grader's judge calls the two halves
    apart, across a worker's channel, and draws each call's positions only after its step
    returned, so that no step can know in advance which of its numbers are read.
    """

    SAMPLES = 64  # per weight tensor (16 left an honest bf16 step at cosine 0.80-0.96 at the tiny profile)

    def __init__(self, step, start: dict[str, torch.Tensor], batch, seed: int = 0, keep: bool = False,
                 count_convolutions: bool = False):
        self.step, self.start, self.keep, self.seed = step, start, keep, seed
        self._batch = batch if callable(batch) else (lambda: batch)
        model = step.model
        tensors = dict(itertools.chain(model.named_parameters(), model.named_buffers()))
        missing = sorted(set(start) - set(tensors))
        if missing:
            raise ValueError(f"the step's model has no {missing[0]}: it is not the lab's ResNet-18")
        with torch.no_grad():  # the start, in each tensor's own layout (channels_last stays so)
            self._put_back = [(tensors[name], torch.empty_like(tensors[name]).copy_(value))
                              for name, value in start.items()]
        starts = {name: value for name, (_, value) in zip(start, self._put_back)}
        self.names = [name for name, _ in model.named_parameters()]
        self._weights = [(p, starts[name]) for name, p in model.named_parameters()]
        self.calls: list[Call] = []
        self._convolutions = 0
        # Forward hooks on every Conv2d (04's recomputation runs through them too); not on a step
        # that may be compiled (06), whose graphs a hook added now would have to be traced again.
        for module in model.modules() if count_convolutions else ():
            if isinstance(module, torch.nn.Conv2d):
                module.register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        self._convolutions += 1

    def put_back(self) -> None:
        with torch.no_grad():
            for tensor, value in self._put_back:
                tensor.copy_(value)
            for state in self.step.optimizer.state.values():
                if state.get("momentum_buffer") is not None:
                    state["momentum_buffer"].zero_()

    def _scale(self):
        scaler = self.step.scaler  # its scale as a tensor, read without a sync (get_scale() syncs)
        return scaler._scale.detach().clone() if scaler.is_enabled() and scaler._scale is not None else None

    def run(self) -> torch.Tensor:
        """One step from the start on the next batch; recorded as a call whose update is not yet
        sampled (:meth:`update_at`). Returns its loss."""
        images, labels = self._batch()
        self.put_back()
        self._convolutions = 0
        before = self._scale()
        loss = self.step(images, labels)
        kept = (images.clone() if images.device.type == "cpu" else images, labels.clone()) if self.keep else None
        self.calls.append(Call(None, torch.as_tensor(loss).detach(), self._convolutions, kept,
                               None if before is None else (before, self._scale())))
        return loss

    def update_at(self, seed: int) -> torch.Tensor:
        """The last call's update at :data:`SAMPLES` positions of every weight tensor, drawn from
        ``seed``: ``(weight tensors, SAMPLES)`` in float32, on the step's device."""
        generator = torch.Generator().manual_seed(seed)
        flat = [torch.randint(0, p.numel(), (self.SAMPLES,), generator=generator) for p, _ in self._weights]
        where = torch.stack(flat).to(self._weights[0][0].device)
        with torch.no_grad():
            update = torch.stack([p.detach()[torch.unravel_index(i, p.shape)].float()
                                  - start[torch.unravel_index(i, p.shape)].float()
                                  for (p, start), i in zip(self._weights, where)])
        if self.calls:
            self.calls[-1].update, self.calls[-1].where = update, seed
        return update

    def __call__(self) -> torch.Tensor:
        loss = self.run()
        self.update_at(self.seed * 1_000_003 + len(self.calls))
        return loss

    def settle(self, most: int = 24) -> None:
        """Call until a float16 GradScaler stops skipping steps from this start (each skip halves
        its scale), so that no timed call is one the scaler skipped; then forget those calls."""
        scaler = self.step.scaler
        for _ in range(most if scaler.is_enabled() else 0):
            scale = scaler.get_scale()
            self.run()
            if scaler.get_scale() == scale:
                break
        self.calls.clear()
