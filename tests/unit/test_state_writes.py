"""A commit's version from the session (StateWrites.own_session), with a fake runner."""

from __future__ import annotations

import logging
import re

import pytest

from dbt.adapters.spark_ivm.delta import confs, tables
from dbt.adapters.spark_ivm.refresh.state_history import StateHistory
from dbt.adapters.spark_ivm.refresh.writes import (
    CancellingRemoval,
    StateWrites,
    Written,
    _MergeInputs,
)
from ivm_compiler import TableName, emit, log_state
from ivm_compiler.reads import VersionRange
from tests.unit.test_compile import (
    EXTREMES_DESCRIBE,
    EXTREMES_PROBE,
    EXTREMES_SQL,
    ORDERS_TABLE,
    compile_with,
)
from tests.unit.test_staged_feeds import (
    BOTH_CHANGED,
    NOT_IN_CHANGED,
    _join_plan,
    _not_in_plan,
)

STATE = TableName(db="analytics", name="m__ivm_state")
MERGE = "MERGE INTO analytics.m__ivm_state ..."


class SessionRunner:
    """Answers the commit with one metrics row, SET of the last-commit conf with `last`."""

    def __init__(self, last: str, history_version: int = 99) -> None:
        self.statements: list[str] = []
        self.last = last
        self.history_version = history_version

    def execute(self, sql: str) -> None:
        self.statements.append(sql)

    def query(self, sql: str):
        self.statements.append(sql)
        if sql == confs.read_conf(confs.LAST_COMMIT_CONF):
            return ["key", "value"], [[confs.LAST_COMMIT_CONF, self.last]]
        if sql.startswith("DESCRIBE HISTORY"):
            return ["version"], [[self.history_version]]
        return ["num_affected_rows"], [[1]]


def _writes(runner: SessionRunner, own_session: bool) -> tuple[StateWrites, StateHistory]:
    history = StateHistory(runner, STATE)
    writes = StateWrites(
        runner,
        logging.getLogger(__name__),
        "m",
        STATE,
        own_session=own_session,
        committed=history.committed,
    )
    return writes, history


def test_own_session_reads_the_commit_version_set_after_the_commit():
    runner = SessionRunner(last="12")
    writes, history = _writes(runner, own_session=True)
    columns, rows = writes.commit(MERGE, {"refresh": "r"}, answer=True)
    assert (columns, rows) == (["num_affected_rows"], [[1]])
    # Unset before the statement, read after it: no earlier commit's version passes.
    forget = runner.statements.index(confs.forget_last_commit())
    assert forget < runner.statements.index(MERGE)
    assert runner.statements[-1] == confs.read_conf(confs.LAST_COMMIT_CONF)
    assert history.latest_version() == 12
    assert not any(s.startswith("DESCRIBE HISTORY") for s in runner.statements)


def test_an_unset_conf_falls_back_to_the_history():
    runner = SessionRunner(last="<undefined>", history_version=7)
    writes, history = _writes(runner, own_session=True)
    writes.commit(MERGE, {"refresh": "r"})
    assert history.latest_version() == 7
    assert runner.statements[-1].startswith("DESCRIBE HISTORY")


def test_a_shared_session_never_reads_the_conf():
    runner = SessionRunner(last="12", history_version=7)
    writes, history = _writes(runner, own_session=False)
    writes.commit(MERGE, {"refresh": "r"})
    assert history.latest_version() == 7
    assert confs.forget_last_commit() not in runner.statements
    assert confs.read_conf(confs.LAST_COMMIT_CONF) not in runner.statements


class FailingRunner(SessionRunner):
    def query(self, sql: str):
        if sql == MERGE:
            self.statements.append(sql)
            raise RuntimeError("the MERGE failed")
        return super().query(sql)


SETTINGS = {"spark.sql.constraintPropagation.enabled": "false"}


def test_settings_hold_for_the_statement_only():
    runner = SessionRunner(last="12")
    writes, _ = _writes(runner, own_session=False)
    writes.commit(MERGE, {"refresh": "r"}, SETTINGS)
    merge = runner.statements.index(MERGE)
    key, value = next(iter(SETTINGS.items()))
    assert runner.statements.index(confs.set_conf(key, value)) < merge
    assert runner.statements.index(confs.reset_conf(key)) > merge


def test_settings_are_reset_when_the_statement_fails():
    runner = FailingRunner(last="12")
    writes, _ = _writes(runner, own_session=False)
    with pytest.raises(RuntimeError, match="the MERGE failed"):
        writes.commit(MERGE, {"refresh": "r"}, SETTINGS, answer=True)
    key = next(iter(SETTINGS))
    # Both the statement's settings and the commit metadata are reset after it.
    assert set(runner.statements[-2:]) == {confs.reset_conf(key), confs.reset_commit_metadata()}


class CancellingRunner(SessionRunner):
    def query(self, sql: str):
        if sql == MERGE:
            raise RuntimeError(f"[USER_RAISED_EXCEPTION] {emit.CANCELLED}: taking deleted values")
        return super().query(sql)


def test_a_refused_cancelling_removal_is_told_apart_from_other_errors():
    writes, _ = _writes(CancellingRunner(last="12"), own_session=False)
    with pytest.raises(CancellingRemoval, match="dominated a group.s floating-point"):
        writes._merge(MERGE, {"refresh": "r"})
    writes, _ = _writes(FailingRunner(last="12"), own_session=False)
    with pytest.raises(RuntimeError, match="the MERGE failed"):
        writes._merge(MERGE, {"refresh": "r"})


# -- change feeds staged once (StateWrites.staged_feeds) ----------------------------------


class StagingRunner(SessionRunner):
    """A SessionRunner whose INSERT fails when `fail_write`, and each UNCACHE when `fail_drop`."""

    def __init__(self, fail_write: bool = False, fail_drop: bool = False) -> None:
        super().__init__(last="12")
        self.fail_write, self.fail_drop = fail_write, fail_drop

    def execute(self, sql: str) -> None:
        # An append is run without fetching (StateWrites.commit's `answer`).
        if self.fail_write and " INSERT INTO " in sql:
            self.statements.append(sql)
            raise RuntimeError("the write failed")
        super().execute(sql)
        if self.fail_drop and sql.startswith("UNCACHE"):
            raise RuntimeError("the session is gone")

    def query(self, sql: str):
        if self.fail_write and " INSERT INTO " in sql:
            self.statements.append(sql)
            raise RuntimeError("the write failed")
        if sql.startswith("SELECT 0 AS `__ivm_key`"):
            self.statements.append(sql)
            return ["__ivm_key", "__ivm_part", "__ivm_lo", "__ivm_hi"], []
        if sql.startswith("SELECT '__ivm_"):
            # The key relations' probes (changes.unchanged_relations_probe): every
            # relation touched by 3 change rows, and with 4 rows now.
            self.statements.append(sql)
            aliases = re.findall(r"SELECT '(__ivm_\w+)' AS relation", sql)
            found = 4 if " LIMIT " in sql else 3
            return ["relation", "found"], [[alias, found] for alias in aliases]
        return super().query(sql)


def _log_join_append(runner: StagingRunner) -> None:
    plan = log_state.with_log(_join_plan())
    writes, _ = _writes(runner, own_session=True)
    writes.append_change(plan, dict(BOTH_CHANGED), "r-read", read_version=3, compacting=False)


def _staged_names(runner: StagingRunner) -> list[str]:
    return [s.split("`")[1] for s in runner.statements if s.startswith("CACHE TABLE")]


def test_a_join_stages_both_feeds_reads_them_and_drops_them_after_the_write():
    runner = StagingRunner()
    _log_join_append(runner)
    names = _staged_names(runner)
    assert len(names) == 2
    probe = next(s for s in runner.statements if s.startswith("SELECT 0 AS `__ivm_key`"))
    write = next(s for s in runner.statements if " INSERT INTO " in s)
    for sql in (probe, write):
        assert "TABLE_CHANGES(" not in sql and all(f"`{n}`" in sql for n in names)
    after = runner.statements[runner.statements.index(write) + 1 :]
    for name in names:
        assert emit.drop_staged(name)[0] in after and emit.drop_staged(name)[1] in after


def test_stages_are_made_keeping_their_analyzed_plan_and_the_write_runs_without_it():
    runner = StagingRunner()
    _log_join_append(runner)
    stages = [i for i, s in enumerate(runner.statements) if s.startswith("CACHE TABLE")]
    write = next(i for i, s in enumerate(runner.statements) if " INSERT INTO " in s)
    for key, value in confs.STAGE_SETTINGS.items():
        assert runner.statements.index(confs.set_conf(key, value)) < min(stages)
        assert max(stages) < runner.statements.index(confs.reset_conf(key)) < write


def test_stages_within_a_change_give_its_confs_back_not_the_session_defaults():
    # The change runs without adaptive execution, as its stages do: the stage
    # block leaves it off for the write, where a RESET would turn it back on.
    runner = StagingRunner()
    writes, _ = _writes(runner, own_session=True)
    writes.staging = confs.Staging(settings=confs.CHANGE_SETTINGS)
    writes.append_change(
        log_state.with_log(_join_plan()), dict(BOTH_CHANGED), "r-read", 3, compacting=False
    )
    adaptive_off = confs.set_conf(confs.ADAPTIVE_CONF, "false")
    adaptive_reset = confs.reset_conf(confs.ADAPTIVE_CONF)
    write = next(i for i, s in enumerate(runner.statements) if " INSERT INTO " in s)
    assert runner.statements.count(adaptive_off) == 1
    assert runner.statements.count(adaptive_reset) == 1
    assert runner.statements.index(adaptive_off) < write < runner.statements.index(adaptive_reset)


def test_a_failed_write_drops_the_stages_and_raises_its_own_error():
    runner = StagingRunner(fail_write=True, fail_drop=True)
    with pytest.raises(RuntimeError, match="the write failed"):
        _log_join_append(runner)
    assert sum(s.startswith("UNCACHE") for s in runner.statements) == 2


def test_a_failed_drop_after_a_good_write_is_raised():
    with pytest.raises(RuntimeError, match="the session is gone"):
        _log_join_append(StagingRunner(fail_drop=True))


def test_a_change_over_small_sources_runs_under_its_settings_from_its_stages_to_its_write():
    runner = StagingRunner()
    writes, _ = _writes(runner, own_session=True)
    writes.staging = confs.Staging(settings={confs.DATA_SKIPPING_CONF: "false"})
    writes.append_change(
        log_state.with_log(_join_plan()), dict(BOTH_CHANGED), "r-read", 3, compacting=False
    )
    set_at = runner.statements.index(confs.set_conf(confs.DATA_SKIPPING_CONF, "false"))
    reset_at = runner.statements.index(confs.reset_conf(confs.DATA_SKIPPING_CONF))
    write = next(i for i, s in enumerate(runner.statements) if " INSERT INTO " in s)
    first_stage = next(i for i, s in enumerate(runner.statements) if s.startswith("CACHE TABLE"))
    last_drop = max(i for i, s in enumerate(runner.statements) if s.startswith("DROP VIEW"))
    # Set once, before the stages (their scans and the probe's run as the
    # write's do), reset once, after the stages are freed.
    assert set_at < first_stage < write < last_drop < reset_at
    assert runner.statements.count(confs.set_conf(confs.DATA_SKIPPING_CONF, "false")) == 1


def test_small_sources_snapshots_are_staged_for_the_write_and_dropped_after_it():
    runner = StagingRunner()
    writes, _ = _writes(runner, own_session=True)
    writes.staging = confs.Staging(frozenset(NOT_IN_CHANGED))
    writes.append_change(
        log_state.with_log(_not_in_plan()), dict(NOT_IN_CHANGED), "r-read", 3, compacting=False
    )
    snapshots = [n for n in _staged_names(runner) if "_snapshot_" in n]
    assert len(snapshots) == 2
    write = next(i for i, s in enumerate(runner.statements) if " INSERT INTO " in s)
    assert "VERSION AS OF" not in runner.statements[write]
    assert all(f"`{n}`" in runner.statements[write] for n in snapshots)
    for name in snapshots:
        assert runner.statements.index(emit.drop_staged(name)[0]) > write


def test_over_small_sources_every_stage_is_coalesced_and_without_them_none():
    coalesced, plain = StagingRunner(), StagingRunner()
    for runner, staging in (
        (coalesced, confs.staging(_sized(NOT_IN_CHANGED, 5_000))),
        (plain, confs.staging(_sized(NOT_IN_CHANGED, confs.SMALL_SOURCE_BYTES + 1))),
    ):
        writes, _ = _writes(runner, own_session=True)
        writes.staging = staging
        writes.append_change(
            log_state.with_log(_not_in_plan()), dict(NOT_IN_CHANGED), "r-read", 3, False
        )
    stages = [s for s in coalesced.statements if s.startswith("CACHE TABLE")]
    # Both change feeds and both snapshots, each in one partition.
    assert len(stages) == 4
    assert all(" AS SELECT /*+ COALESCE(1) */ " in s for s in stages)
    plain_stages = [s for s in plain.statements if s.startswith("CACHE TABLE")]
    assert len(plain_stages) == 2
    assert not any("COALESCE(1)" in s for s in plain_stages)


def _appended_over(size_bytes: int) -> StagingRunner:
    """The statements of a log state's append of NOT_IN_CHANGED, each source of `size_bytes`."""
    runner = StagingRunner()
    writes, _ = _writes(runner, own_session=True)
    writes.staging = confs.staging(_sized(NOT_IN_CHANGED, size_bytes))
    writes.append_change(
        log_state.with_log(_not_in_plan()), dict(NOT_IN_CHANGED), "r-read", 3, compacting=False
    )
    return runner


def _set_from_first_stage_to_write(runner: StagingRunner, key: str, value: str) -> None:
    """`key` is set to `value` before the change's first stage and reset after its write."""
    set_at = runner.statements.index(confs.set_conf(key, value))
    reset_at = runner.statements.index(confs.reset_conf(key))
    first_stage = next(i for i, s in enumerate(runner.statements) if s.startswith("CACHE TABLE"))
    write = next(i for i, s in enumerate(runner.statements) if " INSERT INTO " in s)
    assert set_at < first_stage < write < reset_at


def test_over_a_large_source_a_change_runs_without_adaptive_execution_and_keeps_data_skipping():
    runner = _appended_over(confs.UNSKIPPED_SOURCE_BYTES)
    _set_from_first_stage_to_write(runner, confs.ADAPTIVE_CONF, "false")
    # Its partners' key-bounded reads need Delta's data skipping.
    assert not any(confs.DATA_SKIPPING_CONF in s for s in runner.statements)


def test_under_the_unskipped_size_a_change_reads_its_large_sources_without_data_skipping():
    runner = _appended_over(confs.SMALL_SOURCE_BYTES + 1)
    _set_from_first_stage_to_write(runner, confs.DATA_SKIPPING_CONF, "false")
    # Large sources all the same: their snapshots are not staged, nor coalesced,
    # and their code generated.
    stages = [s for s in runner.statements if s.startswith("CACHE TABLE")]
    assert len(stages) == 2
    assert not any("COALESCE(1)" in s for s in stages)
    assert not any("codegen" in s for s in runner.statements)


def _sized(ranges, size_bytes: int) -> dict[TableName, tables.SourceSnapshot]:
    """Pins of `ranges`' sources at their pinned versions, each of `size_bytes`."""
    return {
        table: tables.SourceSnapshot(table, None, versions.pinned, size_bytes=size_bytes)
        for table, versions in ranges.items()
    }


def test_without_small_sources_no_snapshot_is_staged():
    runner = StagingRunner()
    writes, _ = _writes(runner, own_session=True)
    writes.append_change(
        log_state.with_log(_not_in_plan()), dict(NOT_IN_CHANGED), "r-read", 3, compacting=False
    )
    assert not any("_snapshot_" in n for n in _staged_names(runner))
    write = next(s for s in runner.statements if " INSERT INTO " in s)
    assert "`shop`.`orders` VERSION AS OF 5" in write


# -- a plan with pre-aggregations (StateWrites._merge_change) -------------------------


class MergeRunner(SessionRunner):
    """Records statements; the first MERGE fails with `first_error`, if given."""

    def __init__(self, first_error: str | None = None) -> None:
        super().__init__(last="12")
        self.first_error = first_error

    def query(self, sql: str):
        if sql.startswith("MERGE INTO") and self.first_error is not None:
            self.statements.append(sql)
            error, self.first_error = self.first_error, None
            raise RuntimeError(error)
        return super().query(sql)


def _merge_extremes(
    runner: MergeRunner, staging: confs.Staging, refill_first: bool = False
) -> Written:
    plan, _ = compile_with(EXTREMES_SQL, EXTREMES_DESCRIBE, EXTREMES_PROBE)
    writes, _ = _writes(runner, own_session=True)
    writes.staging = staging
    ranges = {ORDERS_TABLE: VersionRange(recorded=4, pinned=6)}
    pinned = {ORDERS_TABLE: tables.SourceSnapshot(ORDERS_TABLE, None, 6)}
    guard = emit.Guard(read="r-read", write="r-this")
    inputs = _MergeInputs(plan, ranges, guard, {}, {}, refill_first=refill_first)
    return writes._merge_change(inputs, pinned)


def _merges(runner: MergeRunner) -> list[str]:
    return [s for s in runner.statements if s.startswith("MERGE INTO")]


def test_over_a_large_source_the_change_rows_are_staged_and_the_merge_reads_them():
    runner = MergeRunner()
    _merge_extremes(runner, confs.Staging(change_rows=True))
    staged = _staged_names(runner)
    assert len(staged) == 2 and staged[1] == f"{staged[0]}_rows"
    (merge,) = _merges(runner)
    assert f"FROM `{staged[1]}`" in merge and "TABLE_CHANGES" not in merge
    for name in staged:
        assert runner.statements.index(emit.drop_staged(name)[0]) > runner.statements.index(merge)


def test_over_small_sources_only_the_signed_rows_are_staged():
    runner = MergeRunner()
    _merge_extremes(runner, confs.Staging())
    (staged,) = _staged_names(runner)
    (merge,) = _merges(runner)
    assert f"FROM `{staged}`" in merge and "__ivm_kept_a0_min" in merge


def test_a_merge_whose_kept_extremes_ran_out_runs_again_refilling_from_the_sources():
    runner = MergeRunner(first_error=f"[USER_RAISED_EXCEPTION] {emit.EXHAUSTED}: a group of ...")
    written = _merge_extremes(runner, confs.Staging(change_rows=True))
    first, second = _merges(runner)
    assert "__ivm_exhausted` = TRUE" in first and "VERSION AS OF" not in first
    # The refill reads the source at its pinned version, and refuses nothing.
    assert "`shop`.`orders` VERSION AS OF 6" in second and "ivm exhausted" not in second
    assert written.refilled_extremes


def test_after_a_refresh_that_refilled_the_merge_refills_at_once():
    runner = MergeRunner()
    written = _merge_extremes(runner, confs.Staging(change_rows=True), refill_first=True)
    (merge,) = _merges(runner)
    # The refilling MERGE alone: it reads the source at its pinned version and refuses nothing.
    assert "`shop`.`orders` VERSION AS OF 6" in merge and "ivm exhausted" not in merge
    # It cannot tell whether a group ran out, so the next refresh tries the plain MERGE.
    assert not written.refilled_extremes
