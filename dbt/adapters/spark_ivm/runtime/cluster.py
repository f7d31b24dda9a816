"""A local Spark standalone cluster with the Thrift server as its driver: every part its own JVM.

``python -m dbt.adapters.spark_ivm.runtime.cluster up --runtime-dir DIR`` starts, from
the installed pyspark, a standalone master and two workers
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``),
waits until both workers are registered, then starts the Thrift server
(server.py) with ``--master spark://127.0.0.1:7077``: the server is the
driver, and its tasks run in executors in the workers' JVMs. ``down`` stops
everything ``up`` started (by the pids it wrote), ``status`` says what runs.

What only a cluster exercises, and the embedded runtime (``local[2]``, one
JVM) does not: the Delta jars reaching executors (``spark.jars``, shipped by
the driver), tasks serialized to other JVMs, a warehouse every executor
writes (here a local folder, which every worker on this machine sees) and a
metastore only the driver touches, and the loss of an executor mid-refresh.
Everything binds to 127.0.0.1; logs and pids go to ``DIR/cluster``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbt.adapters.spark_ivm.runtime import server

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
HOST = server.DEFAULT_HOST
CLUSTER_DIR = "cluster"
# The Thrift server's part name: its pid file's stem (server.PID_FILE).
THRIFT_PART = Path(server.PID_FILE).stem
# A daemon JVM starts in a few seconds idle; far longer on a loaded machine.
START_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster's shape: sized by default for a 2-core, 24 GB machine."""

    workers: int = 2
    # Each worker offers one core and enough memory for one executor.
    worker_cores: int = 1
    worker_memory: str = "3g"
    executor_memory: str = "2g"
    master_port: int = 7077
    master_ui_port: int = 8080
    thrift_port: int = server.DEFAULT_PORT

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def driver_configs(self) -> dict[str, str]:
        """What the Thrift server needs to run its tasks on the workers."""
        return {
            "spark.master": self.master_url,
            "spark.executor.cores": str(self.worker_cores),
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(self.workers * self.worker_cores),
            # One executor per worker, so losing a worker loses its executor.
            "spark.deploy.spreadOut": "true",
        }


def spark_class() -> Path:
    """pyspark's own spark-class, next to the spark-submit server.py uses."""
    path = server.spark_submit().with_name("spark-class")
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is pyspark installed whole?")
    return path


def master_command(spec: ClusterSpec) -> list[str]:
    return [
        str(spark_class()),
        MASTER_CLASS,
        "--host",
        HOST,
        "--port",
        str(spec.master_port),
        "--webui-port",
        str(spec.master_ui_port),
    ]


def worker_command(spec: ClusterSpec, work_dir: Path) -> list[str]:
    return [
        str(spark_class()),
        WORKER_CLASS,
        spec.master_url,
        "--host",
        HOST,
        "--cores",
        str(spec.worker_cores),
        "--memory",
        spec.worker_memory,
        "--work-dir",
        str(work_dir),
        # Each worker's UI on a free port: two workers cannot share one.
        "--webui-port",
        "0",
    ]


@dataclass(frozen=True)
class Part:
    """One process of the cluster: its name (master, worker-1, ..., thrift) and pid."""

    name: str
    pid: int


def cluster_dir(runtime_dir: str | os.PathLike[str]) -> Path:
    return Path(runtime_dir).resolve() / CLUSTER_DIR


def up(
    runtime_dir: str | os.PathLike[str], spec: ClusterSpec | None = None, thrift: bool = True
) -> list[Part]:
    """Start master, workers and Thrift server; return once the server accepts connections.

    With `thrift=False` no driver is started: the caller's own SparkSession,
    built with `spec.driver_configs()`, becomes the cluster's driver
    (driven_by_this_process, which keeps Spark's status store in process).
    Raises RuntimeError, naming the part and the end of its log, if a part
    exits or does not come up in time; what was started is then stopped.
    """
    spec = spec or ClusterSpec()
    root = Path(runtime_dir).resolve()
    folder = cluster_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    if server.accepts(HOST, spec.master_port):
        raise RuntimeError(f"{HOST}:{spec.master_port} is already in use: is a cluster up?")
    try:
        master = _spawn(folder, "master", master_command(spec))
        _wait(lambda: server.accepts(HOST, spec.master_port), master, folder / "master.log")
        for number in range(1, spec.workers + 1):
            start_worker(root, spec, number, wait=False)
        _wait(
            lambda: alive_workers(spec) >= spec.workers,
            master,
            folder / "master.log",
            what=f"{spec.workers} workers registered with the master",
        )
        if thrift:
            server.start(
                root, spec.thrift_port, extra_configs=spec.driver_configs(), state_dir=folder
            )
    except BaseException:
        down(root)
        raise
    return parts(root)


@contextlib.contextmanager
def driven_by_this_process(
    runtime_dir: str | os.PathLike[str], spec: ClusterSpec
) -> Iterator[dict[str, str]]:
    """A master and workers (no Thrift server) for a SparkSession the caller builds with the
    configs yielded; every part stopped afterwards (the test suite's cluster slice,
    `bench/run --cluster`)."""
    up(runtime_dir, spec, thrift=False)
    try:
        yield spec.driver_configs()
    finally:
        down(runtime_dir)


def down(runtime_dir: str | os.PathLike[str]) -> list[Part]:
    """Stop every part `up` started, the driver first; the parts that were running."""
    stopped = []
    for part in sorted(parts(runtime_dir), key=_stop_order):
        server.terminate(part.pid)
        (cluster_dir(runtime_dir) / f"{part.name}.pid").unlink(missing_ok=True)
        stopped.append(part)
    return stopped


def parts(runtime_dir: str | os.PathLike[str]) -> list[Part]:
    """The parts whose pid files exist and whose processes still run (master, worker-n,
    thrift-server)."""
    found = []
    for pid_file in sorted(cluster_dir(runtime_dir).glob("*.pid")):
        pid = int(pid_file.read_text().strip())
        if _running(pid):
            found.append(Part(name=pid_file.stem, pid=pid))
    return found


def start_worker(
    runtime_dir: str | os.PathLike[str], spec: ClusterSpec, number: int, wait: bool = True
) -> Part:
    """Start worker `number` (again, after kill_worker: a machine back); with `wait`, return
    once the master counts it alive."""
    folder = cluster_dir(runtime_dir)
    name = f"worker-{number}"
    if any(p.name == name for p in parts(runtime_dir)):
        raise RuntimeError(f"{name} is already running")
    # A restarted worker registers under a new id; the master may still list
    # the killed one as alive for a moment, so a count would not tell.
    known = _alive_worker_ids(spec) if wait else set()
    process = _spawn(folder, name, worker_command(spec, folder / f"work-{number}"))
    if wait:
        _wait(
            lambda: bool(_alive_worker_ids(spec) - known),
            process,
            folder / f"{name}.log",
            what=f"{name} registered with the master",
        )
    return Part(name=name, pid=process.pid)


def kill_worker(runtime_dir: str | os.PathLike[str], number: int) -> Part:
    """SIGKILL worker `number` and its executor (its process group): a lost machine."""
    part = next((p for p in parts(runtime_dir) if p.name == f"worker-{number}"), None)
    if part is None:
        raise RuntimeError(f"worker-{number} is not running")
    os.killpg(part.pid, signal.SIGKILL)
    server.reap(part.pid)
    return part


def master_state(spec: ClusterSpec) -> dict[str, Any]:
    """The master's own account (its web UI's /json): workers, applications, cores."""
    url = f"http://{HOST}:{spec.master_ui_port}/json/"
    with urllib.request.urlopen(url, timeout=5) as answer:
        state: dict[str, Any] = json.load(answer)
    return state


def alive_workers(spec: ClusterSpec) -> int:
    return len(_alive_worker_ids(spec))


def _alive_worker_ids(spec: ClusterSpec) -> set[str]:
    try:
        state = master_state(spec)
    except OSError:
        return set()
    return {w["id"] for w in state.get("workers", []) if w.get("state") == "ALIVE"}


def _spawn(folder: Path, name: str, command: list[str]) -> subprocess.Popen:
    env = {
        **os.environ,
        # Shuffle and spill files of the daemons and their executors stay here.
        "SPARK_LOCAL_DIRS": str(folder / "local"),
        "SPARK_LOG_DIR": str(folder),
    }
    with (folder / f"{name}.log").open("ab") as log:
        # A session of its own: its process group (the JVM and an executor it
        # forks) is what down() and kill_worker() signal.
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            env=env,
            start_new_session=True,
        )
    (folder / f"{name}.pid").write_text(f"{process.pid}\n")
    return process


def _wait(
    ready: Callable[[], bool], process: subprocess.Popen, log: Path, what: str | None = None
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(
                f"{log.stem} exited with code {process.returncode}; end of {log}:\n"
                + server.tail(log)
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"no {what or log.stem} within {START_TIMEOUT_SECONDS:.0f}s; end of {log}:\n"
                + server.tail(log)
            )
        time.sleep(0.5)


def _running(pid: int) -> bool:
    server.reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_order(part: Part) -> int:
    """The driver first (its executors end with it), then the workers, the master last."""
    return {THRIFT_PART: 0, "master": 2}.get(part.name, 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dbt.adapters.spark_ivm.runtime.cluster",
        description=(
            "Start, stop or show a local Spark standalone cluster (a master and workers, "
            "each its own JVM) with a Thrift server as its driver, for dbt's method: thrift."
        ),
    )
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument(
        "--runtime-dir",
        required=True,
        help="folder for the warehouse, metastore, logs and pids (created if missing)",
    )
    parser.add_argument("--workers", type=int, default=ClusterSpec.workers)
    parser.add_argument("--port", type=int, default=ClusterSpec.thrift_port, help="Thrift port")
    args = parser.parse_args(argv)
    spec = ClusterSpec(workers=args.workers, thrift_port=args.port)
    if args.action == "down":
        stopped = down(args.runtime_dir)
        print("stopped: " + (", ".join(f"{p.name} (pid {p.pid})" for p in stopped) or "nothing"))
        return 0
    if args.action == "status":
        running = parts(args.runtime_dir)
        print("running: " + (", ".join(f"{p.name} (pid {p.pid})" for p in running) or "nothing"))
        if running:
            print(f"workers alive: {alive_workers(spec)}")
        return 0
    started = time.monotonic()
    try:
        up(args.runtime_dir, spec)
    except (RuntimeError, FileNotFoundError) as error:
        print(error, file=sys.stderr)
        return 1
    print(
        f"Spark standalone cluster ({spec.master_url}, {spec.workers} workers) and its Thrift "
        f"server on {HOST}:{spec.thrift_port} up after {time.monotonic() - started:.0f}s; "
        f"logs in {cluster_dir(args.runtime_dir)}.\n"
        f"Profile: method: thrift, host: {HOST}, port: {spec.thrift_port}\n"
        f"Stop it: python -m dbt.adapters.spark_ivm.runtime.cluster down --runtime-dir {args.runtime_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
