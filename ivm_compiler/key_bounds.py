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

A term's partner filters (plan.PartnerFilter, a semi or anti join on a whole
condition) are bounded by the equalities among their condition's top-level
conjuncts, and only those, both ways:

- a changed input's term reads a filter's input within the range of its
  change keys: every row of the term carries a change key, and a partner
  of that row equals it, so the partners outside the range decide nothing
  (the bound goes into the semi or anti join's ON);
- a filter's own change keeps only the rows that a change row of its input
  partners, so the term's other inputs equal to that input's columns are
  read within the range of those change keys, and so is the input itself
  at both versions (a partner of a kept row equals the row, which equals a
  change row).

A comparison (`ts BETWEEN valid_from AND valid_to`) bounds nothing: the
probe would have to know the other side's values.

A semi, anti or outer join's key relation (plan.KeyRelation: the distinct
keys of its input that have a partner) is joined to its term by equalities
like any input, so it is bounded the same way, both ways, but only where
the probe listed the change's keys:

- a changed input's term reads the key relation within the range of its
  change keys: a key relation is its input grouped by the key, and Spark
  pushes a bound on a grouped column through the grouping into the read;
- the key relation's own change (reads.key_changes: the keys that gained
  their first partner or lost their last) holds only keys of its input's
  change rows, so the term's inputs equal to a key column are read within
  the range of those change keys, and so is the key relation's input at
  its pinned version, where it counts the touched keys' rows. Without it
  that count consolidates the whole input (a day's batch at scale 6000:
  every payment, to find the few whose orders changed).

Ranges alone do not pay there: a day's payments and orders touch keys of
every age, so 16 ranges skip no file of a key relation's input, every row
pays the predicate, and the terms' reads of one key relation, bounded
differently, no longer share one grouping (`1f4a971`..`39b281a`, measured
on the warehouse and reverted). A list keeps the rows of the unlisted keys
out of the grouping. Over small sources the list costs more than the
grouping it spares: the worked example's `customers_to_chase` (22.7 MB of
sources, 4,943 customer keys listed into each term) refreshed in 12.0 s
where 7.0 s, while the warehouse's `slv_payments` (288 MB at scale 6000)
took 4.5 executor CPU s where 33.4. The refresh reads key relations within
a list only over sources past delta.confs.KEY_RELATION_LIST_BYTES
(ChangeKeys.key_relations).

Ranges skip files; they filter few rows when a change's keys are spread
over the whole key space (a day's status updates touch orders of every
month: 16 ranges then cover every order). Where a source is large the
probe also lists the change's distinct keys, up to MAX_LISTED_KEYS, and
the partner is read `IN` that list as well. Delta skips no more files for
a list than for its lowest and highest value (its data skipping turns an
IN list into that one range), so the list is for the rows: Spark pushes
it through a log state's consolidation (a GROUP BY on the key) down to
the scan, which then hands on only the listed keys' rows, where the
ranges alone hand on the whole state to be summed and joined.

Past MAX_LISTED_KEYS the partner is read `IN` a query of the change's
keys instead (ChangeKeys.read, `with_change_reads`): the same rows kept,
without a statement holding each key. Spark plans the IN as a semi join
with the change (a feed read more than once is staged, so a cached
relation of known size, which it broadcasts) and pushes it through the
consolidation to the scan as it pushes the list. A day's batch at scale
6000 changes 22,505 `fct_orders` rows: past the list, so the key
relation of `mart_unpaid_orders`' `NOT IN` summed all 5.5 M payments to
join them with the day's orders. Not in a partner filter's ON, where
Spark takes no subquery.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import KeyRelation, PartnerFilter, SourceRef
from ivm_compiler.sql import TableName, conjuncts, joined_literals, parsed_type

# Types whose MIN/MAX cast to text and back is the same value, compared as
# `=` compares them. (Floating point has NaN and -0.0; timestamps' text
# depends on the session time zone.)
BOUNDED_TYPES = ("tinyint", "smallint", "int", "integer", "bigint", "string", "date")
INTEGER_TYPES = ("tinyint", "smallint", "int", "integer", "bigint")


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
    # Applied only where the probe listed the change's keys: a bound between
    # a key relation and its term (module docstring), which pays by the rows
    # it keeps out of a grouping, not by the files its ranges skip.
    listed_only: bool = False


# A changed key column's values as sorted, disjoint (lowest, highest) ranges
# of text; () when every change row's key is NULL.
KeyRanges = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ChangeKeys:
    """A changed key column's values, as the probe found them."""

    ranges: KeyRanges
    # Every distinct non-NULL value, as text, where the probe listed them
    # (a large source, at most MAX_LISTED_KEYS of them); None otherwise.
    listed: tuple[str, ...] | None = None
    # Whether key relations are read within the list too (PartnerBound.listed_only):
    # only where the sources are large enough to pay for it (the refresh decides).
    key_relations: bool = True
    # Where the probe found more keys than it lists: a query of them, read
    # by the change's rows (with_change_reads), which stands for the list.
    read: exp.Query | None = field(default=None, compare=False, repr=False)


# (table, lower-cased column) -> the change's keys.
Bounds = Mapping[tuple[TableName, str], ChangeKeys]

# The probe splits a key's [lowest, highest] at its widest gaps into at most
# this many ranges. One range skips nothing when a change's keys lie at both
# ends of a source (new rows at the top, deletions at the bottom: the TPC-H
# RF batches read every lineitem file through one range); a few dozen
# BETWEENs cost Delta's file skipping nothing noticeable.
MAX_RANGES = 16
# The most distinct change keys the probe lists (a day's batch of the
# warehouse at scale 6000 changes 8,399 orders). Each costs its text in the
# statement (about 10 bytes for an id) and a lookup in Spark's hash set.
MAX_LISTED_KEYS = 10_000


def _gap(data_type: str, low: exp.Expr, high: exp.Expr) -> exp.Expr | None:
    """How far apart two keys of a type are, for splitting ranges at gaps; None: not measured."""
    text = data_type.lower()
    if text == "date":
        return exp.DateDiff(this=high, expression=low)
    if text in ("tinyint", "smallint", "int", "integer", "bigint") or text.startswith("decimal"):
        return exp.Sub(this=high, expression=low)
    return None


def bounded_type(data_type: str) -> bool:
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


def join_conditions(select: exp.Select) -> list[exp.Expr]:
    """The conjuncts of a SELECT's WHERE and of its JOINs' ON conditions, nested ANDs split."""
    where = select.args.get("where")
    conditions = conjuncts(where.this if where else None, nested=True)
    for join in select.args.get("joins") or []:
        conditions += conjuncts(join.args.get("on"), nested=True)
    return conditions


def column_equalities(conditions: Sequence[exp.Expr]) -> list[tuple[exp.Column, exp.Column]]:
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

    `inputs` are the term's FROM relations in order, then its partner
    filters; plain sources (SourceRef), key relations and filters' inputs
    are bounded. A bound's partner alias is a FROM relation's (for the
    term's WHERE), a filter's input's (for that filter's ON), for a
    filter's own change its input's at either version
    (names.partner_alias), and for a key relation's own change its input's
    (`split_own_input`).
    """
    changed = inputs[position]
    if isinstance(changed, PartnerFilter):
        return _filter_change_bounds(select, inputs, position, source_columns)
    if not isinstance(changed, SourceRef | KeyRelation):
        return []
    found = []
    if inner_joins_only(select):
        partners = {
            relation.alias: _key_columns(relation, source_columns)
            for index, relation in enumerate(inputs)
            if index != position and isinstance(relation, SourceRef | KeyRelation)
        }
        found += _bounds(
            changed.alias,
            _key_columns(changed, source_columns),
            partners,
            column_equalities(join_conditions(select)),
        )
    if isinstance(changed, KeyRelation):
        found += _own_input_bounds(changed, inputs, source_columns)
        return [replace(bound, listed_only=True) for bound in found]
    grouped = {r.alias for r in inputs if isinstance(r, KeyRelation)}
    found = [replace(b, listed_only=b.partner_alias in grouped) for b in found]
    for index, partner in enumerate(inputs):
        if isinstance(partner, PartnerFilter) and index != position:
            # The filter reads its input under its own alias (changes._filtered).
            found += _bounds(
                changed.alias,
                _key_columns(changed, source_columns),
                {partner.alias: _key_columns(partner.source, source_columns)},
                column_equalities(conjuncts(partner.condition, nested=True)),
            )
    return found


def split_own_input(
    bounds: Sequence[PartnerBound], changed: object
) -> tuple[list[PartnerBound], list[PartnerBound]]:
    """`bounds` split into those on a changed key relation's own input and the rest."""
    if not isinstance(changed, KeyRelation):
        return [], list(bounds)
    own = [b for b in bounds if b.partner_alias == changed.source.alias]
    return own, [b for b in bounds if b.partner_alias != changed.source.alias]


def _own_input_bounds(
    changed: KeyRelation,
    inputs: Sequence[object],
    source_columns: Mapping[TableName, Mapping[str, str]],
) -> list[PartnerBound]:
    """A key relation's change: its input at the pinned version, within its change keys.

    Left out where the input's alias names another relation of the term too
    (the bound would be ambiguous); semi joins rename theirs apart.
    """
    taken = {getattr(relation, "alias", None) for relation in inputs}
    if changed.source.alias in taken:
        return []
    return [
        PartnerBound(key, changed.source.alias, key.column)
        for key in _key_columns(changed, source_columns).values()
    ]


def _filter_change_bounds(
    select: exp.Select,
    inputs: Sequence[object],
    position: int,
    source_columns: Mapping[TableName, Mapping[str, str]],
) -> list[PartnerBound]:
    """A partner filter's change: the FROM relations and its input, within its change keys."""
    changed = inputs[position]
    assert isinstance(changed, PartnerFilter)
    source = changed.source
    partners = {
        relation.alias: _key_columns(relation, source_columns)
        for relation in inputs
        if isinstance(relation, SourceRef) and relation.alias != source.alias
    }
    equalities = column_equalities(conjuncts(changed.condition, nested=True))
    found = _bounds(source.alias, _key_columns(source, source_columns), partners, equalities)
    # The input itself, at the versions its change's two terms read it at,
    # on the columns that bounded a relation.
    for bound in list(found):
        for role in ("now", "then"):
            alias = names.partner_alias(position, role)
            found.append(PartnerBound(bound.key, alias, bound.key.column))
    return found


def _key_columns(
    relation: SourceRef | KeyRelation, source_columns: Mapping[TableName, Mapping[str, str]]
) -> dict[str, KeyColumn]:
    """The columns a relation's reads expose that a bound can use, by lower-cased name.

    Each as the key column of the source whose change keys bound it: a
    source's own columns; a key relation's key columns (names.join_key)
    that are a plain column of its input, as that column.
    """
    if isinstance(relation, SourceRef):
        return {
            name.lower(): KeyColumn(relation.table, name, data_type)
            for name, data_type in source_columns.get(relation.table, {}).items()
            if bounded_type(data_type)
        }
    source = relation.source
    types = {name.lower(): t for name, t in source_columns.get(source.table, {}).items()}
    found = {}
    for index, key in enumerate(relation.keys):
        if not isinstance(key, exp.Column) or key.table != source.alias:
            continue
        data_type = types.get(key.name.lower())
        if data_type is not None and bounded_type(data_type):
            found[names.join_key(index).lower()] = KeyColumn(source.table, key.name, data_type)
    return found


def _bounds(
    changed_alias: str,
    changed_columns: Mapping[str, KeyColumn],
    partners: Mapping[str, Mapping[str, KeyColumn]],
    equalities: list[tuple[exp.Column, exp.Column]],
) -> list[PartnerBound]:
    """Each (changed column, partner column) equality of one orderable type, as a bound."""
    found = []
    for mine, theirs in equalities:
        if mine.table != changed_alias or theirs.table not in partners:
            continue
        key = changed_columns.get(mine.name.lower())
        partner = partners[theirs.table].get(theirs.name.lower())
        if key is None or partner is None or key.data_type != partner.data_type:
            continue
        if key.column.lower() == mine.name.lower():
            # As the term writes it, so the probe's SQL keeps the query's spelling.
            key = KeyColumn(key.table, mine.name, key.data_type)
        bound = PartnerBound(key, theirs.table, theirs.name)
        if bound not in found:
            found.append(bound)
    return found


def cast_literal(text: str, data_type: str) -> exp.Expr:
    """A probed key (as text) cast back to its column's type.

    >>> cast_literal("2024-01-02", "date").sql(dialect="spark")
    "CAST('2024-01-02' AS DATE)"
    """
    return exp.cast(exp.Literal.string(text), parsed_type(data_type), copy=False)


def ranges_predicate(column: exp.Expr, ranges: KeyRanges, data_type: str) -> exp.Expr:
    """`column` within one of `ranges`: BETWEENs joined by OR; FALSE for no range.

    >>> print(ranges_predicate(exp.column("k"), (("1", "4"), ("9", "9")), "int").sql("spark"))
    (k BETWEEN CAST('1' AS INT) AND CAST('4' AS INT) OR k BETWEEN CAST('9' AS INT) AND CAST('9' AS INT))
    """
    if not ranges:
        return exp.false()
    within = [
        exp.Between(
            this=column.copy(),
            low=cast_literal(low, data_type),
            high=cast_literal(high, data_type),
        )
        for low, high in ranges
    ]
    return within[0] if len(within) == 1 else exp.paren(exp.or_(*within))


def bound_predicate(
    bound: PartnerBound, bounds: Bounds, subqueries: bool = True
) -> exp.Expr | None:
    """The partner column within the change's key ranges (FALSE for NULL keys only), and its keys.

    The keys: IN their list, or, past it, IN their query (ChangeKeys.read)
    where `subqueries`. None where the key was not probed, or its keys
    are neither for a `listed_only` bound.
    """
    found = bounds.get((bound.key.table, bound.key.column.lower()))
    if found is None:
        return None
    column = exp.column(
        bound.partner_column, table=exp.to_identifier(bound.partner_alias, True), quoted=True
    )
    keys: exp.Expr | None = None
    if found.listed is not None:
        keys = listed_predicate(column, found.listed, bound.key.data_type)
    elif found.read is not None and subqueries:
        keys = exp.In(this=column.copy(), query=exp.Subquery(this=found.read.copy()))
    if bound.listed_only and (keys is None or not found.key_relations):
        return None
    within = ranges_predicate(column, found.ranges, bound.key.data_type)
    if not found.ranges or keys is None:
        return within
    return exp.and_(within, keys)


def with_change_reads(
    bounds: Bounds, changes: Mapping[TableName, tuple[exp.Subquery, Sequence[KeyColumn]]]
) -> Bounds:
    """`bounds`, each key with non-NULL values the probe did not list read from its change rows.

    `changes`: the probe's (probe_query). Only for a probe that lists keys,
    where a missing list means more than MAX_LISTED_KEYS.

    >>> key = KeyColumn(TableName("raw", "t"), "k", "int")
    >>> rows = exp.select("k").from_("raw.t").subquery("c")
    >>> found = with_change_reads({(key.table, "k"): ChangeKeys((("1", "9"),))}, {key.table: (rows, [key])})
    >>> print(found[key.table, "k"].read.sql("spark"))
    SELECT `__ivm_change_keys`.`k` FROM (SELECT k FROM raw.t) AS `__ivm_change_keys`
    """
    found = dict(bounds)
    for table, (rows, keys) in changes.items():
        for key in keys:
            place = (table, key.column.lower())
            probed = found.get(place)
            if probed is None or probed.listed is not None or not probed.ranges:
                continue
            alias = exp.to_identifier(names.CHANGE_KEYS_ALIAS, quoted=True)
            values = rows.copy()
            values.set("alias", exp.TableAlias(this=alias))
            read = exp.select(exp.column(key.column, table=alias.copy(), quoted=True)).from_(values)
            found[place] = replace(probed, read=read)
    return found


def listed_predicate(column: exp.Expr, listed: Sequence[str], data_type: str) -> exp.Expr:
    """`column IN (...)` the listed keys; integers as number literals, to keep a long list short.

    >>> print(listed_predicate(exp.column("k"), ["-1", "20"], "bigint").sql("spark"))
    k IN (-1, 20)
    >>> print(listed_predicate(exp.column("d"), ["2026-12-04"], "date").sql("spark"))
    d IN (CAST('2026-12-04' AS DATE))
    """
    values: list[exp.Expr]
    if data_type.lower() in INTEGER_TYPES:
        values = [exp.Literal.number(int(text)) for text in listed]
    else:
        values = [cast_literal(text, data_type) for text in listed]
    return exp.In(this=column.copy(), expressions=joined_literals(values))


def probe_query(
    changes: Mapping[TableName, tuple[exp.Subquery, Sequence[KeyColumn]]],
    list_keys: bool = False,
    most_listed: int | None = None,
) -> exp.Query:
    """Rows (key index, part, low, high) from which parse_probe makes each key's ranges.

    `changes` maps each changed table to its signed change rows (aliased
    subquery) and the key columns to bound, indexed in `probe_columns` order.
    Per key: one 'all' row with its lowest and highest change key, and for
    a type whose keys have a distance, up to MAX_RANGES - 1 'gap' rows: the
    widest gaps between consecutive distinct keys (the keys either side).
    With `list_keys`, a 'list' row too, whose low is the distinct keys as a
    JSON array of text, where there are at most `most_listed` of them
    (MAX_LISTED_KEYS unless given; it reads the change again, unless Spark
    reuses the distinct keys' shuffle).
    Each key reads the change rows once: Spark inlines a subquery into each
    of its references, and a change feed read costs a few Spark jobs (Q3's
    probe, reading orders' feed four times and lineitem's twice, took
    3.1-3.6 s of a 17.5 s refresh at SF 1).
    """
    parts: list[exp.Select] = []
    most = MAX_LISTED_KEYS if most_listed is None else most_listed
    for index, (rows, key) in enumerate(
        (rows, key) for rows, keys in changes.values() for key in keys
    ):
        value = exp.column(key.column, table=exp.to_identifier(rows.alias, True), quoted=True)
        if list_keys:
            parts.append(_listed_keys(index, rows, value, most))
        bounded = _bounds_and_gaps(index, rows, value, key.data_type)
        if bounded is not None:
            parts.append(bounded)
            continue
        parts.append(
            _probe_row(
                index, exp.Literal.string("all"), exp.Min(this=value.copy()), exp.Max(this=value)
            ).from_(rows.copy())
        )
    query: exp.Query = parts[0]
    for part in parts[1:]:
        query = exp.union(query, part, distinct=False)
    return query


def _probe_row(index: int, part: exp.Expr, low: exp.Expr, high: exp.Expr) -> exp.Select:
    text = exp.DataType.build("string")
    return exp.select(
        exp.alias_(exp.Literal.number(index), f"{names.RESERVED_PREFIX}key", quoted=True),
        exp.alias_(part, f"{names.RESERVED_PREFIX}part", quoted=True),
        exp.alias_(exp.cast(low, text), f"{names.RESERVED_PREFIX}lo", quoted=True),
        exp.alias_(exp.cast(high, text), f"{names.RESERVED_PREFIX}hi", quoted=True),
    )


def _distinct_keys(rows: exp.Subquery, value: exp.Column) -> exp.Select:
    """The change's distinct non-NULL keys, as column `k`."""
    return (
        exp.select(exp.alias_(value.copy(), "k"))
        .distinct()
        .from_(rows.copy())
        .where(exp.Not(this=exp.Is(this=value.copy(), expression=exp.null())))
    )


def _listed_keys(index: int, rows: exp.Subquery, value: exp.Column, most: int) -> exp.Select:
    """A key's 'list' row: its distinct keys as a JSON array of text; no row past `most`.

    One past the limit is read, never more, so a change of millions of keys
    costs no array of them.
    """
    text = exp.DataType.build("string")
    first = _distinct_keys(rows, value).limit(most + 1)
    listed = exp.Anonymous(
        this="TO_JSON",
        expressions=[
            exp.Anonymous(this="COLLECT_LIST", expressions=[exp.cast(exp.column("k"), text)])
        ],
    )
    return (
        _probe_row(index, exp.Literal.string("list"), listed, exp.null())
        .from_(first.subquery(exp.to_identifier(f"l{index}", True)))
        .having(exp.LTE(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(most)))
    )


def _bounds_and_gaps(
    index: int, rows: exp.Subquery, value: exp.Column, data_type: str
) -> exp.Select | None:
    """A key's 'all' row and its MAX_RANGES - 1 widest gaps, from one read; None: no distance.

    Over the distinct keys in order, each key with the next one (`nxt`) and
    the lowest (`lo`): the highest key, the one without a next, gives the
    'all' row (lo, itself); every other key a gap (itself, nxt), of which
    the widest are kept. No non-NULL key: no row, which parse_probe reads as
    an 'all' of NULLs.
    """
    gap = _gap(data_type, exp.column("k"), exp.column("nxt"))
    if gap is None:
        return None
    distinct = _distinct_keys(rows, value)
    following = exp.Window(
        this=exp.Anonymous(this="LEAD", expressions=[exp.column("k")]),
        order=exp.Order(expressions=[exp.Ordered(this=exp.column("k"))]),
    )
    lowest = exp.Window(this=exp.Min(this=exp.column("k")))
    paired = exp.select(
        exp.column("k"), exp.alias_(following, "nxt"), exp.alias_(lowest, "lo")
    ).from_(distinct.subquery("d"))
    last = exp.Is(this=exp.column("nxt"), expression=exp.null())
    kept = (
        exp.select(exp.column("k"), exp.column("nxt"), exp.column("lo"))
        .from_(paired.subquery("p"))
        .order_by(exp.Ordered(this=last.copy(), desc=True), exp.Ordered(this=gap, desc=True))
        .limit(MAX_RANGES)
    )
    return _probe_row(
        index,
        exp.If(this=last.copy(), true=exp.Literal.string("all"), false=exp.Literal.string("gap")),
        exp.If(this=last.copy(), true=exp.column("lo"), false=exp.column("k")),
        exp.If(this=last, true=exp.column("k"), false=exp.column("nxt")),
    ).from_(kept.subquery(exp.to_identifier(f"g{index}", True)))


def probe_columns(
    changes: Mapping[TableName, tuple[exp.Subquery, Sequence[KeyColumn]]],
) -> list[KeyColumn]:
    return [key for _, keys in changes.values() for key in keys]


def parse_probe(keys: Sequence[KeyColumn], rows: Sequence[Sequence[object]]) -> Bounds:
    """The probe's rows as Bounds: each key's [lowest, highest] split at its widest gaps.

    >>> key = KeyColumn(TableName("raw", "t"), "k", "int")
    >>> parse_probe([key], [(0, "all", "1", "99"), (0, "gap", "4", "90")])[key.table, "k"].ranges
    (('1', '4'), ('90', '99'))
    >>> parse_probe([key], [(0, "all", None, None)])[key.table, "k"]
    ChangeKeys(ranges=(), listed=None, key_relations=True)
    >>> parse_probe([key], [(0, "all", None, None), (0, "list", None, None)])[key.table, "k"]
    ChangeKeys(ranges=(), listed=(), key_relations=True)
    >>> parse_probe([key], [(0, "all", "1", "99"), (0, "list", '["99","1","9"]', None)])[key.table, "k"].listed
    ('1', '9', '99')
    """
    ends: dict[int, tuple[str, str] | None] = {}
    gaps: dict[int, list[tuple[str, str]]] = {}
    listed: dict[int, tuple[str, ...]] = {}
    for index, part, low, high in rows:
        position = int(str(index))
        if part == "all":
            ends[position] = None if low is None or high is None else (str(low), str(high))
        elif part == "list":
            # No key but NULLs: some engines give a NULL array, not an empty one.
            listed[position] = tuple(str(k) for k in json.loads(str(low))) if low else ()
        else:
            gaps.setdefault(position, []).append((str(low), str(high)))
    bounds: dict[tuple[TableName, str], ChangeKeys] = {}
    for position, key in enumerate(keys):
        found = ends.get(position)
        if found is None:
            bounds[(key.table, key.column.lower())] = ChangeKeys((), listed.get(position))
            continue
        start, end = found
        ranges = []
        order = _sort_value(key.data_type)
        for before, after in sorted(gaps.get(position, []), key=lambda g: order(g[0])):
            ranges.append((start, before))
            start = after
        ranges.append((start, end))
        found_listed = listed.get(position)
        if found_listed is not None:
            # In key order, so a refresh's statements read the same for the same change.
            found_listed = tuple(sorted(found_listed, key=order))
        bounds[(key.table, key.column.lower())] = ChangeKeys(tuple(ranges), found_listed)
    return bounds


def _sort_value(data_type: str) -> Callable[[str], str | Decimal]:
    """How a probed key of a type sorts: numbers as numbers, dates (and the rest) as text.

    Chosen once per key column: a probe lists up to tens of thousands of
    keys, and deciding per key took 98 py-spy samples at 20 Hz (about 5 s)
    of a day's batch at warehouse scale 1500 (2026-12-08).

    >>> sorted(["10", "9"], key=_sort_value("int")), sorted(["10", "9"], key=_sort_value("string"))
    (['9', '10'], ['10', '9'])
    """
    if _gap(data_type, exp.column("a"), exp.column("b")) is None or data_type == "date":
        return str
    return Decimal
