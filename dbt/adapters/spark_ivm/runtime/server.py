"""A local Spark Thrift Server with Delta Lake, for dbt's ``method: thrift``.

``python -m dbt.adapters.spark_ivm.runtime.server --runtime-dir DIR [--port 10000]``
starts Spark's own HiveThriftServer2 (it ships in pyspark's jars, with no start
script) through pyspark's ``spark-submit``, with the embedded runtime's configs
(runtime.session_configs: Delta Lake, warehouse and metastore under DIR),
bound to 127.0.0.1. It returns once the port accepts connections and leaves the
server running in the background; ``--stop`` with the same runtime directory
stops it. This is the "cluster" path on one machine: dbt then reaches Spark
only through SQL over the wire, each connection in its own server session.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from dbt.adapters.spark_ivm.runtime.embedded import session_configs

SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 10000
PID_FILE = "thrift-server.pid"
LOG_FILE = "thrift-server.log"
# The JVM starts in ~10 s on an idle machine; much longer on a loaded one.
START_TIMEOUT_SECONDS = 300.0


def spark_submit() -> Path:
    """pyspark's own spark-submit (pyspark ships Spark whole, bin/ included)."""
    import pyspark

    path = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is pyspark installed whole?")
    return path


def server_command(
    runtime_dir: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    extra_configs: Mapping[str, str] | None = None,
) -> list[str]:
    """The spark-submit command line of a Thrift server over the runtime in `runtime_dir`.

    `extra_configs` go over the runtime's (cluster.py: the master and executors).
    """
    configs = session_configs(runtime_dir)
    configs["spark.app.name"] = "dbt-spark-ivm thrift server"
    configs.update(extra_configs or {})
    root = Path(runtime_dir).resolve()
    hive_confs = {
        "hive.server2.thrift.bind.host": host,
        "hive.server2.thrift.port": str(port),
        # Per-statement operation logs nobody reads, by default under /tmp/<user>.
        "hive.server2.logging.operation.enabled": "false",
        "hive.exec.local.scratchdir": str(root / "hive-scratch-local"),
        "hive.exec.scratchdir": str(root / "hive-scratch"),
    }
    command = [str(spark_submit()), "--class", SERVER_CLASS]
    for key, value in configs.items():
        command += ["--conf", f"{key}={value}"]
    for key, value in hive_confs.items():
        command += ["--hiveconf", f"{key}={value}"]
    # The server's application is inside Spark itself: spark-submit's name for that.
    command.append("spark-internal")
    return command


def start(
    runtime_dir: str | os.PathLike[str],
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    timeout: float = START_TIMEOUT_SECONDS,
    extra_configs: Mapping[str, str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> subprocess.Popen:
    """Start the server in the background and return once it accepts connections.

    Its output goes to thrift-server.log and its process id to thrift-server.pid
    in `state_dir` (default: `runtime_dir`). Raises RuntimeError (with the log's
    end) if it exits or does not listen within `timeout` seconds.
    """
    root = Path(runtime_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    files = Path(state_dir).resolve() if state_dir is not None else root
    if accepts(host, port):
        raise RuntimeError(f"{host}:{port} is already in use; pick another --port")
    log_path = files / LOG_FILE
    with log_path.open("ab") as log:
        # A session of its own: the server outlives this command and the
        # terminal's Ctrl-C, and --stop ends its whole process group.
        process = subprocess.Popen(
            server_command(root, port, host, extra_configs),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            start_new_session=True,
        )
    (files / PID_FILE).write_text(f"{process.pid}\n")
    deadline = time.monotonic() + timeout
    while not accepts(host, port):
        if process.poll() is not None:
            raise RuntimeError(
                f"the Thrift server exited with code {process.returncode}; "
                f"end of {log_path}:\n{tail(log_path)}"
            )
        if time.monotonic() > deadline:
            terminate(process.pid)
            raise RuntimeError(
                f"the Thrift server did not listen on {host}:{port} within {timeout:.0f}s "
                f"and was stopped; end of {log_path}:\n{tail(log_path)}"
            )
        time.sleep(0.5)
    return process


def stop(runtime_dir: str | os.PathLike[str], timeout: float = 60.0) -> int | None:
    """Stop the server started over `runtime_dir`; its process id, or None if none ran."""
    pid_path = Path(runtime_dir).resolve() / PID_FILE
    if not pid_path.is_file():
        return None
    pid = int(pid_path.read_text().strip())
    terminate(pid, timeout)
    pid_path.unlink(missing_ok=True)
    return pid


def terminate(pid: int, timeout: float = 60.0) -> None:
    """SIGTERM the server's process group (spark-submit execs java: the JVM stops
    the server in its shutdown hook), then SIGKILL what is left after `timeout`."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        reap(pid)
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    reap(pid)


def reap(pid: int) -> None:
    """Collect the exit status when the server is this process's child (a test's)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dbt.adapters.spark_ivm.runtime.server",
        description=(
            "Start (or --stop) a local Spark Thrift Server with Delta Lake for dbt's "
            "method: thrift, keeping its warehouse and metastore in --runtime-dir."
        ),
    )
    parser.add_argument(
        "--runtime-dir",
        required=True,
        help="folder for the warehouse, metastore, log and pid file (created if missing)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--stop", action="store_true", help="stop the server started over --runtime-dir"
    )
    args = parser.parse_args(argv)
    if args.stop:
        pid = stop(args.runtime_dir)
        print(f"stopped the Thrift server (pid {pid})" if pid else "no Thrift server was running")
        return 0
    started = time.monotonic()
    try:
        process = start(args.runtime_dir, args.port)
    except (RuntimeError, FileNotFoundError) as error:
        print(error, file=sys.stderr)
        return 1
    root = Path(args.runtime_dir).resolve()
    print(
        f"Spark Thrift Server (Delta Lake) listening on {DEFAULT_HOST}:{args.port} "
        f"after {time.monotonic() - started:.0f}s (pid {process.pid}, log {root / LOG_FILE}).\n"
        f"Profile: method: thrift, host: {DEFAULT_HOST}, port: {args.port}, user: <any name>\n"
        f"Stop it: python -m dbt.adapters.spark_ivm.runtime.server --runtime-dir {root} --stop"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
