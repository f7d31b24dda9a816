"""The model's flattened rows at pinned versions, and their signed change over version ranges.

Each relation is read by reads.py, at the version or over the version range
a term asks for.

The change of an inner join of n inputs over version ranges, where input i goes
from R_i (recorded version) to R_i' = R_i + dR_i (pinned version), is the
telescoping sum

    d(R_1 x ... x R_n) = sum over i of  R_1' x ... x R_(i-1)' x dR_i x R_(i+1) x ... x R_n

with signed rows (the sign of a term's row is the sign of its dR_i row).
Each term is exact on its own, so a change meeting a change (both sides of a
join changed in one refresh) is counted once: in the term of the later input,
against the earlier input's new version. Inputs that did not change have
dR_i = 0, and their terms are left out. A self-join is two inputs that happen
to read the same table, and the same sum holds.

An input after the changed one that changed too is read at its recorded
version as the signed bag R_j' - dR_j (reads.table_before), so no term reads
an old snapshot of a source: a joined row's sign is the product of the signs
of the rows it joins. Expanded, the sum is the form with new versions only,
dL x R' + L' x dR - dL x dR for two inputs (inclusion-exclusion over the
changed inputs), in n terms rather than 2^n - 1. An outer or semi join's key
relation read at its recorded version is likewise counted from its pinned
version and change (reads.keys_before), and so is a key relation's own
change (reads.key_changes). A key relation none of whose input's change
rows has a key (unchanged_relations_probe: the "has a NULL" of a NOT IN,
where no changed row is NULL), or a keyless one with more rows than the
change has (keyless_presence_probe: "has rows"), is the same at both
versions: it is read at the pinned one, and its own term, whose change is
empty, is left out (with_unchanged_relations).

Outer joins are not linear in their null-supplying input; the compiler
rewrites them as signed inner-join terms over inputs and key relations
(rules/outer_joins.py), and the same sum runs over each term's inputs.

A term's partner filters (plan.PartnerFilter: a semi or anti join of its rows
with an input R on a whole condition θ) are its last inputs. A filter keeps
or drops each row by itself, so a term is linear in its other inputs, which
change as above with every filter read at its recorded version (R_before,
the distinct rows of R counted from its pinned version and change,
reads.rows_before) or, for one R did not change, its pinned one. The filter's
own change, with every other input at its pinned version, is the rows whose
answer R's change turns: a row without a partner among R's change rows dR
has the same partners before and after, so only rows that dR partners can
turn, and for an anti join

    d(X ▷_θ R) =  X' ⋉_θ dR ▷_θ R' ⋉_θ R_before   (lost their last partner: +1)
                - X' ⋉_θ dR ⋉_θ R' ▷_θ R_before   (gained their first: -1)

(a semi join's signs are the other way round): two more terms, each
exact, and no row among them appears in both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping

from sqlglot import exp

from ivm_compiler import key_bounds, names, reads
from ivm_compiler.plan import KeyRelation, PartnerFilter, SourceRef, ViewPlan
from ivm_compiler.reads import (
    VersionRange,
    key_changes,
    keys_at_version,
    keys_before,
    rows_before,
    signed_changes,
    table_at_version,
    table_before,
)
from ivm_compiler.sql import TableName, from_tables, ident, set_operation_branches, union_all


def branches(plan: ViewPlan) -> list[exp.Select]:
    """The flattened rows' SELECTs: one, or one per operand of a set operation."""
    found = set_operation_branches(plan.rows)
    assert all(isinstance(b, exp.Select) for b in found)
    return found  # type: ignore[return-value]


def branch_sources(branch: exp.Select) -> list[SourceRef]:
    return [SourceRef(alias=t.alias_or_name, table=TableName.of(t)) for t in from_tables(branch)]


# Join states that stand in for partner reads (join_states.py): by the input's
# lower-case alias, the join state's read per source version it can serve.
JoinReads = Mapping[str, Mapping[int, exp.Expr]]


# What one input of a term stands for: a source or an outer join's key relation
# (the relations of its FROM clause, in order), or a partner filter (after them).
Input = SourceRef | KeyRelation | PartnerFilter


def _input_table(relation: Input) -> TableName:
    return relation.table if isinstance(relation, SourceRef) else relation.source.table


def _reading(
    select: exp.Select, inputs: list[Input], read: Callable[[int, Input], exp.Expr]
) -> exp.Select:
    """A SELECT with its index-th FROM relation replaced by read(index, inputs[index]).

    The partner filters, after the FROM relations in `inputs`, are left to _filtered.
    """
    rows = select.copy()
    for index, (node, relation) in enumerate(zip(from_tables(rows), inputs)):
        node.replace(read(index, relation))
    return rows


def linear_terms(plan: ViewPlan) -> list[tuple[int, exp.Select, list[Input]]]:
    """(sign, SELECT, its inputs) whose signed sum is the rows; each is an inner join.

    Without outer joins: each operand once, positively. With them: the
    plan's signed join terms (rules/outer_joins.py), a term's inputs being
    its FROM relations and then its partner filters, which keep or drop
    the SELECT's rows.
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
            terms.append((term.sign, term.rows, [*inputs, *term.filters]))
        return terms
    return [(1, branch, list(branch_sources(branch))) for branch in branches(plan)]


def rows_at(plan: ViewPlan, versions: Mapping[TableName, int]) -> exp.Query:
    """The model's flattened rows with every source at its pinned version."""
    return union_all(
        [
            _reading(
                branch,
                list(branch_sources(branch)),
                lambda _, ref: table_at_version(
                    _input_table(ref),
                    versions[_input_table(ref)],
                    ref.alias,
                    plan.upstreams.get(_input_table(ref)),
                ),
            )
            for branch in branches(plan)
        ]
    )


def signed_rows(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> exp.Query:
    """The signed change of the model's flattened rows over the version ranges (the sum above).

    For a set operation the change is the sum of its operands' changes, each
    operand's by the join rule over its own sources; with outer joins, the
    sum of the signed inner-join terms' changes (a negative term flips the
    sign of its change rows). With `bounds` (the probe of `bounded_keys`),
    each term reads the partners of its changed input within the change's
    key range (key_bounds.py). With `join_reads`, a partner that keeps a join
    state is read from it at the version the term asks for.
    """
    terms: list[exp.Select] = []
    # The term of a relation with no change (KeyRelation.unchanged), kept
    # with no rows in case it is the only one: the change is empty then.
    empty: list[exp.Select] = []
    for term_sign, select, inputs in linear_terms(plan):
        for position, changed in enumerate(inputs):
            if not ranges[_input_table(changed)].changed:
                continue
            unchanged = isinstance(changed, KeyRelation) and changed.unchanged
            if unchanged and empty:
                continue
            # The aliases whose rows carry a sign: the changed input, and the
            # later ones read as a signed bag at their recorded version. A
            # filter's change carries its sign in its two terms instead.
            signed = [] if isinstance(changed, PartnerFilter) else [changed.alias]
            found = key_bounds.partner_bounds(select, inputs, position, plan.source_columns)
            own, found = key_bounds.split_own_input(found, changed)
            # A changed key relation counts its touched keys' rows within its change keys.
            own_within = [
                predicate
                for bound in own
                if (predicate := key_bounds.bound_predicate(bound, bounds or {})) is not None
            ]

            def read(
                index: int,
                relation: Input,
                position: int = position,
                signed: list = signed,
                own_within: list = own_within,
            ) -> exp.Expr:
                table = _input_table(relation)
                versions = ranges[table]
                upstream = plan.upstreams.get(table)
                version = versions.pinned if index < position else versions.recorded
                if isinstance(relation, KeyRelation):
                    if index == position:
                        return key_changes(relation, versions, upstream, own_within)
                    if relation.unchanged:
                        return keys_at_version(relation, versions.pinned, upstream)
                    if version != versions.pinned:
                        return keys_before(relation, versions, upstream)
                    return keys_at_version(relation, version, upstream)
                if index == position:
                    return signed_changes(table, versions, relation.alias, upstream)
                kept = (join_reads or {}).get(relation.alias.lower(), {})
                if version in kept:
                    return kept[version].copy()
                if version != versions.pinned and table in plan.source_columns:
                    signed.append(relation.alias)
                    columns = list(plan.source_columns[table])
                    return table_before(table, versions, relation.alias, columns, upstream)
                return table_at_version(table, version, relation.alias, upstream)

            term = _reading(select, inputs, read)
            from_aliases = {node.alias_or_name for node in from_tables(select)}
            # A bound on a filter's input goes into the ON of its semi or anti join.
            within: dict[str, list[exp.Expr]] = {}
            for bound in found:
                # A filter's ON takes no subquery: its input is read within the list alone.
                where = bound.partner_alias in from_aliases
                predicate = key_bounds.bound_predicate(bound, bounds or {}, subqueries=where)
                if predicate is None:
                    continue
                if where:
                    term = term.where(predicate)
                else:
                    within.setdefault(bound.partner_alias, []).append(predicate)
            for filter_sign, filtered in _filtered(plan, term, inputs, position, ranges, within):
                sign = _term_sign(term_sign * filter_sign, signed)
                signed_term = filtered.select(exp.alias_(sign, names.SIGN, quoted=True))
                (empty if unchanged else terms).append(signed_term)
    if not terms and empty:
        terms = [empty[0].where(exp.false())]
    if not terms:
        raise ValueError("signed_rows needs at least one source with changes in its window")
    # Built reading sources by time travel; staged snapshots replace those reads.
    staged = reads.read_snapshots(union_all(terms), ranges)
    assert isinstance(staged, exp.Query)
    return staged


def _filtered(
    plan: ViewPlan,
    term: exp.Select,
    inputs: list[Input],
    position: int,
    ranges: Mapping[TableName, VersionRange],
    within: Mapping[str, list[exp.Expr]],
) -> list[tuple[int, exp.Select]]:
    """The term's rows through its partner filters, as (sign, SELECT): one, or two for a filter's change.

    Each filter before the changed input reads its input at the pinned
    version, each after it at the recorded one (the telescoping sum); the
    changed filter's two terms are in the module's docstring. `within`: by
    the alias a filter's input is read under, the key bounds of its reads.
    """

    def semi_join(
        rows: exp.Select, partner: PartnerFilter, relation: exp.Expr, alias: str, anti: bool
    ) -> exp.Select:
        return _semi_join(rows, partner, relation, alias, anti, within.get(alias, []))

    filters = [(i, f) for i, f in enumerate(inputs) if isinstance(f, PartnerFilter)]
    for index, partner in filters:
        if index == position:
            continue
        versions = ranges[partner.source.table]
        before = index > position and versions.changed
        relation = _partner_rows(plan, partner, versions, before, partner.source.alias)
        term = semi_join(term, partner, relation, partner.source.alias, partner.anti)
    changed = inputs[position]
    if not isinstance(changed, PartnerFilter):
        return [(1, term)]
    versions = ranges[changed.source.table]
    upstream = plan.upstreams.get(changed.source.table)
    change, now, then = (names.partner_alias(position, role) for role in ("change", "now", "then"))
    touched = semi_join(
        term,
        changed,
        signed_changes(changed.source.table, versions, change, upstream),
        change,
        anti=False,
    )
    turned = []
    # A row kept now and not before comes in; one kept before and not now goes.
    for sign, kept_now in ((1, True), (-1, False)):
        filtered = semi_join(
            touched,
            changed,
            _partner_rows(plan, changed, versions, False, now),
            now,
            anti=changed.anti == kept_now,
        )
        filtered = semi_join(
            filtered,
            changed,
            _partner_rows(plan, changed, versions, True, then),
            then,
            anti=changed.anti != kept_now,
        )
        turned.append((sign, filtered))
    return turned


def _partner_rows(
    plan: ViewPlan, partner: PartnerFilter, versions: VersionRange, before: bool, alias: str
) -> exp.Expr:
    """A filter's input at its pinned version, or (`before`) at its recorded one as distinct rows.

    At the recorded version only whether a row has a partner matters, so the
    distinct values of the columns the condition reads stand for the input
    (reads.rows_before), counted from its pinned version and change rows.
    """
    table = partner.source.table
    upstream = plan.upstreams.get(table)
    if not before:
        return table_at_version(table, versions.pinned, alias, upstream)
    columns = list(
        dict.fromkeys(
            column.name
            for column in partner.condition.find_all(exp.Column)
            if column.table == partner.source.alias
        )
    )
    if upstream is None and table not in plan.source_columns:
        return table_at_version(table, versions.recorded, alias)
    return rows_before(table, versions, alias, columns, upstream)


def _semi_join(
    rows: exp.Select,
    partner: PartnerFilter,
    relation: exp.Expr,
    alias: str,
    anti: bool,
    bounds: list[exp.Expr],
) -> exp.Select:
    """rows LEFT SEMI (or ANTI) JOIN relation ON the filter's condition, its input named `alias`.

    `bounds`: predicates on the input's key columns (key_bounds.py), which
    Spark pushes into its read.
    """
    source = partner.source.alias

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == source:
            return exp.column(node.name, table=ident(alias), quoted=True)
        return node

    condition = partner.condition.copy()
    if alias != source:
        condition = condition.transform(rename)
    condition = exp.and_(condition, *[b.copy() for b in bounds]) if bounds else condition
    return rows.join(relation, on=condition, join_type="LEFT ANTI" if anti else "LEFT SEMI")


def _term_sign(term_sign: int, aliases: list[str]) -> exp.Expr:
    """The sign of a term's row: the product of its signed inputs' signs, negated for a negative term.

    A term with no signed input (a partner filter's change) has the term's sign.

    >>> _term_sign(-1, ["a", "b"]).sql("spark")
    '-(`a`.`__ivm_sign` * `b`.`__ivm_sign`)'
    >>> _term_sign(-1, []).sql("spark")
    '-1'
    """
    if not aliases:
        return exp.Literal.number(term_sign)
    sign: exp.Expr = exp.column(names.SIGN, table=ident(aliases[0]), quoted=True)
    for alias in aliases[1:]:
        sign = exp.Mul(
            this=sign, expression=exp.column(names.SIGN, table=ident(alias), quoted=True)
        )
    if term_sign < 0:
        sign = exp.Neg(this=exp.paren(sign) if len(aliases) > 1 else sign)
    return sign


def repeated_feeds(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    list_keys: bool = True,
    key_relations: bool = True,
) -> list[TableName]:
    """The relations whose change one refresh reads more than once: worth staging first.

    Counted on the statements' trees: the key-bounds probe reads a source's
    feed once per key column it bounds, and the sum above reads input i's
    change in term i and, as R_i' - dR_i, in each earlier changed input's
    term. A source is staged if the plan knows the columns it reads
    (plan.source_columns); an upstream ivm model's change (the feed of its
    state, read through its view) is staged as its view's signed rows
    (reads.stage_upstream_change). A range staged already (an overwritten
    relation's summed change) is left as it is. `list_keys`,
    `key_relations`: the probe's (bounded_keys).
    """
    if not any(ranges[table].changed for table in plan.tables):
        return []
    trees: list[exp.Expr] = [signed_rows(plan, ranges)]
    bounded = bounded_keys(plan, ranges, list_keys, key_relations)
    if bounded:
        trees.append(key_bounds.probe_query(bounded, list_keys))
    reads_of: dict[str, int] = {}
    for tree in trees:
        for call in tree.find_all(exp.Anonymous):
            if call.name.lower() == "table_changes" and call.expressions:
                feed = call.expressions[0].name
                reads_of[feed] = reads_of.get(feed, 0) + 1

    def feed_of(table: TableName) -> str:
        upstream = plan.upstreams.get(table)
        return (upstream.state if upstream is not None else table).sql()

    return [
        table
        for table in plan.tables
        if ranges[table].staged is None
        and (table in plan.upstreams or table in plan.source_columns)
        and reads_of.get(feed_of(table), 0) > 1
    ]


def repeated_snapshots(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    small: Collection[TableName],
    bounds: key_bounds.Bounds | None = None,
    join_reads: JoinReads | None = None,
) -> list[TableName]:
    """The `small` sources whose pinned snapshot the change rows read more than once.

    Counted on the change rows' tree as the write builds it (signed_rows
    with its bounds and join reads). A join's term reads each partner at its
    pinned version, and an earlier changed input's term reads a later one
    again (R_i' - dR_i): staged, the snapshot is planned and read once.
    Only the sources in `small`: a stage reads its source whole, where a
    partner read keeps its key bounds (the refresh passes every source
    when all are small, else none: delta.confs.snapshot_sources).
    """
    if not any(ranges[table].changed for table in plan.tables):
        return []
    counts = reads.snapshot_reads(signed_rows(plan, ranges, bounds, join_reads))
    return [
        table
        for table in plan.tables
        if table in small
        and table not in plan.upstreams
        and table in plan.source_columns
        and counts.get((table, ranges[table].pinned), 0) > 1
    ]


def bounded_keys(
    plan: ViewPlan,
    ranges: Mapping[TableName, VersionRange],
    list_keys: bool = True,
    key_relations: bool = True,
) -> dict[TableName, tuple[exp.Subquery, list[key_bounds.KeyColumn]]]:
    """Per changed source: its change rows and the join columns whose bounds narrow a partner read.

    `list_keys`: whether the probe lists the keys; `key_relations`: whether
    key relations are read within them. Without both, the keys that only
    bound where listed (key_bounds.PartnerBound.listed_only) are not asked.
    """
    found: dict[TableName, list[key_bounds.KeyColumn]] = {}
    for _, select, inputs in linear_terms(plan):
        for position, changed in enumerate(inputs):
            if not ranges[_input_table(changed)].changed:
                continue
            for bound in key_bounds.partner_bounds(select, inputs, position, plan.source_columns):
                if bound.listed_only and not (list_keys and key_relations):
                    continue
                keys = found.setdefault(bound.key.table, [])
                if bound.key not in keys:
                    keys.append(bound.key)
    return {
        table: (
            signed_changes(table, ranges[table], names.CHANGES_CTE, plan.upstreams.get(table)),
            keys,
        )
        for table, keys in found.items()
    }


def _changed_relations(
    plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
) -> dict[str, KeyRelation]:
    """The key relations of the plan's join terms whose input changed, by alias."""
    found: dict[str, KeyRelation] = {}
    for term in plan.join_terms:
        for relation in term.key_relations:
            if ranges[relation.source.table].changed:
                found.setdefault(relation.alias, relation)
    return found


def unchanged_relations_probe(
    plan: ViewPlan, ranges: Mapping[TableName, VersionRange]
) -> exp.Query | None:
    """Rows (relation, found): per key relation whose input changed, its change rows with a key.

    A key relation's change (reads.key_changes) comes from the keys its
    input's change rows have, under its condition; with none, it has no
    change. A keyless one ("the subquery has a NULL", for NOT IN) is
    computed from its input whole, and its term joined a large other input
    with that empty change all the same: the warehouse's
    `mart_unpaid_orders` shuffled its 6.7 M orders and 5.5 M payment keys
    for it in every refresh. None: no key relation's input changed.
    """
    parts: list[exp.Select] = []
    for alias, relation in _changed_relations(plan, ranges).items():
        source = relation.source
        rows = reads.key_rows(
            relation,
            signed_changes(
                source.table, ranges[source.table], source.alias, plan.upstreams.get(source.table)
            ),
        )
        parts.append(_counted(alias, rows))
    if not parts:
        return None
    return reads.read_snapshots(union_all(parts), ranges)  # type: ignore[return-value]


def _counted(alias: str, rows: exp.Select) -> exp.Select:
    return exp.select(
        exp.alias_(exp.Literal.string(alias), "relation"),
        exp.alias_(exp.Count(this=exp.Star()), "found"),
    ).from_(rows.subquery(ident(names.TOUCHED_KEYS_ALIAS)))


def keyless_presence_probe(
    plan: ViewPlan, ranges: Mapping[TableName, VersionRange], touched: Mapping[str, int]
) -> exp.Query | None:
    """Rows (relation, found): per keyless relation the change touched, its rows now, up to touched + 1.

    A keyless relation ("the subquery has rows", for NOT IN) has one key,
    present while its input has a row. A change of n rows moves its count
    by at most n: where it has more than n rows now, it had some before
    too, and its presence did not change. Each read stops at n + 1 rows:
    a table's scan stops early; a log upstream is summed per the columns
    the relation reads alone (reads.counted_up_to), for "has rows" none,
    where its view would sum the whole log per every column first.
    `touched`: unchanged_relations_probe's answer. None: no such relation.
    """
    parts: list[exp.Select] = []
    for alias, relation in _changed_relations(plan, ranges).items():
        count = touched.get(alias, 0)
        if count <= 0 or not all(isinstance(key, exp.Boolean) for key in relation.keys):
            continue
        source = relation.source
        upstream = plan.upstreams.get(source.table)
        if upstream is not None:
            read = relation.condition.find_all(exp.Column) if relation.condition else ()
            upstream = reads.counted_up_to(upstream, {c.name for c in read}, count + 1)
        now = table_at_version(source.table, ranges[source.table].pinned, source.alias, upstream)
        parts.append(_counted(alias, reads.key_rows(relation, now).limit(count + 1)))
    if not parts:
        return None
    return reads.read_snapshots(union_all(parts), ranges)  # type: ignore[return-value]


def unchanged_relations(
    touched: Mapping[str, int], present: Mapping[str, int] | None = None
) -> set[str]:
    """The key relations with no change: none touched, or keyless with more rows now than touched.

    >>> sorted(unchanged_relations({"a": 0, "b": 3, "c": 3}, {"b": 4, "c": 3}))
    ['a', 'b']
    """
    found = {alias for alias, count in touched.items() if count == 0}
    for alias, rows in (present or {}).items():
        if rows > touched.get(alias, 0):
            found.add(alias)
    return found


def with_unchanged_relations(plan: ViewPlan, unchanged: Collection[str]) -> ViewPlan:
    """The plan for one refresh, the key relations of `unchanged` (aliases) marked unchanged.

    `unchanged`: unchanged_relations' answer.
    """
    if not unchanged:
        return plan
    terms = tuple(
        dataclasses.replace(
            term,
            key_relations=tuple(
                dataclasses.replace(k, unchanged=True) if k.alias in unchanged else k
                for k in term.key_relations
            ),
        )
        for term in plan.join_terms
    )
    return dataclasses.replace(plan, join_terms=terms)
