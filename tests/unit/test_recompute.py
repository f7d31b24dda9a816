"""Golden SQL of a recompute (fixtures/recompute.sql) and the properties its MERGE must have.

Same format as fixtures/compile.sql (tests/unit/golden.py), with a
recompute's two statements at version 10: overwrite_state (an INSERT
OVERWRITE, for a state no ivm model reads) and merge_recomputed (a MERGE of
the recomputed rows by key, for one they read: only rows that differ are
written, so the readers' change is just those rows). The rules layer runs
merge_recomputed in DuckDB (tests/rules/oracle.py, Refreshes.recompute).

Regenerate with UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_recompute.py
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from ivm_compiler import ViewClass, ViewPlan, compile_model, emit, state_rows
from ivm_compiler.names import GUARD
from ivm_compiler.sql import DIALECT
from tests.unit import golden

FIXTURE = Path(__file__).parent / "fixtures" / "recompute.sql"
STATEMENTS = ("overwrite_state", "merge_recomputed")


def compile_case(fixture: golden.FixtureFile, case: golden.Case) -> ViewPlan:
    return compile_model(golden.MODEL, case.sql, golden.catalog(fixture, case))


def emit_all(plan: ViewPlan) -> dict[str, str]:
    pinned = {table: golden.LAST_CHANGE for table in plan.tables}
    return {
        "overwrite_state": emit.overwrite_state(plan, golden.STATE, pinned, golden.GUARD.write),
        "merge_recomputed": emit.merge_recomputed(plan, golden.STATE, pinned, golden.GUARD),
    }


FIXTURES = golden.load_fixture(
    FIXTURE, STATEMENTS, lambda fixture, case: emit_all(compile_case(fixture, case))
)
IDS = [case.id for case in FIXTURES.cases]


@functools.cache
def compiled(case_id: str) -> tuple[ViewPlan, dict[str, str]]:
    case = next(c for c in FIXTURES.cases if c.id == case_id)
    plan = compile_case(FIXTURES, case)
    return plan, emit_all(plan)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_golden(case: golden.Case) -> None:
    plan, emitted = compiled(case.id)
    assert plan.view_class is ViewClass(case.headers["class"])
    golden.assert_emitted(case, emitted, STATEMENTS)


def _merge(case_id: str) -> exp.Merge:
    merge = sqlglot.parse_one(compiled(case_id)[1]["merge_recomputed"], read=DIALECT)
    assert isinstance(merge, exp.Merge)
    return merge


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_the_merge_reads_the_sources_at_the_pinned_versions(case: golden.Case) -> None:
    merge = _merge(case.id)
    assert not any(f.name.lower() == "table_changes" for f in merge.find_all(exp.Anonymous))
    read = [t for t in merge.find_all(exp.Table) if t.args.get("version")]
    assert read and all(t.args["version"].expression.name == str(golden.LAST_CHANGE) for t in read)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_only_rows_that_differ_are_written(case: golden.Case) -> None:
    plan, _ = compiled(case.id)
    merge = _merge(case.id)
    # Every merge key matched null-safely (NULL groups are rows too), and the
    # guard row meets the guard source row only (emit.Guard).
    safe = [c.this.name for c in merge.args["on"].find_all(exp.NullSafeEQ)]
    assert sorted(safe) == sorted([*plan.merge_keys, GUARD])
    whens = merge.args["whens"].expressions
    move, update = [w for w in whens if w.args.get("matched")]
    assert move.args["condition"].sql(DIALECT) == f"NOT `__ivm_d`.`{GUARD}` IS NULL"
    # A matched row is rewritten only when one of its other columns differs.
    values = [c for c in state_rows.state_table_columns(plan) if c not in plan.merge_keys]
    assert values
    compared = [c.this.name for c in update.args["condition"].find_all(exp.NullSafeEQ)]
    assert sorted(compared) == sorted(values)
    assert [e.this.name for e in update.args["then"].expressions] == values
    # A state row the recomputation no longer holds is deleted, never the guard row.
    (by_source,) = [w for w in whens if w.args.get("source")]
    assert by_source.args["then"] == exp.var("DELETE")
    assert by_source.args["condition"].sql(DIALECT) == f"`__ivm_t`.`{GUARD}` IS NULL"


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_the_overwrite_writes_every_row(case: golden.Case) -> None:
    statement = sqlglot.parse_one(compiled(case.id)[1]["overwrite_state"], read=DIALECT)
    assert isinstance(statement, exp.Insert) and statement.args.get("overwrite")
    assert statement.find(exp.Merge) is None
