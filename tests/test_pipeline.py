"""The fixed input pipeline: decode-once caching and batched augmentation deliver the naive
loader's data (exactly, with augmentation off), every sample once per epoch, reproducibly."""

import torch

from labsupport import pipeline


def test_decode_once_then_normalize_equals_the_naive_loader(tiny_data, tiny):
    images, labels = pipeline.decode_once("val", size=tiny.image_size, root=tiny_data, progress=False)
    naive = next(iter(pipeline.naive_loader(tiny, root=tiny_data, split="val", augment=False)))
    n = len(naive[1])
    torch.testing.assert_close(pipeline.normalize(images[:n]), naive[0], rtol=0, atol=1e-6)
    assert torch.equal(labels[:n], naive[1])


def test_batch_augment_gives_normalised_images_of_the_right_size_reproducibly(tiny_data):
    images, _ = pipeline.decode_once("train", root=tiny_data, progress=False)
    one = pipeline.batch_augment(images[:8], 32, torch.Generator().manual_seed(0))
    two = pipeline.batch_augment(images[:8], 32, torch.Generator().manual_seed(0))
    assert one.shape == (8, 3, 32, 32) and one.dtype == torch.float32
    assert torch.equal(one, two), "the same generator seed must give the same augmentation"
    low = (0 - max(pipeline.MEAN)) / min(pipeline.STD)
    high = (1 - min(pipeline.MEAN)) / min(pipeline.STD)
    assert low - 1e-4 <= one.min() and one.max() <= high + 1e-4, "pixels stay inside [0, 1] before normalising"
    other = pipeline.batch_augment(images[:8], 32, torch.Generator().manual_seed(1))
    assert not torch.equal(one, other)


def test_the_reference_loader_sees_every_sample_once_per_epoch(tiny_data, tiny, monkeypatch):
    """02's reference make_fast_loader (the master's solution) on the lab's parts: shuffled epochs."""
    from autograder import reference
    from labsupport.hardware import Lab, describe_machine

    monkeypatch.setenv("LAB_DATA", str(tiny_data))
    lab = Lab(torch.device("cpu"), describe_machine(torch.device("cpu")), tiny, seed=0)
    loader = reference.solutions("02").make_fast_loader(lab)
    first = torch.cat([y for _, y in loader])
    second = torch.cat([y for _, y in loader])
    assert len(loader.labels) % tiny.batch_size == 0, "the tiny set divides into whole batches"
    assert len(first) == len(loader) * tiny.batch_size == len(loader.labels)
    assert not torch.equal(first, second), "each epoch is shuffled anew"
    assert torch.bincount(first, minlength=10).tolist() == torch.bincount(loader.labels, minlength=10).tolist()
    assert not hasattr(pipeline, "FastLoader"), "02's answer must not ship in labsupport"


def test_decode_once_collects_stale_loader_iterators_before_its_workers_fork(tiny_data):
    """A DataLoader iterator abandoned mid-epoch in a reference cycle is collected in this process
    before decode_once's workers fork. Left to the garbage collector, it could be collected inside
    a worker instead, whose copy's __del__ prints "AssertionError: can only test a child process"
    (seen in 02's graded cell). The collector is off here, so only decode_once can collect it."""
    import gc
    import weakref

    from torch.utils.data import DataLoader, TensorDataset

    abandoned = iter(DataLoader(TensorDataset(torch.arange(64)), batch_size=4, num_workers=2))
    next(abandoned)
    alive = weakref.ref(abandoned)
    cycle = [abandoned]
    cycle.append(cycle)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        del abandoned, cycle
        assert alive() is not None, "the cycle keeps the iterator until a collection"
        pipeline.decode_once("train", root=tiny_data, workers=2, progress=False)
        assert alive() is None, "decode_once forked its workers with a stale iterator still in memory"
    finally:
        if was_enabled:
            gc.enable()


def test_forever_keeps_no_batch_it_handed_out(tiny_data, tiny):
    """A batch held by the iterator would be freed inside the caller's next step, which the memory
    profiler reports as a block "allocated before the profiling started" (01)."""
    import weakref

    batches = pipeline.forever(pipeline.naive_loader(tiny, root=tiny_data))
    for _ in range(len(batches.loader) + 2):  # across an epoch's end
        images, labels = next(batches)
        gone = weakref.ref(images)
        del images, labels
        assert gone() is None, "forever still holds the batch it returned"


def test_forever_timed_records_each_batchs_wait_across_epochs():
    """06's end-to-end check reports its pipeline's data wait from these: a loader that pauses 20 ms
    per batch shows 20 ms per batch, an epoch's restart included; untimed, nothing is recorded."""
    import time

    class Paused:
        def __len__(self):
            return 2

        def __iter__(self):
            for i in range(2):
                time.sleep(0.02)
                yield i

    batches = pipeline.forever(Paused(), timed=True)
    assert [next(batches) for _ in range(5)] == [0, 1, 0, 1, 0]
    assert len(batches.waits_ms) == 5 and all(19 <= w < 200 for w in batches.waits_ms), batches.waits_ms
    assert pipeline.forever(Paused()).waits_ms is None
