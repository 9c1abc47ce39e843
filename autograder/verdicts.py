"""Root's side of the verdict processes: each notebook's checks re-run outside the student's
kernel, on what it takes from the kernel, in the submission's sandbox; its verdicts read back.

After nbgrader has run a notebook, :func:`run` gives the process what it may take of the
kernel's (the code the notebook's checks carried forward, copied through :mod:`.boundary` into a
fresh folder of root's) and starts it: the judge (:mod:`labsupport.grading.judging`, a process
of root's that runs no student code and drives two sandboxed workers, each in its own cgroup:
:func:`worker_groups`), or for the notebooks it does not judge the verdict process
(:mod:`labsupport.grading.verdict`, in the sandbox). What it measured comes back as a verdict,
which :mod:`.deciding` decides check by check.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from labsupport import notebooks
from labsupport.grading import judge_setup, judging

from . import boundary, sandbox, sandbox_memory, sandbox_users

ENV_KEPT = ("PATH", "LANG", "LC_ALL", "ONEDNN_MAX_CPU_ISA", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS")  # what the verdict process inherits from the grader


def environment(extra: dict[str, str]) -> dict[str, str]:
    """The verdict process's environment: a few of the grader's variables, then ``extra``."""
    return {**{k: os.environ[k] for k in ENV_KEPT if k in os.environ}, **extra}


VERDICT_BYTES = 4 * 2**20  # a verdict file is a few KB


def run(number: str, *, dirs, since: float, settings: dict[str, str], box: sandbox.Sandbox | None,
        pythonpath: Path | None, timeout_s: float, env: dict[str, str] | None = None,
        worker_pythonpath: Path | None = None) -> dict:
    """Run notebook ``number``'s verdict process; returns its verdicts (``{"error": ...}`` if none).

    ``dirs`` are the submission's folders (:class:`.batch.Folders`). What the process takes from the kernel,
    the code its checks carried forward (``code/<NN>.pkl``, bytes only: root never unpickles it), is read from the
    kernel's results store through :mod:`.boundary` into ``inputs/<NN>/``, a fresh folder root owns
    and the sandbox sees read-only, beside the spec; the process copies them into the grader's
    store itself. Its verdict comes back as a file in ``outbox/``, read the same bounded way, and
    its output over a pipe, kept up to a cap: root follows, chmods and writes nothing the sandbox
    could have replaced. A judge's workers import labsupport from ``worker_pythonpath`` (a copy
    without the checks and partners: :func:`labsupport.grading.judge_setup.worker_lab_copy`)
    where given, the judge itself from ``pythonpath``.
    """
    inputs = dirs.inputs / number
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    if dirs.judged.is_dir():  # what earlier judges kept (root's own files): their checks, rungs and code
        shutil.copytree(dirs.judged, inputs / "judged", symlinks=True)
    problems = []
    judged = judge_setup.judges(number, settings["profile"])
    # What the process takes, from where: the kernel's carried code; for a judged
    # notebook, also the earlier notebooks' carried code its student worker runs, as this grader
    # kept it (root's copy where a judge decided that notebook, else the store its verdict wrote).
    # and its readable copy (code/<NN>.py: never loaded, kept for the instructor and the student to read).
    wanted = [(dirs.results, f"code/{number}.pkl"), (dirs.results, f"code/{number}.py")]
    for earlier in judge_setup.earlier_code(number) if judged else ():
        name = f"code/{earlier}.pkl"
        wanted.append((dirs.judged if (dirs.judged / name).is_file() else dirs.store, name))
        changed = _changed_since_checked(dirs, name)
        if changed:
            problems.append(changed)
    taken = {}  # where in inputs a file goes, where not under its own name
    if judged and judge_setup.setup_of(number).reads_ladder:
        # 06 judges the report its kernel exported, and the ladder: the judges' rungs are root's
        # own; a verdict process's (02's on CUDA) is taken from the store it wrote.
        wanted.append((dirs.report, "report.html"))
        for nb in notebooks.rungs():
            if not (dirs.judged / f"{nb.stage}.json").is_file():
                wanted.append((dirs.store, f"{nb.stage}.json"))
                taken[f"{nb.stage}.json"] = f"rungs/{nb.stage}.json"
    for source, name in wanted:
        dest = inputs / taken.get(name, name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            boundary.copy_file(source, name, dest)
        except FileNotFoundError:
            pass  # never written: the checks say what is missing
        except OSError as err:
            problems.append(f"{'the kernel' if source == dirs.results else 'the grader'}'s {name} was not taken: {err}")
    for path in [inputs, *inputs.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    if judged:
        return _judge(number, inputs, dirs=dirs, since=since, settings=settings, box=box, pythonpath=pythonpath,
                      timeout_s=timeout_s, env=env, problems=problems, worker_pythonpath=worker_pythonpath)
    shutil.rmtree(dirs.outbox, ignore_errors=True)
    dirs.outbox.mkdir()
    if box is not None:
        sandbox_users.own(dirs.outbox)  # new, empty: nothing in it yet to follow
    out = dirs.outbox / f"verdict-{number}.json"
    spec = {"notebook": number, "store": str(dirs.store), "report": str(dirs.report / "report.html"),
            "since": since, "out": str(out), "inputs": str(inputs), **settings}
    (inputs / "spec.json").write_text(json.dumps(spec, indent=1))
    (inputs / "spec.json").chmod(0o644)
    argv = [sys.executable, "-m", "labsupport.grading.verdict", str(inputs / "spec.json")]
    env = environment({**({"PYTHONPATH": str(pythonpath)} if pythonpath else {}), **(env or {})})
    if box is not None:
        argv = box.command(argv)
    done = boundary.run(argv, env=env, timeout_s=timeout_s, on_timeout=sandbox_users.kill_all if box else None)
    if box is not None:
        sandbox_users.kill_all()
    if done.timed_out:
        return {"error": f"the verdict process ran past {timeout_s:.0f} s", "seconds": done.seconds}
    try:
        verdict = json.loads(boundary.read(dirs.outbox, out.name, VERDICT_BYTES))
        if not isinstance(verdict, dict) or not isinstance(verdict.get("checks", {}), dict):
            raise ValueError("not a verdict")
    except (OSError, ValueError) as err:
        why = f"{err}" if isinstance(err, boundary.Refused) else done.last_line()
        return {"error": f"the verdict process wrote no verdicts (exit {done.returncode}): {why}",
                "seconds": done.seconds}
    verdict["seconds"] = done.seconds
    verdict.setdefault("problems", []).extend(problems)
    return verdict


def _changed_since_checked(dirs, name: str) -> str:
    """A note where the kernel's copy of carried code ``name`` (``code/<NN>.pkl`` in its results
    store) is not the one root kept when that notebook's checks were judged: a later kernel changed
    it. The judge takes root's copy either way; the note says so."""
    ours = dirs.judged / name
    if not ours.is_file():
        return ""
    try:
        theirs = boundary.read(dirs.results, name)
    except OSError:  # removed, or not a plain file (root follows no link)
        theirs = None
    if theirs == ours.read_bytes():
        return ""
    return (f"{name} in your results store is not the code notebook {Path(name).stem}'s checks measured "
            "(it was changed or removed after they ran): the grader used the code they measured")


def _judge(number: str, inputs: Path, *, dirs, since: float, settings: dict[str, str], box: sandbox.Sandbox | None,
           pythonpath: Path | None, timeout_s: float, env: dict[str, str] | None, problems: list[str],
           worker_pythonpath: Path | None = None) -> dict:
    """Notebook ``number``'s verdicts from the judge (:mod:`labsupport.grading.judging`): a process
    of root's that runs no student code, driving the student's code and the baseline in two
    workers, each in the submission's sandbox. Its verdict is a file of root's own."""
    out = dirs.work / f"judge-{number}.json"
    out.unlink(missing_ok=True)
    dirs.judged.mkdir(exist_ok=True)
    lib = worker_pythonpath or pythonpath  # the workers': no checks, no partners
    workers_env = environment({**({"PYTHONPATH": str(lib)} if lib else {}), **(env or {})})
    # The judge (root's) never gets the submission's Inductor cache (TORCHINDUCTOR_CACHE_DIR): a
    # folder the sandbox writes, which root must not write into; it compiles nothing anyway.
    inner = {k: v for k, v in environment({**({"PYTHONPATH": str(pythonpath)} if pythonpath else {}),
                                           **(env or {})}).items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    # The workers see the dataset, labsupport and the carried code, read-only, and write nowhere
    # but their own /tmp and the submission's Inductor cache (05 compiles, and reuses what its
    # kernel compiled): not the grader's store, which later notebooks' verdicts read.
    cache = env.get("TORCHINDUCTOR_CACHE_DIR") if env else None
    readable = () if box is None else tuple(Path(lib) if lib and pythonpath and Path(p) == Path(pythonpath) else p
                                            for p in box.readable)
    worker_box = None if box is None else sandbox.Sandbox(writable=(Path(cache),) if cache else (),
                                                          readable=readable)
    spec = {"notebook": number, "inputs": str(inputs), "judged": str(dirs.judged), "out": str(out), "since": since,
            "sandbox": worker_box.command([], cwd=Path("/tmp")) if worker_box else [],
            "env": workers_env if worker_box else inner, **settings}
    groups, grouped = worker_groups(number, worker_box, problems, within=box.group if box else None)
    spec.update(grouped)
    (inputs / "judge.json").write_text(json.dumps(spec, indent=1))
    argv = [sys.executable, "-P", "-m", "labsupport.grading.judging", str(inputs / "judge.json")]
    try:
        done = boundary.run(argv, env={**inner, **judging.QUIET_WAIT}, timeout_s=timeout_s,
                            on_timeout=sandbox_users.kill_all if box else None)
    finally:  # whatever the judge did: its workers' groups go, with anything still in them
        for group in groups.values():
            group.remove()
    if box is not None:
        sandbox_users.kill_all()  # the workers, and anything they started
    if done.timed_out:
        return {"error": f"the judge ran past {timeout_s:.0f} s", "seconds": done.seconds}
    try:
        verdict = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"error": f"the judge wrote no verdicts (exit {done.returncode}): {done.last_line()}",
                "seconds": done.seconds}
    verdict["seconds"] = done.seconds
    verdict.setdefault("problems", []).extend(problems)
    return verdict


def worker_groups(number: str, worker_box: sandbox.Sandbox | None, problems: list[str], *,
                  within: Path | None = None) -> tuple[dict, dict]:
    """The judge's two workers' cgroup v2 groups (``{"student": Group, "baseline": Group}``), made
    here, as root, under this grader's (:func:`sandbox_memory.group_path`), empty, and what the judge's
    spec says of them: ``groups`` (their paths) and ``sandboxes`` (each worker's sandbox prefix,
    which joins its group as root before bwrap starts the worker: its first instruction is in it).
    The judge freezes each as a whole while it times the other; the caller removes them. None
    where there is no sandbox (the judge then makes its own, where it can) or none can be made
    (``problems`` says why, and the judge grades no speed comparing two sides). ``within``: the
    submission's own group, below which they are made, so that ending it (``cgroup.kill`` when a
    stopped ``grade`` ends its batch) ends the judge's workers too."""
    from labsupport.grading import cgroups

    if worker_box is None:
        return {}, {}
    try:
        groups = {}
        for role in ("student", "baseline"):
            name = f"judge-{number}-{role}"
            groups[role] = cgroups.Group.make(Path(within) / name if within else sandbox_memory.group_path(name))
            groups[role].kill()  # what a killed grader's judge left there, if anything
    except cgroups.CgroupError as err:
        for group in groups.values():
            group.remove()
        problems.append(f"the judge's workers get no cgroup ({err}): speed comparing two sides is not graded")
        return {}, {}
    return groups, {"groups": {role: str(g.path) for role, g in groups.items()},
                    "sandboxes": {role: replace(worker_box, group=g.path).command([], cwd=Path("/tmp"))
                                  for role, g in groups.items()}}
