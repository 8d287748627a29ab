"""A real one-node SLURM cluster on this machine, from Debian's packages, for tests.

munged, MariaDB, slurmdbd, slurmctld and slurmd all run as child processes of the test with their
state, sockets, logs and configuration in one directory, on ports of their own, so nothing of the
host's (/etc/slurm, /run/munge, a system MariaDB) is read or changed; clients find the cluster
through SLURM_CONF (Cluster.env). One exception: the executor plugin's job step drops every SLURM_*
variable before its nested `srun`, which then reads the default /etc/slurm/slurm.conf; so while the
cluster is up that path is a symlink to this cluster's file (only where no slurm.conf exists, or
where the link was left by a test cluster whose process is gone: a machine with its own SLURM
installation is refused). Accounting goes through slurmdbd into MariaDB because the
Snakemake executor plugin asks `sacct` for job states.

    python tests/slurm_cluster.py DIR     # bring one up by hand (Ctrl-C tears it down)
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

DEBIAN_PACKAGES = "slurm-wlm slurmdbd munge mariadb-server"
BINARIES = ("munged", "mariadbd", "mariadb-install-db", "mariadb", "slurmdbd", "slurmctld",
            "slurmd", "sbatch", "sacct", "sacctmgr", "sinfo")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
CLUSTER = "moebench"
PARTITION = "bench"
ACCOUNT = "bench"
# the first line of a test cluster's slurm.conf: names the process that owns the cluster, so a link
# left behind by a killed test run can be told from a SLURM installation of the machine's own
MARKER = "# moe-offload-bench test cluster, owner pid "


class ClusterError(RuntimeError):
    pass


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not shutil.which(b) and not Path("/usr/sbin", b).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stale_test_link(link: Path = DEFAULT_CONF) -> bool:
    """Whether `link` is a symlink a test cluster left behind: dangling, or to a test cluster's
    configuration whose owner process has exited (a test run killed before its teardown)."""
    if not link.is_symlink():
        return False
    if not link.exists():
        return True
    first = link.read_text(errors="replace").split("\n", 1)[0]
    if not first.startswith(MARKER):
        return False
    try:
        return not psutil.pid_exists(int(first[len(MARKER):]))
    except ValueError:
        return False


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.node = socket.gethostname()
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.ports = {k: _free_port() for k in ("mysql", "dbd", "ctld", "slurmd")}
        self.munge_socket = self.root / "munge" / "munge.sock"
        self.conf = self.root / "etc" / "slurm.conf"
        self.linked_default = False

    # -- the environment clients need ---------------------------------------------------------
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> str:
        res = subprocess.run([_which(cmd[0]), *cmd[1:]], env=self.env(), capture_output=True,
                             text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip()}")
        return res.stdout

    # -- bring up ------------------------------------------------------------------------------
    def up(self) -> "Cluster":
        missing = missing_binaries()
        if missing:
            raise ClusterError(f"SLURM test cluster: {', '.join(missing)} not installed "
                               f"(apt-get install {DEBIAN_PACKAGES})")
        for d in ("munge", "db", "etc", "state", "spool", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if DEFAULT_CONF.exists() or DEFAULT_CONF.is_symlink():
            if not stale_test_link():
                raise ClusterError(f"{DEFAULT_CONF} exists: this machine has a SLURM installation "
                                   "of its own, which the test cluster would shadow")
            DEFAULT_CONF.unlink()  # left by a test cluster that was killed
        try:
            DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
            DEFAULT_CONF.symlink_to(self.conf)
            self.linked_default = True
            self._munge()
            self._mariadb()
            self._write_configs()
            # slurmdbd reads slurmdbd.conf from SLURM_CONF's directory
            self._start("slurmdbd", [_which("slurmdbd"), "-D"])
            self._wait(self._dbd_answers, "slurmdbd")
            self.run("sacctmgr", "-i", "add", "cluster", CLUSTER, check=False)
            self.run("sacctmgr", "-i", "add", "account", ACCOUNT, f"Cluster={CLUSTER}", check=False)
            self.run("sacctmgr", "-i", "add", "user", getpass.getuser(), f"Account={ACCOUNT}",
                     f"DefaultAccount={ACCOUNT}", check=False)
            self._start("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self.run("sinfo", "-h", check=False) != "", "slurmctld")
            self._start("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
            self._wait(self._node_idle, "slurmd (node idle)", timeout=90)
        except BaseException:
            self.down()
            raise
        return self

    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.out", "w")
        p = subprocess.Popen(cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append((name, p))
        return p

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise ClusterError(f"{name} exited ({p.returncode}) while waiting for {what}; "
                                       f"log: {self.log_tail(name)}")
            try:
                if ready():
                    return
            except (ClusterError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.5)
        raise ClusterError(f"{what} not ready after {timeout:.0f} s; logs in {self.root / 'log'}")

    def log_tail(self, name: str, lines: int = 15) -> str:
        texts = []
        for f in sorted((self.root / "log").glob(f"{name}*")):
            texts += f.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(texts)

    def _dbd_answers(self) -> bool:
        res = subprocess.run([_which("sacctmgr"), "-n", "list", "cluster"], env=self.env(),
                             capture_output=True, text=True, timeout=20)
        return res.returncode == 0

    def _node_idle(self) -> bool:
        state = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%t", check=False).strip()
        return state in ("idle", "mix", "alloc")

    def _munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        self._start("munged", [_which("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}",
                               f"--pid-file={self.root / 'munge/munged.pid'}",
                               f"--log-file={self.root / 'log/munged.log'}",
                               f"--seed-file={self.root / 'munge/munged.seed'}"])
        self._wait(self.munge_socket.exists, "munged")

    def _mariadb(self) -> None:
        data, sock = self.root / "db", self.root / "run" / "mysql.sock"
        subprocess.run([_which("mariadb-install-db"), "--no-defaults", f"--datadir={data}",
                        "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db"], check=True, capture_output=True, timeout=120)
        self._start("mariadbd", [_which("mariadbd"), "--no-defaults", f"--datadir={data}",
                                 f"--socket={sock}", f"--port={self.ports['mysql']}",
                                 "--bind-address=127.0.0.1", "--user=root",
                                 f"--pid-file={self.root / 'run/mysqld.pid'}",
                                 "--innodb-buffer-pool-size=32M", "--skip-log-bin"])
        self._wait(sock.exists, "mariadbd")
        sql = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;")
        self._wait(lambda: subprocess.run([_which("mariadb"), "--no-defaults", f"--socket={sock}",
                                           "-uroot", "-e", sql], capture_output=True,
                                          timeout=20).returncode == 0, "MariaDB accepting SQL")

    def _write_configs(self) -> None:
        r, auth = self.root, f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        user = getpass.getuser()
        dbd = self.root / "etc" / "slurmdbd.conf"
        dbd.write_text(
            f"{auth}DbdHost=localhost\nDbdPort={self.ports['dbd']}\nSlurmUser={user}\n"
            f"LogFile={r}/log/slurmdbd.log\nPidFile={r}/run/slurmdbd.pid\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            f"StoragePort={self.ports['mysql']}\nStorageUser=slurm\nStoragePass=slurm\n"
            f"StorageLoc=slurm_acct_db\n")
        os.chmod(dbd, 0o600)  # slurmdbd refuses a readable config (it holds the DB password)
        mem_mb = psutil.virtual_memory().total // 2**20 - 512
        cpus = os.cpu_count()
        self.conf.write_text(
            f"{MARKER}{os.getpid()}\n"
            f"ClusterName={CLUSTER}\nSlurmctldHost={self.node}\n{auth}"
            f"SlurmctldPort={self.ports['ctld']}\nSlurmdPort={self.ports['slurmd']}\n"
            f"SlurmUser={user}\nSlurmdUser=root\n"
            f"StateSaveLocation={r}/state\nSlurmdSpoolDir={r}/spool\n"
            f"SlurmctldPidFile={r}/run/slurmctld.pid\nSlurmdPidFile={r}/run/slurmd.pid\n"
            f"SlurmctldLogFile={r}/log/slurmctld.log\nSlurmdLogFile={r}/log/slurmd.log\n"
            # no cgroup plugins: the jobs make their own cgroups (the harness's limits)
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={self.ports['dbd']}\n"
            # for a slurmdbd, AccountingStoragePass names the munge socket of its connections
            f"AccountingStoragePass={self.munge_socket}\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\n"
            "ReturnToService=2\nSchedulerType=sched/backfill\nMinJobAge=600\nKillWait=5\n"
            "InactiveLimit=0\nSlurmdTimeout=120\nSlurmctldTimeout=60\n"
            f"NodeName={self.node} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN\n"
            f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")

    # -- tear down -----------------------------------------------------------------------------
    def down(self) -> None:
        # a second Ctrl-C or SIGTERM during teardown must not leave daemons or the symlink behind
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._down()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def _down(self) -> None:
        if self.procs:
            try:  # jobs still queued or running would outlive their daemons
                self.run("scancel", "--full", "-u", getpass.getuser(), check=False, timeout=10)
            except Exception:
                pass
        for name, p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
        if self.linked_default:
            DEFAULT_CONF.unlink(missing_ok=True)
            self.linked_default = False

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # tear down on SIGTERM too
    with Cluster(Path(sys.argv[1])) as c:
        print(f"cluster up: export SLURM_CONF={c.conf}", flush=True)
        print(c.run("sinfo"), flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
