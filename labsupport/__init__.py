"""labsupport: the helper package of the PyTorch Performance Lab (``import labsupport as ls``).

One module per idea; read any of them in one sitting:

- ``hardware``: the device, the machine description, device classes and scale profiles.
- ``dataset``: the generated lab dataset (JPEG, ImageFolder layout) and its manifest.
- ``pipeline``: the naive input pipeline that notebooks 01 and 02 profile and fix.
- ``train``: ResNet-18 and one training step with every knob the lab teaches.
- ``measure``: steady-state timing, paired A/B speedups, phase breakdowns, one-off timings.
- ``memory``: peak bytes of a step on any device, and bytes saved for backward.
- ``results``: the results store (one JSON file per stage) and its DataFrame view.
- ``grading``: thresholds per class and calibration, verdicts, correctness partners, self-check.
- ``checks``: each notebook's graded checks, which call the student's code and measure it now.
- ``report``: the optimisation ladder from the results store, its plots, the one-file HTML export.

Importing it only imports: no seeding, no backend flags, no downloads. Call ``ls.setup()``.
"""

from . import checks, dataset, grading, hardware, measure, memory, pipeline, report, results, train
from .grading import check
from .hardware import Lab, Profile, describe_machine, pick_device, profile_for, setup
from .train import StepConfig, TrainStep, make_step

__all__ = ["check", "checks", "dataset", "grading", "hardware", "measure", "memory", "pipeline",
           "report", "results", "train",
           "Lab", "Profile", "describe_machine", "pick_device", "profile_for", "setup",
           "StepConfig", "TrainStep", "make_step"]
