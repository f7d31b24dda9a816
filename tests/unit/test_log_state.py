"""Golden SQL of log states (fixtures/log_state.sql), what it must hold, and the refusals.

Same format as fixtures/compile.sql (tests/unit/golden.py), with the
statements of a log state: create_state (marked as a log), append_changes
(the change of versions 8..10 and a marker row), compact (the log and the
change consolidated, over the log) and create_view (the consolidating view).

Regenerate with UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_log_state.py
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from ivm_compiler import ViewClass, ViewPlan, compile_model, emit, log_state
from ivm_compiler.names import COUNT, GUARD, NEGATED_ALIAS
from ivm_compiler.sql import DIALECT
from tests.unit import golden

FIXTURE = Path(__file__).parent / "fixtures" / "log_state.sql"
STATEMENTS = ("create_state", "append_changes", "compact", "create_view")
MARKER = "r-this"


def compile_case(fixture: golden.FixtureFile, case: golden.Case) -> ViewPlan:
    plan = compile_model(golden.MODEL, case.sql, golden.catalog(fixture, case))
    assert log_state.refusal(plan) is None, log_state.refusal(plan)
    return log_state.with_log(plan)


def emit_all(plan: ViewPlan) -> dict[str, str]:
    windows = golden.windows(plan)
    return {
        "create_state": emit.create_state(
            plan, golden.STATE, golden.versions(plan), golden.GUARD.write, change_feed=False
        ),
        "append_changes": log_state.append_changes(plan, golden.STATE, windows, MARKER),
        "compact": log_state.compact(plan, golden.STATE, windows, golden.GUARD.read),
        "create_view": emit.create_view(
            plan,
            golden.STATE,
            golden.TARGET,
            published=emit.Published(
                state_version=golden.PUBLISHED_STATE_VERSION, source_versions=golden.versions(plan)
            ),
        ),
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


def _parsed(case_id: str, name: str) -> exp.Expr:
    return sqlglot.parse_one(compiled(case_id)[1][name], read=DIALECT)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_the_view_sums_the_log_per_key_without_the_guard_and_marker_rows(case: golden.Case):
    plan, _ = compiled(case.id)
    # As readers find it: a projection's split log put back as its sums.
    view = log_state.summed_view(_parsed(case.id, "create_view"), golden.STATE)
    # The innermost SELECT reads the state: the log summed per key.
    consolidation = next(
        s for s in view.find_all(exp.Select) if isinstance(s.args["from_"].this, exp.Table)
    )
    assert consolidation.args["where"].this.sql(DIALECT) == f"`{GUARD}` IS NULL"
    keys = [c.name for c in plan.state_columns if c.rule.value == "key"]
    grouped = [g.name for g in (consolidation.args.get("group") or exp.Group()).expressions]
    assert grouped == keys
    having = consolidation.args.get("having")
    if plan.view_class is ViewClass.GLOBAL_AGGREGATE:
        assert having is None, "a global aggregate keeps its one row"
    else:
        assert having.this.sql(DIALECT) == f"SUM(`{COUNT}`) <> 0"
    # The state is read at the published version.
    read = next(t for t in consolidation.find_all(exp.Table) if t.name == golden.STATE.name)
    assert read.args["version"].expression.name == str(golden.PUBLISHED_STATE_VERSION)


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_a_projections_view_sums_only_the_keys_some_row_removes(case: golden.Case):
    """Rows whose key hash no negated row has are read as they are; the rest summed."""
    plan, _ = compiled(case.id)
    view = _parsed(case.id, "create_view")
    split = next((u for u in view.find_all(exp.Union)), None)
    if plan.view_class is not ViewClass.PROJECTION:
        assert split is None, "other view classes sum every key's rows"
        return
    as_they_are, summing = split.this, split.expression
    assert as_they_are.args.get("group") is None and summing.args.get("group") is not None
    for half, kind in ((as_they_are, "ANTI"), (summing, "SEMI")):
        (join,) = half.args["joins"]
        assert (join.side, join.kind) == ("LEFT", kind)
        assert join.alias_or_name == NEGATED_ALIAS
        negated = join.this.this
        assert negated.args["distinct"] and f"`{COUNT}` < 0" in negated.sql(DIALECT)
        assert half.args["hint"].sql(DIALECT) == f"/*+ BROADCAST({NEGATED_ALIAS}) */"
    # Every read of the state (both halves, both hash lists) is at the published version.
    reads = [t for t in view.find_all(exp.Table) if t.name == golden.STATE.name]
    assert len(reads) == 4
    assert {t.args["version"].expression.name for t in reads} == {
        str(golden.PUBLISHED_STATE_VERSION)
    }


@pytest.mark.parametrize("case", FIXTURES.cases, ids=IDS)
def test_an_append_is_one_insert_with_a_marker_row(case: golden.Case):
    append = _parsed(case.id, "append_changes")
    assert isinstance(append, exp.Insert) and not append.args.get("overwrite")
    assert append.find(exp.Merge) is None
    markers = [lit for lit in append.find_all(exp.Literal) if lit.this == MARKER]
    assert len(markers) == 1
    compact = _parsed(case.id, "compact")
    assert isinstance(compact, exp.Insert) and compact.args.get("overwrite")
    # The rewrite keeps one guard row, holding the guard the refresh read.
    assert [lit.this for lit in compact.find_all(exp.Literal) if lit.this.startswith("r-")] == [
        golden.GUARD.read
    ]


def test_the_state_is_marked_as_a_log():
    _, emitted = compiled(IDS[0])
    assert f"'{log_state.STATE_FORM_PROPERTY}'='{log_state.LOG}'" in emitted["create_state"]


@pytest.mark.parametrize(
    ("sql", "describe", "probe", "named"),
    [
        (
            "SELECT customer, MAX(amount) AS top FROM shop.orders GROUP BY customer",
            "customer string, top decimal(10,2)",
            "key_0 string, value_0 decimal(10,2)",
            "MIN/MAX and COUNT(DISTINCT)",
        ),
        (
            "SELECT customer, SUM(price) AS p FROM shop.orders GROUP BY customer",
            "customer string, p double",
            "key_0 string, sum_0 double",
            "floating-point SUM/AVG",
        ),
        (
            "SELECT customer, COUNT(*) AS n FROM shop.orders GROUP BY customer ORDER BY n LIMIT 3",
            "customer string, n bigint",
            "key_0 string",
            "ORDER BY ... LIMIT",
        ),
    ],
)
def test_states_that_need_their_stored_values_are_refused(sql, describe, probe, named):
    catalog = golden.FakeCatalog(
        FIXTURES.sources, sql, golden.split_columns(describe), golden.split_columns(probe)
    )
    reason = log_state.refusal(compile_model(golden.MODEL, sql, catalog))
    assert reason is not None and named in reason


@pytest.mark.parametrize(
    "circumstances, named",
    [
        (log_state.Circumstances(plan_nodes=True), "plan nodes"),
        (log_state.Circumstances(read_by_ivm_models=True), "other ivm models read"),
        (log_state.Circumstances(join_states=True), "join states"),
        (log_state.Circumstances(own_session=False), "shares a Spark session"),
    ],
)
def test_what_beside_the_plan_keeps_a_state_merged(circumstances, named):
    plan, _ = compiled(IDS[0])
    assert log_state.refusal(plan) is None
    reason = log_state.refusal(plan, circumstances)
    assert reason is not None and named in reason


def test_only_a_projection_is_a_log_that_ivm_models_read():
    """Its log rows are rows of the model (reads.signed_changes); others' are partial rows."""
    read = log_state.Circumstances(read_by_ivm_models=True)
    by_class = {compiled(i)[0].view_class: log_state.refusal(compiled(i)[0], read) for i in IDS}
    assert by_class[ViewClass.PROJECTION] is None
    for view_class in (ViewClass.DISTINCT, ViewClass.GROUPED_AGGREGATE):
        reason = by_class[view_class]
        assert reason is not None and "only a projection's log rows" in reason, view_class
