"""What one relation of a refresh's queries reads, at a pinned version or over a version range.

Every source is read at an exact Delta version (time travel) or as its
change-feed rows over an exact version range, so a maintenance query never
sees a source state newer or older than the range it applies (the ECA
paper's anomalies cannot occur). A version range (VersionRange) goes from
the version the state reflects (`recorded`) to the one the refresh pinned
(`pinned`); "window" is kept for SQL window functions (view_classes/window.py).

The relations read are: a source, an upstream ivm model (through its view
over its state table, whose change feed is read the same way), and an outer
or semi join's key relation (rules/outer_joins.py), read at a version or as
its change. model_query reads the model's own query at pinned versions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from ivm_compiler import names
from ivm_compiler.plan import KeyRelation, UpstreamModel, ViewPlan
from ivm_compiler.sql import DIALECT, TableName, aliased, ident, version_as_of

# Delta's change-feed column naming what a row's change was.
CHANGE_TYPE = "_change_type"
# Change-feed rows that add a row to the source; the other two types remove one.
ADDING_CHANGE_TYPES = ("insert", "update_postimage")


@dataclass(frozen=True)
class VersionRange:
    """One source's versions in a refresh: the state reflects `recorded`; the refresh brings it to `pinned`.

    >>> VersionRange(recorded=4, pinned=6).changed
    True
    """

    recorded: int
    pinned: int
    # A session relation holding this range's change-feed rows, staged once
    # by the refresh when its statements read them more than once
    # (stage_feed), or, where the range overwrote the relation, its change
    # summed per row (stage_net_change); None: read the change feed itself.
    staged: str | None = field(default=None, repr=False)
    # A session relation holding the source's rows at `pinned`, staged once by
    # the refresh when its change statement reads that snapshot more than
    # once (stage_snapshot, read_snapshots); None: time travel to it.
    snapshot: str | None = field(default=None, repr=False)
    # A commit in the range overwrote the table (Delta's INSERT OVERWRITE, as a
    # recompute of an ivm model's state writes it): its change feed holds
    # every row before, deleted, and every row after, inserted.
    overwritten: bool = field(default=False, repr=False)
    # A commit in the range replaced the table (CREATE OR REPLACE, as dbt
    # rebuilds a `table` model): there is no change feed across it, and its
    # change is the difference of its rows at the two versions, which the
    # log keeps (stage_net_change). Overwritten too: summed and staged first.
    replaced: bool = field(default=False, repr=False)

    @property
    def changed(self) -> bool:
        return self.pinned > self.recorded


def _upstream_reading(upstream: UpstreamModel, state_rows: exp.Expr) -> exp.Select:
    """The upstream model's view definition with its state table replaced by `state_rows`."""

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table) and TableName.of(node) == upstream.state:
            return state_rows.copy()
        return node

    view = upstream.view.transform(replace)  # on a copy: the upstream's view stays as it is
    assert isinstance(view, exp.Select)
    return view


def _change_sign() -> exp.If:
    """+1 for a change-feed row that adds a row, -1 for one that removes one."""
    return exp.If(
        this=exp.In(
            this=exp.column(CHANGE_TYPE),
            expressions=[exp.Literal.string(t) for t in ADDING_CHANGE_TYPES],
        ),
        true=exp.Literal.number(1),
        false=exp.Literal.number(-1),
    )


def _log_consolidation(view: exp.Select, state: TableName) -> exp.Subquery | None:
    """The subquery by which a log state's view sums its rows per key (log_state.consolidated).

    It reads the state and takes the state's name as its alias; a merged
    state's view reads the state table itself (None).
    """
    for subquery in view.find_all(exp.Subquery):
        reads_state = any(TableName.of(t) == state for t in subquery.find_all(exp.Table))
        if subquery.alias == state.name and reads_state:
            return subquery
    return None


def _log_changes(
    upstream: UpstreamModel, consolidation: exp.Subquery, changes: exp.Expr
) -> exp.Select:
    """A log upstream's view over its change-feed rows: each row's count, signed, is its change.

    A log row appended with count c adds c rows of the model (a projection's
    rows are its state rows repeated by count; log_state.refusal keeps other
    classes merged where ivm models read them): so a change-feed row stands
    for |sign * c| rows, each with the sign of sign * c. They go through the
    view with its consolidation taken out, as a merged state's rows do.
    `consolidation`: _log_consolidation's, in a copy of the view this replaces it in.
    """
    summed = consolidation.this
    assert isinstance(summed, exp.Select)
    names_summed = [p.alias_or_name for p in summed.expressions]
    sums = [p.alias_or_name for p in summed.expressions if p.find(exp.Sum)]
    repeated = any(
        isinstance(lateral.this, exp.Explode)
        for lateral in consolidation.root().find_all(exp.Lateral)
    )
    if sums != [names.COUNT] or not repeated:
        # Only a projection's log (rows repeated by their summed count) is
        # read by ivm models (log_state.refusal); a log of partial counts or
        # sums written before a reader existed is not rows of the model, and
        # its own next refresh merges it.
        raise ValueError(
            f"{upstream.state} is a log of partial rows, which its readers cannot apply: "
            "refresh the model it belongs to first (it then keeps a merged state)"
        )
    signed_count = exp.Mul(
        this=exp.paren(_change_sign()), expression=exp.column(names.COUNT, quoted=True)
    )
    columns = []
    for name in names_summed:
        if name == names.COUNT:
            columns.append(exp.alias_(exp.Abs(this=signed_count.copy()), name, quoted=True))
        else:
            columns.append(exp.column(name, quoted=True))
    sign = exp.Anonymous(this="SIGN", expressions=[signed_count])
    columns.append(exp.alias_(exp.cast(sign, exp.DataType.build("INT")), names.SIGN, quoted=True))
    rows = exp.select(*columns).from_(changes)
    view = consolidation.root()
    consolidation.replace(rows.subquery(ident(names.UPSTREAM_CHANGES_ALIAS)))
    assert isinstance(view, exp.Select)
    return view


def narrowed(upstream: UpstreamModel, columns: Collection[str]) -> UpstreamModel:
    """The upstream as a model reading only `columns` of it reads it: a log's sums kept to theirs.

    A log state's view sums its rows per state column before repeating each
    row by its count, and Spark keeps every grouping column of a GROUP BY
    it reads: the warehouse's slv_payments, reading the order ids of
    brz_orders, shuffled all five of its columns, twice (the statement 9.4-10.2 s
    warm, 7.1-7.9 s summed per order id alone; 2026-12-05). Summing per the
    columns read is exact for the logs readers read: a projection's
    (log_state.refusal), whose rows each have a net count of at least zero
    at every version, so the counts of the rows agreeing on the columns read
    add up to that narrower row's count, and none cancels another. The view
    keeps only the projections of `columns`, so every read of the upstream
    (at a version, its change, its net change) has the same columns. A
    merged state's view, or one reading none of the columns or all of them,
    is left as it is.

    >>> summed = exp.select("g0", "g1", exp.alias_(exp.Sum(this=exp.column("c")), "c"))
    >>> summed = summed.from_("m.s").group_by("g0", "g1").having("SUM(c) <> 0")
    >>> view = exp.select("g0 AS a", "g1 AS b").from_(summed.subquery("s")).where("c > 0")
    >>> up = narrowed(UpstreamModel(TableName("m", "s"), view), ["b"])
    >>> up.view.sql(dialect="spark")
    'SELECT g1 AS b FROM (SELECT g1, SUM(c) AS c FROM m.s GROUP BY g1 HAVING SUM(c) <> 0) AS s WHERE c > 0'
    """
    wanted = {column.lower() for column in columns}
    view = upstream.view.copy()
    consolidation = _log_consolidation(view, upstream.state)
    kept = [p for p in view.expressions if p.alias_or_name.lower() in wanted]
    if consolidation is None or not kept or len(kept) == len(view.expressions):
        return upstream
    grouped = _grouped_columns(consolidation)
    view.set("expressions", kept)
    read = _read_outside(view, consolidation)
    if grouped is None or not any(g.name in read for g in grouped):
        return upstream
    _sum_per(consolidation, grouped, read)
    return dataclasses.replace(upstream, view=view)


def _grouped_columns(consolidation: exp.Subquery) -> list[exp.Column] | None:
    """The columns a log's consolidation sums per; None unless it groups by plain columns."""
    summed = consolidation.this
    group = summed.args.get("group") if isinstance(summed, exp.Select) else None
    if group is None or not all(isinstance(g, exp.Column) for g in group.expressions):
        return None
    return list(group.expressions)


def _read_outside(view: exp.Select, consolidation: exp.Subquery) -> set[str]:
    """The columns of the consolidation's rows the view reads."""
    inside = {id(node) for node in consolidation.walk()}
    return {c.name for c in view.find_all(exp.Column) if id(c) not in inside}


def _sum_per(consolidation: exp.Subquery, grouped: list[exp.Column], read: set[str]) -> None:
    """The consolidation (changed in place) summed per the grouping columns in `read` alone."""
    summed = consolidation.this
    dropped = {g.name for g in grouped if g.name not in read}
    summed.set("expressions", [p for p in summed.expressions if p.alias_or_name not in dropped])
    remaining = [g for g in grouped if g.name not in dropped]
    summed.set("group", exp.Group(expressions=remaining) if remaining else None)


def counted_up_to(upstream: UpstreamModel, columns: Collection[str], most: int) -> UpstreamModel:
    """The upstream as read to count its rows up to `most`: a log summed per `columns` alone.

    The probe of keyless key relations (changes.keyless_presence_probe)
    asks whether an upstream has more rows now than a change touched. A log
    state's view sums the log per every state column before a row comes
    out, which no LIMIT cuts short: the warehouse's "has rows" probe over
    `fct_payments` took 4.3 executor CPU s to count 4,164 rows
    (2026-12-06). Summed per the columns the relation reads, and where it
    reads none as one sum of the whole log (a scan), the view yields a few
    rows, each repeated by its count: at most `most` times, since copies
    past `most` change no count the probe can give. Exact as `narrowed` is,
    for a projection's log. A merged state's view is left as it is: its
    scan stops at the LIMIT.

    >>> summed = exp.select("g0", "g1", exp.alias_(exp.Sum(this=exp.column("c")), "c"))
    >>> summed = summed.from_("m.s").group_by("g0", "g1").having("SUM(c) <> 0")
    >>> view = exp.select("g0 AS a", "g1 AS b").from_(summed.subquery("s")).where("c > 0")
    >>> series = exp.GenerateSeries(start=exp.Literal.number(1), end=exp.column("c"))
    >>> copies = exp.TableAlias(this=exp.to_identifier("x"), columns=[exp.to_identifier("n")])
    >>> view.append("laterals", exp.Lateral(this=exp.Explode(this=series), view=True, alias=copies))
    >>> up = UpstreamModel(TableName("m", "s"), view)
    >>> print(counted_up_to(up, [], 5).view.sql(dialect="spark"))
    SELECT TRUE AS `__ivm_present` FROM (SELECT SUM(c) AS c FROM m.s HAVING SUM(c) <> 0) AS s LATERAL VIEW EXPLODE(SEQUENCE(1, LEAST(c, 5))) x AS n WHERE c > 0
    >>> print(counted_up_to(up, ["b"], 5).view.sql(dialect="spark"))
    SELECT g1 AS b FROM (SELECT g1, SUM(c) AS c FROM m.s GROUP BY g1 HAVING SUM(c) <> 0) AS s LATERAL VIEW EXPLODE(SEQUENCE(1, LEAST(c, 5))) x AS n WHERE c > 0
    """
    view = upstream.view.copy()
    consolidation = _log_consolidation(view, upstream.state)
    grouped = _grouped_columns(consolidation) if consolidation is not None else None
    if consolidation is None or grouped is None:
        return upstream
    wanted = {column.lower() for column in columns}
    kept = [p for p in view.expressions if p.alias_or_name.lower() in wanted]
    view.set("expressions", kept or [exp.alias_(exp.true(), names.PRESENT, quoted=True)])
    _sum_per(consolidation, grouped, _read_outside(view, consolidation))
    # Only the copies' series: a projection of the model may hold a SEQUENCE of its own.
    for lateral in view.args.get("laterals") or []:
        for series in lateral.find_all(exp.GenerateSeries):
            end = series.args["end"]
            series.set("end", exp.Least(this=end.copy(), expressions=[exp.Literal.number(most)]))
    return dataclasses.replace(upstream, view=view)


def table_at_version(
    table: TableName,
    version: int,
    alias: str,
    upstream: UpstreamModel | None = None,
) -> exp.Expr:
    """A source as of a pinned version, under the alias the model's query uses.

    For an upstream ivm model the version is its state table's, read through
    the model's view definition.
    """
    if upstream is None:
        return aliased(version_as_of(table, version), alias)
    state = version_as_of(upstream.state, version)
    view = _upstream_reading(upstream, state)
    if upstream.unsummed_version == version:
        consolidation = _log_consolidation(view, upstream.state)
        if consolidation is not None:
            consolidation.replace(_unsummed(consolidation))
    return view.subquery(ident(alias))


def _unsummed(consolidation: exp.Subquery) -> exp.Subquery:
    """A log's consolidation as a plain read of its rows: no GROUP BY, no HAVING, each sum its value.

    For a version one commit wrote whole (UpstreamModel.unsummed_version):
    its rows are the model's rows with positive counts, so repeating each
    row by its count gives the bag the sums would, without a shuffle of the
    whole log (the warehouse's first build summed each bronze log once per
    model reading it).

    >>> summed = exp.select("k", exp.alias_(exp.Sum(this=exp.column("c")), "c")).from_("s")
    >>> summed = summed.where("g IS NULL").group_by("k").having("SUM(c) <> 0")
    >>> _unsummed(summed.subquery("s")).sql(dialect="spark")
    '(SELECT k, c AS c FROM s WHERE g IS NULL) AS s'
    """
    select = consolidation.this.copy()
    assert isinstance(select, exp.Select)
    select.set("group", None)
    select.set("having", None)
    select.set(
        "expressions",
        [
            exp.alias_(p.this.this.copy(), p.alias, quoted=p.args["alias"].quoted)
            if isinstance(p, exp.Alias) and isinstance(p.this, exp.Sum)
            else p
            for p in select.expressions
        ],
    )
    return select.subquery(consolidation.args.get("alias"))


def signed_changes(
    table: TableName, versions: VersionRange, alias: str, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """Change-feed rows after `recorded` up to `pinned` (both inclusive), each with a +1/-1 sign.

    For an upstream ivm model: its state's change rows, each turned into the
    view rows it stands for, keeping the sign. A staged range reads its
    staged relation instead of the change feed (stage_feed; for an
    upstream, stage_net_change, whose rows are signed already).
    """
    if versions.staged is not None and upstream is not None:
        staged = exp.Table(this=ident(versions.staged))
        return exp.select(exp.Star()).from_(staged).subquery(ident(alias))
    if versions.staged is not None:
        changes = exp.Table(this=ident(versions.staged))
    else:
        changes = change_feed(upstream.state if upstream else table, versions)
    sign = _change_sign()
    rows = exp.select(exp.Star(), exp.alias_(sign, names.SIGN, quoted=True, copy=False)).from_(
        changes, copy=False
    )
    if upstream is None:
        return rows.subquery(ident(alias), copy=False)
    if _log_consolidation(upstream.view, upstream.state) is not None:
        # _log_changes rewrites the view around it: found again in a copy.
        consolidation = _log_consolidation(upstream.view.copy(), upstream.state)
        assert consolidation is not None
        view = _log_changes(upstream, consolidation, changes)
    else:
        view = _upstream_reading(upstream, rows.subquery(ident(names.UPSTREAM_CHANGES_ALIAS)))
    sign_column = exp.column(names.SIGN, table=ident(names.UPSTREAM_CHANGES_ALIAS), quoted=True)
    signed = view.select(exp.alias_(sign_column, names.SIGN, quoted=True))
    if versions.overwritten:
        signed = net_rows(signed, _output_names(upstream.view))
    return signed.subquery(ident(alias))


def stage_net_change(
    table: TableName,
    versions: VersionRange,
    name: str,
    upstream: UpstreamModel | None = None,
    columns: Sequence[str] = (),
) -> exp.Cache:
    """CACHE TABLE <name> AS an overwritten relation's change, summed per row (net_rows).

    Staged before the refresh decides: its row count is the change's size,
    which an overwrite's commit metrics do not tell (they count the rows
    written, not those that differ), and every reference of the change
    reads the sum from the stage instead of summing the overwrite again.
    An upstream ivm model's stage holds its view's rows, signed; a source's
    holds `columns` (those the model reads) with a change type, as a staged
    feed does (stage_feed), so signed_changes reads either as it reads the
    change.

    >>> up = UpstreamModel(TableName("m", "up__ivm_state"), exp.select("k").from_("m.up__ivm_state"))
    >>> sql = stage_net_change(TableName("m", "up"), VersionRange(2, 5, overwritten=True), "s", up).sql("spark")
    >>> sql[: sql.index(" FROM")]
    'CACHE TABLE `s` AS SELECT `k`, EXPLODE(ARRAY_REPEAT(IF(`__ivm_net_sign` > 0, 1, -1), CAST(ABS(`__ivm_net_sign`) AS INT))) AS `__ivm_sign`'
    >>> sql = stage_net_change(TableName("raw", "t"), VersionRange(2, 5, overwritten=True), "s", columns=["k"]).sql("spark")
    >>> sql[: sql.index(" FROM")]
    "CACHE TABLE `s` AS SELECT `k`, IF(`__ivm_sign` > 0, 'insert', 'delete') AS `_change_type`"
    """
    assert versions.overwritten and versions.staged is None
    assert not (versions.replaced and upstream is not None), "a replaced ivm state is rebuilt"
    if upstream is not None:
        # signed_changes sums an overwritten upstream's change per row (net_rows).
        return stage_upstream_change(table, versions, name, upstream)
    read = [exp.column(c, quoted=True) for c in columns]
    feed = (
        _versions_signed(table, versions, columns)
        if versions.replaced
        else signed_changes(table, versions, names.OVERWRITTEN_ALIAS)
    )
    summed = net_rows(exp.select(*read, exp.column(names.SIGN, quoted=True)).from_(feed), columns)
    change_type = exp.If(
        this=exp.GT(this=exp.column(names.SIGN, quoted=True), expression=exp.Literal.number(0)),
        true=exp.Literal.string(ADDING_CHANGE_TYPES[0]),
        false=exp.Literal.string("delete"),
    )
    rows = exp.select(
        *[r.copy() for r in read], exp.alias_(change_type, CHANGE_TYPE, quoted=True)
    ).from_(summed.subquery(ident(names.NET_ALIAS)))
    return _cache(name, rows, None)


def _versions_signed(
    table: TableName, versions: VersionRange, columns: Sequence[str]
) -> exp.Subquery:
    """A replaced table's rows at `pinned` signed +1 and at `recorded` signed -1.

    Summed per row (net_rows), the rows both versions hold cancel: what is
    left is the replace's change, as its change feed would have said.

    >>> sql = _versions_signed(TableName("m", "t"), VersionRange(2, 5, replaced=True), ["k"]).sql("spark")
    >>> "FROM `m`.`t` VERSION AS OF 5 UNION ALL SELECT `k`, -1 AS `__ivm_sign` FROM `m`.`t` VERSION AS OF 2" in sql
    True
    """
    sides = [
        exp.select(
            *[exp.column(c, quoted=True) for c in columns],
            exp.alias_(exp.Literal.number(sign), names.SIGN, quoted=True),
        ).from_(version_as_of(table, version))
        for version, sign in ((versions.pinned, 1), (versions.recorded, -1))
    ]
    return exp.union(*sides, distinct=False).subquery(ident(names.OVERWRITTEN_ALIAS))


def net_rows(signed: exp.Query, columns: Sequence[str]) -> exp.Select:
    """Signed rows with every row's signs summed: what an overwrite of a table changed.

    An INSERT OVERWRITE's change feed deletes every row and inserts every
    row again; summed per row, the rows it left as they were cancel, and
    the rest come out one row per unit of their net sign, as change rows
    always are. A recompute that changed a hundred rows of a million hands
    its readers a hundred change rows, not two million.

    >>> sql = net_rows(exp.select("k", "__ivm_sign").from_("c"), ["k"]).sql("spark")
    >>> sql[: sql.index(" FROM")]
    'SELECT `k`, EXPLODE(ARRAY_REPEAT(IF(`__ivm_net_sign` > 0, 1, -1), CAST(ABS(`__ivm_net_sign`) AS INT))) AS `__ivm_sign`'
    >>> "GROUP BY `k` HAVING SUM(`__ivm_sign`) <> 0" in sql
    True
    """
    keys = [exp.column(c, quoted=True) for c in columns]
    sign = exp.column(names.SIGN, quoted=True)
    net = (
        exp.select(*keys, exp.alias_(exp.Sum(this=sign), names.NET_SIGN, quoted=True))
        .from_(signed.subquery(ident(names.OVERWRITTEN_ALIAS)))
        .group_by(*[k.copy() for k in keys])
        .having(exp.NEQ(this=exp.Sum(this=sign.copy()), expression=exp.Literal.number(0)))
    )
    net_sign = exp.column(names.NET_SIGN, quoted=True)
    unit = exp.If(
        this=exp.GT(this=net_sign, expression=exp.Literal.number(0)),
        true=exp.Literal.number(1),
        false=exp.Literal.number(-1),
    )
    copies = exp.cast(exp.Abs(this=net_sign.copy()), exp.DataType.build("INT"))
    units = exp.Explode(this=exp.Anonymous(this="ARRAY_REPEAT", expressions=[unit, copies]))
    return exp.select(*[k.copy() for k in keys], exp.alias_(units, names.SIGN, quoted=True)).from_(
        net.subquery(ident(names.NET_ALIAS))
    )


def change_feed(table: TableName, versions: VersionRange) -> exp.Table:
    """TABLE_CHANGES of `table` after `recorded` up to `pinned` (both inclusive).

    >>> change_feed(TableName("raw", "t"), VersionRange(2, 5)).sql("spark")
    "TABLE_CHANGES('`raw`.`t`', 3, 5)"
    """
    return exp.Table(
        this=exp.Anonymous(
            this="table_changes",
            expressions=[
                exp.Literal.string(table.sql()),
                exp.Literal.number(versions.recorded + 1),
                exp.Literal.number(versions.pinned),
            ],
        )
    )


def stage_feed(
    table: TableName,
    versions: VersionRange,
    columns: Sequence[str],
    name: str,
    partitions: int | None = None,
) -> exp.Cache:
    """CACHE TABLE <name> AS a source's change-feed rows over `versions`, with `columns` only.

    `columns`: the source columns the model reads (plan.source_columns);
    the change type rides along for the sign (signed_changes). Spark
    inlines a relation into every reference, and TABLE_CHANGES reads the
    change files and the log anew each time: a join's probe and change
    terms read one source's feed up to four times (Q3 of the benchmark).

    >>> stage_feed(TableName("raw", "t"), VersionRange(2, 5), ["k"], "s").sql("spark")
    "CACHE TABLE `s` AS SELECT `k`, `_change_type` FROM TABLE_CHANGES('`raw`.`t`', 3, 5)"
    """
    projected = [exp.column(c, quoted=True) for c in [*columns, CHANGE_TYPE]]
    rows = exp.select(*projected).from_(change_feed(table, versions))
    return _cache(name, rows, partitions)


def stage_upstream_change(
    table: TableName,
    versions: VersionRange,
    name: str,
    upstream: UpstreamModel,
    partitions: int | None = None,
) -> exp.Cache:
    """CACHE TABLE <name> AS an upstream ivm model's change: its view's rows, signed.

    What signed_changes reads for the upstream, computed once: its state's
    change feed turned into view rows (a log state's consolidated first).
    A change statement reads an upstream's change once per term and probe,
    each time planning and scanning the feed and turning it into view rows
    again (the warehouse's `mart_unpaid_orders` read `fct_payments`' 16
    times in one statement). An overwritten upstream's summed change
    (stage_net_change) is staged by it too; signed_changes reads either.

    >>> up = UpstreamModel(TableName("m", "up__ivm_state"), exp.select("k").from_("m.up__ivm_state"))
    >>> sql = stage_upstream_change(TableName("m", "up"), VersionRange(2, 5), "s", up).sql("spark")
    >>> sql[: sql.index(" FROM")]
    'CACHE TABLE `s` AS SELECT k, `__ivm_uc`.`__ivm_sign` AS `__ivm_sign`'
    >>> "TABLE_CHANGES('`m`.`up__ivm_state`', 3, 5)" in sql
    True
    """
    assert versions.staged is None
    signed = signed_changes(table, versions, name, upstream).this
    assert isinstance(signed, exp.Select)
    return _cache(name, signed, partitions)


def stage_snapshot(
    table: TableName,
    version: int,
    columns: Sequence[str],
    name: str,
    partitions: int | None = None,
) -> exp.Cache:
    """CACHE TABLE <name> AS a source's rows at `version`, with `columns` only.

    Each `VERSION AS OF` reference is planned anew: Delta resolves the
    snapshot and lists its files once per reference (0.4 s on this runtime
    at the latest version), and a join's change statement reads each
    partner once per term (the worked example's customers_to_chase: 19
    references to two sources).

    >>> stage_snapshot(TableName("raw", "t"), 5, ["k"], "s").sql("spark")
    'CACHE TABLE `s` AS SELECT `k` FROM `raw`.`t` VERSION AS OF 5'
    """
    rows = exp.select(*[exp.column(c, quoted=True) for c in columns])
    return _cache(name, rows.from_(version_as_of(table, version)), partitions)


def _cache(name: str, rows: exp.Select, partitions: int | None) -> exp.Cache:
    """CACHE TABLE <name> AS `rows`, coalesced into `partitions` when given (a COALESCE hint).

    A stage's partitions are the tasks of every scan of it; small sources'
    stages are made into one (delta.confs.staging), their reads one task each.

    >>> _cache("s", exp.select("k").from_("t"), 1).sql("spark")
    'CACHE TABLE `s` AS SELECT /*+ COALESCE(1) */ k FROM t'
    """
    if partitions is not None:
        rows.set("hint", exp.Hint(expressions=[exp.Coalesce(this=exp.Literal.number(partitions))]))
    return exp.Cache(this=exp.Table(this=ident(name)), expression=rows)


def snapshot_reads(tree: exp.Expr) -> dict[tuple[TableName, int], int]:
    """How often `tree` reads each table at each version (`VERSION AS OF`).

    >>> tree = exp.select("*").from_(version_as_of(TableName("raw", "t"), 5))
    >>> snapshot_reads(tree.union(tree.copy(), distinct=False))
    {(TableName(db='raw', name='t', catalog=None), 5): 2}
    """
    counts: dict[tuple[TableName, int], int] = {}
    for node in tree.find_all(exp.Table):
        key = _versioned(node)
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    return counts


def read_snapshots(tree: exp.Expr, ranges: Mapping[TableName, VersionRange]) -> exp.Expr:
    """`tree` with each read of a source at its pinned version taken from its staged snapshot.

    >>> table = TableName("raw", "t")
    >>> tree = exp.select("*").from_(aliased(version_as_of(table, 5), "a"))
    >>> read_snapshots(tree, {table: VersionRange(2, 5, snapshot="s")}).sql("spark")
    'SELECT * FROM `s` AS `a`'
    """
    staged = {(t, r.pinned): r.snapshot for t, r in ranges.items() if r.snapshot is not None}
    if not staged:
        return tree

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Table):
            name = staged.get(_versioned(node))  # type: ignore[arg-type]
            if name is not None:
                relation = exp.Table(this=ident(name))
                alias = node.args.get("alias")
                if alias is not None:
                    relation.set("alias", alias.copy())
                return relation
        return node

    return tree.transform(replace)


def _versioned(node: exp.Table) -> tuple[TableName, int] | None:
    """The table and version a `VERSION AS OF` reference reads; None for any other relation."""
    version = node.args.get("version")
    if not isinstance(version, exp.Version) or not isinstance(version.expression, exp.Literal):
        return None
    return TableName.of(node), int(version.expression.this)


def table_before(
    table: TableName,
    versions: VersionRange,
    alias: str,
    columns: list[str],
    upstream: UpstreamModel | None = None,
) -> exp.Subquery:
    """A source at its recorded version, as a signed bag read from its pinned version and change.

    R_recorded = R_pinned - dR: the rows at the pinned version with sign +1,
    and the range's change rows with their sign negated (a row inserted in
    the range cancels, a deleted one comes back). It reads no old snapshot:
    Delta rebuilds a time-travel snapshot from its log on every reference
    (0.5-0.7 s measured on this runtime, against 0.2 s at the latest
    version), while the pinned version is nearly always the latest, which
    Delta keeps. A join with it multiplies signs (changes.signed_rows).
    `columns`: the source columns the model reads (plan.source_columns).

    >>> sql = table_before(TableName("raw", "t"), VersionRange(2, 5), "t", ["k"]).sql("spark")
    >>> "VERSION AS OF 5" in sql and "TABLE_CHANGES('`raw`.`t`', 3, 5)" in sql
    True
    """
    sign = exp.column(names.SIGN, quoted=True)
    if upstream is None:
        projected = [exp.column(c, quoted=True) for c in columns]
        now = exp.select(
            *projected, exp.alias_(exp.Literal.number(1), names.SIGN, quoted=True, copy=False)
        )
        now = now.from_(version_as_of(table, versions.pinned), copy=False)
        changed = signed_changes(table, versions, names.CHANGED_ROWS_ALIAS)
        undone = exp.select(*[p.copy() for p in projected]).from_(changed, copy=False)
    else:
        now = _upstream_reading(upstream, version_as_of(upstream.state, versions.pinned))
        now = now.select(exp.alias_(exp.Literal.number(1), names.SIGN, quoted=True))
        changed = signed_changes(table, versions, names.CHANGED_ROWS_ALIAS, upstream)
        undone = exp.select(
            *[exp.column(c, quoted=True) for c in _output_names(upstream.view)]
        ).from_(changed)
    undone = undone.select(
        exp.alias_(exp.Neg(this=sign), names.SIGN, quoted=True, copy=False), copy=False
    )
    return exp.union(now, undone, distinct=False, copy=False).subquery(ident(alias), copy=False)


def rows_before(
    table: TableName,
    versions: VersionRange,
    alias: str,
    columns: list[str],
    upstream: UpstreamModel | None = None,
) -> exp.Subquery:
    """The distinct values of `columns` among a relation's rows at its recorded version.

    Counted as keys_before counts keys: the rows at the pinned version less
    the range's signed change rows (table_before), grouped by the columns,
    kept where their count is positive. What a semi or anti join on a
    condition reading those columns asks of the relation (a partner filter,
    changes.py); without columns, one row while the relation has any.

    >>> rows = rows_before(TableName("raw", "d"), VersionRange(2, 5), "d", ["k"]).this
    >>> rows.sql("spark")[: rows.sql("spark").index(" FROM")]
    'SELECT `k`'
    >>> rows.args["group"].sql("spark"), rows.args["having"].sql("spark")
    ('GROUP BY `k`', 'HAVING SUM(`__ivm_sign`) > 0')
    """
    signed = table_before(table, versions, names.BEFORE_ALIAS, columns, upstream)
    projected: list[exp.Expr] = [exp.column(c, quoted=True) for c in columns]
    rows = exp.select(*(projected or [exp.alias_(exp.Literal.number(1), names.ANY, quoted=True)]))
    rows = rows.from_(signed, copy=False)
    if projected:
        rows = rows.group_by(*[p.copy() for p in projected], copy=False)
    count = exp.Sum(this=exp.column(names.SIGN, quoted=True))
    return rows.having(exp.GT(this=count, expression=exp.Literal.number(0)), copy=False).subquery(
        ident(alias), copy=False
    )


def _output_names(view: exp.Select) -> list[str]:
    return [projection.alias_or_name for projection in view.expressions]


def _key_rows(relation: KeyRelation, rows: exp.Expr, *extra: exp.Expr) -> exp.Select:
    """SELECT <keys>, *extra FROM rows WHERE <condition> AND no key is NULL (a bag)."""
    conditions: list[exp.Expr] = [
        exp.Not(this=exp.Is(this=key.copy(), expression=exp.Null())) for key in relation.keys
    ]
    if relation.condition is not None:
        conditions.append(relation.condition.copy())
    return (
        exp.select(
            *[
                exp.alias_(key.copy(), names.join_key(i), quoted=True, copy=False)
                for i, key in enumerate(relation.keys)
            ],
            *extra,
        )
        .from_(rows, copy=False)
        .where(exp.and_(*conditions, copy=False), copy=False)
    )


def key_rows(relation: KeyRelation, rows: exp.Expr) -> exp.Select:
    """The relation's keys of its input's `rows` (a version, or its signed change), a bag."""
    return _key_rows(relation, rows)


def _key_values(relation: KeyRelation, rows: exp.Expr) -> exp.Select:
    """SELECT DISTINCT <keys> FROM rows WHERE <condition> AND no key is NULL."""
    return _key_rows(relation, rows).distinct(copy=False)


def _key_columns(relation: KeyRelation, table: str | None = None) -> list[exp.Column]:
    return [
        exp.column(names.join_key(i), table=ident(table) if table else None, quoted=True)
        for i in range(len(relation.keys))
    ]


def keys_at_version(
    relation: KeyRelation, version: int, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """An outer join's key relation with its input at a pinned version."""
    source = relation.source
    rows = table_at_version(source.table, version, source.alias, upstream)
    return _key_values(relation, rows).subquery(ident(relation.alias), copy=False)


def _counted_rows(
    relation: KeyRelation,
    versions: VersionRange,
    upstream: UpstreamModel | None,
    now: list[exp.Expr],
    then: list[exp.Expr],
    only: exp.Subquery | None = None,
    within: Sequence[exp.Expr] = (),
) -> exp.Query:
    """Each key row at the pinned version with the columns `now`, each change row's with `then`.

    Summed per key, a column that is 1 for the pinned rows and minus the sign
    for the change rows counts the key's rows at the recorded version
    (R_recorded = R_pinned - dR, per key), so no old snapshot is read.
    `only`: keys (names.join_key columns) the pinned rows are limited to;
    `within`: predicates on the input's columns that hold for those keys
    (key_bounds.py), which Spark pushes into the read where `only`, a join,
    is not.
    """
    source = relation.source
    pinned = _key_rows(
        relation, table_at_version(source.table, versions.pinned, source.alias, upstream), *now
    )
    if within:
        pinned = pinned.where(exp.and_(*[p.copy() for p in within]), copy=False)
    if only is not None:
        on = [
            exp.EQ(this=key.copy(), expression=column)
            for key, column in zip(relation.keys, _key_columns(relation, only.alias))
        ]
        pinned = pinned.join(only, on=exp.and_(*on, copy=False), join_type="LEFT SEMI", copy=False)
    changed = signed_changes(source.table, versions, source.alias, upstream)
    return exp.union(pinned, _key_rows(relation, changed, *then), distinct=False, copy=False)


def keys_before(
    relation: KeyRelation, versions: VersionRange, upstream: UpstreamModel | None = None
) -> exp.Subquery:
    """An outer or semi join's key relation at the recorded version, read from the pinned one.

    A key is present when its rows at the recorded version, counted as the
    rows at the pinned version minus the range's signed change rows, number
    more than zero. Like table_before, it reads no old snapshot (Delta
    rebuilds one from its log on every reference; the pinned version is
    nearly always the latest, which Delta keeps).

    >>> from ivm_compiler.plan import SourceRef
    >>> keys = KeyRelation(
    ...     alias="k", source=SourceRef("o", TableName("raw", "o")),
    ...     keys=(exp.column("c", table="o"),), condition=None,
    ... )
    >>> sql = keys_before(keys, VersionRange(2, 5)).sql("spark")
    >>> "VERSION AS OF 5" in sql and "VERSION AS OF 2" not in sql
    True
    """
    sign = exp.column(names.SIGN, table=ident(relation.source.alias), quoted=True)
    rows = _counted_rows(
        relation,
        versions,
        upstream,
        now=[exp.alias_(exp.Literal.number(1), names.SIGN, quoted=True)],
        then=[exp.alias_(exp.Neg(this=sign), names.SIGN, quoted=True)],
    )
    count = exp.Sum(this=exp.column(names.SIGN, quoted=True))
    return (
        exp.select(*_key_columns(relation))
        .from_(rows.subquery(ident("p"), copy=False), copy=False)
        .group_by(*_key_columns(relation), copy=False)
        .having(exp.GT(this=count, expression=exp.Literal.number(0)), copy=False)
        .subquery(ident(relation.alias), copy=False)
    )


def key_changes(
    relation: KeyRelation,
    versions: VersionRange,
    upstream: UpstreamModel | None = None,
    within: Sequence[exp.Expr] = (),
) -> exp.Subquery:
    """The keys that gained their first partner (+1) or lost their last (-1) over the versions.

    Only keys that occur in the range's change rows can change. For those
    keys alone, one read of the pinned version counts their rows now, and
    the change rows' signs give their count at the recorded version (as in
    keys_before): a key's sign is its presence now minus its presence then.
    `within`: the change keys' bounds on the input's columns (key_bounds.py).
    """
    source = relation.source
    touched = _key_values(
        relation, signed_changes(source.table, versions, source.alias, upstream)
    ).subquery(ident(names.TOUCHED_KEYS_ALIAS), copy=False)
    now_rows, change_rows = "__ivm_now", "__ivm_change"
    sign = exp.column(names.SIGN, table=ident(source.alias), quoted=True)
    rows = _counted_rows(
        relation,
        versions,
        upstream,
        now=[
            exp.alias_(exp.Literal.number(1), now_rows, quoted=True),
            exp.alias_(exp.Literal.number(0), change_rows, quoted=True),
        ],
        then=[
            exp.alias_(exp.Literal.number(0), now_rows, quoted=True),
            exp.alias_(sign, change_rows, quoted=True),
        ],
        only=touched,
        within=within,
    )
    now = exp.Sum(this=exp.column(now_rows, quoted=True))
    then = exp.Sub(this=now.copy(), expression=exp.Sum(this=exp.column(change_rows, quoted=True)))

    def present(count: exp.Expr) -> exp.Expr:
        return exp.If(
            this=exp.GT(this=count, expression=exp.Literal.number(0)),
            true=exp.Literal.number(1),
            false=exp.Literal.number(0),
        )

    presence = exp.Sub(this=present(now), expression=present(then))
    return (
        exp.select(
            *_key_columns(relation), exp.alias_(presence, names.SIGN, quoted=True, copy=False)
        )
        .from_(rows.subquery(ident("p"), copy=False), copy=False)
        .group_by(*_key_columns(relation), copy=False)
        .having(exp.NEQ(this=presence.copy(), expression=exp.Literal.number(0)), copy=False)
        .subquery(ident(relation.alias), copy=False)
    )


def model_query(plan: ViewPlan, versions: Mapping[TableName, int]) -> str:
    """The model's own query, as written, with every source read at its pinned version."""
    ctes = {cte.alias_or_name.lower() for cte in plan.query.find_all(exp.CTE)}

    def replace(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Table) or (not node.db and node.name.lower() in ctes):
            return node
        table = TableName.of(node)
        return table_at_version(
            table, versions[table], node.alias_or_name, plan.upstreams.get(table)
        )

    return plan.query.transform(replace).sql(dialect=DIALECT)
