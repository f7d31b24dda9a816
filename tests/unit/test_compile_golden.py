"""The compiler's emitted SQL, compared with the golden fixtures in fixtures/compile.sql.

Regenerate after an intended change with
    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_compile_golden.py
and review the diff of the fixture file: a golden file only helps if someone
has read it. The structural tests below state, independently of the text, the
properties every golden output must have, so a regeneration cannot quietly
bake a broken statement in.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from ivm_compiler import ViewClass, ViewPlan, compile_model, emit, names
from ivm_compiler import changes as relations
from ivm_compiler.names import CHANGES_CTE, COUNT, GUARD, SIGN, SLOT, is_reserved
from ivm_compiler.plan import KeyRelation, PartnerFilter
from ivm_compiler.sql import DIALECT
from tests.unit import golden

FIXTURE = Path(__file__).parent / "fixtures" / "compile.sql"


def compile_case(
    fixture: golden.FixtureFile, case: golden.Case
) -> tuple[ViewPlan, golden.FakeCatalog]:
    catalog = golden.catalog(fixture, case)
    return compile_model(golden.MODEL, case.sql, catalog), catalog


def emit_all(plan: ViewPlan) -> dict[str, str]:
    return {
        "create_state": emit.create_state(
            plan, golden.STATE, golden.versions(plan), golden.GUARD.write
        ),
        "merge_changes": emit.merge_changes(plan, golden.STATE, golden.windows(plan), golden.GUARD),
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
    FIXTURE, golden.STATEMENTS, lambda fixture, case: emit_all(compile_case(fixture, case)[0])
)


def _params(cases: list[golden.Case]) -> list:
    return [
        pytest.param(
            case,
            id=case.id,
            # A wrong statement fails an assertion; any other error is a broken case.
            marks=[pytest.mark.xfail(raises=AssertionError, strict=True, reason=case.xfail)]
            if case.xfail
            else [],
        )
        for case in cases
    ]


CASES = _params(FIXTURES.cases)
# The structural tests hold for what the compiler emits today; a case marked
# xfail is wrong today, so it is left out of them.
CORRECT_CASES = [case for case in FIXTURES.cases if not case.xfail]


@functools.cache
def compiled(case_id: str) -> tuple[ViewPlan, golden.FakeCatalog, dict[str, str]]:
    """Each case compiled once per run; the tests below only read the results."""
    case = next(c for c in FIXTURES.cases if c.id == case_id)
    plan, catalog = compile_case(FIXTURES, case)
    return plan, catalog, emit_all(plan)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: golden.Case) -> None:
    plan, catalog, emitted = compiled(case.id)
    assert plan.view_class is ViewClass(case.headers["class"])
    # A '# describe probe:' header that the compiler never asks for is stale.
    assert ("describe probe" in catalog.asked) == ("describe probe" in case.headers)
    # One probe per model at most: every type the compiler needs comes from it.
    assert catalog.asked.count("describe probe") <= 1
    golden.assert_emitted(case, emitted, golden.STATEMENTS)


def test_fixture_covers_every_view_class() -> None:
    covered = {ViewClass(case.headers["class"]) for case in CORRECT_CASES}
    # WINDOW applies changes with other statements: fixtures/windows.sql.
    assert covered == set(ViewClass) - {ViewClass.WINDOW}


# -- properties every golden statement must have ------------------------------


@functools.cache
def _parsed(case_id: str) -> dict[str, exp.Expression]:
    return {
        name: sqlglot.parse_one(sql, read=DIALECT) for name, sql in compiled(case_id)[2].items()
    }


def _statements(case: golden.Case) -> tuple[ViewPlan, dict[str, exp.Expression]]:
    # Copies, so no test can change what the next one reads.
    return compiled(case.id)[0], {name: tree.copy() for name, tree in _parsed(case.id).items()}


def _ids(cases: list[golden.Case]) -> list[str]:
    return [case.id for case in cases]


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_view_exposes_exactly_the_model_columns(case: golden.Case) -> None:
    _, statements = _statements(case)
    view = statements["create_view"].expression
    assert isinstance(view, exp.Select)
    described = golden.split_columns(case.headers["describe"])
    assert [p.alias for p in view.expressions] == [name for name, _ in described]
    # Bookkeeping is read, never shown.
    assert not any(is_reserved(p.alias) for p in view.expressions)
    # Each output is cast to the type Spark reports for the model's query.
    for projection, (_, data_type) in zip(view.expressions, described):
        assert isinstance(projection.this, exp.Cast)
        assert projection.this.to == exp.DataType.build(data_type, dialect=DIALECT)


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_merge_matches_state_rows_null_safely(case: golden.Case) -> None:
    plan, statements = _statements(case)
    merge = statements["merge_changes"]
    assert isinstance(merge, exp.Merge)
    # A state row is its row key, then (with pre-aggregation rows) its slot and value;
    # a bounded MIN/MAX keeps its values on the group row.
    assert plan.keys == tuple(k.name for k in plan.key_columns)
    if plan.row_preaggregations:
        assert plan.merge_keys == (
            *plan.keys,
            SLOT,
            *(p.value_column for p in plan.row_preaggregations),
        )
    else:
        assert plan.merge_keys == plan.keys
    on = merge.args["on"]
    conditions = list(on.flatten()) if isinstance(on, exp.And) else [on]
    # The last condition matches the guard row to the guard source row only (emit.Guard).
    *conditions, same_guard = conditions
    assert same_guard.sql(DIALECT) == (
        f"`__ivm_t`.`{GUARD}` IS NOT DISTINCT FROM `__ivm_d`.`{GUARD}`"
    )
    if not plan.merge_keys:
        assert plan.view_class is ViewClass.GLOBAL_AGGREGATE
        assert not conditions
        return
    # NULL is a group (GROUP BY) and a projected value like any other: '=' would
    # never match it, and every change to a NULL key would insert a new row.
    assert all(isinstance(c, exp.NullSafeEQ) for c in conditions)
    assert [c.this.name for c in conditions] == list(plan.merge_keys)
    assert [c.expression.name for c in conditions] == list(plan.merge_keys)


def _where(select: exp.Select) -> str:
    return select.args["where"].sql(DIALECT) if select.args.get("where") else ""


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_merge_deletes_emptied_rows_except_the_global_row(case: golden.Case) -> None:
    plan, statements = _statements(case)
    whens = statements["merge_changes"].args["whens"].expressions
    deletes = [w for w in whens if w.args.get("then") == exp.var("DELETE")]
    view = statements["create_view"].expression
    populated_filter = f"`{COUNT}` > 0" in _where(view)
    emptied = f"`__ivm_t`.`{COUNT}` + `__ivm_d`.`{COUNT}` = 0"
    if plan.view_class is ViewClass.GLOBAL_AGGREGATE:
        # SELECT COUNT(*) FROM empty answers one row with 0: the group row stays;
        # only pre-aggregation rows whose value lost its last row leave.
        if plan.row_preaggregations:
            assert len(deletes) == 1
            assert deletes[0].args["condition"].sql(DIALECT) == (
                f"{emptied} AND `__ivm_d`.`{SLOT}` > 0"
            )
        else:
            assert deletes == []
        assert not populated_filter
    else:
        assert len(deletes) == 1
        assert deletes[0].args["condition"].sql(DIALECT) == emptied
        assert populated_filter
    # The view shows group rows only, never the pre-aggregation rows beside them.
    assert (f"`{SLOT}` = 0" in _where(view)) == bool(plan.row_preaggregations)


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_changes_are_signed_by_change_type(case: golden.Case) -> None:
    plan, statements = _statements(case)
    merge = statements["merge_changes"]
    signs = [a for a in merge.find_all(exp.Alias) if a.alias == SIGN and isinstance(a.this, exp.If)]
    feeds = [f for f in merge.find_all(exp.Anonymous) if f.name.lower() == "table_changes"]
    # Every change feed read is signed.
    assert len(signs) == len(feeds)
    for sign in signs:
        assert sign.this.sql(DIALECT) == (
            "IF(_change_type IN ('insert', 'update_postimage'), 1, -1)"
        )
    if not plan.join_terms:
        # Every source occurrence changed in its window: each is read as a change
        # feed in its own term, and again, undone, in the terms of inputs before it
        # (reads.table_before), so occurrence i's feed is read i + 1 times per operand.
        expected = sorted(
            ref.table.sql()
            for branch in relations.branches(plan)
            for index, ref in enumerate(relations.branch_sources(branch))
            for _ in range(index + 1)
        )
        assert sorted(f.expressions[0].this for f in feeds) == expected
    else:
        # Outer joins: each changed input in every term it occurs in (and a key
        # relation's change reads its input's feed too), but only the sources' feeds.
        assert {f.expressions[0].this for f in feeds} == {ref.table.sql() for ref in plan.sources}
    for feed in feeds:
        assert [e.sql(DIALECT) for e in feed.expressions[1:]] == [
            str(golden.FIRST_CHANGE),
            str(golden.LAST_CHANGE),
        ]


def _union_terms(query: exp.Expression) -> list[exp.Select]:
    if isinstance(query, exp.Union):
        return _union_terms(query.this) + _union_terms(query.expression)
    assert isinstance(query, exp.Select)
    return [query]


def _read_as(term: exp.Select) -> dict[str, str]:
    """Alias -> how a term reads that input: 'changes' or 'version <n>'.

    An outer join's key relation is a subquery over its input: its changes
    read the input's change feed; at a version, the input at that version.
    """
    reads = {}
    for node in [term.args["from_"].this, *[j.this for j in term.args.get("joins") or []]]:
        if isinstance(node, exp.Subquery):
            feed = node.find(exp.Anonymous)
            if isinstance(node.this, exp.Union) and feed is not None:
                # reads.table_before: the pinned version less the range's changes.
                table = next(t for t in node.find_all(exp.Table) if t.args.get("version"))
                reads[node.alias] = (
                    f"version {table.args['version'].expression.sql(DIALECT)} less changes"
                )
            elif feed is not None and SIGN not in node.this.named_selects:
                # reads.keys_before: keys counted at the pinned version less the changes.
                table = next(t for t in node.find_all(exp.Table) if t.args.get("version"))
                reads[node.alias] = (
                    f"version {table.args['version'].expression.sql(DIALECT)} less changes"
                )
            elif feed is not None and feed.name.lower() == "table_changes":
                reads[node.alias] = "changes"
            else:
                table = next(t for t in node.find_all(exp.Table) if t.args.get("version"))
                reads[node.alias] = f"version {table.args['version'].expression.sql(DIALECT)}"
        else:
            reads[node.alias] = f"version {node.args['version'].expression.sql(DIALECT)}"
    return reads


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_changes_telescope_over_the_joined_sources(case: golden.Case) -> None:
    """Change term i of a linear term reads its input i's changes, earlier ones pinned, later as recorded.

    A later source is read as recorded without time travel: its pinned version
    less the range's changes, its rows' signs multiplied into the term's
    (reads.table_before); a later key relation likewise, its keys counted at the
    pinned version less the changes (reads.keys_before).

    A query without a set operation or outer join is one linear term; a set
    operation's change is the sum of its operands' terms, in operand order; an
    outer join's, the sum of its signed inner-join terms' (a negative term
    negates its rows' signs).
    """
    plan, statements = _statements(case)
    ctes = {cte.alias: cte.this for cte in statements["merge_changes"].find_all(exp.CTE)}
    terms = iter(_union_terms(ctes[CHANGES_CTE]))
    for term_sign, _, inputs in relations.linear_terms(plan):
        for position, changed in enumerate(inputs):

            def read(index: int, ref, position: int = position) -> str:
                if index == position:
                    return "changes"
                if index < position:
                    return f"version {golden.LAST_CHANGE}"
                return f"version {golden.LAST_CHANGE} less changes"

            expected = {ref.alias: read(i, ref) for i, ref in enumerate(inputs)}
            if isinstance(changed, PartnerFilter):
                # A partner filter's change: two terms over the rows its change
                # rows partner, its input read now and as recorded, each sign fixed.
                del expected[changed.alias]
                expected |= {
                    names.partner_alias(position, "change"): "changes",
                    names.partner_alias(position, "now"): f"version {golden.LAST_CHANGE}",
                    names.partner_alias(position, "then"): (
                        f"version {golden.LAST_CHANGE} less changes"
                    ),
                }
                for turned in (1, -1):
                    term = next(terms)
                    assert _read_as(term) == expected
                    assert term.expressions[-1].this.sql(DIALECT) == str(term_sign * turned)
                continue
            term = next(terms)
            assert _read_as(term) == expected
            # The term's row carries the product of the signs of the change row it
            # was made from and of the undone rows it joins.
            sign = term.expressions[-1]
            assert sign.alias == SIGN
            signed = [changed.alias] + [
                ref.alias
                for index, ref in enumerate(inputs)
                if index > position and not isinstance(ref, (KeyRelation, PartnerFilter))
            ]
            product = " * ".join(f"`{alias}`.`{SIGN}`" for alias in signed)
            if term_sign < 0:
                product = f"-({product})" if len(signed) > 1 else f"-{product}"
            assert sign.this.sql(DIALECT) == product
    assert next(terms, None) is None, "more change terms than inputs of the linear terms"


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_build_and_model_query_read_the_pinned_version(case: golden.Case) -> None:
    plan, statements = _statements(case)
    for name in ("create_state", "model_query"):
        tables = list(statements[name].find_all(exp.Table))
        sources = [t for t in tables if t.args.get("version")]
        # Each source occurrence is read once (a self-join reads its table twice).
        assert len(sources) == len(plan.sources), name
        assert sorted(t.alias for t in sources) == sorted(ref.alias for ref in plan.sources), name
        for source in sources:
            assert source.args["version"].expression == exp.Literal.number(golden.BUILD_VERSION)


@pytest.mark.parametrize("case", CORRECT_CASES, ids=_ids(CORRECT_CASES))
def test_no_select_reads_two_relations_under_one_alias(case: golden.Case) -> None:
    """Every relation the compiler adds beside a model's own gets an alias of its own.

    A key relation's touched keys were once aliased `c` beside its input, so an
    input the model aliases `c` met itself in `... AS c LEFT SEMI JOIN (...) AS c`.
    """
    _, statements = _statements(case)
    for name, statement in statements.items():
        for select in statement.find_all(exp.Select):
            relations = [select.args.get("from_")] if select.args.get("from_") else []
            aliases = [r.this.alias_or_name for r in relations]
            aliases += [join.this.alias_or_name for join in select.args.get("joins") or []]
            aliases = [alias.lower() for alias in aliases if alias]
            assert len(aliases) == len(set(aliases)), (name, aliases)
