"""A real two-node Slurm cluster on this one host, for tests: munged, slurmctld, two slurmd.

`slurm_cluster(root)` writes `slurm.conf` and `gres.conf` under `root`, makes fake GPU character
devices there with `mknod` (Slurm's gres/gpu plugin sets `CUDA_VISIBLE_DEVICES` only for character
devices; regular files give an empty value), starts every daemon in the foreground as a child of
this process, waits until all nodes are idle, and on exit (also on error) cancels the jobs, stops
the daemons and any job step processes left behind, each by its pid.

Everything is private to `root`: munge key and socket (`AuthInfo=socket=`), state, spool, pid and
log files, and free ports on 127.0.0.1 picked at start. Clients reach the cluster through
`SLURM_CONF`, which `SlurmCluster.env` sets; nothing under /etc is read or written except Slurm's
compiled-in `plugstack.conf`.

Run as a script it keeps a cluster up while a command runs (handy to try a profile by hand):

    python tests/slurm/cluster.py /tmp/slurm-root -- snakemake --profile profiles/2node -j 16 ...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PROGRAMS = (
    "munged",
    "slurmctld",
    "slurmd",
    "scontrol",
    "sinfo",
    "squeue",
    "sbatch",
    "srun",
    "scancel",
)
MARKER = "CKPTEVAL_SLURM_TEST_ROOT"


class ClusterError(RuntimeError):
    """The test cluster could not be brought up; the message carries the daemon's log tail."""


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: where its files live and the environment its clients need."""

    root: Path
    nodes: tuple[str, ...]
    gpus_per_node: int
    cpus_per_node: int
    env: dict[str, str]

    @property
    def conf(self) -> Path:
        """The cluster's `slurm.conf`."""
        return self.root / "slurm.conf"

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float = 60,
        check: bool = True,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command (`sinfo`, `sbatch`, `srun`, ...) against this cluster."""
        return subprocess.run(
            list(args),
            env=self.env,
            cwd=cwd,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=check,
        )

    def node_states(self) -> dict[str, str]:
        """Node name -> Slurm state (`idle`, `mixed`, `allocated`, `down*`, ...)."""
        out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"], timeout=15).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def job_ids(self) -> list[str]:
        """Ids of the jobs the controller still lists (pending, running or completing)."""
        out = self.run(["squeue", "--noheader", "--format=%i"], timeout=15, check=False).stdout
        return out.split()


def missing_binaries() -> list[str]:
    """The Slurm and munge programs this harness needs that are not on PATH."""
    return [name for name in PROGRAMS if shutil.which(name) is None]


def free_ports(count: int) -> list[int]:
    """Distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def slurm_conf_text(
    root: Path,
    nodes: Sequence[str],
    ports: Sequence[int],
    *,
    gpus_per_node: int,
    cpus_per_node: int,
    real_memory_mb: int,
) -> str:
    """The one `slurm.conf` every daemon and client of the test cluster reads.

    `ports[0]` is slurmctld's, `ports[1:]` one per node. `config_overrides` lets a 2-core host
    advertise `cpus_per_node` CPUs and `real_memory_mb` memory per node; `MinJobAge=3600` keeps
    finished jobs visible to `squeue`, which the Snakemake plugin polls when there is no slurmdbd.
    `LLN=YES` starts each job on the node with the most idle CPUs, so two jobs running at once
    already sit on both nodes (without it, Slurm fills node1 first and a test needs more than 8
    GPU jobs at once to see node2: tests/test_slurm.py's workflow sweep then ran 17, each a Slurm
    job that parses the workflow twice).
    """
    host = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=ckpteval-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "MinJobAge=3600",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmdTimeout=300",
        "SchedulerParameters=sched_interval=2,bf_interval=2",
    ]
    for node, port in zip(nodes, ports[1:]):
        lines.append(
            f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus_per_node} RealMemory={real_memory_mb} Gres=gpu:{gpus_per_node} "
            "State=UNKNOWN"
        )
    lines.append(
        f"PartitionName=main Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP LLN=YES"
    )
    return "\n".join(lines) + "\n"


def gres_conf_text(device_dir: Path, nodes: Sequence[str], gpus_per_node: int) -> str:
    """`gres.conf`: node i owns fake devices i*gpus_per_node .. (i+1)*gpus_per_node-1."""
    lines = []
    for index, node in enumerate(nodes):
        first = index * gpus_per_node
        last = first + gpus_per_node - 1
        lines.append(f"NodeName={node} Name=gpu File={device_dir}/fakegpu[{first}-{last}]")
    return "\n".join(lines) + "\n"


def make_fake_gpus(device_dir: Path, count: int) -> None:
    """Character devices `fakegpu0..count-1` (major 1, minor 3: the same device as /dev/null)."""
    device_dir.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        path = device_dir / f"fakegpu{index}"
        if not path.exists():
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))


def write_srun_shim(path: Path, conf: Path) -> None:
    """An `srun` first on PATH that defaults SLURM_CONF to this cluster's config.

    Snakemake's slurm-jobstep plugin removes every SLURM_* variable, SLURM_CONF included, before
    it calls `srun` inside the job. A real node then reads /etc/slurm/slurm.conf; this cluster
    keeps its config under its root so as not to touch the host's, hence the shim.
    """
    real = shutil.which("srun", path=os.defpath + ":/usr/bin:/usr/local/bin")
    path.write_text(f'#!/bin/sh\nexport SLURM_CONF="${{SLURM_CONF:-{conf}}}"\nexec {real} "$@"\n')
    path.chmod(0o755)


@contextlib.contextmanager
def slurm_cluster(
    root: Path,
    *,
    nodes: Sequence[str] = ("node1", "node2"),
    gpus_per_node: int = 8,
    cpus_per_node: int = 64,
    real_memory_mb: int = 256000,
    start_timeout: float = 60,
) -> Iterator[SlurmCluster]:
    """Bring a cluster up under `root`, yield it once every node is idle, tear it down on exit."""
    if os.geteuid() != 0:
        raise ClusterError("the Slurm test cluster needs root (slurmd runs jobs as their owner)")
    if missing := missing_binaries():
        raise ClusterError(f"not on PATH: {', '.join(missing)} (apt-get install slurm-wlm munge)")
    root = Path(root).resolve()
    for sub in ("munge", "state", "spool", "run", "log", "dev", "bin"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for node in nodes:
        (root / "spool" / node).mkdir(exist_ok=True)
    os.chmod(root / "munge", 0o700)
    make_fake_gpus(root / "dev", gpus_per_node * len(nodes))
    (root / "slurm.conf").write_text(
        slurm_conf_text(
            root,
            nodes,
            free_ports(len(nodes) + 1),
            gpus_per_node=gpus_per_node,
            cpus_per_node=cpus_per_node,
            real_memory_mb=real_memory_mb,
        )
    )
    (root / "gres.conf").write_text(gres_conf_text(root / "dev", nodes, gpus_per_node))
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o600)

    write_srun_shim(root / "bin" / "srun", root / "slurm.conf")
    env = {
        **os.environ,
        "SLURM_CONF": str(root / "slurm.conf"),
        MARKER: str(root),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    cluster = SlurmCluster(
        root=root,
        nodes=tuple(nodes),
        gpus_per_node=gpus_per_node,
        cpus_per_node=cpus_per_node,
        env=env,
    )
    daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        munge = root / "munge"
        daemons.append(
            (
                "munged",
                _spawn(
                    root,
                    "munged",
                    [
                        "munged",
                        "--foreground",
                        "--force",
                        f"--key-file={key}",
                        f"--socket={munge / 'munge.socket'}",
                        f"--pid-file={munge / 'munged.pid'}",
                        f"--log-file={root / 'log' / 'munged.log'}",
                        f"--seed-file={munge / 'munged.seed'}",
                    ],
                    env,
                ),
            )
        )
        _wait(
            lambda: (munge / "munge.socket").exists(), start_timeout, "munged socket", root, daemons
        )
        daemons.append(("slurmctld", _spawn(root, "slurmctld", ["slurmctld", "-D", "-i"], env)))
        _wait(
            lambda: cluster.run(["scontrol", "ping"], check=False, timeout=10).returncode == 0,
            start_timeout,
            "slurmctld to answer `scontrol ping`",
            root,
            daemons,
        )
        for node in nodes:
            daemons.append(
                (
                    f"slurmd-{node}",
                    _spawn(root, f"slurmd-{node}", ["slurmd", "-D", "-N", node], env),
                )
            )
        _wait(lambda: _all_idle(cluster), start_timeout, "all nodes idle in `sinfo`", root, daemons)
        yield cluster
    finally:
        _teardown(cluster, daemons)


def _spawn(root: Path, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start one daemon in the foreground, its output in `log/<name>.out`."""
    out = open(root / "log" / f"{name}.out", "wb")
    try:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        out.close()


def _all_idle(cluster: SlurmCluster) -> bool:
    try:
        states = cluster.node_states()
    except subprocess.SubprocessError:
        return False
    return set(states) == set(cluster.nodes) and all(s == "idle" for s in states.values())


def _wait(
    ready: Callable[[], bool],
    timeout: float,
    what: str,
    root: Path,
    daemons: list[tuple[str, subprocess.Popen[bytes]]],
) -> None:
    """Poll `ready()` until true; a daemon that exits meanwhile fails fast with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, proc in daemons:
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {proc.returncode} while waiting for "
                    f"{what}:\n{_log_tail(root, name)}"
                )
        if ready():
            return
        time.sleep(0.25)
    logs = "\n".join(_log_tail(root, name) for name, _proc in daemons)
    raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}:\n{logs}")


def _log_tail(root: Path, name: str, lines: int = 12) -> str:
    """The last lines of a daemon's stdout/stderr and of its own log file, for error messages."""
    parts = []
    for path in (root / "log" / f"{name}.out", root / "log" / f"{name}.log"):
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path}\n" + "\n".join(tail))
    return "\n".join(parts) or "(no log written)"


def _teardown(cluster: SlurmCluster, daemons: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    """Cancel jobs, stop daemons newest first, then kill job processes they left, all by pid."""
    alive = {name for name, proc in daemons if proc.poll() is None}
    if "slurmctld" in alive and any(name.startswith("slurmd-") for name in alive):
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            ids = cluster.job_ids()
            if ids:
                cluster.run(["scancel", *ids], check=False, timeout=15)
                deadline = time.monotonic() + 20
                while cluster.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.5)
    for _name, proc in reversed(daemons):
        _stop(proc)
    for pid in _leftover_pids(cluster.root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stop(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


def _leftover_pids(root: Path) -> list[int]:
    """Processes still carrying this cluster's marker or `SLURM_CONF` (job steps, job scripts)."""
    needles = (f"{MARKER}={root}".encode(), f"SLURM_CONF={root / 'slurm.conf'}".encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(needle in environ for needle in needles):
            found.append(int(entry.name))
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Keep a cluster up under ROOT while COMMAND runs with its environment; return its status."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    with slurm_cluster(args.root) as cluster:
        print(f"SLURM_CONF={cluster.conf}", file=sys.stderr)
        if not command:
            command = ["sinfo", "--Node", "--long"]
        return subprocess.run(command, env=cluster.env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
