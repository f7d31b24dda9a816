"""Golden SQL of WINDOW models (fixtures/windows.sql) and the properties it must have.

Same format as fixtures/compile.sql (tests/unit/golden.py), with the statements
a WINDOW model's refresh runs instead of merge_changes: probe_partitions (the
touched partition keys, from the change feed of versions 8..10) and
merge_partitions (the MERGE recomputing them at version 10). Each case's
`# touched:` header lists the partition keys the merge is emitted for: keys
separated by `;`, a key's values by `,`, NULL for a NULL value.

Regenerate with UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_windows_golden.py
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from ivm_compiler import ViewClass, ViewPlan, compile_model, emit
from ivm_compiler.names import COUNT, GONE, GUARD, STORED_ALIAS
from ivm_compiler.sql import DIALECT
from ivm_compiler.view_classes.window import PartitionKey
from tests.unit import golden

FIXTURE = Path(__file__).parent / "fixtures" / "windows.sql"
STATEMENTS = golden.WINDOW_STATEMENTS


def touched(case: golden.Case) -> list[PartitionKey]:
    """The `# touched:` header as partition keys (values as the probe returns them: text).

    >>> touched(golden.Case("t", {"touched": "1, a; NULL, b"}, "", {}))
    [('1', 'a'), (None, 'b')]
    """
    return [
        tuple(None if v.strip() == "NULL" else v.strip() for v in key.split(","))
        for key in case.headers["touched"].split(";")
    ]


def compile_case(fixture: golden.FixtureFile, case: golden.Case) -> ViewPlan:
    return compile_model(golden.MODEL, case.sql, golden.catalog(fixture, case))


def emit_all(plan: ViewPlan, case: golden.Case) -> dict[str, str]:
    pinned = {table: golden.LAST_CHANGE for table in plan.tables}
    return {
        "create_state": emit.create_state(
            plan, golden.STATE, golden.versions(plan), golden.GUARD.write
        ),
        "probe_partitions": emit.probe_partitions(plan, golden.windows(plan)),
        "merge_partitions": emit.merge_partitions(
            plan, golden.STATE, pinned, touched(case), golden.GUARD
        ),
        "create_view": emit.create_view(
            plan,
            golden.STATE,
            golden.TARGET,
            published=emit.Published(
                state_version=golden.PUBLISHED_STATE_VERSION, source_versions=golden.versions(plan)
            ),
        ),
        "model_query": emit.model_query(plan, golden.versions(plan)),
    }


FIXTURES = golden.load_fixture(
    FIXTURE, STATEMENTS, lambda fixture, case: emit_all(compile_case(fixture, case), case)
)
IDS = [case.id for case in FIXTURES.cases]


@functools.cache
def compiled(case_id: str) -> tuple[ViewPlan, dict[str, str]]:
    case = next(c for c in FIXTURES.cases if c.id == case_id)
    plan = compile_case(FIXTURES, case)
    return plan, emit_all(plan, case)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_golden(case: golden.Case) -> None:
    plan, emitted = compiled(case.id)
    assert plan.view_class is ViewClass(case.headers["class"])
    golden.assert_emitted(case, emitted, STATEMENTS)


def _parsed(case: golden.Case) -> dict[str, exp.Expression]:
    return {n: sqlglot.parse_one(sql, read=DIALECT) for n, sql in compiled(case.id)[1].items()}


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_merge_recomputes_only_the_touched_partitions(case: golden.Case) -> None:
    """The partition predicate filters the rows before the windows, and bounds the delete."""
    plan, _ = compiled(case.id)
    merge = _parsed(case)["merge_partitions"]
    assert isinstance(merge, exp.Merge)
    rows = next(c.this for c in merge.find_all(exp.CTE))
    # The filter is in the WHERE of the SELECT that computes the window functions
    # (under a QUALIFY that SELECT is a derived table of the rows).
    windowed = next(
        s for s in rows.find_all(exp.Select) if any(p.find(exp.Window) for p in s.expressions)
    )
    where = windowed.args["where"].sql(DIALECT)
    for column in plan.window_partition:
        assert column.source.sql(DIALECT) in where
    # The source is read at the pinned version, never as a change feed.
    assert not any(f.name.lower() == "table_changes" for f in merge.find_all(exp.Anonymous))
    whens = merge.args["whens"].expressions
    # No clause reads the state's unmatched rows (WHEN NOT MATCHED BY SOURCE):
    # Delta would then join the whole state (emit._with_gone_rows).
    assert not [w for w in whens if w.args.get("source")]
    # The state rows the recomputation no longer holds are in the source, marked
    # gone: read from the state within the touched partitions, the guard row spared.
    anti = next(j for j in merge.find_all(exp.Join) if j.args.get("kind") == "ANTI")
    stored = anti.parent_select
    assert stored.args["from_"].this.alias_or_name == STORED_ALIAS
    assert [e.alias for e in stored.expressions][-1] == GONE
    within = stored.args["where"].sql(DIALECT)
    assert f"`{STORED_ALIAS}`.`{GUARD}` IS NULL" in within
    for column in plan.window_partition:
        assert f"`{STORED_ALIAS}`.`{column.state_column}`" in within
    # ... and not held: matched null-safely on every key.
    held = [c.this.name for c in anti.args["on"].find_all(exp.NullSafeEQ)]
    assert sorted(held) == sorted(plan.keys)
    # Every key is matched null-safely (NULL partitions and values are rows too).
    on = merge.args["on"]
    safe = [c.this.name for c in on.find_all(exp.NullSafeEQ)]
    # ... and the guard row meets the guard source row only (emit.Guard).
    assert sorted(safe) == sorted([*plan.keys, GUARD])
    # The guard row is moved first, a gone row deleted; a matched model row is
    # rewritten only when its multiplicity changed.
    move, delete, matched = [w for w in whens if w.args.get("matched")]
    assert move.args["condition"].sql(DIALECT) == f"NOT `__ivm_d`.`{GUARD}` IS NULL"
    assert delete.args["condition"].sql(DIALECT) == f"`__ivm_d`.`{GONE}`"
    assert delete.args["then"] == exp.var("DELETE")
    assert matched.args["condition"].sql(DIALECT) == (
        f"NOT (`__ivm_t`.`{COUNT}` IS NOT DISTINCT FROM `__ivm_d`.`{COUNT}`)"
    )
    # A gone row is never inserted back.
    insert = next(w for w in whens if not w.args.get("matched"))
    assert f"NOT `__ivm_d`.`{GONE}`" in insert.args["condition"].sql(DIALECT)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_probe_reads_the_change_feed_through_the_models_where(case: golden.Case) -> None:
    plan, _ = compiled(case.id)
    probe = _parsed(case)["probe_partitions"]
    feeds = [f for f in probe.find_all(exp.Anonymous) if f.name.lower() == "table_changes"]
    assert [f.expressions[0].this for f in feeds] == [plan.sources[0].table.sql()]
    # Pre- and post-images alike: no filter on the change type.
    assert "_change_type" not in (
        probe.args["where"].sql(DIALECT) if probe.args.get("where") else ""
    )
    assert probe.args.get("distinct") is not None
    rows_where = plan.rows.args.get("where")
    if rows_where is not None:
        assert probe.args["where"].sql(DIALECT) == rows_where.sql(DIALECT)
