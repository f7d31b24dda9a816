"""The group publication protocol's order of statements, and its repair (fake runner)."""

from __future__ import annotations

import json

import sqlglot

from dbt.adapters.spark_ivm.consistency.groups import GroupRun, Member, Staged, consistency_groups
from dbt.adapters.spark_ivm.consistency.publish import COMMIT_LOG_NAME, Publisher, commit_row
from ivm_compiler import TableName

LOG = TableName(db="analytics", name=COMMIT_LOG_NAME)


class FakeRunner:
    def __init__(self, answers=None):
        self.statements: list[str] = []
        self.answers = answers or []

    def execute(self, sql: str) -> None:
        self.statements.append(sql)

    def query(self, sql: str):
        self.statements.append(sql)
        return self.answers.pop(0)


class FakeLog:
    def __init__(self):
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)

    def warning(self, message: str) -> None:
        self.lines.append("WARNING " + message)


def _run() -> GroupRun:
    members = [
        Member(f"model.p.{n}", n, TableName("analytics", n), frozenset({"raw.src"}))
        for n in ("a", "b")
    ]
    return GroupRun("inv-1", consistency_groups(members))


def _staged(name: str, version: int, published: bool = False) -> Staged:
    return Staged(
        model_id=f"model.p.{name}",
        relation=TableName("analytics", name),
        state=TableName("analytics", f"{name}__ivm_state"),
        state_version=version,
        view_sql=f"CREATE OR REPLACE VIEW analytics.{name} AS SELECT {version}",
        publish_sql=(f"ALTER VIEW analytics.{name} AS SELECT {version}",),
        action="incremental",
        seconds=1.5,
        source_versions={"raw.src": 12},
        published=published,
    )


def _publisher(run: GroupRun, name: str, runner: FakeRunner, log: FakeLog) -> Publisher:
    return Publisher(
        runner=runner,
        log=log,
        model=f"model.p.{name}",
        commit_log=LOG,
        group_run=run,
        progress=run.progress(f"model.p.{name}"),
        relation_exists=lambda table: "table",
    )


def test_members_publish_together_after_the_commit_row() -> None:
    run, runner, log = _run(), FakeRunner(), FakeLog()
    _publisher(run, "a", runner, log).publish(_staged("a", 4))
    # The first member waits: nothing is shown yet.
    assert runner.statements == []
    assert "publishes when 1 more member(s) have refreshed" in log.lines[-1]
    _publisher(run, "b", runner, log).publish(_staged("b", 9))
    kinds = [s.split()[0] + (" commit" if "'commit'" in s else "") for s in runner.statements]
    assert kinds == ["INSERT commit", "ALTER", "ALTER", "INSERT"]
    assert "'published'" in runner.statements[-1]
    assert runner.statements[1].endswith("SELECT 4") and runner.statements[2].endswith("SELECT 9")
    assert "consistency group 'b' committed" in log.lines[-1]
    assert "analytics.a@4 (incremental, 1.5s)" in log.lines[-1]


def test_a_failed_member_stops_the_group() -> None:
    run, runner, log = _run(), FakeRunner(), FakeLog()
    _publisher(run, "a", runner, log).fail(RuntimeError("boom"))
    _publisher(run, "b", runner, log).publish(_staged("b", 9))
    assert runner.statements == []
    assert log.lines[0].startswith("WARNING consistency group 'b': model.p.a failed")


def test_nothing_moves_when_every_view_already_shows_its_state() -> None:
    run, runner, log = _run(), FakeRunner(), FakeLog()
    _publisher(run, "a", runner, log).publish(_staged("a", 4, published=True))
    _publisher(run, "b", runner, log).publish(_staged("b", 9, published=True))
    assert runner.statements == []
    assert log.lines[-1] == "consistency group 'b': no member changed, nothing to publish"


def test_commit_row_is_one_valid_insert() -> None:
    run = _run()
    progress = run.progress("model.p.a")
    sql = commit_row(LOG, "c1", "commit", progress, "inv-1", [_staged("a", 4), _staged("b", 9)])
    tree = sqlglot.parse_one(sql, read="spark")
    assert tree.key == "insert"
    assert "`analytics`.`ivm_group_commits`" in sql
    assert "MAP('raw.src', 12)" in sql


def test_repair_reruns_only_views_whose_latest_commit_is_unfinished() -> None:
    members = [
        {"model": "model.p.a", "publish_sql": ["VIEW a AT 4"]},
        {"model": "model.p.b", "publish_sql": ["VIEW b AT 9"]},
    ]
    runner = FakeRunner(
        answers=[
            (
                ["commit_id", "group_name", "members", "committed_at"],
                [["c1", "g", json.dumps(members), None]],
            ),
            # b was published again by a later commit: c1 must not move it back.
            (["model", "commit_id"], [["model.p.a", "c1"], ["model.p.b", "c2"]]),
        ]
    )
    log = FakeLog()
    repaired = Publisher(
        runner=runner, log=log, model="x", commit_log=LOG, relation_exists=lambda table: "table"
    ).repair()
    assert repaired == 1
    assert "VIEW a AT 4" in runner.statements
    assert "VIEW b AT 9" not in runner.statements
    assert "'published'" in runner.statements[-1]


def _layered_run() -> GroupRun:
    """Group 'silver' (s1, s2 over raw.src) and group 'gold' (g1, g2 reading s1)."""

    def member(name: str, inputs: set[str], group: str) -> Member:
        return Member(
            f"model.p.{name}", name, TableName("analytics", name), frozenset(inputs), group
        )

    return GroupRun(
        "inv-2",
        consistency_groups(
            [
                member("s1", {"raw.src"}, "silver"),
                member("s2", {"raw.src"}, "silver"),
                member("g1", {"analytics.s1"}, "gold"),
                member("g2", {"analytics.s1"}, "gold"),
            ]
        ),
    )


def test_a_reader_of_a_refreshed_unpublished_group_publishes_after_it() -> None:
    run, runner, log = _layered_run(), FakeRunner(), FakeLog()
    _publisher(run, "s1", runner, log).publish(_staged("s1", 4))
    # gold's members read s1 at its refreshed state before silver publishes.
    progress, staged = run.staged_upstream(TableName("analytics", "s1"))
    assert (progress.group.name, staged.state_version) == ("silver", 4)
    gold = run.progress("model.p.g1")
    gold.after.add("silver")
    _publisher(run, "g1", runner, log).publish(_staged("g1", 7))
    why = _publisher(run, "g2", runner, log).publish(_staged("g2", 8))
    # Every gold member is in, but silver has not published: nothing moves.
    assert runner.statements == []
    assert why is not None and "publishes it after 'silver'" in why
    # silver's last member publishes silver, then gold, in that order.
    _publisher(run, "s2", runner, log).publish(_staged("s2", 5))
    moved = [s for s in runner.statements if s.startswith("ALTER VIEW")]
    assert moved == [
        "ALTER VIEW analytics.s1 AS SELECT 4",
        "ALTER VIEW analytics.s2 AS SELECT 5",
        "ALTER VIEW analytics.g1 AS SELECT 7",
        "ALTER VIEW analytics.g2 AS SELECT 8",
    ]
    assert run.progress("model.p.g1").committed
    # Once published, the model is read as its view shows it.
    assert run.staged_upstream(TableName("analytics", "s1")) is None


def test_a_reader_group_publishes_nothing_when_the_group_it_read_fails() -> None:
    run, runner, log = _layered_run(), FakeRunner(), FakeLog()
    _publisher(run, "s1", runner, log).publish(_staged("s1", 4))
    run.progress("model.p.g1").after.add("silver")
    _publisher(run, "g1", runner, log).publish(_staged("g1", 7))
    _publisher(run, "s2", runner, log).fail(RuntimeError("boom"))
    why = _publisher(run, "g2", runner, log).publish(_staged("g2", 8))
    assert not [s for s in runner.statements if s.startswith("ALTER VIEW")]
    assert why is not None and "withheld" in why and "'silver'" in why, why
    assert any("gold" in line and "publishes nothing" in line for line in log.lines), log.lines


def test_a_group_committed_in_this_run_answers_the_version_it_showed() -> None:
    # A reader that read s1's view text before silver committed pins after it:
    # the run answers the state silver's commit moved s1's view to.
    run, runner, log = _layered_run(), FakeRunner(), FakeLog()
    _publisher(run, "s1", runner, log).publish(_staged("s1", 4))
    assert run.published_in_run(TableName("analytics", "s1")) is None  # not committed yet
    _publisher(run, "s2", runner, log).publish(_staged("s2", 5))
    assert run.published_in_run(TableName("analytics", "s1")) == 4
    assert run.published_in_run(TableName("analytics", "g1")) is None  # gold never refreshed
