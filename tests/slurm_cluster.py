"""A one-node Slurm cluster on this machine, for the grading test: munged, slurmctld and slurmd.

Started as root from Debian's packages (``make test`` installs ``slurmctld slurmd slurm-client
munge``), with everything in one folder: its own munge key and socket, its own ports, state,
logs and PID files, and two fake GPUs (``gres.conf`` maps them to two character devices made in
the folder, which Slurm hands out as ``CUDA_VISIBLE_DEVICES`` 0 and 1). Nothing of the machine's
own configuration is read or changed. Every daemon started is stopped by its PID afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = (*DAEMONS, "sbatch", "squeue", "sinfo", "scancel", "mknod")


class Unavailable(RuntimeError):
    """The cluster did not come up here (the test skips, saying why)."""


def problem() -> str | None:
    """Why no cluster can be started here (None when one can)."""
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (as root: apt-get install slurmctld slurmd "
                "slurm-client munge; make test does it)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(folder: Path, gpus: int) -> str:
    node = socket.gethostname().split(".")[0]
    return "\n".join([
        "ClusterName=labtest",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",  # a task's processes stay on its CPUs, as on a real cluster
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "SchedulerType=sched/builtin",
        "ReturnToService=2",
        "MpiDefault=none",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} Gres=gpu:{gpus} State=UNKNOWN",
        f"PartitionName=lab Nodes={node} Default=YES MaxTime=INFINITE State=UP",
        ""]), f"NodeName={node} Name=gpu File={folder / 'fake-gpu'}[0-{gpus - 1}]\n"


@contextlib.contextmanager
def one_node_cluster(folder: Path, gpus: int = 2):
    """Start the cluster in ``folder``; yields ``.env`` (what its clients need: ``SLURM_CONF``)
    and ``.pids`` (each daemon's), and stops them all afterwards.

    Raises :class:`Unavailable`, with the daemons' log tails, when it does not come up in 60 s.
    """
    folder = Path(folder).resolve()
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # munged checks the socket's folder
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    for i in range(gpus):  # character devices (Slurm checks), of NVIDIA's major number, unused
        subprocess.run(["mknod", str(folder / f"fake-gpu{i}"), "c", "195", str(i)], check=True)
    conf, gres = _config(folder, gpus)
    (folder / "slurm.conf").write_text(conf)
    (folder / "gres.conf").write_text(gres)  # slurmd reads it beside slurm.conf
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    pids: dict[str, int] = {}
    try:
        try:
            _start(folder, key, env, pids)
        except (subprocess.CalledProcessError, OSError, Unavailable) as err:
            detail = getattr(err, "stderr", b"") or b""
            raise Unavailable(f"{err} {detail.decode(errors='replace')[-300:]} {logs(folder)}") from err
        yield SimpleNamespace(env={"SLURM_CONF": env["SLURM_CONF"]}, pids=pids, folder=folder)
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], capture_output=True, env=env)
        for daemon in reversed(DAEMONS):
            if daemon in pids:
                _stop(pids[daemon])


def _start(folder: Path, key: Path, env: dict, pids: dict) -> None:
    """munged, then slurmctld and slurmd; returns when the node is idle (raises Unavailable if not)."""
    subprocess.run(["munged", "--force", f"--socket={folder / 'munge.socket'}", f"--key-file={key}",
                    f"--log-file={folder / 'munged.log'}", f"--pid-file={folder / 'munged.pid'}",
                    f"--seed-file={folder / 'munged.seed'}"], check=True, capture_output=True)
    pids["munged"] = _pid(folder / "munged.pid")
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon, "-f", str(folder / "slurm.conf")], check=True, capture_output=True, env=env)
        pids[daemon] = _pid(folder / f"{daemon}.pid")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout
        if state.strip() == "idle":
            break
        time.sleep(0.5)
    else:
        raise Unavailable(f"the node never became idle (sinfo: {state.strip()!r})")


def logs(folder: Path, lines: int = 5) -> str:
    out = []
    for daemon in DAEMONS:
        path = Path(folder) / f"{daemon}.log"
        if path.is_file():
            out.append(f"{daemon}: " + " | ".join(path.read_text(errors="replace").splitlines()[-lines:]))
    return "; ".join(out)


def _pid(path: Path, wait_s: float = 10) -> int:
    """The PID a daemon wrote (it writes the file after forking, so wait for it)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):  # IndexError: created, not yet written
            return int(path.read_text().split()[0])
        time.sleep(0.1)
    raise Unavailable(f"{path} was never written")


def _stop(pid: int, wait_s: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``wait_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


running = _alive  # the test's check that every daemon was stopped
