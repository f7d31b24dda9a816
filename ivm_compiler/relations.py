"""The relations a refresh reads: the model's rows at pinned versions, and their signed change.

Every source is read at an exact Delta version (time travel) or as the
change-feed rows of an exact window, so a maintenance query never sees a source
state newer or older than the window it applies (the ECA paper's anomalies
cannot occur).

The change of an inner join of n inputs over a window, where input i goes
from R_i (recorded version) to R_i' = R_i + dR_i (pinned version), is the
telescoping sum

    d(R_1 x ... x R_n) = sum over i of  R_1' x ... x R_(i-1)' x dR_i x R_(i+1) x ... x R_n

with signed rows (the sign of a term's row is the sign of its dR_i row).
Each term is exact on its own, so a change meeting a change (both sides of a
join changed in one refresh) is counted once: in the term of the later input,
against the earlier input's new version. Inputs that did not change have
dR_i = 0, and their terms are left out. A self-join is two inputs that happen
to read the same table, and the same sum holds.

Outer joins are not linear in their null-supplying input; the compiler
rewrites them as signed inner-join terms over inputs and key relations
(rules/outer_joins.py), and the same sum runs over each term's inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.plan import KeyRelation, MergeRule, SourceRef, UpstreamModel, ViewPlan
from ivm_compiler.rules import extremes
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    aliased,
    from_tables,
    ident,
    set_operation_branches,
    union_all,
    version_as_of,
)

# Change-feed rows that add a row to the source; the other two types remove one.
ADDING_CHANGE_TYPES = ("insert", "update_postimage")


@dataclass(frozen=True)
class Window:
    """One source's change window: the state reflects `recorded`; the refresh brings it to `pinned`."""

    recorded: int
    pinned: int

    @property
    def changed(self) -> bool:
        return self.pinned > self.recorded


def _upstream_reading(upstream: UpstreamModel, state_rows: exp.Expression) -> exp.Select:
    """The upstream model's view definition with its state table replaced by `state_rows`."""

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and TableName.of(node) == upstream.state:
            return state_rows.copy()
        return node

    view = upstream.view.copy().transform(replace)
    assert isinstance(view, exp.Select)
    return view


def table_at_version(
    table: TableName,
    version: int,
    alias: str,
    upstream: UpstreamModel | None = None,
) -> exp.Expression:
    """A source as of a pinned version, under the alias the model's query uses.

    For an upstream ivm model the version is its state table's, read through
    the model's view definition.
    """
    if upstream is None:
        return aliased(version_as_of(table, version), alias)
    state = version_as_of(upstream.state, version)
    return _upstream_reading(upstream, state).subquery(ident(alias))


def signed_changes(
    table: TableName, window: Window, alias: str, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """Change-feed rows after `recorded` up to `pinned` (both inclusive), each with a +1/-1 sign.

    For an upstream ivm model: its state's change rows, each turned into the
    view rows it stands for, keeping the sign.
    """
    changes = exp.Table(
        this=exp.Anonymous(
            this="table_changes",
            expressions=[
                exp.Literal.string((upstream.state if upstream else table).sql()),
                exp.Literal.number(window.recorded + 1),
                exp.Literal.number(window.pinned),
            ],
        )
    )
    sign = exp.If(
        this=exp.In(
            this=exp.column("_change_type"),
            expressions=[exp.Literal.string(t) for t in ADDING_CHANGE_TYPES],
        ),
        true=exp.Literal.number(1),
        false=exp.Literal.number(-1),
    )
    rows = exp.select(exp.Star(), exp.alias_(sign, names.SIGN, quoted=True)).from_(changes)
    if upstream is None:
        return rows.subquery(ident(alias))
    view = _upstream_reading(upstream, rows.subquery(ident(names.UPSTREAM_CHANGES_ALIAS)))
    sign_column = exp.column(names.SIGN, table=ident(names.UPSTREAM_CHANGES_ALIAS), quoted=True)
    return view.select(exp.alias_(sign_column, names.SIGN, quoted=True)).subquery(ident(alias))


def branches(plan: ViewPlan) -> list[exp.Select]:
    """The flattened rows' SELECTs: one, or one per operand of a set operation."""
    found = set_operation_branches(plan.rows)
    assert all(isinstance(b, exp.Select) for b in found)
    return found  # type: ignore[return-value]


def branch_sources(branch: exp.Select) -> list[SourceRef]:
    return [SourceRef(alias=t.alias_or_name, table=TableName.of(t)) for t in from_tables(branch)]


# Join states that stand in for partner reads (join_states.py): by the input's
# lower-case alias, the join state's read per source version it can serve.
JoinReads = Mapping[str, Mapping[int, exp.Expression]]

# What one relation of a FROM clause stands for: a source, or an outer join's key relation.
Input = SourceRef | KeyRelation


def _input_table(relation: Input) -> TableName:
    return relation.table if isinstance(relation, SourceRef) else relation.source.table


def _reading(
    select: exp.Select, inputs: list[Input], read: Callable[[int, Input], exp.Expression]
) -> exp.Select:
    """A SELECT with its index-th FROM relation replaced by read(index, inputs[index])."""
    rows = select.copy()
    for index, (node, relation) in enumerate(zip(from_tables(rows), inputs)):
        node.replace(read(index, relation))
    return rows


def linear_terms(plan: ViewPlan) -> list[tuple[int, exp.Select, list[Input]]]:
    """(sign, SELECT, its inputs) whose signed sum is the rows; each is an inner join.

    Without outer joins: each operand once, positively. With them: the
    plan's signed join terms (rules/outer_joins.py).
    """
    if plan.join_terms:
        terms = []
        for term in plan.join_terms:
            by_alias = {k.alias: k for k in term.key_relations}
            inputs: list[Input] = [
                by_alias.get(node.alias_or_name)
                or SourceRef(alias=node.alias_or_name, table=TableName.of(node))
                for node in from_tables(term.rows)
            ]
            terms.append((term.sign, term.rows, inputs))
        return terms
    return [(1, branch, list(branch_sources(branch))) for branch in branches(plan)]


def _key_values(relation: KeyRelation, rows: exp.Expression) -> exp.Select:
    """SELECT DISTINCT <keys> FROM rows WHERE <condition> AND no key is NULL."""
    conditions = [
        exp.Not(this=exp.Is(this=key.copy(), expression=exp.Null())) for key in relation.keys
    ]
    if relation.condition is not None:
        conditions.append(relation.condition.copy())
    return (
        exp.select(
            *[
                exp.alias_(key.copy(), names.join_key(i), quoted=True)
                for i, key in enumerate(relation.keys)
            ]
        )
        .distinct()
        .from_(rows)
        .where(exp.and_(*conditions))
    )


def keys_at_version(
    relation: KeyRelation, version: int, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """An outer join's key relation with its input at a pinned version."""
    source = relation.source
    rows = table_at_version(source.table, version, source.alias, upstream)
    return _key_values(relation, rows).subquery(ident(relation.alias))


def key_changes(
    relation: KeyRelation, window: Window, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """The keys that gained their first partner (+1) or lost their last (-1) in the window.

    Only keys that occur in the window's change rows can change, so both
    versions of the input are read for those keys alone.
    """
    source = relation.source
    key_names = [names.join_key(i) for i in range(len(relation.keys))]
    touched = _key_values(
        relation, signed_changes(source.table, window, source.alias, upstream)
    ).subquery(ident("c"))

    def present(version: int, presence: int) -> exp.Select:
        values = _key_values(
            relation, table_at_version(source.table, version, source.alias, upstream)
        ).subquery(ident("v"))
        return (
            exp.select(
                *[exp.column(k, table=ident("v"), quoted=True) for k in key_names],
                exp.alias_(exp.Literal.number(presence), names.SIGN, quoted=True),
            )
            .from_(values)
            .join(
                touched.copy(),
                on=exp.and_(
                    *[
                        exp.EQ(
                            this=exp.column(k, table=ident("v"), quoted=True),
                            expression=exp.column(k, table=ident("c"), quoted=True),
                        )
                        for k in key_names
                    ]
                ),
                join_type="LEFT SEMI",
            )
        )

    both = exp.union(present(window.pinned, 1), present(window.recorded, -1), distinct=False)
    net = exp.Sum(this=exp.column(names.SIGN, quoted=True))
    return (
        exp.select(
            *[exp.column(k, quoted=True) for k in key_names],
            exp.alias_(net, names.SIGN, quoted=True),
        )
        .from_(both.subquery(ident("p")))
        .group_by(*[exp.column(k, quoted=True) for k in key_names])
        .having(exp.NEQ(this=net.copy(), expression=exp.Literal.number(0)))
        .subquery(ident(relation.alias))
    )


def rows_at(plan: ViewPlan, versions: Mapping[TableName, int]) -> exp.Query:
    """The model's flattened rows with every source at its pinned version."""
    return union_all(
        [
            _reading(
                branch,
                list(branch_sources(branch)),
                lambda _, ref: table_at_version(
                    ref.table, versions[ref.table], ref.alias, plan.upstreams.get(ref.table)
                ),
            )
            for branch in branches(plan)
        ]
    )


def signed_rows(
    plan: ViewPlan,
    windows: Mapping[TableName, Window],
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """The signed change of the model's flattened rows over the windows (the sum above).

    For a set operation the change is the sum of its operands' changes, each
    operand's by the join rule over its own sources; with outer joins, the
    sum of the signed inner-join terms' changes (a negative term flips the
    sign of its change rows). With `bounds` (the probe of `bounded_keys`),
    each term reads the partners of its changed input within the change's
    key range (key_bounds.py). With `join_reads`, a partner that keeps a join
    state is read from it at the version the term asks for.
    """
    terms: list[exp.Select] = []
    for term_sign, select, inputs in linear_terms(plan):
        for position, changed in enumerate(inputs):
            if not windows[_input_table(changed)].changed:
                continue

            def read(index: int, relation: Input, position: int = position) -> exp.Expression:
                table = _input_table(relation)
                window = windows[table]
                upstream = plan.upstreams.get(table)
                version = window.pinned if index < position else window.recorded
                if isinstance(relation, KeyRelation):
                    if index == position:
                        return key_changes(relation, window, upstream)
                    return keys_at_version(relation, version, upstream)
                if index == position:
                    return signed_changes(table, window, relation.alias, upstream)
                kept = (join_reads or {}).get(relation.alias.lower(), {})
                if version in kept:
                    return kept[version].copy()
                return table_at_version(table, version, relation.alias, upstream)

            term = _reading(select, inputs, read)
            for bound in key_bounds.partner_bounds(select, inputs, position, plan.source_columns):
                predicate = key_bounds.bound_predicate(bound, bounds or {})
                if predicate is not None:
                    term = term.where(predicate)
            sign: exp.Expression = exp.column(names.SIGN, table=ident(changed.alias), quoted=True)
            if term_sign < 0:
                sign = exp.Neg(this=sign)
            terms.append(term.select(exp.alias_(sign, names.SIGN, quoted=True)))
    if not terms:
        raise ValueError("signed_rows needs at least one source with changes in its window")
    return union_all(terms)


# -- the state's rows -----------------------------------------------------------


def _group_select(plan: ViewPlan, rows: str, use_delta: bool) -> exp.Select:
    columns = [
        exp.alias_((c.delta if use_delta else c.build).copy(), c.name, quoted=True)
        for c in plan.state_columns
        if not (use_delta and c.rule is MergeRule.RECOMPUTED)
    ]
    select = exp.select(*columns).from_(exp.to_table(rows, quoted=True))
    if plan.keys:
        select = select.group_by(*[exp.column(k, quoted=True) for k in plan.keys])
    return select


def _in_state_order(plan: ViewPlan, values: Mapping[str, exp.Expression]) -> list[exp.Expression]:
    """One SELECT list in the state table's column order; unnamed columns are NULL."""
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True)
        for name in state_table_columns(plan)
    ]


def state_table_columns(plan: ViewPlan) -> list[str]:
    """Every column of the state table, in order: group rows' columns, then pre-aggregations'."""
    columns = [c.name for c in plan.state_columns]
    if plan.preaggregations:
        columns.append(names.SLOT)
        columns.extend(p.value_column for p in plan.preaggregations)
    return columns


def build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expression | None = None,
) -> exp.Query:
    """The whole state computed from the sources at pinned versions (first build, full refresh).

    `rows_filter` is added to the WHERE of the flattened rows (a WINDOW
    model's refresh recomputes the touched partitions only).
    """
    rows = rows_at(plan, versions)
    if rows_filter is not None:
        assert isinstance(rows, exp.Select), "a filter applies to one SELECT"
        rows = rows.where(rows_filter.copy())
    if not plan.preaggregations:
        return _group_select(plan, names.ROWS_ALIAS, use_delta=False).with_(
            names.ROWS_ALIAS, as_=rows
        )
    group_rows = _group_select(plan, names.ROWS_ALIAS, use_delta=False)
    group_values = {e.alias: e.this for e in group_rows.expressions}
    group_values[names.SLOT] = exp.Literal.number(0)
    union: exp.Query = group_rows.select(*_in_state_order(plan, group_values), append=False)
    for pre in plan.preaggregations:
        value = exp.column(pre.argument, quoted=True)
        pre_values: dict[str, exp.Expression] = {k: exp.column(k, quoted=True) for k in plan.keys}
        pre_values[names.COUNT] = exp.Count(this=exp.Star(), big_int=True)
        pre_values[names.SLOT] = exp.Literal.number(pre.slot)
        pre_values[pre.value_column] = value.copy()
        pre_rows = (
            exp.select(*_in_state_order(plan, pre_values))
            .from_(exp.to_table(names.ROWS_ALIAS, quoted=True))
            .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
            .group_by(*[exp.column(k, quoted=True) for k in plan.keys], value.copy())
        )
        union = exp.union(union, pre_rows, distinct=False)
    return (
        exp.select(exp.Star())
        .from_(union.subquery(ident(names.PREAGG_ALIAS)))
        .with_(names.ROWS_ALIAS, as_=rows)
    )


def _nonzero(columns: list[exp.Expression]) -> exp.Expression:
    return exp.or_(
        *[
            exp.NEQ(
                this=exp.Coalesce(this=c, expressions=[exp.Literal.number(0)]),
                expression=exp.Literal.number(0),
            )
            for c in columns
        ]
    )


def bounded_keys(
    plan: ViewPlan, windows: Mapping[TableName, Window]
) -> dict[TableName, tuple[exp.Subquery, list[key_bounds.KeyColumn]]]:
    """Per changed source: its change rows and the join columns whose bounds narrow a partner read."""
    found: dict[TableName, list[key_bounds.KeyColumn]] = {}
    for _, select, inputs in linear_terms(plan):
        for position, changed in enumerate(inputs):
            if not windows[_input_table(changed)].changed:
                continue
            for bound in key_bounds.partner_bounds(select, inputs, position, plan.source_columns):
                keys = found.setdefault(bound.key.table, [])
                if bound.key not in keys:
                    keys.append(bound.key)
    return {
        table: (
            signed_changes(table, windows[table], names.CHANGES_CTE, plan.upstreams.get(table)),
            keys,
        )
        for table, keys in found.items()
    }


def delta_query(
    plan: ViewPlan,
    windows: Mapping[TableName, Window],
    state: TableName,
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """Per state row, the change to apply: additive columns as differences, recomputed ones as values.

    Rows whose changes cancel out (a row inserted then deleted, an update that
    moved nothing the model reads) are dropped here, so they cost no MERGE work.
    The state table itself is read only for the pre-aggregation rows of groups
    whose values changed.
    """
    changes = signed_rows(plan, windows, bounds, join_reads)
    additive = [c for c in plan.value_columns if c.rule is not MergeRule.RECOMPUTED]
    if not plan.preaggregations:
        select = _group_select(plan, names.CHANGES_CTE, use_delta=True).having(
            _nonzero([c.delta.copy() for c in additive])
        )
        return select.with_(names.CHANGES_CTE, as_=changes)

    def key_columns(table: str | None = None) -> list[exp.Column]:
        return [
            exp.column(k, table=ident(table) if table else None, quoted=True) for k in plan.keys
        ]

    def same_group(left: str, right: str) -> exp.Expression:
        if not plan.keys:
            return exp.true()
        return exp.and_(
            *[
                exp.NullSafeEQ(
                    this=exp.column(k, table=ident(left), quoted=True),
                    expression=exp.column(k, table=ident(right), quoted=True),
                )
                for k in plan.keys
            ]
        )

    ctes: list[tuple[str, exp.Query]] = [(names.CHANGES_CTE, changes)]
    group_delta = _group_select(plan, names.CHANGES_CTE, use_delta=True)
    main = "__ivm_m"
    ctes.append((main, group_delta))
    changed_groups = [
        _nonzero([exp.column(c.name, table=ident(main), quoted=True) for c in additive])
    ]
    group_values: dict[str, exp.Expression] = {
        c.name: exp.column(c.name, table=ident(main), quoted=True)
        for c in plan.state_columns
        if c.rule is not MergeRule.RECOMPUTED
    }
    group_values[names.SLOT] = exp.Literal.number(0)
    group_select = exp.select().from_(exp.to_table(main, quoted=True).as_(main, quoted=True))
    branches: list[exp.Select] = []

    for pre in plan.preaggregations:
        value = exp.column(pre.argument, quoted=True)
        delta_cte = names.preaggregation_cte(pre.argument_index)
        recomputed_cte = names.recomputed_cte(pre.argument_index)
        signed_count = exp.Sum(this=exp.column(names.SIGN, quoted=True))
        # (group, value, net count change) for the values this refresh touched.
        ctes.append(
            (
                delta_cte,
                exp.select(
                    *key_columns(),
                    exp.alias_(value.copy(), pre.value_column, quoted=True),
                    exp.alias_(signed_count, names.COUNT, quoted=True),
                )
                .from_(exp.to_table(names.CHANGES_CTE, quoted=True))
                .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
                .group_by(*key_columns(), value.copy())
                .having(exp.NEQ(this=signed_count.copy(), expression=exp.Literal.number(0))),
            )
        )
        # The touched groups' stored pre-aggregation rows, plus the change: each
        # distinct value's new count; values whose count reaches zero drop out.
        stored = (
            exp.select(
                *key_columns("s"),
                exp.column(pre.value_column, table=ident("s"), quoted=True),
                exp.column(names.COUNT, table=ident("s"), quoted=True),
            )
            .from_(state.to_table().as_("s", quoted=True))
            .join(
                exp.to_table(delta_cte, quoted=True).as_("c", quoted=True),
                on=same_group("s", "c"),
                join_type="LEFT SEMI",
            )
            .where(
                exp.EQ(
                    this=exp.column(names.SLOT, table=ident("s"), quoted=True),
                    expression=exp.Literal.number(pre.slot),
                )
            )
        )
        touched = exp.select(
            *key_columns(),
            exp.column(pre.value_column, quoted=True),
            exp.column(names.COUNT, quoted=True),
        ).from_(exp.to_table(delta_cte, quoted=True))
        new_counts = (
            exp.select(
                *key_columns(),
                exp.column(pre.value_column, quoted=True),
                exp.alias_(
                    exp.Sum(this=exp.column(names.COUNT, quoted=True)), names.COUNT, quoted=True
                ),
            )
            .from_(exp.union(stored, touched, distinct=False).subquery(ident("u")))
            .group_by(*key_columns(), exp.column(pre.value_column, quoted=True))
        )
        surviving = exp.If(
            this=exp.GT(
                this=exp.column(names.COUNT, quoted=True), expression=exp.Literal.number(0)
            ),
            true=exp.column(pre.value_column, quoted=True),
            false=exp.Null(),
        )
        recomputed = exp.select(
            *key_columns(),
            *[
                exp.alias_(
                    extremes.over_surviving_values(kind, surviving.copy()), name, quoted=True
                )
                for name, kind in pre.recomputed
            ],
            exp.alias_(exp.true(), pre.touched_flag, quoted=True),
        ).from_(new_counts.subquery(ident("n")))
        if plan.keys:
            recomputed = recomputed.group_by(*key_columns())
        else:
            # Without GROUP BY an aggregate answers one row even over no input;
            # the flag must say "touched" only when the refresh changed a value.
            recomputed = recomputed.having(
                exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
            )
        ctes.append((recomputed_cte, recomputed))

        group_select = group_select.join(
            exp.to_table(recomputed_cte, quoted=True).as_(recomputed_cte, quoted=True),
            on=same_group(main, recomputed_cte),
            join_type="LEFT",
        )
        touched_flag = exp.column(pre.touched_flag, table=ident(recomputed_cte), quoted=True)
        changed_groups.append(exp.Not(this=exp.Is(this=touched_flag.copy(), expression=exp.Null())))
        group_values[pre.touched_flag] = touched_flag
        for name, kind in pre.recomputed:
            recomputed_value: exp.Expression = exp.column(
                name, table=ident(recomputed_cte), quoted=True
            )
            if kind == "COUNT":
                # A new group none of whose values is non-NULL has 0 distinct values.
                recomputed_value = exp.Coalesce(
                    this=recomputed_value, expressions=[exp.Literal.number(0)]
                )
            group_values[name] = recomputed_value

        pre_values: dict[str, exp.Expression] = {k: exp.column(k, quoted=True) for k in plan.keys}
        pre_values[names.COUNT] = exp.column(names.COUNT, quoted=True)
        pre_values[names.SLOT] = exp.Literal.number(pre.slot)
        pre_values[pre.value_column] = exp.column(pre.value_column, quoted=True)
        branches.append(
            exp.select(*_in_delta_order(plan, pre_values)).from_(
                exp.to_table(delta_cte, quoted=True)
            )
        )

    group_branch = group_select.select(*_in_delta_order(plan, group_values)).where(
        exp.or_(*changed_groups)
    )
    union: exp.Query = group_branch
    for branch in branches:
        union = exp.union(union, branch, distinct=False)
    select = exp.select(exp.Star()).from_(union.subquery(ident(names.PREAGG_ALIAS)))
    for name, query in ctes:
        select = select.with_(name, as_=query)
    return select


def delta_columns(plan: ViewPlan) -> list[str]:
    """The delta query's columns: the state table's, then each pre-aggregation's touched flag."""
    return state_table_columns(plan) + [p.touched_flag for p in plan.preaggregations]


def _in_delta_order(plan: ViewPlan, values: Mapping[str, exp.Expression]) -> list[exp.Expression]:
    return [
        exp.alias_(values.get(name, exp.null()), name, quoted=True) for name in delta_columns(plan)
    ]


def model_query(plan: ViewPlan, versions: Mapping[TableName, int]) -> str:
    """The model's own query, as written, with every source read at its pinned version."""
    ctes = {cte.alias_or_name.lower() for cte in plan.query.find_all(exp.CTE)}

    def replace(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Table) or (not node.db and node.name.lower() in ctes):
            return node
        table = TableName.of(node)
        return table_at_version(
            table, versions[table], node.alias_or_name, plan.upstreams.get(table)
        )

    return plan.query.copy().transform(replace).sql(dialect=DIALECT)
