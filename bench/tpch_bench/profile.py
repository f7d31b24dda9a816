"""Where a refresh's time goes: the statements of a dbt debug log, summed per kind.

Run the harness with `--dbt-log-level-file debug`, then

    .venv/bin/python -m tpch_bench.profile bench/work/dbt/logs/dbt.log [--nodes q01,q06]

prints, per model node, each kind of statement it ran (MERGE, DESCRIBE
HISTORY, ALTER VIEW, ...) with how many and how long in total, from dbt's own
"SQL status: ... in X seconds" lines. Time outside statements (compiling the
model in Python, dbt's bookkeeping) is not in the log and not in the table.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# dbt's text log: "<color>HH:MM:SS.ffffff [level] [thread]: message".
# A line of a dbt debug log: its time of day, level, thread and message.
LOG_LINE = re.compile(
    r"^(?:\x1b\[\d+m)?(?P<time>\d\d:\d\d:\d\d\.\d+) \[\w+\s*\] \[(?P<thread>[^\]]+)\]: (?P<msg>.*)$"
)
_STATEMENT = re.compile(r"^On (?P<node>\S+): (?P<sql>.*)$")
_STATUS = re.compile(r"^SQL status: .* in (?P<seconds>[\d.]+) seconds$")
_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)

# The words that name a statement's kind, longest first.
_KINDS = (
    "CREATE OR REPLACE TABLE",
    "CREATE OR REPLACE VIEW",
    "CREATE TABLE",
    "CREATE SCHEMA",
    "DESCRIBE TABLE EXTENDED",
    "DESCRIBE DETAIL",
    "DESCRIBE HISTORY",
    "DESCRIBE QUERY",
    "SHOW TABLE EXTENDED",
    "SHOW TBLPROPERTIES",
    "SHOW TABLES",
    "ALTER VIEW",
    "ALTER TABLE",
    "MERGE",
    "INSERT",
    "SELECT",
    "WITH",
    "RESET",
    "SET",
    "DROP",
)


@dataclass
class Statement:
    node: str
    sql: str
    seconds: float | None = None

    @property
    def kind(self) -> str:
        text = " ".join(_COMMENT.sub(" ", self.sql).split()).upper()
        for kind in _KINDS:
            if text.startswith(kind):
                if kind == "ALTER VIEW" and " AS SELECT" in text:
                    return "ALTER VIEW ... AS"
                return kind
        return text.split(" ", 1)[0] if text else "?"


@dataclass
class NodeProfile:
    node: str
    by_kind: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    @property
    def total(self) -> float:
        return sum(sum(times) for times in self.by_kind.values())


def statements(lines: Iterable[str]) -> list[Statement]:
    """Every statement in a dbt debug log, with its duration once its status line came."""
    found: list[Statement] = []
    open_by_thread: dict[str, Statement] = {}
    current: Statement | None = None
    for raw in lines:
        line = raw.rstrip("\n")
        match = LOG_LINE.match(line)
        if match is None:
            if current is not None:
                current.sql += "\n" + line  # a statement's further lines
            continue
        current = None
        thread, message = match["thread"].strip(), match["msg"]
        if started := _STATEMENT.match(message):
            current = Statement(started["node"], started["sql"])
            open_by_thread[thread] = current
            found.append(current)
        elif (status := _STATUS.match(message)) and thread in open_by_thread:
            open_by_thread.pop(thread).seconds = float(status["seconds"])
    return found


def profile(found: list[Statement], nodes: tuple[str, ...] = ()) -> list[NodeProfile]:
    profiles: dict[str, NodeProfile] = {}
    for statement in found:
        if statement.seconds is None:
            continue
        if nodes and not any(name in statement.node for name in nodes):
            continue
        entry = profiles.setdefault(statement.node, NodeProfile(statement.node))
        entry.by_kind[statement.kind].append(statement.seconds)
    return list(profiles.values())


def render(profiles: list[NodeProfile]) -> str:
    out = []
    for entry in profiles:
        out.append(f"{entry.node}: {entry.total:.2f}s in statements")
        ranked = sorted(entry.by_kind.items(), key=lambda item: -sum(item[1]))
        for kind, times in ranked:
            out.append(f"  {kind:<26} x{len(times):<3} {sum(times):7.2f}s")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpch_bench.profile", description=__doc__)
    parser.add_argument("log", type=Path, help="dbt.log written with --log-level-file debug")
    parser.add_argument(
        "--nodes", default="", help="only nodes whose id contains one of these (comma separated)"
    )
    args = parser.parse_args(argv)
    nodes = tuple(n.strip() for n in args.nodes.split(",") if n.strip())
    with args.log.open(encoding="utf-8", errors="replace") as log:
        print(render(profile(statements(log), nodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
