"""Scenario submissions for the instructor pipeline's tests, built from the release and the masters.

Each scenario is what one kind of student hands in, as ``{notebook name: notebook}``; a notebook
left out of a scenario is a missing notebook (it scores 0). They are built, not committed, so
they follow the masters whenever the lab changes:

- ``reference``: the release with every solution cell taken from the master.
- ``unchanged``: the release as handed out.
- ``hardcoded``: prints and stores excellent numbers without doing the work (02 returns the naive
  loader, 03 trains in fp32, 05 does not compile).
- ``wrong-but-fast``: fast answers that are wrong (02 drops a batch per epoch after the first, 03 skips backward,
  04 accumulates without scaling the loss).
- ``monkeypatch``: no solutions, but a cell replaces labsupport's timing and grading functions
  (``measure.compare``, ``grading.judge``, ``checks.run``, ``check``) with ones that say pass.
- ``crash``: in 01, the cell that defines ``diagnose`` raises first.
- ``infinite-loop``: in 01, the cell that defines ``measure_throughput`` never ends.
- ``tampered``: in 02, no solution, and the test cells and the graded-checks cell are edited to
  pass.
- ``slow-loader``: the reference with a correct but slower 02 loader; 01, 04, 05 and 07 not submitted.
- ``reuse``: answers reused from where they used to ship.
- ``shortcuts``: each does less than the check times, and passed the checks before their
  correctness partners covered what is measured (02 decodes its training images at half
  resolution and resizes them up, 03 trains only the last layer when it finds labsupport's
  timing loop on its call stack and every layer otherwise, 04 runs one full batch whatever
  ``micro_batches`` says, 05 compiles a decoy and returns the eager model, 07 rounds the weights
  to int8 levels and keeps them in float32).
- ``honest-bugs``: mistakes a real student makes (01 counts the copy to the device as data wait
  and ranks operators by total time, 02 shuffles labels with their own permutation,
  03 forgets ``scaler.update()``, 04 checkpoints without freezing BatchNorm's statistics in the
  recomputation, 07 makes its pruning permanent before the fine-tune).
- ``patched-baseline``: the reference 02, plus a cell that slows ``PIL.Image.open``, which the
  naive loader (the baseline of the speedup) reads every image with.
- ``variant``: a correct 02 written differently from the master (module-level constants and a
  helper class beside the graded function, which only builds it).
- the attacks on the grader in ``attacks.py``: ``hostile``, ``cheater``, ``outsider``, ``filler``,
  ``sleeper``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

import attacks

from autograder import reference as answers


def _by_id(nb, grade_id: str):
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(f"no cell with grade_id {grade_id!r}")


def _insert_after(nb, grade_id: str, source: str) -> None:
    """Add a new code cell after the cell ``grade_id`` (students can add cells anywhere)."""
    index = nb.cells.index(_by_id(nb, grade_id))
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(source))


def _replace(source: str, old: str, new: str) -> str:
    """``source`` with ``old`` replaced; an error if the master no longer contains ``old``."""
    if old not in source:
        raise ValueError(f"the master's solution changed: {old!r} is not in it; update tests/scenarios.py")
    return source.replace(old, new, 1)


# A cell that slows the naive loader, the baseline of 02's speedup, in the student's kernel: the
# dataset's ImageFolder opens every image with PIL.Image.open.
PATCH_BASELINE = (
    "import time\n\nimport PIL.Image\n\n_open = PIL.Image.open\n\n\n"
    "def _slow_open(*args, **kwargs):  # the naive loader slower, my loader's speedup larger\n"
    "    time.sleep(0.01)\n    return _open(*args, **kwargs)\n\n\n"
    "PIL.Image.open = _slow_open\n")


# A step that looks for labsupport's timing on its call stack and does less there, as a clever
# student writes it after reading the student distribution: measure.compare's loop (in one
# process), or the call the grader's judge asks a worker for when it times a held step (03's
# HeldStep.run, the only call of it the checks make).
TIMED_FROM_MY_STACK = (
    "import sys\n\n\ndef _timed():\n"
    "    frame = sys._getframe(1)\n"
    "    while frame is not None:  # a timing loop, or a timed call, on my call stack\n"
    "        where, name = frame.f_code.co_filename, frame.f_code.co_name\n"
    "        if (where.endswith(\"measure.py\") and name in (\"compare\", \"block\")\n"
    "                or where.endswith(\"g03_amp.py\") and name == \"run\"):\n"
    "            return True\n"
    "        frame = frame.f_back\n"
    "    return False\n\n\n")


def reference(release: dict, masters: dict) -> dict:
    """The release with every solution cell (code and written answers) from the master."""
    return answers.submission(release, masters)


def build(scenario: str, release: dict, masters: dict) -> dict:
    """The notebooks of ``scenario`` (see the module docstring), keyed by notebook name."""
    ref = reference(release, masters)
    plain = copy.deepcopy(release)
    if scenario == "reference":
        return ref
    if scenario == "unchanged":
        return plain
    if scenario == "hardcoded":
        nbs = {n: ref[n] for n in ("02_data_loading", "03_amp", "05_compile")}
        _by_id(nbs["02_data_loading"], "make_fast_loader").source = (
            'def make_fast_loader(lab, split="train", augment=True):\n'
            '    return ls.pipeline.naive_loader(lab.profile, split=split, augment=augment)\n\n'
            'loader_speedup = 6.2\nprint("my loader: 6.2x faster than the naive one, data wait 0.4%")')
        _by_id(nbs["03_amp"], "amp_train_step").source = (
            "import torch.nn.functional as F\n\n\n"
            "def amp_train_step(model, optimizer, scaler, images, labels, dtype):\n"
            "    optimizer.zero_grad(set_to_none=True)\n"
            "    loss = F.cross_entropy(model(images), labels)  # fp32: no autocast\n"
            "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"
            "    return loss.detach()\n\n"
            'amp_speedup = 1.9\nprint("bf16 step: 1.9x faster, activations 45% of fp32")')
        _by_id(nbs["05_compile"], "compile_inference").source = (
            "def compile_inference(model):\n    return model  # not compiled\n\n"
            'compile_speedup = 1.8\nprint("compiled inference: 1.8x faster")')
        return nbs
    if scenario == "wrong-but-fast":
        nbs = {n: ref[n] for n in ("02_data_loading", "03_amp", "04_checkpointing")}
        _insert_after(nbs["02_data_loading"], "make_fast_loader", (
            "_honest_loader = make_fast_loader\n\n\n"
            'def make_fast_loader(lab, split="train", augment=True):\n'
            '    """Faster: after its first epoch (the one that used to be checked), it skips a batch."""\n'
            "    loader = _honest_loader(lab, split, augment)\n\n"
            "    class Dropping:\n"
            "        epochs = 0\n\n"
            "        def __len__(self):\n            return len(loader)\n\n"
            "        def __iter__(self):\n            self.epochs += 1\n            it = iter(loader)\n"
            "            if self.epochs > 1:\n                next(it)\n"
            "            yield from it\n"
            "    return Dropping()"))
        _by_id(nbs["03_amp"], "amp_train_step").source = (
            "import torch.nn.functional as F\n\n\n"
            "def amp_train_step(model, optimizer, scaler, images, labels, dtype):\n"
            "    with torch.autocast(images.device.type, dtype=dtype):\n"
            "        loss = F.cross_entropy(model(images), labels)\n"
            "    return loss.detach()  # no backward, no optimizer step: very fast")
        _by_id(nbs["04_checkpointing"], "accumulate_step").source = (
            "def accumulate_step(model, optimizer, images, labels, micro_batches):\n"
            "    optimizer.zero_grad(set_to_none=True)\n"
            "    total = torch.zeros((), device=images.device)\n"
            "    for x, y in zip(images.tensor_split(micro_batches), labels.tensor_split(micro_batches)):\n"
            "        loss = F.cross_entropy(model(x), y)  # not scaled by the micro-batch's share\n"
            "        loss.backward()\n        total += loss.detach()\n"
            "    optimizer.step()\n    return total / micro_batches")
        return nbs
    if scenario == "monkeypatch":
        nbs = {n: plain[n] for n in ("02_data_loading",)}
        patch = (
            "import labsupport, labsupport.grading, labsupport.measure\n"
            "from labsupport.grading import CheckResult\n\n\n"
            "def always_pass(check, measured, machine, **kwargs):\n"
            '    return CheckResult(check, 10.0, 1.0, "higher", machine["device_class"], "pass")\n\n\n'
            "class Ten:\n    median = 10.0\n\n\n"
            "class FakeComparison:\n    speedup = Ten()\n\n\n"
            "labsupport.grading.judge = always_pass\n"
            "labsupport.measure.compare = lambda *args, **kwargs: FakeComparison()\n"
            "labsupport.grading.run = lambda notebook, namespace, **kw: {}\n"
            "labsupport.check = lambda *args, **kwargs: None")
        _insert_after(nbs["02_data_loading"], "make_fast_loader", patch)
        return nbs
    if scenario == "crash":
        nbs = {"01_profile": ref["01_profile"]}
        cell = _by_id(nbs["01_profile"], "diagnose")
        cell.source = 'raise RuntimeError("a bug in my diagnose cell")\n\n' + cell.source
        return nbs
    if scenario == "infinite-loop":
        nbs = {"01_profile": ref["01_profile"]}
        cell = _by_id(nbs["01_profile"], "measure_throughput")
        # It waits asleep, as a cell polling for a result does: nbgrader's timeout interrupts it the
        # same way as a spinning loop, without taking a core from the graders beside it for the
        # minute the limit lasts.
        cell.source = ("import time\n\nwhile True:  # waits for a result that never comes\n    time.sleep(0.1)\n\n"
                       + cell.source)
        return nbs
    if scenario == "tampered":
        nbs = {"02_data_loading": plain["02_data_loading"]}
        nb = nbs["02_data_loading"]
        _by_id(nb, "graded_checks").source = (
            "from labsupport.grading import CheckResult\n\n"
            'graded = {c: CheckResult(c, 9.0, 1.0, "higher", "cpu", "pass")\n'
            '          for c in ("02-loader-speedup", "02-data-wait-share")}')
        for grade_id in ("test_loader_speedup", "test_data_wait"):
            cell = _by_id(nb, grade_id)
            cell.source = cell.source.splitlines()[0] + "\npass  # trust me"
        return nbs
    if scenario == "slow-loader":
        # The reference with a correct but slower 02 loader: the same batches, each after a pause.
        # Every later rung and 06's end-to-end check must use it (the student's own ladder).
        # 04 and 05 are not submitted, to keep the tests short: their rungs run the same carried
        # loader as 03's, through the same code (labsupport/grading/rungs.py); 07 records no rung.
        # Nor is 01: its baseline rung runs the naive loader, not the student's, and 06's
        # end-to-end check re-measures the naive baseline itself.
        nbs = {n: nb for n, nb in ref.items()
               if n not in ("01_profile", "04_checkpointing", "05_compile", "07_compression")}
        cell = _by_id(nbs["02_data_loading"], "make_fast_loader")
        cell.source = ("import time\n\n" + cell.source.replace("def make_fast_loader(", "def _decode_once_loader(", 1)
                       + "\n\n\ndef make_fast_loader(lab, split=\"train\", augment=True):\n"
                       "    loader = _decode_once_loader(lab, split, augment)\n\n"
                       "    class Slower:  # the same batches, each after a pause: correct, and slower\n"
                       "        def __len__(self):\n            return len(loader)\n\n"
                       "        def __iter__(self):\n            for batch in loader:\n"
                       "                time.sleep(0.05)\n                yield batch\n\n"
                       "    return Slower()\n")
        return nbs
    if scenario == "reuse":
        # Graded functions answered by the lab's former reference implementations (they shipped in
        # labsupport before the answers moved to the instructor's side) or by the instructor's own
        # reference module: neither exists where students, or their graded kernels, can import it.
        nbs = {n: ref[n] for n in ("02_data_loading", "03_amp", "04_checkpointing", "05_compile", "06_report")}
        _by_id(nbs["02_data_loading"], "make_fast_loader").source = (
            'def make_fast_loader(lab, split="train", augment=True):\n'
            '    return ls.pipeline.FastLoader(lab.profile, split=split, augment=augment, device=lab.device)\n')
        _by_id(nbs["03_amp"], "choose_precision").source = (
            "import torch\n\n\ndef choose_precision(machine):\n"
            "    dtype = ls.hardware.autocast_dtype(machine)\n"
            '    return {"dtype": dtype and getattr(torch, dtype), "channels_last": dtype is not None}\n')
        _by_id(nbs["04_checkpointing"], "checkpointed").source = (
            "def checkpointed(model, segments):\n    return ls.train.CheckpointedResNet(model, segments)\n\n\n"
            "SEGMENTS = 9\n")
        _by_id(nbs["05_compile"], "compile_inference").source = (
            "import torch\n\n\ndef compile_inference(model):\n"
            "    from autograder import reference  # the instructor's side\n"
            '    return reference.solutions("05").compile_inference(model)\n')
        _by_id(nbs["06_report"], "assemble_ladder").source = (
            "def assemble_ladder(frame):\n    return ls.report.ladder_from_frame(frame)\n")
        return nbs
    if scenario == "shortcuts":
        nbs = {n: ref[n] for n in ("02_data_loading", "03_amp", "04_checkpointing", "05_compile", "07_compression")}
        _by_id(nbs["07_compression"], "distillation_loss").source = (  # a student trained without the teacher
            "import torch.nn.functional as F\n\n\n"
            "def distillation_loss(student_logits, teacher_logits, labels, alpha, temperature):\n"
            "    return F.cross_entropy(student_logits, labels)  # the labels are what is graded, surely\n")
        _by_id(nbs["07_compression"], "quantize_int8").source = (
            "def quantize_int8(model, calibration):\n"
            "    with torch.no_grad():  # int8's rounding simulated in float32: its accuracy, without the export\n"
            "        for m in model.modules():\n"
            "            if isinstance(m, (nn.Conv2d, nn.Linear)):\n"
            "                scale = m.weight.abs().amax() / 127\n"
            "                m.weight.copy_((m.weight / scale).round().clamp(-128, 127) * scale)\n"
            "    return model\n")
        cell = _by_id(nbs["02_data_loading"], "make_fast_loader")
        cell.source = _replace(cell.source, "self.images, self.labels = ls.pipeline.decode_once(split, size=size)\n", (
            "self.images, self.labels = ls.pipeline.decode_once(split, size=size)\n"
            "            if split == \"train\":  # training images at half resolution: a quarter of the pixels to decode\n"
            "                half = ls.pipeline.decode_once(split, size=lab.profile.image_size // 2)[0]\n"
            "                self.images = torch.nn.functional.interpolate(\n"
            "                    half.float(), size=lab.profile.image_size, mode=\"bilinear\").round().clamp(0, 255).byte()\n"))
        cell = _by_id(nbs["03_amp"], "amp_train_step")
        cell.source = TIMED_FROM_MY_STACK + _replace(cell.source, "    optimizer.zero_grad(set_to_none=True)\n", (
            "    optimizer.zero_grad(set_to_none=True)\n"
            "    for name, p in model.named_parameters():  # timed, only the classifier learns: a cheaper backward\n"
            "        p.requires_grad_(name.startswith(\"fc.\") or not _timed())\n"))
        _by_id(nbs["04_checkpointing"], "accumulate_step").source = (
            "def accumulate_step(model, optimizer, images, labels, micro_batches):\n"
            "    optimizer.zero_grad(set_to_none=True)\n"
            "    loss = F.cross_entropy(model(images), labels)  # the micro-batches' gradients, in one pass\n"
            "    loss.backward()\n    optimizer.step()\n    return loss.detach()\n")
        _by_id(nbs["05_compile"], "compile_inference").source = (
            "import torch\n\n\ndef compile_inference(model):\n"
            "    decoy = torch.compile(lambda x: torch.relu(x) * 2)\n"
            "    decoy(torch.randn(8))  # Dynamo captures a graph, so something was compiled\n"
            "    return model\n")
        return nbs
    if scenario == "honest-bugs":
        nbs = {n: ref[n] for n in ("01_profile", "02_data_loading", "03_amp", "04_checkpointing", "07_compression")}
        cell = _by_id(nbs["07_compression"], "prune_globally")  # permanent at once: the fine-tune regrows the zeros
        cell.source = _replace(cell.source, "    return model\n",
                               "    for m, name in layers:\n        prune.remove(m, name)  # done: zeros in the weights\n"
                               "    return model\n")
        cell = _by_id(nbs["07_compression"], "distillation_loss")  # the soft term without its T^2
        cell.source = _replace(cell.source, "return alpha * task + (1 - alpha) * t * t * soft",
                               "return alpha * task + (1 - alpha) * soft")
        cell = _by_id(nbs["01_profile"], "labelled_step")
        cell.source = _replace(cell.source, (
            '    with record_function("data wait"):\n        batch = next(batches)\n'
            '    with record_function("host to device"):\n        images, labels = step.to_device(*batch)\n'), (
            '    with record_function("data wait"):  # the copy is part of getting the data, isn\'t it?\n'
            '        images, labels = step.to_device(*next(batches))\n'))
        cell = _by_id(nbs["01_profile"], "top_operators")
        cell.source = _replace(cell.source, 'key=lambda event: getattr(event, key)',
                               'key=lambda event: getattr(event, key.removeprefix("self_"))')  # total time
        cell = _by_id(nbs["02_data_loading"], "make_fast_loader")
        cell.source = _replace(cell.source, "self.gather(self.labels, idx)",
                               "self.gather(self.labels, label_order[i * b:(i + 1) * b])")
        cell.source = _replace(cell.source, "            for i in range(len(self)):\n", (
            "            label_order = torch.randperm(n, generator=self.order) if self.shuffle else torch.arange(n)\n"
            "            for i in range(len(self)):\n"))
        cell = _by_id(nbs["03_amp"], "amp_train_step")
        cell.source = _replace(cell.source, "    scaler.update()\n", "")
        cell = _by_id(nbs["04_checkpointing"], "checkpointed")
        imports, _ = cell.source.split("def checkpointed(", 1)
        cell.source = imports + (
            "def checkpointed(model, segments):\n"
            "    class Checkpointed(nn.Module):\n"
            "        def __init__(self):\n"
            "            super().__init__()\n"
            "            self.model = model\n"
            "            units = [nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool),\n"
            "                     *model.layer1, *model.layer2, *model.layer3, *model.layer4]\n"
            "            bounds = np.linspace(0, len(units), segments + 1).round().astype(int)\n"
            "            self.segments = [nn.Sequential(*units[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]\n\n"
            "        def forward(self, x):\n"
            "            for segment in self.segments:  # BatchNorm updates its statistics again when recomputed\n"
            "                x = checkpoint(segment, x, use_reentrant=False)\n"
            "            return model.fc(torch.flatten(model.avgpool(x), 1))\n\n"
            "    return Checkpointed()\n")
        return nbs
    if scenario == "patched-baseline":
        nbs = {"02_data_loading": ref["02_data_loading"]}
        _insert_after(nbs["02_data_loading"], "make_fast_loader", PATCH_BASELINE)
        return nbs
    if scenario == "variant":
        nbs = {"02_data_loading": ref["02_data_loading"]}
        _by_id(nbs["02_data_loading"], "make_fast_loader").source = VARIANT_HELPERS + "\n\n" + VARIANT_LOADER
        return nbs
    if scenario in attacks.ATTACKS:
        return attacks.build(scenario, ref, plain)
    raise ValueError(f"unknown scenario {scenario!r}")


# A correct 02 written as many students write it: constants and a helper class at module level
# beside the graded function, which only builds it.
VARIANT_HELPERS = '''import torch

SHUFFLED_SPLITS = ("train",)  # the split whose order changes every epoch
PINNED = torch.cuda.is_available()


class DecodedBatches:
    """Decode a split once; serve batches made with tensor ops on the training device."""

    def __init__(self, lab, split, augment):
        self.lab, self.augment = lab, augment
        self.images, self.labels = ls.pipeline.decode_once(split, size=None if augment else lab.profile.image_size)
        self.shuffle = split in SHUFFLED_SPLITS
        self.order = torch.Generator().manual_seed(lab.seed)
        self.random = torch.Generator(lab.device).manual_seed(lab.seed)

    def _take(self, cache, idx):
        if not PINNED or self.lab.device.type != "cuda":
            return cache.index_select(0, idx).to(self.lab.device)
        batch = torch.empty((len(idx), *cache.shape[1:]), dtype=cache.dtype, pin_memory=True)
        torch.index_select(cache, 0, idx, out=batch)
        return batch.to(self.lab.device, non_blocking=True)

    def __len__(self):
        n, b = len(self.labels), self.lab.profile.batch_size
        return n // b if self.shuffle else -(-n // b)

    def __iter__(self):
        n, b = len(self.labels), self.lab.profile.batch_size
        order = torch.randperm(n, generator=self.order) if self.shuffle else torch.arange(n)
        for i in range(len(self)):
            idx = order[i * b:(i + 1) * b]
            images, labels = self._take(self.images, idx), self._take(self.labels, idx)
            if self.augment:
                yield ls.pipeline.batch_augment(images, self.lab.profile.image_size, self.random), labels
            else:
                yield ls.pipeline.normalize(images), labels
'''
VARIANT_LOADER = '''def make_fast_loader(lab, split="train", augment=True):
    """My loader: the helper class above does the work."""
    return DecodedBatches(lab, split, augment)
'''

SCENARIOS = ("reference", "unchanged", "hardcoded", "wrong-but-fast", "monkeypatch", "crash",
             "infinite-loop", "tampered", "reuse", "slow-loader", "shortcuts", "honest-bugs",
             "patched-baseline", "variant") + attacks.ATTACKS


def _read(paths) -> dict:
    """``{name: notebook}`` of the notebook files ``paths``."""
    return {p.stem: nbformat.read(p, as_version=4) for p in paths}


def from_checkout(scenario: str) -> dict:
    """``scenario``'s notebooks, built from the committed release (notebooks/, which test_course
    proves is what the masters generate) and the masters, without running nbgrader."""
    from autograder import course

    return build(scenario, _read(sorted(course.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))), _read(course.masters()))


def write(scenario: str, release_dir: Path, masters_dir: Path, folder: Path) -> list[Path]:
    """Write ``scenario``'s notebooks into ``folder`` (a student's submission folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, nb in build(scenario, _read(sorted(Path(release_dir).glob("*.ipynb"))),
                          _read(sorted(Path(masters_dir).glob("*.ipynb")))).items():
        path = folder / f"{name}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Write scenario submissions into an inbox, for ``python -m autograder collect``.

    Regenerates the course's release first (nbgrader generate_assignment). This is how the grades
    are proven at the real profile on a grading machine (the stability figures in
    autograder/README.md): write the scenarios, collect, calibrate, grade.
    """
    import argparse
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from autograder import course, release

    p = argparse.ArgumentParser(prog="python tests/scenarios.py", description=main.__doc__.split("\n\n")[0])
    p.add_argument("inbox", type=Path, help="where the per-student folders go (one per scenario)")
    p.add_argument("scenario", nargs="*", default=list(SCENARIOS),
                   help=f"scenarios to write (default: all): {', '.join(SCENARIOS)}")
    p.add_argument("--course", type=Path, default=course.COURSE_ROOT,
                   help="the course root (default: %(default)s)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.scenario) - set(SCENARIOS))
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    release_dir = release.generate(args.course)  # nbgrader generate_assignment: the release as students get it
    for scenario in args.scenario:
        written = write(scenario, release_dir, course.masters_dir(args.course), args.inbox / scenario)
        print(f"{scenario:15s} {len(written)} notebook(s) in {args.inbox / scenario}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
