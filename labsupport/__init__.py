"""labsupport: the helper package of the PyTorch Performance Lab (``import labsupport as ls``).

One module per idea; read any of them in one sitting:

- ``hardware``: the device, the machine description, and the table of device classes (profile,
  grading time limit, whether compile pays for training).
- ``notebooks``: the registry of the lab's notebooks (file, graded names, the rung each records, times).
- ``paths``: where results, the dataset and the report live (a Google Drive folder in Colab, flushed
  by every notebook's last cell).
- ``dataset``: the generated lab dataset (JPEG, ImageFolder layout) and its manifest.
- ``pipeline``: the naive input pipeline that notebooks 01 and 02 profile, and the parts of a fast one.
- ``train``: ResNet-18 and the harness of one training step (the student's update plugs into it).
- ``measure``: steady-state timing, paired A/B speedups, phase breakdowns, one-off timings.
- ``memory``: peak bytes of a step on any device, and bytes saved for backward.
- ``results``: the results store (one JSON file per stage) and its DataFrame view.
- ``carry``: the student's code of one notebook, kept for the notebooks after it.
- ``grading``: thresholds, verdicts and the self-check; one module of graded checks per notebook.
- ``report``: the optimisation ladder from the results store, its plots, the one-file HTML export.
- ``paired``: 06's paired ladder: every rung timed in one process, in interleaved rounds, with its spread.
- ``compress``: 07's harness: a trained fp32 model, and the size, latency and accuracy of a compressed one.
- ``distributed``: DDP over gloo in processes on this machine (08, optional).
- ``topics``: short measured topics beside the graded work (hooks, bandwidth, packed files, threads,
  training memory, export, attention).

Nothing in it answers a graded question: the reference solutions live with the instructor.
Importing it only imports: no seeding, no backend flags, no downloads. Call ``ls.setup()``.
"""

from . import (carry, compress, dataset, distributed, grading, hardware, measure, memory, notebooks,
               paths, pipeline, report, results, topics, train)
from .grading import check, paired
from .hardware import Lab, Profile, describe_machine, pick_device, profile_for, setup
from .train import StepConfig, TrainStep, make_step

__all__ = ["carry", "check", "compress", "dataset", "distributed", "grading", "hardware", "measure", "memory", "notebooks", "paired", "paths",
           "pipeline", "report", "results", "topics", "train",
           "Lab", "Profile", "describe_machine", "pick_device", "profile_for", "setup",
           "StepConfig", "TrainStep", "make_step"]
