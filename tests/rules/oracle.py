"""One model's refresh cycle in DuckDB, and the two identities every refresh must keep.

For a change window v..v' of the model's sources:

    state(v) (+) change(v..v') == state(v')             as bags, and
    view(state(v')) == the model's query at v'          as bags,

where state(v) is the compiler's build query (emit.create_state) at the
versions v, change(v..v') the USING side of the compiler's MERGE
(each view class's change_query, guarded), and (+) applies it as the MERGE does.

(+) is computed twice. `apply_changes` is the rule written down in Python
over the fetched rows (what emit.merge_changes is documented to do), so a
mismatch names the rows and columns involved; and the compiler's own MERGE
statement runs in DuckDB, so the statement that ships is the one checked,
guard row included. The state after the MERGE must equal apply_changes'
state, which must equal the build at v'. The next refresh starts from the
MERGE's state, so errors accumulate as they would in Spark.

A WINDOW model's change is different: the partitions its change rows touch
(emit.probe_partitions), recomputed at v' (emit.merge_partitions, whose
source also names their state rows that are gone, checked against the
state); (+) replaces those partitions (replace_partitions). Refreshes read join partners within the
probed key bounds (emit.probe_join_keys), as refresh/recipe.py does: by
turns ranges alone, listed keys, and keys past the list read from the
change (emit.keys_past_list); join states (ivm_join_state) are not used here.

A recompute of a state that ivm models read merges the recomputed rows by
key (emit.merge_recomputed, `run(..., recompute_at=...)`): after it the
state must equal the build, and the next refresh's MERGE applies over it.

A state kept as a log (log_state.py, `run(..., log=True)`) takes each
change with the compiler's INSERT of the change rows, every other refresh
with its rewrite (log_state.compact) instead; then its consolidated rows
(log_state.consolidated, what the view reads) must equal the build at v',
and after a rewrite the log holds one row per key.

A model with plan nodes (nodes.split_nodes: CTEs and subqueries kept as ivm
models of their own) refreshes its nodes first, each through this cycle and
its identities, and reads each node as refresh.py does, as an upstream ivm
model: the node's state rows are committed after each write to a simulated
Delta table under the state's name (DeltaTable.commit_rows), whose versions
and change feed the model's statements read.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import math
import unittest.mock
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import duckdb
from sqlglot import exp

from ivm_compiler import (
    TableName,
    ViewClass,
    ViewPlan,
    changes,
    compile_model,
    emit,
    key_bounds,
    log_state,
    merge_source,
    names,
)
from ivm_compiler import state_rows as state_queries
from ivm_compiler.compile import view_class_rule
from ivm_compiler.key_bounds import parse_probe
from ivm_compiler.nodes import split_nodes
from ivm_compiler.plan import MergeRule, PreAggregation, UpstreamModel
from ivm_compiler.reads import VersionRange, model_query
from ivm_compiler.rules import top_k_buffer
from ivm_compiler.view_classes import window as window_rules
from tests.rules.engine import (
    SPARK,
    Catalog,
    Change,
    ChangeFeedHook,
    DeltaTable,
    Engine,
    Insert,
    Memo,
    Row,
)
from tests.rules.models import Model, Source

# The model's view and state; a plan node's are named after the view (nodes.node_relation).
RELATION = TableName(db="analytics", name="model")
STATE = TableName(db="analytics", name="model__ivm_state")


def state_of(relation: TableName) -> TableName:
    """The state table behind a model's or a plan node's view (refresh.state_of)."""
    return TableName(db=relation.db, name=f"{relation.name}{names.STATE_SUFFIX}")


@dataclass(frozen=True)
class Scenario:
    """Commits before the first build, then the commits before each refresh (maybe none)."""

    seed: tuple[tuple[TableName, Change], ...]
    steps: tuple[tuple[tuple[TableName, Change], ...], ...]


class Mismatch(AssertionError):
    """An identity failed; the message says which, after which commits, and the rows that differ."""


@functools.cache
def memo_of(model: Model) -> Memo:
    """What the engines of one model share (types and translations; no rows)."""
    return Memo()


# A bounded MIN/MAX keeps this many values per group here (rules/extremes.py;
# 16 by default): with the few values the sources draw from, a refresh then
# often cuts a group's values back (past 2) and often deletes its only kept
# one, so the refill from the sources runs as well as the plain change.
RULES_EXTREMES_KEPT = 1


@dataclass(frozen=True)
class Chain:
    """A model's plan and the plan nodes it reads (nodes.split_nodes), each a chain of its own.

    `nodes` are the model's own nodes in refresh order; `sql` is the query as
    written (the node's query, for a node), which its view must equal.
    """

    name: str
    sql: str
    relation: TableName
    plan: ViewPlan
    nodes: tuple[Chain, ...] = ()

    @property
    def state(self) -> TableName:
        return state_of(self.relation)

    def all_nodes(self) -> list[Chain]:
        """Every node below the model, each after the nodes it reads."""
        return [found for node in self.nodes for found in (*node.all_nodes(), node)]


@dataclass
class _Compiling:
    """What compiling a model's chain has found so far: the nodes' views and columns, by relation."""

    sources: dict[TableName, tuple[tuple[str, str], ...]]
    upstreams: dict[TableName, UpstreamModel]
    outputs: dict[TableName, list[tuple[str, str]]]
    # The nodes' views made empty tables in the compiling engine (_NodeCatalog).
    created: set[TableName] = field(default_factory=set)

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        if table in self.outputs:
            return list(self.outputs[table])
        return list(self.sources[table])


class _NodeCatalog(Catalog):
    """The compiler's catalog over the sources and the plan nodes compiled so far.

    A node's view answers with its outputs; a query reading it is planned
    over an empty table of those columns under the view's name.
    """

    def __init__(self, engine: Engine, compiling: _Compiling) -> None:
        super().__init__(engine)
        self.compiling = compiling

    def columns(self, table: TableName) -> list[tuple[str, str]]:
        return self.compiling.columns(table)

    def describe_query(self, sql: str) -> list[tuple[str, str]]:
        for relation, columns in self.compiling.outputs.items():
            if relation not in self.compiling.created:
                self.engine.create_empty(relation, columns)
                self.compiling.created.add(relation)
        return super().describe_query(sql)


def _chain(
    name: str, sql: str, relation: TableName, compiling: _Compiling, engine: Engine
) -> Chain:
    """The chain of a model's (or a node's) query: its own nodes compiled first, then its plan."""
    split = split_nodes(name, sql, relation, compiling.columns)
    nodes = []
    for node in split.nodes:
        chain = _chain(f"{name} (CTE {node.name})", node.sql, node.relation, compiling, engine)
        view = emit.view_query(chain.plan, chain.state)
        assert isinstance(view, exp.Select)
        compiling.upstreams[node.relation] = UpstreamModel(state=chain.state, view=view)
        compiling.outputs[node.relation] = [(o.name, o.data_type) for o in chain.plan.outputs]
        nodes.append(chain)
    plan = compile_model(
        name,
        split.sql,
        _NodeCatalog(engine, compiling),
        dict(compiling.upstreams),
        written=sql if split.nodes else None,
        extremes_kept=RULES_EXTREMES_KEPT,
    )
    return Chain(name=name, sql=sql, relation=relation, plan=plan, nodes=tuple(nodes))


@functools.cache
def chain_of(model: Model) -> Chain:
    """The model's plan and its plan nodes' plans, compiled once against empty sources."""
    sources = [DeltaTable(s.name, s.schema) for s in model.sources]
    compiling = _Compiling({s.name: s.schema for s in model.sources}, {}, {})
    with contextlib.closing(Engine(sources, memo=memo_of(model))) as engine:
        return _chain(model.name, model.sql, RELATION, compiling, engine)


def compiled(model: Model) -> ViewPlan:
    """The model's plan, compiled once against a catalog of empty sources."""
    return chain_of(model).plan


# -- bags -----------------------------------------------------------------------------


def _bag(rows: Sequence[Row]) -> Counter[Row]:
    # Python compares and hashes int, Decimal and float by value, so 2 and
    # Decimal('2.00') are one element, as they are one value in SQL.
    return Counter(rows)


def _difference(expected: Sequence[Row], actual: Sequence[Row]) -> str:
    want, got = _bag(expected), _bag(actual)
    missing = sorted(map(repr, (want - got).elements()))
    extra = sorted(map(repr, (got - want).elements()))
    if not (missing or extra) or _close(expected, actual):
        return ""
    return f"missing {missing}, unexpected {extra}"


# Floating-point columns (DOUBLE sums, means, moments) of a refresh and of a
# rebuild add in different orders: they are equal within these tolerances
# (rules/floating.py, rules/moments.py), everything else exactly.
RELATIVE_TOLERANCE = 1e-9
ABSOLUTE_TOLERANCE = 1e-9


def _close(expected: Sequence[Row], actual: Sequence[Row]) -> bool:
    """The bags are equal but for floats within the tolerances.

    Rows are paired in order after sorting by their exact columns, then
    their floats: rows whose floats differ by rounding sort alike.
    """
    if len(expected) != len(actual):
        return False

    def order(row: Row) -> tuple:
        exact = tuple(
            repr(Decimal(v).normalize()) if isinstance(v, (int, Decimal)) else repr(v)
            for v in row
            if not isinstance(v, float)
        )
        floats = tuple(
            (math.isnan(v), v if not math.isnan(v) else 0.0) for v in row if isinstance(v, float)
        )
        return exact, floats

    for want, got in zip(sorted(expected, key=order), sorted(actual, key=order)):
        if len(want) != len(got):
            return False
        for a, b in zip(want, got):
            if isinstance(a, float) and isinstance(b, float):
                if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
                    if repr(a) != repr(b):
                        return False
                elif abs(a - b) > ABSOLUTE_TOLERANCE + RELATIVE_TOLERANCE * max(abs(a), abs(b)):
                    return False
            elif a != b:
                return False
    return True


def state_rows(plan: ViewPlan, columns: Sequence[str], rows: Sequence[Row]) -> list[Row]:
    """State rows in state_table_columns order, a sum's NULL read as 0.

    An ADD_NULLABLE column holds NULL where no non-NULL value was added yet:
    the build's SUM over only NULLs is NULL, a MERGE's is 0 (it adds
    coalesced values). Both mean the same sum; the view reads neither, as
    its non-NULL count is 0.
    """
    nullable = {
        c.name
        for c in plan.state_columns
        if c.rule in (MergeRule.ADD_NULLABLE, MergeRule.COMPENSATED_SUM)
    }
    wanted = [n for n in state_queries.state_table_columns(plan) if n not in history_columns(plan)]
    position = {name: i for i, name in enumerate(columns)}
    return [
        tuple(
            (0 if row[position[name]] is None else row[position[name]])
            if name in nullable
            else row[position[name]]
            for name in wanted
        )
        for row in rows
    ]


def history_columns(plan: ViewPlan) -> list[str]:
    """The state columns that tell the rows' history, not the rows (MergeRule.MASS), and a
    bounded MIN/MAX's kept values (the build keeps `kept`, a refresh 1 to 2 * `kept`).

    A rebuild's differ from a refreshed state's: state_rows leaves them out,
    and _check_state compares the MERGE's with the Python rule's instead.
    """
    kept = [p.values_column for p in plan.preaggregations if p.kept is not None]
    return [c.name for c in plan.state_columns if c.rule is MergeRule.MASS] + kept


# -- (+) in Python ----------------------------------------------------------------------


def apply_changes(plan: ViewPlan, state: list[dict], delta: list[dict]) -> list[dict]:
    """state (+) delta, as emit.merge_changes's MERGE does it, over rows as dicts.

    A delta row matches the state row with the same merge keys (NULL equals
    NULL). Matched: KEY columns stay; ADD columns add (SQL's NULL + x is
    NULL); ADD_NULLABLE columns add with NULL as 0; a RECOMPUTED column
    takes the delta's value when its pre-aggregation's touched flag is TRUE;
    COMPENSATED_SUM/SUM_ERROR and MOMENT columns combine the stored row with
    the delta (`_compensated`, `_moments`). A row whose count reaches 0 is
    deleted, except a global aggregate's group row (slot 0). Unmatched:
    inserted with the delta's state columns, the combined ones merged into
    an empty row.
    """
    keys = plan.merge_keys
    columns = state_queries.state_table_columns(plan)
    flags = {p.slot: p.touched_flag for p in plan.preaggregations}
    result = {tuple(row[k] for k in keys): dict(row) for row in state}
    if len(result) != len(state):
        raise Mismatch(f"two state rows share their merge keys {keys}")
    for change in delta:
        key = tuple(change[k] for k in keys)
        stored = result.get(key)
        if stored is None:
            if change[names.COUNT] == 0:
                continue  # nothing to hold: a moments' change whose parts cancel
            result[key] = {name: change[name] for name in columns}
            result[key].update(_combined(plan, {}, change))
            continue
        count = stored[names.COUNT] + change[names.COUNT]
        keeps_group = plan.view_class is ViewClass.GLOBAL_AGGREGATE and (
            not plan.row_preaggregations or change[names.SLOT] == 0
        )
        if count == 0 and not keeps_group:
            del result[key]
            continue
        updated = dict(stored)
        for column in plan.value_columns:
            old, new = stored[column.name], change[column.name]
            if column.rule is MergeRule.RECOMPUTED:
                assert column.preaggregation is not None
                if change[flags[column.preaggregation]] is True:
                    updated[column.name] = new
            elif column.rule in COMBINED:
                continue
            elif column.rule is MergeRule.ADD_NULLABLE:
                updated[column.name] = (old or 0) + (new or 0)
            else:
                updated[column.name] = None if old is None or new is None else old + new
        updated.update(_combined(plan, stored, change))
        result[key] = updated
    return list(result.values())


COMBINED = (MergeRule.COMPENSATED_SUM, MergeRule.SUM_ERROR, MergeRule.MOMENT, MergeRule.CO_MOMENT)


def _combined(plan: ViewPlan, stored: dict, change: dict) -> dict[str, object]:
    """The new values of the columns combined from several stored and changed ones.

    A pre-aggregation's row (slot > 0) has none: the MERGE's expressions over its
    NULL counts are NULL, as the build leaves them.
    """
    values: dict[str, object] = {}
    if plan.row_preaggregations and change[names.SLOT] != 0:
        return {c.name: None for c in plan.value_columns if c.rule in COMBINED}
    for column in plan.value_columns:
        index = column.argument
        if column.rule is MergeRule.CO_MOMENT:
            assert index is not None and column.partner is not None
            values[column.name] = _co_moment(stored, change, index, column.partner)
        if column.rule is MergeRule.COMPENSATED_SUM:
            values.update(
                zip(
                    (names.sum_of(index), names.sum_error_of(index)),
                    _compensated(stored, change, index),
                )
            )
        elif column.rule is MergeRule.MOMENT:
            values.update(
                zip(
                    (names.mean_of(index), names.squared_deviations_of(index)),
                    _moments(stored, change, index),
                )
            )
    return values


def _compensated(stored: dict, change: dict, index: int) -> tuple[float, float]:
    """(sum, error) + the change's sum, with the addition's exact rounding error (TwoSum)."""
    a = stored.get(names.sum_of(index)) or 0.0
    b = change[names.sum_of(index)] or 0.0
    total = a + b
    added = total - a
    error = (a - (total - added)) + (b - added)
    return total, (stored.get(names.sum_error_of(index)) or 0.0) + error


def _moments(stored: dict, change: dict, index: int) -> tuple[float | None, float]:
    """(mean, M2) of the stored values with the inserted ones added, then the removed ones out."""
    n = float(stored.get(names.moment_count_of(index)) or 0)
    mean = stored.get(names.mean_of(index))
    m2 = stored.get(names.squared_deviations_of(index)) or 0.0
    n_in = float(change[names.added_count_of(index)])
    if n_in:
        mean_in = change[names.mean_of(index)]
        m2_in = change[names.squared_deviations_of(index)] or 0.0
        if n:
            step = mean_in - mean
            mean, m2 = (
                mean + step * n_in / (n + n_in),
                m2 + m2_in + step * step * n * n_in / (n + n_in),
            )
        else:
            mean, m2 = mean_in, m2_in
        n += n_in
    n_out = float(change[names.removed_count_of(index)])
    if n_out:
        rest = n - n_out
        if not rest:
            return None, 0.0
        mean_out = change[names.removed_mean_of(index)]
        m2_out = change[names.removed_squared_deviations_of(index)] or 0.0
        new_mean = mean + (mean - mean_out) * n_out / rest
        apart = mean_out - new_mean
        m2 = max(m2 - m2_out - apart * apart * rest * n_out / n, 0.0) if rest > 1 else 0.0
        mean = new_mean
    return mean, m2


def _co_moment(stored: dict, change: dict, x: int, y: int) -> float:
    """The co-moment of arguments x and y with the inserted pairs added, then the removed ones out.

    Their counts are x's (both are NULL outside the same pairs); each step
    reads both arguments' means before and after it, as `_moments` updates them.
    """
    name, removed = names.co_moment_of(x, y), names.removed_co_moment_of(x, y)
    n = float(stored.get(names.moment_count_of(x)) or 0)
    means = {i: stored.get(names.mean_of(i)) for i in (x, y)}
    c = stored.get(name) or 0.0
    n_in = float(change[names.added_count_of(x)])
    if n_in:
        means_in = {i: change[names.mean_of(i)] for i in (x, y)}
        c_in = change[name] or 0.0
        if n:
            dx, dy = (means_in[i] - means[i] for i in (x, y))
            c = c + c_in + dx * dy * n * n_in / (n + n_in)
            means = {i: means[i] + (means_in[i] - means[i]) * n_in / (n + n_in) for i in (x, y)}
        else:
            c, means = c_in, means_in
        n += n_in
    n_out = float(change[names.removed_count_of(x)])
    if n_out:
        rest = n - n_out
        if rest <= 1:
            return 0.0
        means_out = {i: change[names.removed_mean_of(i)] for i in (x, y)}
        new = {i: means[i] + (means[i] - means_out[i]) * n_out / rest for i in (x, y)}
        dx, dy = (means_out[i] - new[i] for i in (x, y))
        c = c - (change[removed] or 0.0) - dx * dy * rest * n_out / n
    return c


def replace_partitions(
    plan: ViewPlan,
    state: list[dict],
    touched: Sequence[window_rules.PartitionKey],
    rows: list[dict],
) -> list[dict]:
    """A WINDOW state with the touched partitions' rows replaced by their recomputation."""
    columns = [p.state_column for p in plan.window_partition]

    def partition(row: dict) -> tuple[str | None, ...]:
        return tuple(None if row[c] is None else str(row[c]) for c in columns)

    keys = set(touched)
    kept = [row for row in state if partition(row) not in keys]
    return kept + [
        {name: row[name] for name in state_queries.state_table_columns(plan)} for row in rows
    ]


# -- the cycle ------------------------------------------------------------------------------


class Refreshes:
    """A model's state in DuckDB, built once and refreshed through the compiler's statements.

    A model with plan nodes (chain_of) refreshes each node first, as
    refresh.py does, each a Refreshes of its own whose state the model reads
    as an upstream ivm model: after every write to a node's state, its rows
    are committed to a DeltaTable under the state's name (commit_rows), so
    the model reads the node's state at a version and its change feed as it
    reads a source's.
    """

    def __init__(
        self,
        model: Model,
        hook: ChangeFeedHook | None = None,
        log: bool = False,
        chain: Chain | None = None,
        tables: dict[TableName, DeltaTable] | None = None,
        history: list[str] | None = None,
    ) -> None:
        self.model = model
        self.chain = chain_of(model) if chain is None else chain
        self.state = self.chain.state
        plan = self.chain.plan
        self.plan = log_state.with_log(plan) if log else plan
        # The log's refreshes so far: every second one rewrites it (log_state.compact).
        self.appends = 0
        self.compacted = False
        # Change feeds staged before a refresh's statements (writes.StateWrites.staged_feeds).
        self.staged_feeds = 0
        # Source snapshots staged likewise (writes.StateWrites.staged_snapshots).
        self.staged_snapshots = 0
        self.sources = {s.name: s for s in model.sources}
        if tables is None:
            # The sources, and a table per plan node's state, every chain's alike.
            tables = {s.name: DeltaTable(s.name, s.schema) for s in model.sources}
            tables |= {n.state: DeltaTable(n.state, ()) for n in self.chain.all_nodes()}
        self.tables = tables
        # The commits so far, shared with the nodes (for their messages).
        self.history: list[str] = [] if history is None else history
        # The model's own nodes, each refreshed before it.
        self.nodes = [
            Refreshes(model, hook, chain=node, tables=tables, history=self.history)
            for node in self.chain.nodes
        ]
        # Every table but its own state, which its statements write as a table.
        read = [table for name, table in self.tables.items() if name != self.state]
        self.engine = Engine(read, hook, memo_of(model))
        self.engine.ensure_schema(self.state)
        self.ids = itertools.count(1)
        # Join-key probes so far (_join_key_bounds).
        self.probes = 0
        # Key relations each refresh found the change left as they were
        # (writes.StateWrites.unchanged_key_relations), in refresh order.
        self.unchanged_relations: list[str] = []
        self.refresh_ids = (f"r{i}" for i in itertools.count())
        self.guard = ""
        self.versions: dict[TableName, int] = {}
        self.view = emit.view_query(self.plan, self.state).sql(dialect=SPARK)
        # The refreshes whose MERGE refused a cancelling removal (emit.CANCELLED)
        # and were recomputed instead, as refresh/recipe.py does: their commit lists.
        self.recomputed: list[str] = []
        # The groups those refreshes recomputed, by merge keys (none: the model was).
        self.replaced_groups: list[tuple] = []
        # The refreshes whose MERGE found a group's bounded MIN/MAX values run
        # out (emit.EXHAUSTED) and ran again refilling them, as refresh/writes.py does.
        self.refilled: list[str] = []
        # The refreshes whose change may have left a top-k state kept to its
        # best rows fewer than k (top_k_buffer.SHORT), recomputed as recipe.py does.
        self.refilled_top_k: list[str] = []
        # The rows whose worst is the edge a top-k state kept to its best rows
        # must hold every row up to (None: it holds every row), for _check_state.
        self.top_k_edge: list[dict] | None = None
        # After each refresh: per bounded pre-aggregation slot, its most values in one group.
        self.most_kept: list[dict[int, int]] = []

    def close(self) -> None:
        """Drop the engines of the model and its nodes."""
        for node in self.nodes:
            node.close()
        self.engine.close()

    # -- sources --------------------------------------------------------------------

    def commit(self, table: TableName, change: Change) -> None:
        if isinstance(change, Insert):
            change = Insert(tuple(self._with_ids(self.sources[table], row) for row in change.rows))
        version = self.tables[table].commit(change)
        self.history.append(f"{table}@{version}: {change}")

    def _with_ids(self, source: Source, row: Row) -> Row:
        return tuple(next(self.ids) if c.serial else v for c, v in zip(source.columns, row))

    def _newest(self) -> dict[TableName, int]:
        """The newest version of every table the plan reads: a node's is its state's."""
        found = {}
        for table in self.plan.tables:
            upstream = self.plan.upstreams.get(table)
            found[table] = self.tables[upstream.state if upstream else table].version
        return found

    def _published(self) -> None:
        """A node's state written: its rows committed as the next version of its DeltaTable."""
        node = self.tables.get(self.state)
        if node is None:
            return  # the model itself: nothing reads its state here
        columns, rows = self.engine.query(f"SELECT * FROM {self.state.sql()}")
        if not node.columns:
            node.columns = tuple(self.engine.describe(f"SELECT * FROM {self.state.sql()}"))
        assert [c.lower() for c in columns] == [c.lower() for c, _ in node.columns]
        node.commit_rows(rows)

    def _query(self) -> str:
        """The model's query as written, every relation at its pinned version (a node's through its state).

        A source only the model's nodes read was pinned by them, at its
        newest version (nothing commits during a refresh), which the state
        records too (pins.Pins.recorded).
        """
        if not self.plan.upstreams:
            return self.chain.sql
        newest = {name: table.version for name, table in self.tables.items()}
        return model_query(self.plan, {**newest, **self.versions})

    # -- statements ---------------------------------------------------------------------

    def build(self) -> None:
        for node in self.nodes:
            node.build()
        self._build()

    def _build(self) -> None:
        self.versions = self._newest()
        self.guard = next(self.refresh_ids)
        self.engine.execute(emit.create_state(self.plan, self.state, self.versions, self.guard))
        self._published()
        view = self.engine.describe(self.view)
        query = self.engine.describe(self._query())
        if view != query:
            # Rows are compared by value (2 == Decimal("2.00")): the types are compared here.
            raise Mismatch(
                f"{self.model.name}: the view's columns {view} are not the query's {query}"
            )
        if top_k_buffer.keeps_best_rows(self.plan):
            self._check_best_rows()
        self.check_view()

    def refresh(self) -> None:
        for node in self.nodes:
            node.refresh()
        pinned = self._newest()
        windows = {t: VersionRange(recorded=self.versions[t], pinned=pinned[t]) for t in pinned}
        if not any(w.changed for w in windows.values()):
            return
        self._refresh(pinned, windows)
        self._published()

    def _refresh(
        self, pinned: dict[TableName, int], windows: dict[TableName, VersionRange]
    ) -> None:
        plan = self.plan
        try:
            self._refresh_with(pinned, windows)
        finally:
            # Marked for one refresh (_join_key_bounds): the model's plan again.
            self.plan = plan

    def _refresh_with(
        self, pinned: dict[TableName, int], windows: dict[TableName, VersionRange]
    ) -> None:
        guard = emit.Guard(read=self.guard, write=next(self.refresh_ids))
        if self.plan.log_state:
            with self._staged_feeds(windows, guard) as staged:
                self._append(staged, guard)
            self.versions = pinned
            self._check_log()
            self.check_view()
            return
        before = self._state()
        # A top-k state showing k rows or more keeps the change up to its edge.
        self.top_k_edge = before if self._shows_k(before) else None
        if self.plan.view_class is ViewClass.WINDOW:
            applied = self._refresh_partitions(windows, pinned, guard, before)
        else:
            try:
                with self._staged_feeds(windows, guard) as staged:
                    try:
                        applied = self._merge_changes(staged, guard, before)
                    except duckdb.Error as error:
                        if emit.EXHAUSTED not in str(error):
                            raise
                        # As writes.StateWrites._merge_or_recompute: the MERGE
                        # wrote nothing; again, refilling at the pinned versions.
                        self.refilled.append(self.history[-1])
                        applied = self._merge_changes(staged, guard, before, refill=pinned)
            except duckdb.Error as error:
                if top_k_buffer.SHORT in str(error):
                    # As recipe.Refresh._apply: the MERGE wrote nothing; the
                    # state's best rows recomputed (at the newest versions: the pinned ones).
                    self.refilled_top_k.append(self.history[-1])
                    self._build()
                    return
                if emit.CANCELLED not in str(error):
                    raise
                # As writes.StateWrites.apply_change: the cancelled groups
                # recomputed where the plan allows it, else the whole model.
                self.recomputed.append(self.history[-1])
                if not merge_source.recomputes_groups(self.plan):
                    self._build()  # at the newest versions: the pinned ones
                    return
                applied = self._merge_recomputing(windows, pinned, guard, before)
        self.versions = pinned
        self._check_state(applied)
        if self.top_k_edge is not None and not self._shows_k(self._state()):
            raise Mismatch(self._where("the MERGE left a top-k state fewer than k rows"))
        self.check_view()

    def _shows_k(self, rows: list[dict]) -> bool:
        """Whether a top-k state kept to its best rows shows k rows or more (False: not one)."""
        if not top_k_buffer.keeps_best_rows(self.plan):
            return False
        assert self.plan.top_k is not None
        shown = (
            sum(row[names.COUNT] for row in rows)
            if self.plan.view_class is ViewClass.PROJECTION
            else len(rows)
        )
        return shown >= self.plan.top_k.limit

    def _check_best_rows(self) -> None:
        """A built or recomputed top-k state holds the query's rows up to its rows_kept-th
        best: row (a projection's copies counted), or distinct ordering (a DISTINCT's)."""
        assert self.plan.top_k is not None
        columns, rebuilt = self._rebuilt()
        ranked = sorted(
            (dict(zip(columns, row)) for row in rebuilt),
            key=functools.cmp_to_key(self._in_top_k_order),
        )
        best: list[dict] = []
        for row in ranked:
            if self.plan.view_class is ViewClass.PROJECTION:
                best += [row] * row[names.COUNT]
            elif not best or self._in_top_k_order(best[-1], row) != 0:
                best.append(row)
        self.top_k_edge = best[: top_k_buffer.rows_kept(self.plan.top_k)]
        self._check_state(self._state())

    def recompute(self) -> None:
        """As writes.StateWrites.recompute for a state ivm models read: the state's
        rows recomputed at the newest versions, merged by key (emit.merge_recomputed).

        The MERGE must leave exactly the build, guard row moved, and the next
        refresh's MERGE must apply its change over it. The model's plan nodes
        are refreshed first, as they are before a recompute.
        """
        for node in self.nodes:
            node.refresh()
        pinned = self._newest()
        guard = emit.Guard(read=self.guard, write=next(self.refresh_ids))
        self._apply(
            emit.merge_recomputed(self.plan, self.state, pinned, guard), guard, self.plan.merge_keys
        )
        self.versions = pinned
        self._published()
        if top_k_buffer.keeps_best_rows(self.plan):
            # Its best rows, as a build keeps them.
            self._check_best_rows()
        else:
            columns, rows = self.engine.query(
                view_class_rule(self.plan.view_class).build_query(self.plan, pinned)
            )
            self._check_state([dict(zip(columns, row)) for row in rows])
        self.check_view()

    @contextlib.contextmanager
    def _staged_feeds(
        self, windows: Mapping[TableName, VersionRange], guard: emit.Guard
    ) -> Iterator[dict[TableName, VersionRange]]:
        """As writes.StateWrites.staged_feeds: each feed read more than once staged first."""
        stages, staged = emit.stage_feeds(self.plan, windows, f"{names.STAGED_PREFIX}{guard.write}")
        with self._staged(stages):
            self.staged_feeds += len(stages)
            yield staged

    @contextlib.contextmanager
    def _staged_snapshots(
        self, windows: Mapping[TableName, VersionRange], guard: emit.Guard, bounds: dict
    ) -> Iterator[dict[TableName, VersionRange]]:
        """As writes.StateWrites.staged_snapshots, every source taken as small."""
        stages, staged = emit.stage_snapshots(
            self.plan,
            windows,
            f"{names.STAGED_PREFIX}{guard.write}_snapshot",
            small=self.plan.tables,
            bounds=bounds,
        )
        with self._staged(stages):
            self.staged_snapshots += len(stages)
            yield staged

    @contextlib.contextmanager
    def _staged(self, stages: list[emit.Stage]) -> Iterator[None]:
        staged = []
        try:
            for stage in stages:
                self.engine.execute(stage.statement)
                staged.append(stage.name)
            yield
        finally:
            for name in staged:
                for statement in emit.drop_staged(name):
                    self.engine.execute(statement)

    def _merge_changes(
        self,
        windows: Mapping[TableName, VersionRange],
        guard: emit.Guard,
        before: list[dict],
        refill: Mapping[TableName, int] | None = None,
    ) -> list[dict]:
        bounds = self._join_key_bounds(windows)
        with self._staged_snapshots(windows, guard, bounds) as reading:
            # As writes.StateWrites.apply_change runs it: the signed rows staged
            # first where the change query reads them more than once.
            staged = (
                f"{names.STAGED_PREFIX}{guard.write}" if emit.stages_changes(self.plan) else None
            )
            # and the change query's rows then too (emit.stage_change_rows);
            # a refill reads the sources, so its rows are not staged.
            rows = f"{staged}_rows" if staged is not None and refill is None else None
            if staged is not None:
                self.engine.execute(emit.stage_changes(self.plan, reading, staged, bounds))
            if rows is not None:
                self.engine.execute(
                    emit.stage_change_rows(
                        self.plan, self.state, reading, rows, bounds, staged=staged
                    )
                )
            merge = emit.merge_changes(
                self.plan,
                self.state,
                reading,
                guard,
                bounds,
                staged=staged,
                refill=refill,
                staged_rows=rows,
            )
            try:
                delta = self._apply(merge, guard, self.plan.merge_keys)
            finally:
                for name in (rows, staged):
                    for statement in emit.drop_staged(name) if name is not None else ():
                        self.engine.execute(statement)
        return apply_changes(self.plan, before, delta)

    def _append(self, windows: Mapping[TableName, VersionRange], guard: emit.Guard) -> None:
        """As writes.StateWrites.append_change: the change appended, or the log rewritten."""
        bounds = self._join_key_bounds(windows)
        self.appends += 1
        self.compacted = self.appends % 2 == 0
        with self._staged_snapshots(windows, guard, bounds) as reading:
            if self.compacted:
                statement = log_state.compact(self.plan, self.state, reading, self.guard, bounds)
            else:
                statement = log_state.append_changes(
                    self.plan, self.state, reading, guard.write, bounds
                )
            self.engine.execute(statement)

    def _join_key_bounds(self, windows: Mapping[TableName, VersionRange]) -> dict:
        """The probe's key bounds, as writes.StateWrites.join_key_bounds reads them.

        Two probes in three list the change's keys too, as one over a large
        source does; the third of them with no room in the list, so every
        key with a value is read from the change past it. The plan is then
        marked for this refresh as unchanged_key_relations marks it, over
        large sources.
        """
        self._mark_unchanged_relations(windows)
        self.probes += 1
        listing = self.probes % 3
        probe = emit.probe_join_keys(self.plan, windows, list_keys=listing > 0)
        if probe is None:
            return {}
        sql, keys = probe
        if listing == 2:
            # The list's limit is read as the probe is built: rebuilt with none.
            with unittest.mock.patch.object(key_bounds, "MAX_LISTED_KEYS", 0):
                sql, keys = emit.probe_join_keys(self.plan, windows, list_keys=True)
        _, rows = self.engine.query(sql)
        bounds = parse_probe(keys, rows)
        if listing == 0:
            return bounds
        return emit.keys_past_list(self.plan, windows, bounds)

    def _mark_unchanged_relations(self, windows: Mapping[TableName, VersionRange]) -> None:
        """As writes.StateWrites.unchanged_key_relations: the relations the change left marked."""
        unchanged = emit.unchanged_relations(
            self.plan, windows, lambda sql: self.engine.query(sql)[1]
        )
        self.unchanged_relations += sorted(unchanged)
        self.plan = changes.with_unchanged_relations(self.plan, unchanged)

    def _merge_recomputing(
        self,
        windows: Mapping[TableName, VersionRange],
        pinned: Mapping[TableName, int],
        guard: emit.Guard,
        before: list[dict],
    ) -> list[dict]:
        """The change merged into all groups but the cancelled ones, which are recomputed."""
        bounds = self._join_key_bounds(windows)
        merge = emit.merge_changes_recomputing_cancelled(
            self.plan, self.state, windows, pinned, guard, bounds
        )
        rows = self._apply(merge, guard, self.plan.merge_keys)
        replacing = [row for row in rows if row[names.REPLACING]]
        self.replaced_groups += [tuple(row[k] for k in self.plan.merge_keys) for row in replacing]
        applied = apply_changes(self.plan, before, [r for r in rows if not r[names.REPLACING]])
        keys = {tuple(row[k] for k in self.plan.merge_keys) for row in replacing}
        columns = state_queries.state_table_columns(self.plan)
        return [
            row for row in applied if tuple(row[k] for k in self.plan.merge_keys) not in keys
        ] + [{c: row[c] for c in columns} for row in replacing]

    def _refresh_partitions(
        self,
        windows: Mapping[TableName, VersionRange],
        pinned: Mapping[TableName, int],
        guard: emit.Guard,
        before: list[dict],
    ) -> list[dict]:
        """A WINDOW model's refresh: probe the touched partitions, recompute them with one MERGE."""
        if not self.plan.window_partition:
            raise NotImplementedError("a WINDOW model without a common PARTITION BY is recomputed")
        _, probed = self.engine.query(emit.probe_partitions(self.plan, windows))
        touched = window_rules.parse_probe(probed)
        assert len(touched) <= window_rules.MAX_TOUCHED_PARTITIONS
        if not touched:
            return before  # refresh/recipe.py commits no data then, and keeps the guard
        merge = emit.merge_partitions(self.plan, self.state, pinned, touched, guard)
        rows = self._apply(merge, guard, self.plan.keys)
        recomputed = [r for r in rows if not r[names.GONE]]
        # The source names the state rows it deletes (emit._with_gone_rows):
        # those of the touched partitions that the recomputation does not hold.
        untouched = replace_partitions(self.plan, before, touched, [])

        def key(row: dict) -> tuple:
            return tuple(row[k] for k in self.plan.merge_keys)

        held = {key(r) for r in recomputed}
        expected = [key(r) for r in before if r not in untouched and key(r) not in held]
        diff = _difference(expected, [key(r) for r in rows if r[names.GONE]])
        if diff:
            raise Mismatch(
                self._where(f"the MERGE's gone rows differ from the Python rule: {diff}")
            )
        return replace_partitions(self.plan, before, touched, recomputed)

    def _apply(self, merge: str, guard: emit.Guard, keys: Sequence[str]) -> list[dict]:
        """Run the MERGE; return its source rows but the guard source row.

        That row must carry guard.read. Delta fails a MERGE in which two source
        rows match one target row, so the keys the MERGE matches on must be
        unique among the others.
        """
        columns, rows = self.engine.merge(merge)
        found = [dict(zip(columns, row)) for row in rows]
        checks = [row for row in found if row[names.GUARD] is not None]
        if [row[names.GUARD] for row in checks] != [guard.read]:
            raise Mismatch(f"the guard source rows are {checks}, expected one holding {guard.read}")
        changes = [row for row in found if row[names.GUARD] is None]
        repeated = [
            k for k, n in Counter(tuple(r[k] for k in keys) for r in changes).items() if n > 1
        ]
        if repeated:
            raise Mismatch(self._where(f"the MERGE source repeats the merge keys {repeated}"))
        self.guard = guard.write
        return changes

    # -- reading and checking ---------------------------------------------------------------

    def _state(self) -> list[dict]:
        columns, rows = self.engine.query(
            f"SELECT * FROM {self.state.sql()} WHERE `{names.GUARD}` IS NULL"
        )
        return [dict(zip(columns, row)) for row in rows]

    def _check_state(self, applied: list[dict]) -> None:
        """The state equals the build, its bounded MIN/MAX values each group's best ones.

        A bounded pre-aggregation's kept values are not the build's (that
        keeps exactly `kept` values, a refresh between 1 and 2 * `kept`):
        they are checked against the group's values by _check_kept, and the
        MERGE's against the Python rule's (history_columns).
        """
        columns = state_queries.state_table_columns(self.plan)
        merged = self._state()
        bounded = {p.slot: p for p in self.plan.preaggregations if p.kept is not None}

        def as_rows(rows: list[dict]) -> list[Row]:
            return state_rows(self.plan, columns, [[r[c] for c in columns] for r in rows])

        expected_columns, rebuilt = self._rebuilt()
        expected = [dict(zip(expected_columns, row)) for row in rebuilt]
        if self.top_k_edge is not None:
            expected = self._up_to_edge(expected, self.top_k_edge)
        rebuilt_rows = as_rows(expected)
        if bounded:
            self._check_kept(merged, bounded)
            self.most_kept.append(
                {
                    slot: max((len(r[pre.values_column] or ()) for r in merged), default=0)
                    for slot, pre in bounded.items()
                }
            )
            whole = [*self.plan.merge_keys, names.COUNT]
            diff = _difference(
                [tuple(r[c] for c in whole) for r in applied],
                [tuple(r[c] for c in whole) for r in merged],
            )
            if diff:
                raise Mismatch(
                    self._where(f"the compiler's MERGE differs from the Python rule: {diff}")
                )
        for what, rows in (
            ("state (+) change (in Python)", as_rows(applied)),
            ("the compiler's MERGE", as_rows(merged)),
        ):
            diff = _difference(rebuilt_rows, rows)
            if diff:
                raise Mismatch(
                    self._where(
                        f"{what} differs from the build at {self._shown()}: {diff}\n"
                        f"columns: {', '.join(columns)}"
                    )
                )
        history = [*self.plan.merge_keys, *history_columns(self.plan)]
        if len(history) > len(self.plan.merge_keys):
            diff = _difference(
                [tuple(r[c] for c in history) for r in applied],
                [tuple(r[c] for c in history) for r in merged],
            )
            if diff:
                raise Mismatch(
                    self._where(
                        f"the compiler's MERGE differs from the Python rule at {self._shown()} "
                        f"in {', '.join(history)}: {diff}"
                    )
                )

    def _up_to_edge(self, rebuilt: list[dict], edge_rows: list[dict]) -> list[dict]:
        """The rebuilt rows at or before the worst of `edge_rows` in the model's order.

        What a top-k state kept to its best rows must hold (rules/top_k_buffer.py):
        after a refresh that kept the change rows up to the state's edge, the
        model's rows up to that edge; after a build or refill, up to its
        rows_kept-th best.
        """
        if not edge_rows:
            return []
        edge = max(edge_rows, key=functools.cmp_to_key(self._in_top_k_order))
        return [row for row in rebuilt if self._in_top_k_order(row, edge) <= 0]

    def _in_top_k_order(self, a: dict, b: dict) -> int:
        """-1, 0 or 1 as state row `a` comes before, with or after `b` in the model's ORDER BY."""
        top = self.plan.top_k
        assert top is not None
        columns = {o.name: o.expression.name for o in self.plan.outputs}
        for o in top.order:
            x, y = a[columns[o.output]], b[columns[o.output]]
            if (x is None and y is None) or x == y:
                continue
            if x is None or y is None:
                return (-1 if x is None else 1) * (1 if o.nulls_first else -1)
            return (-1 if x < y else 1) * (-1 if o.descending else 1)
        return 0

    def _check_kept(self, merged: list[dict], bounded: Mapping[int, PreAggregation]) -> None:
        """Each bounded pre-aggregation keeps, per group, a prefix of its best values.

        Best first (smallest for MIN, largest for MAX), with their exact
        counts, at least one while the group has values and at most 2 * kept.
        """
        columns, rows = self.engine.query(
            state_queries.rows_to_build(self.plan, self.versions, None)
        )
        flat = [dict(zip(columns, row)) for row in rows]
        for slot, pre in bounded.items():
            values: dict[tuple, Counter] = collections.defaultdict(Counter)
            for row in flat:
                if row[pre.argument] is not None:
                    values[tuple(row[k] for k in self.plan.keys)][row[pre.argument]] += 1
            kept: dict[tuple, dict] = collections.defaultdict(dict)
            for row in merged:
                if row.get(names.SLOT, 0) == 0:
                    group = tuple(row[k] for k in self.plan.keys)
                    kept[group].update(row[pre.values_column] or ())
            descending = pre.bounded_kind == "MAX"
            for group in values.keys() | kept.keys():
                best = sorted(values[group].items(), reverse=descending)
                stored = sorted(kept[group].items(), reverse=descending)
                assert pre.kept is not None
                if (
                    stored != best[: len(stored)]
                    or (best and not stored)
                    or len(stored) > 2 * pre.kept
                ):
                    raise Mismatch(
                        self._where(
                            f"slot {slot} ({pre.bounded_kind}) of group {group} keeps {stored}, "
                            f"not the best of its values at {self._shown()}: {best}"
                        )
                    )

    def _rebuilt(self) -> tuple[list[str], list[tuple]]:
        """The state rebuilt at the current versions, one row per key.

        Built as the merged state: a log's own build need not group equal rows
        (state_rows.ungrouped_build_query), its readers sum them.
        """
        merged = dataclasses.replace(self.plan, log_state=False)
        return self.engine.query(
            view_class_rule(self.plan.view_class).build_query(merged, self.versions)
        )

    def _check_log(self) -> None:
        """The log's consolidated rows equal the build; a rewritten log has one row per key."""
        columns, rows = self.engine.query(log_state.consolidated(self.plan, self.state.to_table()))
        expected_columns, rebuilt = self._rebuilt()
        diff = _difference(
            state_rows(self.plan, expected_columns, rebuilt),
            state_rows(self.plan, columns, rows),
        )
        if diff:
            raise Mismatch(
                self._where(
                    f"the consolidated log differs from the build at {self._shown()}: {diff}"
                )
            )
        if self.compacted:
            keys = [c.name for c in self.plan.state_columns if c.rule is MergeRule.KEY]
            logged = [tuple(row[k] for k in keys) for row in self._state()]
            repeated = [key for key, n in Counter(logged).items() if n > 1]
            if repeated:
                raise Mismatch(self._where(f"the rewritten log repeats the keys {repeated}"))

    def check_view(self) -> None:
        view_columns, view = self.engine.query(self.view)
        query_columns, query = self.engine.query(self._query(), pinned=self.versions)
        if [c.lower() for c in view_columns] != [c.lower() for c in query_columns]:
            raise Mismatch(f"the view's columns {view_columns} are not the query's {query_columns}")
        diff = _difference(query, view)
        if diff:
            raise Mismatch(
                self._where(
                    f"the view differs from the query at {self._shown()}: {diff}\n"
                    f"columns: {', '.join(query_columns)}"
                )
            )

    def _shown(self) -> str:
        return ", ".join(f"{t}@{v}" for t, v in self.versions.items())

    def _where(self, message: str) -> str:
        return f"{self.model.name}: {message}\ncommits:\n  " + "\n  ".join(self.history)


def run(
    model: Model,
    scenario: Scenario,
    hook: ChangeFeedHook | None = None,
    log: bool = False,
    recompute_at: Collection[int] = (),
) -> Refreshes:
    """Build the model after the seed commits, then refresh and check after every step.

    `log`: its state kept as a log (the model must be one log_state.refusal allows).
    `recompute_at`: the steps (from 0) after which the state is recomputed and
    merged by key instead (Refreshes.recompute).
    """
    refreshes = Refreshes(model, hook, log)
    with contextlib.closing(refreshes):
        for table, change in scenario.seed:
            refreshes.commit(table, change)
        refreshes.build()
        for index, step in enumerate(scenario.steps):
            for table, change in step:
                refreshes.commit(table, change)
            if index in recompute_at:
                refreshes.recompute()
            else:
                refreshes.refresh()
    return refreshes
