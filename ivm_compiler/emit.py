"""ViewPlan -> Spark SQL statements, built as sqlglot trees (never by string formatting).

Statements:
- create_state: the state table computed at pinned source versions (first build, full refresh);
- merge_changes: the change of the sources' version ranges, applied with one MERGE;
- probe_join_keys: the key range of a join's change, which narrows the
  MERGE's reads of join partners (key_bounds.py);
- probe_partitions, merge_partitions: a WINDOW model's touched partitions, and
  the MERGE that recomputes them (view_classes/window.py);
- create_view: the relation users query, exposing only the model's columns;
- model_query: the model's own query at pinned versions (the correctness oracle).

Every state has one guard row (names.GUARD set, every other column NULL):
create_state writes it, each MERGE fails unless it still holds the refresh id
the refresh read, and moves it to its own (Guard). The view and every reader
of the state leave it out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from sqlglot import exp
from sqlglot.errors import ParseError

from ivm_compiler import (
    changes,
    join_states,
    key_bounds,
    layout,
    log_state,
    merge_source,
    names,
    reads,
    state_rows,
)
from ivm_compiler.compile import view_class_rule
from ivm_compiler.plan import MergeRule, StateColumn, ViewClass, ViewPlan
from ivm_compiler.rules import extremes, floating, top_k_buffer
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    aliased,
    create_delta_table,
    ident,
    version_as_of,
)
from ivm_compiler.view_classes import top_k, window

STATE_TABLE_PROPERTIES: dict[str, str] = {
    # Deletion vectors are left off on small states: on small local tables they
    # made each MERGE about twice as slow (measured 9-15 s against 4.8 s under
    # load). A large state's layout turns them on (layout.py).
}


def _sql(expression: exp.Expr) -> str:
    return expression.sql(dialect=DIALECT)


@dataclass(frozen=True)
class Guard:
    """What a MERGE checks and leaves in the state's guard row.

    `read`: the refresh id the state's newest refresh commit recorded (the
    commit this refresh read its recorded versions from); `write`: this
    refresh's id. If another refresh committed in between, the guard holds
    its id and the MERGE fails before writing anything.
    """

    read: str
    write: str


# The start of the error a MERGE raises when its guard check fails; refresh/recipe.py
# recognises it and turns it into the model's "another refresh" error.
GUARD_FAILED = "ivm guard"


def _guard_column(table: str | None = None) -> exp.Column:
    return exp.column(names.GUARD, table=ident(table) if table else None, quoted=True)


def _is_guard_row(table: str | None, guard_row: bool = True) -> exp.Expr:
    null = exp.Is(this=_guard_column(table), expression=exp.null())
    return exp.not_(null) if guard_row else null


def stale_guard_error(state: TableName, guard: Guard) -> exp.Expr:
    """The error a MERGE raises when the state's guard row no longer holds `guard.read`."""
    message = (
        f"{GUARD_FAILED}: {state} no longer holds refresh {guard.read}: another refresh "
        "committed to it after this one read it"
    )
    return exp.Anonymous(this="RAISE_ERROR", expressions=[exp.Literal.string(message)])


# The start of the error a MERGE raises, having written nothing, where
# merging a change into a group's moments or floating-point sum would cancel
# most of their digits (rules/moments.cancels, rules/floating.cancels): the
# refresh recomputes those groups, or the model.
CANCELLED = "ivm cancelled"


def _cancelling(plan: ViewPlan, layered: bool, matched: bool) -> exp.Expr | None:
    """When merging a change row cancels; None when nothing in the plan can.

    The layered source (merge_source.py) says so in names.CANCELLED; without
    it the floating-point sums are tested on the target's columns (NULL for
    a row the state lacks) and the change row's.
    """
    if layered:
        return exp.column(names.CANCELLED, table=ident(names.CHANGE_ALIAS), quoted=True)

    def stored(name: str) -> exp.Expr:
        return _target_column(name) if matched else exp.null()

    cancelling = [
        exp.paren(floating.cancels(index, stored, _source_column))
        for index in merge_source.cancellable_sums(plan)
    ]
    return exp.or_(*cancelling) if cancelling else None


# The start of the error a MERGE raises, having written nothing, where a
# group's bounded MIN/MAX values ran out (rules/extremes.py): the refresh runs
# it again, refilling those groups from the sources (merge_changes's `refill`).
EXHAUSTED = "ivm exhausted"


def _refuse_exhausted(state: TableName) -> exp.When:
    """A clause that fails the MERGE on a group whose bounded MIN/MAX kept values ran out.

    Such a group is in the state (it had kept values), so only a matched row can be one.
    """
    error = exp.Anonymous(
        this="RAISE_ERROR",
        expressions=[
            exp.Literal.string(
                f"{EXHAUSTED}: a group of {state} lost every MIN/MAX value the state kept "
                "while it still has values; they are read from the sources"
            )
        ],
    )
    return exp.When(
        matched=True,
        source=False,
        condition=exp.EQ(
            this=exp.column(names.EXHAUSTED, table=ident(names.CHANGE_ALIAS), quoted=True),
            expression=exp.true(),
        ),
        then=exp.Update(
            expressions=[exp.EQ(this=_guard_column(names.TARGET_ALIAS), expression=error)]
        ),
    )


def _refuse_cancelled(state: TableName, matched: bool, condition: exp.Expr) -> exp.When:
    """A clause that fails the MERGE on a change row whose merge cancels (`condition`)."""
    error = exp.Anonymous(
        this="RAISE_ERROR",
        expressions=[
            exp.Literal.string(
                f"{CANCELLED}: merging the change into a group's floating-point sums or "
                f"moments in {state} would leave fewer than 33 of their 53 bits"
            )
        ],
    )
    if matched:
        then: exp.Expr = exp.Update(
            expressions=[exp.EQ(this=_guard_column(names.TARGET_ALIAS), expression=error)]
        )
    else:
        then = exp.Insert(
            this=exp.Tuple(expressions=[_guard_column()]), expression=exp.Tuple(expressions=[error])
        )
    return exp.When(matched=matched, source=False, condition=condition, then=then)


def _guarded(source: exp.Query, guard: Guard) -> exp.Subquery:
    """The MERGE's source rows (guard column NULL), plus the guard source row (`guard.read`).

    The guard source row meets the state's guard row in ON (_same_guard) only
    while it holds `guard.read`: then the first clause moves it (_move_guard);
    otherwise the row is not matched and the last insert clause raises
    (_refuse_stale_guard). The state is read by the MERGE itself, at its own
    snapshot, and the guard row's file is rewritten by every MERGE: a refresh
    that committed earlier fails the match, and one that commits while this
    MERGE runs makes its commit a conflict. A full join ON FALSE appends the
    row without naming the source's columns.

    The check used to be a subquery over the state in the source (MAX of the
    guard column): one more scan of the state and three more Spark jobs per
    MERGE (measured: 1.67 s against 1.58 s on a 50-row state, 1.93 s against
    1.68 s on a 200,000-row one).
    """
    guard_row = exp.select(exp.alias_(exp.Literal.string(guard.read), names.GUARD, quoted=True))
    rows = (
        exp.select(
            exp.Column(this=exp.Star(), table=ident(names.GUARDED_ALIAS)),
            _guard_column(names.GUARD_CHECK_ALIAS),
        )
        # copy=False: every caller builds `source` for this statement alone,
        # and copying a change query is about a tenth of emitting the MERGE.
        .from_(source.subquery(ident(names.GUARDED_ALIAS), copy=False), copy=False)
        .join(
            guard_row.subquery(ident(names.GUARD_CHECK_ALIAS)),
            on=exp.false(),
            join_type="FULL OUTER",
            copy=False,
        )
    )
    return rows.subquery(ident(names.CHANGE_ALIAS), copy=False)


def _target_column(name: str) -> exp.Column:
    """A column of the MERGE's target (the state, or a join state) in ON and its clauses."""
    return exp.column(name, table=ident(names.TARGET_ALIAS), quoted=True)


def _source_column(name: str) -> exp.Column:
    """A column of the MERGE's source: the change (or the recomputed rows) of one state row."""
    return exp.column(name, table=ident(names.CHANGE_ALIAS), quoted=True)


def _same_guard() -> exp.Expr:
    """In ON: model rows (guard NULL) match model rows, the guard source row the guard row."""
    return exp.NullSafeEQ(
        this=_guard_column(names.TARGET_ALIAS), expression=_guard_column(names.CHANGE_ALIAS)
    )


def _move_guard(guard: Guard) -> exp.When:
    """The first clause: the matched guard row takes this refresh's id."""
    return exp.When(
        matched=True,
        source=False,
        condition=_is_guard_row(names.CHANGE_ALIAS),
        then=exp.Update(
            expressions=[
                exp.EQ(
                    this=_guard_column(names.TARGET_ALIAS),
                    expression=exp.Literal.string(guard.write),
                )
            ]
        ),
    )


def _insert_row(
    columns: Sequence[str],
    values: Mapping[str, exp.Expr] | None = None,
    condition: exp.Expr | None = None,
) -> exp.When:
    """WHEN NOT MATCHED THEN INSERT a model row (never the guard source row: it always matches).

    Each column takes the source row's column of the same name, or its `values`
    entry; `condition` narrows the rows inserted.
    """
    values = values or {}
    return exp.When(
        matched=False,
        source=False,
        condition=exp.and_(_is_guard_row(names.CHANGE_ALIAS, guard_row=False), condition)
        if condition is not None
        else _is_guard_row(names.CHANGE_ALIAS, guard_row=False),
        then=exp.Insert(
            this=exp.Tuple(
                expressions=[exp.column(n, quoted=True) for n in (*columns, names.GUARD)]
            ),
            expression=exp.Tuple(
                expressions=[
                    *(values.get(n, _source_column(n)) for n in columns),
                    exp.cast(exp.null(), exp.DataType.build("STRING")),
                ]
            ),
        ),
    )


def _refuse_stale_guard(state: TableName, guard: Guard) -> exp.When:
    """The last insert clause: the guard source row found no guard row holding `guard.read`.

    Conditioned on the guard source row, so a change row no clause inserts
    (a moments' change whose parts cancel) is left alone, not taken for it.
    """
    return exp.When(
        matched=False,
        source=False,
        condition=_is_guard_row(names.CHANGE_ALIAS),
        then=exp.Insert(
            this=exp.Tuple(expressions=[_guard_column()]),
            expression=exp.Tuple(expressions=[stale_guard_error(state, guard)]),
        ),
    )


def _build_query(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    rows_filter: exp.Expr | None = None,
) -> exp.Query:
    """The state's rows at pinned versions; a top-k state's best ones (rules/top_k_buffer.py)."""
    if top_k_buffer.keeps_best_rows(plan):
        return top_k_buffer.best_rows(plan, versions, rows_filter)
    return view_class_rule(plan.view_class).build_query(plan, versions, rows_filter)


# The state's change data feed, kept only for a state that ivm models read
# (a downstream model, or the model of a plan node): Delta then writes every
# MERGE's updated and deleted rows a second time, as change files (measured:
# a guarded MERGE of 3 rows 1.43 s with it, 1.22 s without, on 2,000 rows).
CHANGE_FEED_PROPERTY = "delta.enableChangeDataFeed"


def create_state(
    plan: ViewPlan,
    state: TableName,
    versions: Mapping[TableName, int],
    guard: str,
    change_feed: bool = True,
    state_layout: layout.Layout = layout.PLAIN,
) -> str:
    """The state at pinned versions, with its guard row holding this build's refresh id.

    `change_feed`: whether ivm models read the state's changes (they do for a
    plan node, and for a model other ivm models ref). `state_layout`: how
    its rows lie in its files (layout.py; its write_settings go with the
    statement).
    """
    properties = {
        **STATE_TABLE_PROPERTIES,
        **({CHANGE_FEED_PROPERTY: "true"} if change_feed else {}),
        **({log_state.STATE_FORM_PROPERTY: log_state.LOG} if plan.log_state else {}),
        **state_layout.properties,
    }
    rows = layout.sorted_rows(_built_rows(plan, versions, guard), state_layout.sort_key)
    return _sql(create_delta_table(state, properties, rows))


def overwrite_state(
    plan: ViewPlan,
    state: TableName,
    versions: Mapping[TableName, int],
    guard: str,
    sort_key: str | None = None,
) -> str:
    """The state's rows recomputed at pinned versions, written over the state in place.

    For a recompute, whose state already has this plan's columns: unlike
    CREATE OR REPLACE, the table stays the one ivm models reading it
    recorded, so they go on incrementally, reading the recompute's change
    consolidated (reads.signed_changes), where a replaced table makes each
    of them rebuild in turn.
    """
    rows = layout.sorted_rows(_built_rows(plan, versions, guard), sort_key)
    return _sql(exp.Insert(this=state.to_table(), expression=rows, overwrite=True))


def _built_rows(plan: ViewPlan, versions: Mapping[TableName, int], guard: str) -> exp.Query:
    """The state's rows at pinned versions, and its guard row holding `guard`."""
    columns = state_rows.state_table_columns(plan)
    built = _build_query(plan, versions).subquery(ident(names.BUILT_ALIAS))
    rows = exp.select(
        exp.Star(),
        exp.alias_(exp.cast(exp.null(), exp.DataType.build("STRING")), names.GUARD, quoted=True),
    ).from_(built)
    guard_row = exp.select(
        *(exp.alias_(exp.null(), name, quoted=True) for name in columns),
        exp.alias_(exp.Literal.string(guard), names.GUARD, quoted=True),
    )
    return exp.union(rows, guard_row, distinct=False)


def merge_changes(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    guard: Guard,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
    staged: str | None = None,
    refill: Mapping[TableName, int] | None = None,
    staged_rows: str | None = None,
    target: Sequence[layout.TargetBounds] = (),
) -> str:
    """One MERGE that applies a refresh's whole change to the state, in one Delta commit.

    It applies nothing and fails if another refresh committed to the state
    since this one read it (`guard`), and moves the guard row to this refresh.
    `bounds`: the answer of probe_join_keys, narrowing the join partners' reads;
    `join_reads`: join states that stand in for partner reads (join_states.py);
    `staged`: the temporary view stage_changes cached the signed change rows in.
    The change query and which rows leave the state are the view class's
    (a WINDOW model has no change query: see merge_partitions).
    With bounded MIN/MAX values it fails with EXHAUSTED where a group's
    ran out; `refill`, the pinned versions, makes the MERGE that reads
    those groups' values from the sources instead (rules/extremes.py).
    `staged_rows`: the relation stage_change_rows cached the change query's
    rows in, read instead of the query. `target`: the change's keys in the
    state's key columns (layout.py): a sorted state's ranges, so Delta
    searches only the files they fall in, and listed keys, which filter
    the state's rows before the MERGE's joins.
    """
    if staged_rows is not None:
        source: exp.Query = exp.select(exp.Star()).from_(exp.Table(this=ident(staged_rows)))
    else:
        source = _change_source(plan, state, ranges, bounds, join_reads, staged, refill)
    layered = bool(merge_source.merged_columns(plan))
    if layered:
        source = merge_source.with_merged_values(plan, source, state)
    whens = _change_clauses(plan, state, guard, layered)
    if refill is None and any(p.kept is not None for p in plan.preaggregations):
        whens.insert(1, _refuse_exhausted(state))
    if top_k_buffer.keeps_best_rows(plan):
        whens.insert(1, top_k_buffer.refuse_short(state))
    return _merge_into(plan, state, source, guard, whens, target)


def merge_changes_recomputing_cancelled(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    versions: Mapping[TableName, int],
    guard: Guard,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
    staged: str | None = None,
) -> str:
    """merge_changes, with the groups whose removal cancels recomputed at `versions` instead.

    For a plan merge_source.recomputes_groups accepts, after merge_changes
    failed with CANCELLED: the change is merged into every other group as
    there, and each cancelled group's state row is replaced by its row
    computed from the sources, in the same commit.
    """
    assert merge_source.recomputes_groups(plan)
    source = merge_source.with_cancelled_groups_recomputed(
        plan,
        _change_source(plan, state, ranges, bounds, join_reads, staged),
        state,
        _build_query(plan, versions),
    )
    replacing = exp.column(names.REPLACING, table=ident(names.CHANGE_ALIAS), quoted=True)
    columns = state_rows.state_table_columns(plan)
    values = [c for c in columns if c not in plan.merge_keys]
    replace = exp.When(
        matched=True,
        source=False,
        condition=replacing,
        then=exp.Update(
            expressions=[
                exp.EQ(this=_target_column(c), expression=_source_column(c)) for c in values
            ]
        ),
    )
    insert = _insert_row(columns, condition=replacing.copy())
    move, *rest = _change_clauses(plan, state, guard, layered=True)
    # Spark's grammar takes every WHEN MATCHED clause before any WHEN NOT MATCHED.
    matched = [w for w in rest if w.args.get("matched")]
    unmatched = [w for w in rest if not w.args.get("matched")]
    return _merge_into(plan, state, source, guard, [move, replace, *matched, insert, *unmatched])


def _change_source(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    bounds: key_bounds.Bounds | None,
    join_reads: changes.JoinReads | None,
    staged: str | None,
    refill: Mapping[TableName, int] | None = None,
) -> exp.Query:
    """The view class's change query, reading the staged signed rows when there are.

    `refill`: the pre-aggregations' change query refilling bounded MIN/MAX
    values at those versions (merge_changes). A top-k state kept to its
    best rows takes only the change rows up to its edge (rules/top_k_buffer.py).
    """
    if refill is not None:
        source = extremes.change_query(plan, ranges, state, bounds, join_reads, refill)
    else:
        rule = view_class_rule(plan.view_class)
        source = rule.change_query(plan, ranges, state, bounds, join_reads)
    if staged is not None:
        source = _reading_staged(source, staged)
    if top_k_buffer.keeps_best_rows(plan) and refill is None:
        # Around the query, after its CTE of signed rows is the stage's.
        source = top_k_buffer.changes_within_edge(plan, source, state)
    return source


def _merge_into(
    plan: ViewPlan,
    state: TableName,
    source: exp.Query,
    guard: Guard,
    whens: list[exp.When],
    target: Sequence[layout.TargetBounds] = (),
) -> str:
    """MERGE INTO the state USING the guarded `source`, matching on the merge keys.

    `target`: the change's keys per key column, conditions on the state alone in ON.
    """
    # The guard row (NULL keys) matches the guard source row only, never a
    # change row of a NULL group.
    on: exp.Expr = exp.and_(
        *[
            exp.NullSafeEQ(this=_target_column(k), expression=_source_column(k))
            for k in plan.merge_keys
        ],
        _same_guard(),
        *[layout.target_bounds(bounds, names.TARGET_ALIAS) for bounds in target],
        copy=False,
    )
    merge = exp.Merge(
        this=aliased(state.to_table(), names.TARGET_ALIAS),
        using=_guarded(source, guard),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return _sql(merge)


def _change_clauses(
    plan: ViewPlan, state: TableName, guard: Guard, layered: bool
) -> list[exp.When]:
    """merge_changes's clauses, in order: the guard's move, a row emptied, a refused
    cancelling merge (moments, floating-point sums), the update, the insert, the
    stale guard's refusal. `layered`: the source is merge_source.py's."""
    rule = view_class_rule(plan.view_class)
    whens = [_move_guard(guard)]
    emptied = rule.leaves_state(
        plan,
        exp.EQ(
            this=exp.Add(this=_target_column(names.COUNT), expression=_source_column(names.COUNT)),
            expression=exp.Literal.number(0),
        ),
    )
    if emptied is not None:
        whens.append(
            exp.When(matched=True, source=False, condition=emptied, then=exp.var("DELETE"))
        )
    cancelling = _cancelling(plan, layered, matched=True)
    if cancelling is not None:
        whens.append(_refuse_cancelled(state, True, cancelling))
    whens.append(exp.When(matched=True, source=False, then=exp.Update(expressions=_updates(plan))))
    cancelling = _cancelling(plan, layered, matched=False)
    if cancelling is not None:
        whens.append(_refuse_cancelled(state, False, cancelling))
    # A new state row is its change merged into an empty row (for moments,
    # what the source merged with the NULLs its LEFT JOIN found).
    first_values = {
        c.name: _merged(c, lambda _: exp.null(), _source_column)
        for c in plan.value_columns
        if c.rule in COMBINED_RULES
    }
    # A row the state lacks had no rows, so its change counts what it has now;
    # all but a moments' change (its inserted and removed parts are carried
    # apart, rules/moments.py) are dropped by the change query when that is 0.
    has_rows = None
    if any(c.rule is MergeRule.CHANGE_ONLY for c in plan.state_columns):
        has_rows = exp.NEQ(this=_source_column(names.COUNT), expression=exp.Literal.number(0))
    whens.append(_insert_row(state_rows.state_table_columns(plan), first_values, has_rows))
    whens.append(_refuse_stale_guard(state, guard))
    return whens


def merge_settings(plan: ViewPlan) -> dict[str, str]:
    """Spark session settings merge_changes's statement must run under (merge_source.py)."""
    return merge_source.session_settings(plan)


def stages_changes(plan: ViewPlan) -> bool:
    """Whether the signed change rows are worth caching before the MERGE (stage_changes).

    Spark inlines a CTE into every reference, so a change query that reads
    the signed rows from several branches (the group rows and each
    pre-aggregation) computes them, change feeds and joins included, once
    per branch. Read once, caching them first costs more than it saves
    (measured: a CACHE TABLE, a count and a MERGE of the cached rows took
    3.4 s where the MERGE alone took 2.4 s, 26 Spark jobs against 15).
    """
    return bool(plan.preaggregations)


def stage_changes(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    name: str,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
) -> str:
    """CACHE TABLE <name> AS <the signed change rows>: computed once, read by every branch.

    A temporary view of the session (one Thrift connection's server session),
    which the refresh drops after its MERGE (drop_staged).
    """
    rows = changes.signed_rows(plan, ranges, bounds, join_reads)
    return _sql(exp.Cache(this=exp.Table(this=ident(name)), expression=rows))


def stage_change_rows(
    plan: ViewPlan,
    state: TableName,
    ranges: Mapping[TableName, reads.VersionRange],
    name: str,
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
    staged: str | None = None,
) -> str:
    """CACHE TABLE <name> AS <the change query>: each state row's change, computed once.

    For a plan with pre-aggregations (stages_changes), after stage_changes
    (`staged`). Delta's MERGE evaluates its source twice (to find the files
    holding touched rows, then to rewrite them), and the change query's
    recomputed values are broadcast beside the group rows while the
    pre-aggregation rows they come from are read again by their own branch:
    bounded MIN/MAX's kept values were computed three times per MERGE
    (TPC-H SF 1, lineitem_supplier_extremes: three broadcast jobs of 2-8 s,
    then the find and rewrite passes). Cached, the MERGE reads them. Its
    reads of the state happen here, before the MERGE: the guard row still
    fails the MERGE if another refresh committed since this one read the
    guard, which it did before staging.
    """
    rows = _change_source(plan, state, ranges, bounds, join_reads, staged)
    return _sql(exp.Cache(this=exp.Table(this=ident(name)), expression=rows))


class Stage(NamedTuple):
    """A source's rows staged for one refresh: the source, the relation's name, its CACHE TABLE."""

    table: TableName
    name: str
    statement: str


def stage_feeds(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    prefix: str,
    partitions: int | None = None,
    list_keys: bool = True,
    key_relations: bool = True,
) -> tuple[list[Stage], dict[TableName, reads.VersionRange]]:
    """Each change feed the refresh reads more than once, staged as `<prefix>_<n>`.

    The stages (changes.repeated_feeds) cache the source's change rows, only
    the columns the model reads and `_change_type`, or an upstream ivm
    model's change as its view's signed rows, with CACHE TABLE; the
    ranges returned name them (`staged=`), so the probe and the change rows
    read the stage (reads.signed_changes). The refresh runs the statements
    first and frees the relations after the write (drop_staged).
    `partitions`: each stage coalesced into that many (delta.confs.staging);
    `list_keys`, `key_relations`: the key-bounds probe's (probe_join_keys).
    """
    return _staged(
        plan,
        ranges,
        prefix,
        changes.repeated_feeds(plan, ranges, list_keys, key_relations),
        lambda table, columns, name: (
            reads.stage_upstream_change(
                table, ranges[table], name, plan.upstreams[table], partitions
            )
            if table in plan.upstreams
            else reads.stage_feed(table, ranges[table], columns, name, partitions)
        ),
        lambda versions, name: replace(versions, staged=name),
    )


def stage_snapshots(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    prefix: str,
    small: Collection[TableName],
    bounds: key_bounds.Bounds | None = None,
    join_reads: changes.JoinReads | None = None,
    partitions: int | None = None,
) -> tuple[list[Stage], dict[TableName, reads.VersionRange]]:
    """Each small source's pinned snapshot the change rows read more than once, staged as `<prefix>_<n>`.

    As stage_feeds, for the sources' rows at their pinned versions
    (changes.repeated_snapshots, reads.stage_snapshot): the ranges returned
    name the stages (`snapshot=`), and the change rows read them
    (reads.read_snapshots). `bounds` and `join_reads` are the write's.
    """
    return _staged(
        plan,
        ranges,
        prefix,
        changes.repeated_snapshots(plan, ranges, small, bounds, join_reads),
        lambda table, columns, name: reads.stage_snapshot(
            table, ranges[table].pinned, columns, name, partitions
        ),
        lambda versions, name: replace(versions, snapshot=name),
    )


def stage_net_changes(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    prefix: str,
) -> tuple[list[Stage], dict[TableName, reads.VersionRange]]:
    """The change of each relation overwritten in its range, summed and staged as `<prefix>_<n>`.

    An upstream ivm model's state is overwritten by its recompute; a source
    by an `INSERT OVERWRITE` reload (one whose read columns the plan knows).
    reads.stage_net_change: the ranges returned name the stages (`staged=`),
    every read of the change reads them (reads.signed_changes; stage_feeds
    leaves them be), and a COUNT of each stage sizes the change before the
    refresh decides how to apply it (refresh/recipe.py).
    """
    stages = []
    reading = dict(ranges)
    for index, table in enumerate(overwritten_tables(plan, ranges)):
        name = f"{prefix}_{index}"
        cache = reads.stage_net_change(
            table,
            ranges[table],
            name,
            plan.upstreams.get(table),
            list(plan.source_columns.get(table, {})),
        )
        stages.append(Stage(table, name, _sql(cache)))
        reading[table] = replace(ranges[table], staged=name)
    return stages, reading


def overwritten_tables(
    plan: ViewPlan, ranges: Mapping[TableName, reads.VersionRange]
) -> list[TableName]:
    """The relations whose change stage_net_changes sums: overwritten in a range not staged yet."""
    return [
        table
        for table in plan.tables
        if ranges[table].changed
        and ranges[table].overwritten
        and ranges[table].staged is None
        and (table in plan.upstreams or table in plan.source_columns)
    ]


def count_staged(name: str) -> str:
    """The number of rows a staged relation holds (a cached one: read from memory).

    >>> count_staged("s")
    'SELECT COUNT(*) FROM `s`'
    """
    return _sql(exp.select(exp.Count(this=exp.Star())).from_(exp.Table(this=ident(name))))


def _staged(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    prefix: str,
    tables: list[TableName],
    cache: Callable[[TableName, list[str], str], exp.Cache],
    reading_stage: Callable[[reads.VersionRange, str], reads.VersionRange],
) -> tuple[list[Stage], dict[TableName, reads.VersionRange]]:
    """`tables` staged as `<prefix>_<n>` by `cache`, and `ranges` with each read from its stage."""
    stages = []
    reading = dict(ranges)
    for index, table in enumerate(tables):
        name = f"{prefix}_{index}"
        stages.append(
            Stage(table, name, _sql(cache(table, list(plan.source_columns.get(table, {})), name)))
        )
        reading[table] = reading_stage(ranges[table], name)
    return stages, reading


def drop_staged(name: str) -> list[str]:
    """The statements that free a staged relation: its cache, then its temporary view."""
    return [
        _sql(exp.Uncache(this=exp.Table(this=ident(name)), exists=True)),
        _sql(exp.Drop(tables=[exp.Table(this=ident(name))], kind="VIEW", exists=True)),
    ]


def _reading_staged(query: exp.Query, staged: str) -> exp.Query:
    """The change query with its signed-rows CTE replaced by the staged relation."""
    query = query.copy()
    with_ = query.args.get("with_")
    if with_ is not None:
        kept = [cte for cte in with_.expressions if cte.alias_or_name != names.CHANGES_CTE]
        if kept:
            with_.set("expressions", kept)
        else:
            query.set("with_", None)
    for table in query.find_all(exp.Table):
        if not table.db and table.name == names.CHANGES_CTE:
            table.set("this", ident(staged))
    return query


# The rules whose new value reads several of the row's columns (rules/floating.py,
# rules/moments.py, rules/covariance.py).
COMBINED_RULES = (
    MergeRule.COMPENSATED_SUM,
    MergeRule.SUM_ERROR,
    MergeRule.MOMENT,
    MergeRule.CO_MOMENT,
)


def _merged(
    column: StateColumn,
    stored: Callable[[str], exp.Expr],
    change: Callable[[str], exp.Expr],
) -> exp.Expr:
    """A COMBINED_RULES column's new value, from the stored row's columns and the change row's.

    Moments and co-moments are merged in the MERGE's source (merge_source.py).
    """
    if column.rule in merge_source.MERGED_RULES:
        return _source_column(names.merged_value_of(column.name))
    return floating.merged(column, stored, change)


def _updates(plan: ViewPlan) -> list[exp.Expr]:
    """A matched state row's new values: stored + change, combined, or recomputed (MergeRule)."""
    touched_flags = {p.slot: p.touched_flag for p in plan.preaggregations}
    updates: list[exp.Expr] = []
    for column in plan.value_columns:
        stored: exp.Expr = _target_column(column.name)
        change: exp.Expr = _source_column(column.name)
        if column.rule is MergeRule.RECOMPUTED:
            assert column.preaggregation is not None
            # Recomputed from the pre-aggregation when its values changed; kept otherwise.
            touched = exp.EQ(
                this=_source_column(touched_flags[column.preaggregation]), expression=exp.true()
            )
            value = exp.If(this=touched, true=change, false=stored)
            updates.append(exp.EQ(this=_target_column(column.name), expression=value))
            continue
        if column.rule in COMBINED_RULES:
            combined = _merged(column, _target_column, _source_column)
            updates.append(exp.EQ(this=_target_column(column.name), expression=combined))
            continue
        if column.rule is MergeRule.ADD_NULLABLE:
            stored = exp.Coalesce(this=stored, expressions=[exp.Literal.number(0)])
            change = exp.Coalesce(this=change, expressions=[exp.Literal.number(0)])
        updates.append(
            exp.EQ(
                this=_target_column(column.name), expression=exp.Add(this=stored, expression=change)
            )
        )
    return updates


def probe_join_keys(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    list_keys: bool = False,
    key_relations: bool = True,
) -> tuple[str, list[key_bounds.KeyColumn]] | None:
    """The probe of a join's change key bounds, and the keys in its answer's order; None: no join.

    `list_keys`: the probe lists each key's distinct values too (a large
    source); `key_relations`: the keys that bound only key relations, where
    listed, are asked too (changes.bounded_keys).
    """
    bounded = changes.bounded_keys(plan, ranges, list_keys, key_relations)
    if not bounded:
        return None
    return _sql(key_bounds.probe_query(bounded, list_keys)), key_bounds.probe_columns(bounded)


def keys_past_list(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    bounds: key_bounds.Bounds,
    key_relations: bool = True,
) -> key_bounds.Bounds:
    """The answer of a probe that lists keys, each key it found too many of read from its change.

    key_bounds.with_change_reads; `key_relations` as the probe was asked.
    """
    probed = changes.bounded_keys(plan, ranges, True, key_relations)
    return key_bounds.with_change_reads(bounds, probed)


def unchanged_relations_probe(
    plan: ViewPlan, ranges: Mapping[TableName, reads.VersionRange]
) -> str | None:
    """changes.unchanged_relations_probe as SQL; None: no key relation's input changed."""
    probe = changes.unchanged_relations_probe(plan, ranges)
    return None if probe is None else _sql(probe)


def keyless_presence_probe(
    plan: ViewPlan, ranges: Mapping[TableName, reads.VersionRange], touched: Mapping[str, int]
) -> str | None:
    """changes.keyless_presence_probe as SQL; None: no keyless relation to ask about."""
    probe = changes.keyless_presence_probe(plan, ranges, touched)
    return None if probe is None else _sql(probe)


def unchanged_relations(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    ask: Callable[[str], Sequence[Sequence[Any]]],
) -> set[str]:
    """The key relations the change leaves as they were (changes.unchanged_relations).

    `ask` runs a probe and answers its rows: unchanged_relations_probe, then
    keyless_presence_probe where a keyless relation was touched.
    """
    probe = unchanged_relations_probe(plan, ranges)
    if probe is None:
        return set()
    touched = {str(row[0]): int(row[1]) for row in ask(probe)}
    keyless = keyless_presence_probe(plan, ranges, touched)
    present = {} if keyless is None else {str(row[0]): int(row[1]) for row in ask(keyless)}
    return changes.unchanged_relations(touched, present)


def probe_partitions(
    plan: ViewPlan,
    ranges: Mapping[TableName, reads.VersionRange],
    limit: int = window.MAX_TOUCHED_PARTITIONS,
) -> str:
    """A WINDOW model's touched partitions: the distinct keys of its source's change rows.

    At most `limit` + 1 of them: one more than the refresh recomputes by partition.
    """
    assert plan.view_class is ViewClass.WINDOW and plan.window_partition
    (source,) = plan.sources
    changed = reads.signed_changes(
        source.table, ranges[source.table], source.alias, plan.upstreams.get(source.table)
    )
    rows = plan.rows
    assert isinstance(rows, exp.Select)
    return _sql(window.probe_query(rows, changed, plan.window_partition, limit))


def merge_partitions(
    plan: ViewPlan,
    state: TableName,
    versions: Mapping[TableName, int],
    keys: Sequence[window.PartitionKey],
    guard: Guard,
    staged_rows: str | None = None,
) -> str:
    """One MERGE that replaces a WINDOW model's state rows of the touched partitions.

    The source is the model's rows of those partitions at the pinned versions
    (a partition's rows depend on that partition alone); state rows of those
    partitions that the recomputation no longer produces are deleted, and
    the rest of the state is left alone. The partitions, as literals, are in
    the rows' WHERE, in ON and in the delete's condition, so Delta can skip
    other partitions' files in the source and in the state. The guard check
    and move are merge_changes's (a NULL partition's delete spares the guard row).
    `staged_rows`: the relation stage_partition_rows cached those rows in,
    read instead of recomputing them.
    """
    assert plan.view_class is ViewClass.WINDOW and plan.window_partition
    types = [p.data_type for p in plan.window_partition]
    in_state = window.partition_predicate(
        [_target_column(p.state_column) for p in plan.window_partition], types, keys
    )
    if staged_rows is not None:
        rows: exp.Query = exp.select(exp.Star()).from_(exp.Table(this=ident(staged_rows)))
    else:
        rows = _partition_rows(plan, versions, keys)
    return _merge_recomputed_rows(plan, state, rows, guard, within=in_state)


def stage_partition_rows(
    plan: ViewPlan,
    versions: Mapping[TableName, int],
    keys: Sequence[window.PartitionKey],
    name: str,
) -> str:
    """CACHE TABLE <name> AS <the state rows of the touched partitions>, computed once.

    Delta's MERGE reads a source of Delta scans twice (to find the files
    holding matches, then to rewrite them), so the windows of thousands of
    partitions were computed twice; cached, they are computed once, and the
    MERGE joins the state with rows whose size Spark knows.
    """
    rows = _partition_rows(plan, versions, keys)
    return _sql(exp.Cache(this=exp.Table(this=ident(name)), expression=rows))


def _partition_rows(
    plan: ViewPlan, versions: Mapping[TableName, int], keys: Sequence[window.PartitionKey]
) -> exp.Query:
    """The state rows of the partitions `keys` at pinned versions (view_classes/window.py)."""
    types = [p.data_type for p in plan.window_partition]
    in_rows = window.partition_predicate([p.source for p in plan.window_partition], types, keys)
    return _build_query(plan, versions, rows_filter=in_rows)


def merge_recomputed(
    plan: ViewPlan, state: TableName, versions: Mapping[TableName, int], guard: Guard
) -> str:
    """The state's rows recomputed at pinned versions, merged into the state by key.

    A recompute for a state that ivm models read: only the rows that differ
    from the recomputation are written (updated, inserted, deleted), so the
    state's change feed holds what changed and the commit's metrics count
    it. Its readers then size it and read only those rows, where an
    overwrite's change is every row twice and a reader applying it has to
    sum it first (reads.stage_net_change). The MERGE joins the state with
    the recomputed rows, about 2.5 times an overwrite's time on a
    600,000-row state, so the refresh takes it only for a change small
    enough that readers apply it (recipe.Refresh._recompute_write), and
    overwrites otherwise (overwrite_state). Guarded as merge_changes is.
    """
    return _merge_recomputed_rows(plan, state, _build_query(plan, versions), guard)


def _merge_recomputed_rows(
    plan: ViewPlan,
    state: TableName,
    rows: exp.Query,
    guard: Guard,
    within: exp.Expr | None = None,
) -> str:
    """MERGE recomputed state `rows` into the state: a row that differs is updated, a new
    one inserted, and a state row the rows no longer hold deleted.

    `within`: a condition on the state's rows when `rows` recompute only
    those (a WINDOW model's touched partitions); the rest is left alone.
    The deletes are then named in the source (_with_gone_rows). `within` is
    in ON too, where it changes no match (every source row lies within) and
    lets Delta prune the state's files and filter its rows before joining
    them; the guard row (NULL keys) is in ON's rows explicitly, so the guard
    source row always finds it.
    """
    columns = state_rows.state_table_columns(plan)
    values = [c for c in columns if c not in plan.merge_keys]
    same_row = [
        exp.NullSafeEQ(this=_target_column(k), expression=_source_column(k))
        for k in plan.merge_keys
    ]
    if within is None:
        on = exp.and_(*same_row, _same_guard())
        whens = [
            _move_guard(guard),
            _updated_where_different(values),
            _insert_row(columns),
            _refuse_stale_guard(state, guard),
            exp.When(
                matched=False,
                source=True,
                condition=_is_guard_row(names.TARGET_ALIAS, guard_row=False),
                then=exp.var("DELETE"),
            ),
        ]
    else:
        on = exp.and_(
            *same_row,
            _same_guard(),
            exp.paren(exp.or_(exp.paren(within.copy()), _is_guard_row(names.TARGET_ALIAS))),
        )
        gone = _source_column(names.GONE)
        whens = [
            _move_guard(guard),
            exp.When(matched=True, source=False, condition=gone, then=exp.var("DELETE")),
            _updated_where_different(values),
            _insert_row(columns, condition=exp.not_(gone.copy())),
            _refuse_stale_guard(state, guard),
        ]
        rows = _with_gone_rows(plan, state, rows, within, columns)
    merge = exp.Merge(
        this=aliased(state.to_table(), names.TARGET_ALIAS),
        using=_guarded(rows, guard),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return _sql(merge)


def _with_gone_rows(
    plan: ViewPlan, state: TableName, rows: exp.Query, within: exp.Expr, columns: Sequence[str]
) -> exp.Query:
    """`rows`, then the state's rows `within` that `rows` no longer hold, marked names.GONE.

    Deleted by a WHEN NOT MATCHED BY SOURCE clause instead, every state row
    was a candidate: Delta joined the whole state with the rows, keeping all
    of it, in each of the MERGE's three jobs (on the warehouse at scale 6000,
    `mart_customer_running_spend`'s 7.1 M state rows shuffled three times
    for 274,835 recomputed ones). Named here, every clause is a matched or
    not matched one, so ON's `within` filters the state's scan before the
    join; the state's rows of those partitions are read once more here.
    bench/micro/partition_merge.py: 12.1 s where 35.8 s on a 7.1 M-row state.
    """

    def recomputed() -> exp.Subquery:
        return rows.subquery(ident(names.RECOMPUTED_ALIAS))

    kept = exp.select(
        *[exp.column(c, table=ident(names.RECOMPUTED_ALIAS), quoted=True) for c in columns],
        exp.alias_(exp.false(), names.GONE, quoted=True),
    ).from_(recomputed())
    stored = within.transform(
        lambda node: (
            exp.column(node.name, table=ident(names.STORED_ALIAS), quoted=True)
            if isinstance(node, exp.Column) and node.table == names.TARGET_ALIAS
            else node
        )
    )
    same_row = exp.and_(
        *[
            exp.NullSafeEQ(
                this=exp.column(k, table=ident(names.STORED_ALIAS), quoted=True),
                expression=exp.column(k, table=ident(names.RECOMPUTED_ALIAS), quoted=True),
            )
            for k in plan.merge_keys
        ]
    )
    gone = (
        exp.select(
            *[exp.column(c, table=ident(names.STORED_ALIAS), quoted=True) for c in columns],
            exp.alias_(exp.true(), names.GONE, quoted=True),
        )
        .from_(aliased(state.to_table(), names.STORED_ALIAS))
        .join(recomputed(), on=same_row, join_type="LEFT ANTI")
        .where(exp.and_(exp.paren(stored), _is_guard_row(names.STORED_ALIAS, guard_row=False)))
    )
    return exp.union(kept, gone, distinct=False)


def _updated_where_different(values: Sequence[str]) -> exp.When:
    """WHEN MATCHED with any other value THEN UPDATE them: a recomputed row that changed.

    Compared NULL-safely, so an unchanged row is not written (nor shown in
    the change feed) again.
    """
    differs = exp.not_(
        exp.paren(
            exp.and_(
                *[
                    exp.NullSafeEQ(this=_target_column(c), expression=_source_column(c))
                    for c in values
                ]
            )
        )
    )
    return exp.When(
        matched=True,
        source=False,
        condition=differs,
        then=exp.Update(
            expressions=[
                exp.EQ(this=_target_column(c), expression=_source_column(c)) for c in values
            ]
        ),
    )


def view_query(plan: ViewPlan, state: TableName, version: int | None = None) -> exp.Select:
    """The model's rows from the state table (at `version`): bookkeeping columns stay hidden.

    Which state rows the view shows, and how often, is the view class's; a
    top-k model's view then orders and limits them (view_classes/top_k.py).
    """
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
    table: exp.Expr = state.to_table() if version is None else version_as_of(state, version)
    if plan.log_state:
        table = log_state.view_rows(plan, table).subquery(ident(state.name))
    # The guard row is bookkeeping, in every view class (a global aggregate's
    # view keeps rows with a zero count).
    select = exp.select(*outputs).from_(table).where(_is_guard_row(None, guard_row=False))
    select = view_class_rule(plan.view_class).view(plan, select)
    return top_k.ordered(select, plan.top_k) if plan.top_k else select


# View properties that let dbt tests and people find a model's query and state.
QUERY_PROPERTY = "spark_ivm.query"
STATE_PROPERTY = "spark_ivm.state"
# The model's query with every source at the version the shown state reflects:
# what the view must equal (the ivm_matches_query test reads it).
QUERY_AT_VERSIONS_PROPERTY = "spark_ivm.query_at_versions"
# The state version the view reads (also in its text, as VERSION AS OF): a
# refresh learns it with the view's other properties, in one statement.
STATE_VERSION_PROPERTY = "spark_ivm.state_version"


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
    name: exp.Expr = target.to_table()
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
        set_properties(target, "VIEW", _published_properties(plan, published)),
    ]
    if docs is not None and any(docs.columns.values()):
        statements.append(create_view(plan, state, target, docs, published))
    return statements


def _published_properties(plan: ViewPlan, published: Published) -> dict[str, str]:
    return {
        QUERY_AT_VERSIONS_PROPERTY: model_query(plan, published.source_versions),
        STATE_VERSION_PROPERTY: str(published.state_version),
        **published.properties,
    }


def _commented_column(name: str, comment: str | None) -> exp.Expr:
    if comment is None:
        return ident(name)
    return exp.ColumnDef(
        this=ident(name),
        constraints=[
            exp.ColumnConstraint(kind=exp.CommentColumnConstraint(this=exp.Literal.string(comment)))
        ],
    )


def model_query(plan: ViewPlan, versions: Mapping[TableName, int]) -> str:
    """The model's query evaluated with every source at its pinned version."""
    return reads.model_query(plan, versions)


def record_refresh(state: TableName, refresh_id: str) -> str:
    """A commit that changes no data, to carry a refresh's metadata when its MERGE wrote nothing."""
    return set_properties(state, "TABLE", {"spark_ivm.last_refresh": refresh_id})


def set_properties(relation: TableName, kind: str, properties: Mapping[str, str]) -> str:
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


def create_join_state(
    join_input: join_states.JoinInput, relation: TableName, version: int, guard: str
) -> str:
    """A join state (join_states.py) at a source version, its guard row holding `guard`."""
    return join_states.create(join_input, relation, version, guard)


def merge_join_state(
    join_input: join_states.JoinInput,
    relation: TableName,
    versions: reads.VersionRange,
    guard: Guard,
    bounds: key_bounds.Bounds | None = None,
) -> str:
    """One MERGE that brings a join state over a source's version range (guarded like a state).

    `bounds`: the probe's answer; the join state's rows outside the change's
    key range are left out of ON, so their files are not read.
    """

    columns = [name for name, _ in join_input.columns]
    signed = reads.signed_changes(join_input.table, versions, join_input.alias)
    on = exp.and_(
        *[exp.NullSafeEQ(this=_target_column(c), expression=_source_column(c)) for c in columns],
        _same_guard(),
    )
    bound = join_states.target_bound(join_input, bounds or {}, names.TARGET_ALIAS)
    if bound is not None:
        on = exp.and_(on, bound)
    new_count = exp.Add(this=_target_column(names.COUNT), expression=_source_column(names.COUNT))
    whens = [
        _move_guard(guard),
        exp.When(
            matched=True,
            source=False,
            condition=exp.EQ(this=new_count, expression=exp.Literal.number(0)),
            then=exp.var("DELETE"),
        ),
        exp.When(
            matched=True,
            source=False,
            then=exp.Update(
                expressions=[exp.EQ(this=_target_column(names.COUNT), expression=new_count.copy())]
            ),
        ),
        _insert_row([*columns, names.COUNT]),
        _refuse_stale_guard(relation, guard),
    ]
    merge = exp.Merge(
        this=aliased(relation.to_table(), names.TARGET_ALIAS),
        using=_guarded(join_states.changes(join_input, signed), guard),
        on=on,
        whens=exp.Whens(expressions=whens),
    )
    return _sql(merge)
