"""Join-key bounds: narrow a join's partner reads to the key range of the change.

The change of an inner join reads every partner input at a pinned version
(changes.signed_rows), though only partner rows whose join key equals the
key of a change row can contribute to it. Delta skips a file by its min/max
statistics only for a predicate whose values are known when the query is
planned, so a refresh first asks the change feed for the smallest and the
largest key of each changed input's join columns (one probe statement for
all of them), and its MERGE then reads each partner of a changed input with
`partner.key BETWEEN lo AND hi` added to that term.

Exact: in an inner join every partner row that meets a change row equals
its key, which lies in [lo, hi]; a change with no non-NULL key meets no
partner (NULL never equals), and its terms read nothing. Files are skipped
only where a partner's files are organised by the key (written in key order,
clustered or Z-ordered); elsewhere the predicate costs nothing but the probe.

Only equalities between two plain columns of the same orderable type whose
text form casts back to the same value (integers, decimals, strings, dates)
are used, and only in terms whose joins are all inner: a bound on the padded
side of an outer join, or inside a semi join, would drop rows that matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import SourceRef
from ivm_compiler.sql import TableName, conjuncts

# Types whose MIN/MAX cast to text and back is the same value, compared as
# `=` compares them. (Floating point has NaN and -0.0; timestamps' text
# depends on the session time zone.)
BOUNDED_TYPES = ("tinyint", "smallint", "int", "integer", "bigint", "string", "date")


@dataclass(frozen=True)
class KeyColumn:
    """A join column of a changed input whose bounds the probe asks for."""

    table: TableName
    column: str  # as the source names it
    data_type: str


@dataclass(frozen=True)
class PartnerBound:
    """In one term: `partner_alias.partner_column` lies within the bounds of `key`."""

    key: KeyColumn
    partner_alias: str
    partner_column: str


# (table, lower-cased column) -> (lowest, highest) change key as text; (None,
# None) when every change row's key is NULL.
Bounds = Mapping[tuple[TableName, str], tuple[str | None, str | None]]


def _bounded_type(data_type: str) -> bool:
    text = data_type.lower()
    return text in BOUNDED_TYPES or text.startswith("decimal")


def inner_joins_only(select: exp.Select) -> bool:
    """Every JOIN of the SELECT is an inner or cross join with ON (no USING)."""
    for join in select.args.get("joins") or []:
        if join.side or (join.kind and join.kind.upper() not in ("INNER", "CROSS")):
            return False
        if join.args.get("using"):
            return False
    return True


def join_conditions(select: exp.Select) -> list[exp.Expression]:
    """The conjuncts of a SELECT's WHERE and of its JOINs' ON conditions, nested ANDs split."""
    where = select.args.get("where")
    conditions = conjuncts(where.this if where else None, nested=True)
    for join in select.args.get("joins") or []:
        conditions += conjuncts(join.args.get("on"), nested=True)
    return conditions


def column_equalities(conditions: Sequence[exp.Expression]) -> list[tuple[exp.Column, exp.Column]]:
    """Each `a.x = b.y` between two qualified columns, once from each side: (mine, theirs)."""
    found = []
    for condition in conditions:
        if not isinstance(condition, exp.EQ):
            continue
        sides = (condition.this, condition.expression)
        if all(isinstance(side, exp.Column) and side.table for side in sides):
            found += [(sides[0], sides[1]), (sides[1], sides[0])]
    return found


def partner_bounds(
    select: exp.Select,
    inputs: Sequence[object],
    position: int,
    source_columns: Mapping[TableName, Mapping[str, str]],
) -> list[PartnerBound]:
    """The partners of input `position` of an inner-join term that its change keys can narrow.

    `inputs` are the term's FROM relations in order; only plain sources
    (SourceRef) are bounded, on either side.
    """
    changed = inputs[position]
    if not isinstance(changed, SourceRef) or not inner_joins_only(select):
        return []
    partners = {
        relation.alias: relation
        for index, relation in enumerate(inputs)
        if index != position and isinstance(relation, SourceRef)
    }

    def typed(ref: SourceRef, column: exp.Column) -> str | None:
        columns = {name.lower(): t for name, t in source_columns.get(ref.table, {}).items()}
        return columns.get(column.name.lower())

    found = []
    for mine, theirs in column_equalities(join_conditions(select)):
        if mine.table != changed.alias or theirs.table not in partners:
            continue
        partner = partners[theirs.table]
        mine_type, theirs_type = typed(changed, mine), typed(partner, theirs)
        if mine_type is None or mine_type != theirs_type or not _bounded_type(mine_type):
            continue
        key = KeyColumn(table=changed.table, column=mine.name, data_type=mine_type)
        found.append(PartnerBound(key, partner.alias, theirs.name))
    return found


def cast_literal(text: str, data_type: str) -> exp.Expression:
    """A probed key (as text) cast back to its column's type.

    >>> cast_literal("2024-01-02", "date").sql(dialect="spark")
    "CAST('2024-01-02' AS DATE)"
    """
    return exp.cast(exp.Literal.string(text), exp.DataType.build(data_type, dialect="spark"))


def bound_predicate(bound: PartnerBound, bounds: Bounds) -> exp.Expression | None:
    """`partner.column BETWEEN lo AND hi`, FALSE for a change of NULL keys only, None if unprobed."""
    found = bounds.get((bound.key.table, bound.key.column.lower()))
    if found is None:
        return None
    low, high = found
    if low is None or high is None:
        return exp.false()
    column = exp.column(
        bound.partner_column, table=exp.to_identifier(bound.partner_alias, True), quoted=True
    )
    return exp.Between(
        this=column,
        low=cast_literal(low, bound.key.data_type),
        high=cast_literal(high, bound.key.data_type),
    )


def probe_query(
    changes: Mapping[TableName, tuple[exp.Subquery, Sequence[KeyColumn]]],
) -> exp.Select:
    """One row: per changed table and key column, its lowest and highest change key as text.

    `changes` maps each changed table to its signed change rows (aliased
    subquery) and the key columns to bound. Columns are named
    `__ivm_lo_<n>`/`__ivm_hi_<n>` in the order of `probe_columns`.
    """
    selects = []
    index = 0
    for rows, keys in changes.values():
        columns = []
        for key in keys:
            value = exp.column(key.column, table=exp.to_identifier(rows.alias, True), quoted=True)
            for end, bound in (("lo", exp.Min), ("hi", exp.Max)):
                columns.append(
                    exp.alias_(
                        exp.cast(bound(this=value.copy()), exp.DataType.build("string")),
                        f"{names.RESERVED_PREFIX}{end}_{index}",
                        quoted=True,
                    )
                )
            index += 1
        selects.append(
            exp.select(*columns)
            .from_(rows.copy())
            .subquery(exp.to_identifier(f"b{len(selects)}", True))
        )
    query = exp.select(exp.Star()).from_(selects[0])
    for extra in selects[1:]:
        query = query.join(extra, join_type="CROSS")
    return query


def probe_columns(
    changes: Mapping[TableName, tuple[exp.Subquery, Sequence[KeyColumn]]],
) -> list[KeyColumn]:
    return [key for _, keys in changes.values() for key in keys]


def parse_probe(
    keys: Sequence[KeyColumn], row: Sequence[object]
) -> dict[tuple[TableName, str], tuple[str | None, str | None]]:
    """The probe's one row as Bounds (its columns in `keys` order, lowest then highest)."""
    bounds: dict[tuple[TableName, str], tuple[str | None, str | None]] = {}
    for index, key in enumerate(keys):
        low, high = row[2 * index], row[2 * index + 1]
        bounds[(key.table, key.column.lower())] = (
            None if low is None else str(low),
            None if high is None else str(high),
        )
    return bounds
