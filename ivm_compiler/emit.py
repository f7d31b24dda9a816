"""ViewPlan -> Spark SQL statements, built as sqlglot trees (never by string formatting).

Statements:
- create_state: the state table computed at pinned source versions (first build, full refresh);
- merge_changes: the signed delta of a change window, applied with one MERGE;
- probe_partitions, merge_partitions: a WINDOW model's touched partitions, and
  the MERGE that recomputes them (rules/windows.py);
- create_view: the relation users query, exposing only the model's columns;
- model_query: the model's own query at pinned versions (the correctness oracle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.errors import ParseError

from ivm_compiler import names, relations
from ivm_compiler.parse import DIALECT, TableName
from ivm_compiler.plan import MergeRule, ViewClass, ViewPlan
from ivm_compiler.rules import top_k
from ivm_compiler.rules import windows as window_rules

STATE_TABLE_PROPERTIES = {
    # Downstream consumers (later: ivm models over ivm models) read the state's changes.
    "delta.enableChangeDataFeed": "true",
    # Deletion vectors are left off: on small local tables they made each MERGE
    # about twice as slow (measured 9-15 s against 4.8 s under load); revisit
    # with the benchmark for large states, where rewriting whole files costs more.
}


def _sql(expression: exp.Expression) -> str:
    return expression.sql(dialect=DIALECT)


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def create_state(plan: ViewPlan, state: TableName, versions: Mapping[TableName, int]) -> str:
    properties = [exp.FileFormatProperty(this=exp.Var(this="DELTA"))] + [
        exp.Property(this=exp.Literal.string(key), value=exp.Literal.string(value))
        for key, value in STATE_TABLE_PROPERTIES.items()
    ]
    create = exp.Create(
        this=state.to_table(),
        kind="TABLE",
        replace=True,
        properties=exp.Properties(expressions=properties),
        expression=relations.build_query(plan, versions),
    )
    return _sql(create)


def merge_changes(
    plan: ViewPlan, state: TableName, windows: Mapping[TableName, relations.Window]
) -> str:
    """One MERGE that applies a refresh's whole change to the state, in one Delta commit."""
    if plan.view_class is ViewClass.WINDOW:
        # Window values are not linear in the change rows: see merge_partitions.
        raise ValueError("a WINDOW model's change is applied by merge_partitions")
    target, delta = names.TARGET_ALIAS, names.DELTA_ALIAS

    def t(name: str) -> exp.Column:
        return exp.column(name, table=_ident(target), quoted=True)

    def d(name: str) -> exp.Column:
        return exp.column(name, table=_ident(delta), quoted=True)

    keys = plan.merge_keys
    on: exp.Expression = (
        exp.and_(*[exp.NullSafeEQ(this=t(k), expression=d(k)) for k in keys])
        if keys
        else exp.true()
    )
    touched_flags = {p.slot: p.touched_flag for p in plan.preaggregations}
    updates = []
    for column in plan.value_columns:
        stored, change = t(column.name), d(column.name)
        if column.rule is MergeRule.RECOMPUTED:
            assert column.preaggregation is not None
            # Recomputed from the pre-aggregation when its values changed; kept otherwise.
            touched = exp.EQ(this=d(touched_flags[column.preaggregation]), expression=exp.true())
            value = exp.If(this=touched, true=change, false=stored)
            updates.append(exp.EQ(this=t(column.name), expression=value))
            continue
        if column.rule is MergeRule.ADD_NULLABLE:
            stored = exp.Coalesce(this=stored, expressions=[exp.Literal.number(0)])
            change = exp.Coalesce(this=change, expressions=[exp.Literal.number(0)])
        updates.append(
            exp.EQ(this=t(column.name), expression=exp.Add(this=stored, expression=change))
        )

    whens = []
    emptied: exp.Expression = exp.EQ(
        this=exp.Add(this=t(names.COUNT), expression=d(names.COUNT)),
        expression=exp.Literal.number(0),
    )
    if plan.view_class is ViewClass.GLOBAL_AGGREGATE:
        # The global aggregate keeps its one group row even when the source is
        # empty; only pre-aggregation rows (slot > 0) leave the state.
        emptied = (
            exp.and_(emptied, exp.GT(this=d(names.SLOT), expression=exp.Literal.number(0)))
            if plan.preaggregations
            else None
        )
    if emptied is not None:
        whens.append(
            exp.When(matched=True, source=False, condition=emptied, then=exp.var("DELETE"))
        )
    whens.append(exp.When(matched=True, source=False, then=exp.Update(expressions=updates)))
    all_columns = relations.state_table_columns(plan)
    whens.append(
        exp.When(
            matched=False,
            source=False,
            then=exp.Insert(
                this=exp.Tuple(expressions=[exp.column(n, quoted=True) for n in all_columns]),
                expression=exp.Tuple(expressions=[d(n) for n in all_columns]),
            ),
        )
    )
    merge = exp.Merge(
        this=relations.aliased(state.to_table(), target),
        using=relations.delta_query(plan, windows, state).subquery(_ident(delta)),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return _sql(merge)


def probe_partitions(plan: ViewPlan, windows: Mapping[TableName, relations.Window]) -> str:
    """A WINDOW model's touched partitions: the distinct keys of the window's change rows."""
    assert plan.view_class is ViewClass.WINDOW and plan.window_partition
    (source,) = plan.sources
    changes = relations.signed_changes(
        source.table, windows[source.table], source.alias, plan.upstreams.get(source.table)
    )
    rows = plan.rows
    assert isinstance(rows, exp.Select)
    return _sql(window_rules.probe_query(rows, changes, plan.window_partition))


def merge_partitions(
    plan: ViewPlan,
    state: TableName,
    versions: Mapping[TableName, int],
    keys: Sequence[window_rules.PartitionKey],
) -> str:
    """One MERGE that replaces a WINDOW model's state rows of the touched partitions.

    The source is the model's rows of those partitions at the pinned versions
    (a partition's rows depend on that partition alone); state rows of those
    partitions that the recomputation no longer produces are deleted, and
    the rest of the state is left alone. The partitions, as literals, are in
    the rows' WHERE, in ON and in the delete's condition, so Delta can skip
    other partitions' files in the source and in the state.
    """
    assert plan.view_class is ViewClass.WINDOW and plan.window_partition
    target, delta = names.TARGET_ALIAS, names.DELTA_ALIAS

    def t(name: str) -> exp.Column:
        return exp.column(name, table=_ident(target), quoted=True)

    def d(name: str) -> exp.Column:
        return exp.column(name, table=_ident(delta), quoted=True)

    types = [p.data_type for p in plan.window_partition]
    in_rows = window_rules.partition_predicate(
        [p.source for p in plan.window_partition], types, keys
    )
    in_state = window_rules.partition_predicate(
        [t(p.state_column) for p in plan.window_partition], types, keys
    )
    # The state's side of the partitions in ON too: it changes no match (every
    # source row lies in those partitions), and lets Delta prune the state's
    # files when it looks for matches.
    on = exp.and_(*[exp.NullSafeEQ(this=t(k), expression=d(k)) for k in plan.keys], in_state.copy())
    all_columns = relations.state_table_columns(plan)
    whens = [
        exp.When(
            matched=True,
            source=False,
            condition=exp.NEQ(this=t(names.COUNT), expression=d(names.COUNT)),
            then=exp.Update(expressions=[exp.EQ(this=t(names.COUNT), expression=d(names.COUNT))]),
        ),
        exp.When(
            matched=False,
            source=False,
            then=exp.Insert(
                this=exp.Tuple(expressions=[exp.column(n, quoted=True) for n in all_columns]),
                expression=exp.Tuple(expressions=[d(n) for n in all_columns]),
            ),
        ),
        exp.When(matched=False, source=True, condition=exp.paren(in_state), then=exp.var("DELETE")),
    ]
    merge = exp.Merge(
        this=relations.aliased(state.to_table(), target),
        using=relations.build_query(plan, versions, rows_filter=in_rows).subquery(_ident(delta)),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return _sql(merge)


def view_query(plan: ViewPlan, state: TableName, version: int | None = None) -> exp.Select:
    """The model's rows from the state table (at `version`): bookkeeping columns stay hidden."""
    outputs = []
    for output in plan.outputs:
        expression = output.expression.copy()
        try:
            data_type = exp.DataType.build(output.data_type, dialect=DIALECT)
        except (ParseError, ValueError):
            data_type = None  # a type sqlglot cannot spell: the expression already has it
        if data_type is not None:
            expression = exp.cast(expression, data_type)
        outputs.append(exp.alias_(expression, output.name, quoted=True))
    table = state.to_table()
    if version is not None:
        table.set(
            "version",
            exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(version)),
        )
    select = exp.select(*outputs).from_(table)
    if plan.preaggregations:
        group_rows = exp.EQ(
            this=exp.column(names.SLOT, quoted=True), expression=exp.Literal.number(0)
        )
        select = select.where(group_rows)
    populated = exp.GT(this=exp.column(names.COUNT, quoted=True), expression=exp.Literal.number(0))
    if plan.view_class is not ViewClass.GLOBAL_AGGREGATE:
        select = select.where(populated)
    if plan.having is not None:
        select = select.where(plan.having.copy())
    copies = _copies(plan)
    if copies is not None:
        if plan.view_class is ViewClass.SET_OPERATION:
            select = select.where(exp.GT(this=copies.copy(), expression=exp.Literal.number(0)))
        # A row with multiplicity n is shown n times: the view is the query's bag.
        repeat = exp.Lateral(
            this=exp.Explode(this=exp.GenerateSeries(start=exp.Literal.number(1), end=copies)),
            view=True,
            alias=exp.TableAlias(this=_ident(names.COPIES_ALIAS), columns=[_ident(names.COPY)]),
        )
        select.append("laterals", repeat)
    elif plan.view_class is ViewClass.SET_OPERATION:
        select = select.where(_set_operation_keeps(plan))
    return top_k.ordered(select, plan.top_k) if plan.top_k else select


def _operand_counts(plan: ViewPlan) -> list[exp.Column]:
    return [
        exp.column(c.name, quoted=True)
        for c in plan.state_columns
        if names.is_operand_count(c.name)
    ]


def _copies(plan: ViewPlan) -> exp.Expression | None:
    """How many times the view repeats a state row; None when it shows it at most once."""
    if plan.view_class in (ViewClass.PROJECTION, ViewClass.WINDOW):
        return exp.column(names.COUNT, quoted=True)
    if plan.set_operation == "INTERSECT ALL":
        return exp.Least(this=_operand_counts(plan)[0], expressions=_operand_counts(plan)[1:])
    if plan.set_operation == "EXCEPT ALL":
        first, *rest = _operand_counts(plan)
        removed: exp.Expression = rest[0]
        for count in rest[1:]:
            removed = exp.Add(this=removed, expression=count)
        return exp.Sub(this=first, expression=exp.Paren(this=removed))
    return None


def _set_operation_keeps(plan: ViewPlan) -> exp.Expression:
    """INTERSECT: a row every operand produces; EXCEPT: one the first produces and no other."""
    first, *rest = _operand_counts(plan)
    present = [exp.GT(this=c, expression=exp.Literal.number(0)) for c in (first, *rest)]
    if plan.set_operation == "INTERSECT":
        return exp.and_(*present)
    absent = [exp.EQ(this=c.copy(), expression=exp.Literal.number(0)) for c in rest]
    return exp.and_(present[0], *absent)


# View properties that let dbt tests and people find a model's query and state.
QUERY_PROPERTY = "spark_ivm.query"
STATE_PROPERTY = "spark_ivm.state"
# The model's query with every source at the version the shown state reflects:
# what the view must equal (the ivm_matches_query test reads it).
QUERY_AT_VERSIONS_PROPERTY = "spark_ivm.query_at_versions"


@dataclass(frozen=True)
class Published:
    """The state version a view shows, and the source versions that state reflects."""

    state_version: int
    source_versions: Mapping[TableName, int]
    # Further view properties the refresh keeps with the published state
    # (its refresh history, for ivm_strategy: auto).
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ViewDocs:
    """dbt's persist_docs for the view: its description and its columns' descriptions."""

    description: str | None = None
    columns: Mapping[str, str] = field(default_factory=dict)


def create_view(
    plan: ViewPlan,
    state: TableName,
    target: TableName,
    docs: ViewDocs | None = None,
    published: Published | None = None,
) -> str:
    """CREATE OR REPLACE VIEW <model>: the model's rows from its state table.

    With `published`, the view reads the state at that fixed version: the
    state can then take the next refresh's commit without readers seeing it
    until the view is pointed at it (how a consistency group publishes).
    """
    docs = docs or ViewDocs()
    comment = (
        [exp.SchemaCommentProperty(this=exp.Literal.string(docs.description))]
        if docs.description
        else []
    )
    properties = exp.Properties(
        expressions=[
            *comment,
            exp.Property(
                this=exp.Literal.string(QUERY_PROPERTY),
                value=exp.Literal.string(plan.sql.strip()),
            ),
            exp.Property(
                this=exp.Literal.string(STATE_PROPERTY), value=exp.Literal.string(str(state))
            ),
            *(
                exp.Property(this=exp.Literal.string(name), value=exp.Literal.string(value))
                for name, value in (
                    _published_properties(plan, published) if published else {}
                ).items()
            ),
        ]
    )
    described = {name.lower(): text for name, text in docs.columns.items() if text}
    name: exp.Expression = target.to_table()
    if described:
        # Spark takes column comments only in the view's column list, which must
        # then name every column, in order.
        name = exp.Schema(
            this=name,
            expressions=[
                _commented_column(o.name, described.get(o.name.lower())) for o in plan.outputs
            ],
        )
    create = exp.Create(
        this=name,
        kind="VIEW",
        replace=True,
        properties=properties,
        expression=view_query(plan, state, published.state_version if published else None),
    )
    return _sql(create)


def publish_view(
    plan: ViewPlan,
    state: TableName,
    target: TableName,
    published: Published,
    docs: ViewDocs | None = None,
) -> list[str]:
    """Point an existing view at another state version: the statements, in order.

    ALTER VIEW ... AS swaps the definition in one metastore update, where
    CREATE OR REPLACE VIEW drops the view and creates it again (a reader in
    between finds no view). ALTER keeps the view's comment and properties but
    not its column comments, so a view with column docs is then created again
    with them (the one case with a moment without the view).
    """
    statements = [
        _sql(
            exp.Alter(
                this=target.to_table(),
                kind="VIEW",
                actions=[view_query(plan, state, published.state_version)],
            )
        ),
        _set_properties(target, "VIEW", _published_properties(plan, published)),
    ]
    if docs is not None and any(docs.columns.values()):
        statements.append(create_view(plan, state, target, docs, published))
    return statements


def _published_properties(plan: ViewPlan, published: Published) -> dict[str, str]:
    return {
        QUERY_AT_VERSIONS_PROPERTY: model_query(plan, published.source_versions),
        **published.properties,
    }


def _commented_column(name: str, comment: str | None) -> exp.Expression:
    if comment is None:
        return _ident(name)
    return exp.ColumnDef(
        this=_ident(name),
        constraints=[
            exp.ColumnConstraint(kind=exp.CommentColumnConstraint(this=exp.Literal.string(comment)))
        ],
    )


def model_query(plan: ViewPlan, versions: Mapping[TableName, int]) -> str:
    """The model's query evaluated with every source at its pinned version."""
    return relations.model_query(plan, versions)


def record_refresh(state: TableName, refresh_id: str) -> str:
    """A commit that changes no data, to carry a refresh's metadata when its MERGE wrote nothing."""
    return _set_properties(state, "TABLE", {"spark_ivm.last_refresh": refresh_id})


def _set_properties(relation: TableName, kind: str, properties: Mapping[str, str]) -> str:
    """ALTER TABLE|VIEW <relation> SET TBLPROPERTIES (...)."""
    return _sql(
        exp.Alter(
            this=relation.to_table(),
            kind=kind,
            actions=[
                exp.AlterSet(
                    expressions=[
                        exp.Properties(
                            expressions=[
                                exp.Property(
                                    this=exp.Literal.string(name), value=exp.Literal.string(value)
                                )
                                for name, value in properties.items()
                            ]
                        )
                    ]
                )
            ],
        )
    )
