"""Reverse-join tables (the KV-store paper's join state): a join input kept by its join key.

The change of an inner join reads every partner input at a pinned version
(changes.signed_rows). A join state for input X is a Delta table of X's
rows projected to the columns the model reads of X, filtered by the model's
conditions on X alone, grouped with a count (`__ivm_count`), and written in
join-key order so a partner read with the change's key bounds skips files.
It is narrower than X, often far smaller (Q3's customer: one market segment
of five), and it is what the change of the other inputs needs of X.

A join state is versioned by its source: each of its commits records, in its
commit metadata, the source version whose rows it holds. A refresh first
brings it from the recorded source version to the pinned one (one MERGE of
X's change rows, `upkeep`), then reads it by Delta time travel at the commit
of either version, as the telescoping sum asks. A refresh that fails after
the upkeep leaves the join state ahead of the model; the next refresh finds
the commit of the model's recorded version in the join state's history.

Which inputs keep one is the refresh's decision (`ivm_join_state`); this
module says which inputs can (`candidates`) and emits their SQL. An input
can when the model is one SELECT of inner joins (no outer, semi or anti
join, no set operation, no window), the input is a plain source (not an
upstream ivm model) and every column the model reads of it can be grouped
and compared exactly (no floating point: -0.0 and 0.0 group together; no
maps, arrays or structs).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import key_bounds, names
from ivm_compiler.plan import SourceRef, ViewClass, ViewPlan
from ivm_compiler.rules import counting
from ivm_compiler.sql import (
    DIALECT,
    TableName,
    aliased,
    create_delta_table,
    from_tables,
    ident,
    version_as_of,
)

# Column types a join state does not keep (see the module docstring).
UNSUPPORTED_TYPE_PREFIXES = ("float", "double", "real", "map", "array", "struct", "variant")

# `<model>__ivm_join_<alias>`
JOIN_STATE_INFIX = f"{names.RESERVED_PREFIX}join_"

TABLE_PROPERTIES = {
    # Nothing reads a join state's changes; its commits only need their metadata.
    "delta.enableChangeDataFeed": "false",
}


@dataclass(frozen=True)
class JoinInput:
    """A join input that can keep a join state, and what that state holds."""

    alias: str  # as the model's query names the input (lower-case)
    table: TableName
    # The columns the model reads of the source (name -> type), in the source's spelling.
    columns: tuple[tuple[str, str], ...]
    # The model's conditions on this input alone, and its join keys being non-NULL
    # (columns qualified by `alias`), or None.
    condition: exp.Expr | None
    # The input's columns equi-joined to another input: the state's sort order.
    join_keys: tuple[str, ...]
    # Whether the model has a condition of its own on this input (beyond non-NULL keys).
    filtered: bool = False

    def relation(self, model: TableName) -> TableName:
        """The join state's table, next to the model's view."""
        return TableName(db=model.db, name=f"{model.name}{JOIN_STATE_INFIX}{self.alias}")

    @property
    def fingerprint(self) -> str:
        """Changes whenever the join state would hold other rows or columns."""
        text = "|".join(
            [
                str(self.table),
                ",".join(f"{n}:{t}" for n, t in self.columns),
                self.condition.sql(dialect=DIALECT) if self.condition is not None else "",
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _supported(data_type: str) -> bool:
    return not data_type.lower().startswith(UNSUPPORTED_TYPE_PREFIXES)


def _only_on(condition: exp.Expr, alias: str) -> bool:
    """A condition that reads columns of `alias` only, and nothing that is not a plain value."""
    columns = list(condition.find_all(exp.Column))
    if not columns or any(c.table != alias for c in columns):
        return False
    return not any(
        condition.find(kind) for kind in (exp.Subquery, exp.AggFunc, exp.Window, exp.Select)
    )


def candidates(plan: ViewPlan) -> list[JoinInput]:
    """The inputs of the model's join that can keep a join state, in query order."""
    rows = plan.rows
    if (
        not isinstance(rows, exp.Select)
        or plan.join_terms
        or plan.view_class is ViewClass.WINDOW
        or not key_bounds.inner_joins_only(rows)
    ):
        return []
    tables = from_tables(rows)
    if len(tables) < 2 or not all(isinstance(t, exp.Table) for t in tables):
        return []
    conditions = key_bounds.join_conditions(rows)
    equalities = key_bounds.column_equalities(conditions)
    found = []
    for node in tables:
        ref = SourceRef(alias=node.alias_or_name, table=TableName.of(node))
        if ref.table in plan.upstreams or not re.fullmatch(r"\w+", ref.alias):
            continue
        columns = tuple(plan.source_columns.get(ref.table, {}).items())
        if not columns or not all(_supported(t) for _, t in columns):
            continue
        own = [c.copy() for c in conditions if _only_on(c, ref.alias)]
        own_filter = list(own)
        keys: list[str] = []
        for mine, theirs in equalities:
            if mine.table == ref.alias and theirs.table != ref.alias and mine.name not in keys:
                keys.append(mine.name)
        # A row with a NULL join key meets no partner (NULL never equals), so
        # the join state leaves it out, and its changes too.
        own += [
            exp.Not(
                this=exp.Is(
                    this=exp.column(k, table=ident(ref.alias), quoted=True), expression=exp.null()
                )
            )
            for k in keys
        ]
        found.append(
            JoinInput(
                alias=ref.alias.lower(),
                table=ref.table,
                columns=columns,
                condition=exp.and_(*own) if own else None,
                join_keys=tuple(keys),
                filtered=bool(own_filter),
            )
        )
    return found


def _column(join_input: JoinInput, name: str) -> exp.Column:
    return exp.column(name, table=ident(join_input.alias), quoted=True)


def _grouped(join_input: JoinInput, rows: exp.Expr, count: exp.Expr) -> exp.Select:
    """SELECT <columns>, <count> AS __ivm_count FROM rows WHERE <condition> GROUP BY <columns>."""
    columns = [_column(join_input, name) for name, _ in join_input.columns]
    select = (
        exp.select(
            *[exp.alias_(c, c.name, quoted=True) for c in columns],
            exp.alias_(count, names.COUNT, quoted=True),
        )
        .from_(rows)
        .group_by(*[c.copy() for c in columns])
    )
    if join_input.condition is not None:
        select = select.where(join_input.condition.copy())
    return select


def build_query(join_input: JoinInput, version: int, guard: str) -> exp.Query:
    """The join state's rows at a source version, in join-key order, plus its guard row."""
    source = aliased(version_as_of(join_input.table, version), join_input.alias)
    rows = _grouped(join_input, source, exp.Count(this=exp.Star(), big_int=True)).select(
        exp.alias_(exp.cast(exp.null(), exp.DataType.build("STRING")), names.GUARD, quoted=True)
    )
    guard_row = exp.select(
        *[exp.alias_(exp.null(), name, quoted=True) for name, _ in join_input.columns],
        exp.alias_(exp.null(), names.COUNT, quoted=True),
        exp.alias_(exp.Literal.string(guard), names.GUARD, quoted=True),
    )
    union = exp.union(rows, guard_row, distinct=False)
    ordered = exp.select(exp.Star()).from_(union.subquery(ident(names.BUILT_ALIAS)))
    keys = join_input.join_keys or tuple(name for name, _ in join_input.columns[:1])
    return ordered.order_by(*[exp.column(k, quoted=True) for k in keys])


def create(join_input: JoinInput, relation: TableName, version: int, guard: str) -> str:
    """CREATE OR REPLACE the join state at a source version."""
    query = build_query(join_input, version, guard)
    return create_delta_table(relation, TABLE_PROPERTIES, query).sql(dialect=DIALECT)


def target_bound(
    join_input: JoinInput, bounds: key_bounds.Bounds, target_alias: str
) -> exp.Expr | None:
    """For the upkeep MERGE's ON: the target's rows within the change's join-key range.

    The join state is written in order of its first join key, and the probe
    (key_bounds.py) knows the ranges of the source's change keys, so Delta
    skips the join state's files outside them. The guard row
    (NULL key) must still match. None when the key was not probed.
    """
    if not join_input.join_keys:
        return None
    key = join_input.join_keys[0]
    found = bounds.get((join_input.table, key.lower()))
    if found is None:
        return None
    guard_row = exp.not_(
        exp.Is(
            this=exp.column(names.GUARD, table=ident(target_alias), quoted=True),
            expression=exp.null(),
        )
    )
    if not found.ranges:
        return guard_row  # every change row has a NULL key: the state keeps none of them
    within = key_bounds.ranges_predicate(
        exp.column(key, table=ident(target_alias), quoted=True),
        found.ranges,
        dict(join_input.columns)[key],
    )
    return exp.Paren(this=exp.or_(within, guard_row))


def changes(join_input: JoinInput, signed: exp.Subquery) -> exp.Select:
    """The net count change per projected row of the source's change rows `signed`."""
    net = exp.Sum(this=exp.column(names.SIGN, table=ident(join_input.alias), quoted=True))
    return _grouped(join_input, signed, net).having(
        exp.NEQ(this=net.copy(), expression=exp.Literal.number(0))
    )


def read(join_input: JoinInput, relation: TableName, version: int) -> exp.Subquery:
    """The join state at its own Delta `version`, each row repeated by its count, as the input's alias.

    It stands in for `source VERSION AS OF v AS alias` in a join term: same
    alias, the columns the model reads, the rows that pass the model's
    conditions on the input (the term applies them again, to the same effect).
    """
    select = (
        exp.select(*[exp.column(name, quoted=True) for name, _ in join_input.columns])
        .from_(version_as_of(relation, version))
        .where(exp.Is(this=exp.column(names.GUARD, quoted=True), expression=exp.null()))
    )
    return counting.repeated(select, counting.count()).subquery(ident(join_input.alias))
