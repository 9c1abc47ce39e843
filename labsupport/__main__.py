"""Command line: ``python -m labsupport data|machine|baseline``.

- ``data``: generate (or verify) the lab dataset; idempotent.
- ``machine``: print the machine description, device class and scale profile.
- ``baseline``: the naive pipeline's steady-state throughput and its phase breakdown
  (what ``make run`` prints).
"""

from __future__ import annotations

import argparse
import sys
import time

import pandas as pd


def cmd_data(args) -> int:
    from . import dataset

    t0 = time.perf_counter()
    root = dataset.ensure(args.root, full_check=args.verify)
    n = sum(1 for _ in root.rglob("*.jpg"))
    print(f"Lab dataset ready: {root} ({n} images, {time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_machine(args) -> int:
    from .hardware import setup

    setup()
    return 0


def baseline_table(lab, root=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure the naive pipeline: throughput summary and per-phase breakdown tables."""
    from . import measure, pipeline, train

    loader = pipeline.naive_loader(lab.profile, root=root, seed=lab.seed)
    step = train.make_step(train.StepConfig(), lab.device, seed=lab.seed)
    batches = pipeline.forever(loader)
    p = lab.profile
    timing = measure.time_steps(train.pipeline_step(batches, step), lab.device,
                                warmup=p.warmup_steps, steps=p.measure_steps,
                                samples_per_step=p.batch_size, progress=True)
    phases = train.phase_breakdown(batches, step, steps=p.measure_steps, warmup=1)
    breakdown = pd.DataFrame({"median_ms": {k: float(pd.Series(v).median()) for k, v in phases.items()}})
    breakdown["share"] = breakdown["median_ms"] / breakdown["median_ms"].sum()
    summary = pd.DataFrame([timing.summary()], index=["naive baseline"])
    return summary, breakdown


def cmd_baseline(args) -> int:
    from . import dataset
    from .hardware import setup

    dataset.ensure(args.root)
    lab = setup()
    print(f"\nNaive baseline: PIL decode + per-sample augmentation in the main process, fp32, "
          f"batch {lab.profile.batch_size} at {lab.profile.image_size} px, loss.item() every step")
    summary, breakdown = baseline_table(lab, args.root)
    with pd.option_context("display.float_format", "{:.2f}".format):
        print("\nThroughput (steady state, after warm-up):")
        print(summary.to_string())
        print("\nWhere a step goes (synchronised at each phase boundary):")
        print(breakdown.to_string(formatters={"share": "{:.0%}".format}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labsupport", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="generate or verify the lab dataset")
    data.add_argument("--root", default=None, help="where to write it (default: data/lab-shapes)")
    data.add_argument("--verify", action="store_true", help="re-hash every file against the manifest")
    data.set_defaults(func=cmd_data)
    sub.add_parser("machine", help="describe this machine").set_defaults(func=cmd_machine)
    base = sub.add_parser("baseline", help="measure the naive pipeline")
    base.add_argument("--root", default=None, help="dataset root (default: the lab dataset)")
    base.set_defaults(func=cmd_baseline)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
