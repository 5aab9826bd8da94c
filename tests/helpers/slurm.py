"""A one-node SLURM cluster with accounting, started and stopped by the test suite.

Everything lives in one temp folder and on free loopback ports; nothing under /etc is
touched: the daemons get ``-f <conf>``, the clients (``sbatch``, ``sacct``, ``scancel``, the
ones submitit calls) ``SLURM_CONF``, and munge its own key and socket (``AuthInfo``).

submitit learns a job's state only from ``sacct`` (or its result file, which a cancelled job
never writes), so the cluster has real accounting: ``slurmdbd`` on a throwaway MariaDB. With
``AccountingStorageType=accounting_storage/none`` every poll warns and a cancelled array task
stays UNKNOWN forever, which hangs the sweep (docs/cluster.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from stability.tracking.server import free_port

CLUSTER = "stabilitytest"
PARTITION = "debug"
NODE_CPUS = 4  # at least: the tests' largest array has 3 tasks
DAEMONS = ("munged", "mariadbd", "mariadb-install-db", "slurmdbd", "slurmctld", "slurmd")


def missing_daemons() -> list[str]:
    """The daemons this machine lacks (``make setup-dev`` installs them as root)."""
    return [d for d in DAEMONS if not shutil.which(d, path="/usr/sbin:/usr/bin:" +
                                                   os.environ.get("PATH", ""))]


def _wait(what: str, ok: callable, log: Path | None, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if ok():
                return
        time.sleep(0.5)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise RuntimeError(f"{what} did not come up in {timeout_s:.0f}s\n{tail}")


@dataclass
class SlurmCluster:
    """The running cluster; ``env`` is what a submitting shell needs (``SLURM_CONF``)."""

    root: Path
    node: str
    cpus: int
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster."""
        return os.environ | {"SLURM_CONF": str(self.root / "slurm.conf")}

    def run(self, *cmd: str, timeout: float = 60) -> str:
        """A SLURM client command against this cluster; its stdout."""
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        return done.stdout

    def version(self) -> str:
        """E.g. ``slurm-wlm 22.05.8``."""
        return self.run("sinfo", "-V").strip()

    def log(self) -> str:
        """The tails of the daemon logs (for failure messages)."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                         for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """Cancel every job, stop the daemons (last started first), remove the folder."""
        # a job still running when slurmd stops leaves its slurmstepd and tasks behind
        with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
            self.run("scancel", "--user", "root")
            deadline = time.monotonic() + 60  # KillWait (30 s) is the longest a task may take
            while self.run("squeue", "-h").strip() and time.monotonic() < deadline:
                time.sleep(1)
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _conf(root: Path, node: str, cpus: int, mem_mb: int, ports: dict[str, int]) -> None:
    sock = root / "munge.socket"
    (root / "slurm.conf").write_text(f"""\
ClusterName={CLUSTER}
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports['ctld']}
SlurmdPort={ports['d']}
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'slurmctld.log'}
SlurmdLogFile={root / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
# sacct (submitit's status poll) needs job accounting: slurmdbd
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={ports['dbd']}
AccountingStoragePass={sock}   # for munge: the socket of the connections to slurmdbd
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# seconds between SIGTERM and SIGKILL on scancel: time for a run to close itself KILLED
KillWait=30
# the node may advertise more CPUs than the machine has (see start_slurm)
SlurmdParameters=config_overrides
NodeName={node} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName={PARTITION} Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    dbd = root / "slurmdbd.conf"  # read from SLURM_CONF's folder; must be 0600
    dbd.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={sock}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={ports['dbd']}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['sql']}
StorageUser=root
StorageLoc=slurm_acct_db
LogFile={root / 'slurmdbd.log'}
PidFile={root / 'slurmdbd.pid'}
""")
    dbd.chmod(0o600)


def start_slurm(timeout_s: float = 90) -> SlurmCluster:
    """munged, MariaDB + slurmdbd, slurmctld and slurmd; returns once ``sinfo`` shows idle.

    Needs root (slurmd starts jobs as their users); ``make setup-dev`` installs the packages.
    """
    assert os.geteuid() == 0, "the test cluster's slurmd must run as root"
    root = Path(tempfile.mkdtemp(prefix="stability-slurm-"))
    root.chmod(0o755)  # munge clients of any user reach the socket
    # A test's array (up to NODE_CPUS one-CPU tasks) runs at once, as on a cluster with free
    # nodes; on a 2-core machine the third task would otherwise wait for the first to end.
    node, cpus = socket.gethostname(), max(os.cpu_count() or 1, NODE_CPUS)
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
    ports = {k: free_port() for k in ("ctld", "d", "dbd", "sql")}
    for sub in ("state", "spool", "sql"):
        (root / sub).mkdir()
    _conf(root, node, cpus, mem_mb, ports)
    cluster = SlurmCluster(root, node, cpus)
    env = cluster.env

    def daemon(cmd: list[str], log: str) -> None:
        cluster.processes.append(subprocess.Popen(
            cmd, env=env, stdout=(root / log).open("w"), stderr=subprocess.STDOUT))

    try:
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        daemon(["munged", "-F", "--force", f"--key-file={key}", f"--socket={root / 'munge.socket'}",
                f"--pid-file={root / 'munged.pid'}", f"--seed-file={root / 'munged.seed'}",
                f"--log-file={root / 'munged.log'}"], "munged.out.log")
        _wait("munged", lambda: (root / "munge.socket").exists(), root / "munged.log")

        subprocess.run(["mariadb-install-db", f"--datadir={root / 'sql'}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       capture_output=True, check=True, timeout=120)
        daemon(["mariadbd", "--no-defaults", f"--datadir={root / 'sql'}", "--user=root",
                f"--port={ports['sql']}", "--bind-address=127.0.0.1",
                f"--socket={root / 'mysql.sock'}", f"--pid-file={root / 'mysql.pid'}",
                "--skip-grant-tables", "--innodb-flush-log-at-trx-commit=0"], "mariadb.log")
        _wait("mariadb", lambda: socket.create_connection(("127.0.0.1", ports["sql"]), 1)
              .close() is None, root / "mariadb.log")

        daemon(["slurmdbd", "-D"], "slurmdbd.out.log")
        _wait("slurmdbd", lambda: socket.create_connection(("127.0.0.1", ports["dbd"]), 1)
              .close() is None, root / "slurmdbd.log")
        cluster.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        daemon(["slurmctld", "-D", "-f", str(root / "slurm.conf")], "slurmctld.out.log")
        daemon(["slurmd", "-D", "-f", str(root / "slurm.conf")], "slurmd.out.log")
        _wait("the node", lambda: cluster.run("sinfo", "-h", "-N", "-o", "%T").strip()
              == "idle", root / "slurmctld.log", timeout_s)
    except BaseException as err:
        log = cluster.log()
        cluster.stop()
        raise RuntimeError(f"SLURM did not start: {err}\n{log}") from None
    return cluster
