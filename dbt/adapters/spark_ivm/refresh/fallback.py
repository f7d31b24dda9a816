"""An ivm_fallback model's table, written in place so that its ivm readers take its change.

A model the compiler refuses, with `ivm_fallback='full_refresh'`, is a Delta
table computed whole on every run. dbt's way, CREATE OR REPLACE, makes it a
new table to the ivm models reading it (its change feed cannot be read
across the replace), so each would rebuild, and theirs after them. Where ivm
models read it and the table already has the query's columns, the refresh
writes it in place instead (ivm_compiler/row_difference.py): the difference
between its rows and the query's, computed once and staged, then merged by
whole row, so its change feed holds only the rows that differ, which every
reader applies as it applies any change; a difference too large to be worth
merging (handoff.choose, by its counted rows) is written as an overwrite.
No row differing, nothing is written, and its readers have no change.
Otherwise (a first build, other columns, --full-refresh, a table that is not
Delta, a MAP column, SQL that sqlglot cannot parse) the materialization
builds it as dbt does (macros/materializations/ivm/fallback.sql), its
readers rebuild once, and the log says why.

Either way the query reads each upstream ivm model that refreshed in this run
but whose consistency group has not published yet at its refreshed state
(`reading_staged`), as ivm readers do: dbt starts the fallback once its refs
have run, not once their group has published, and their views would show
the previous run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from sqlglot import exp, parse_one
from sqlglot.errors import ParseError

from dbt.adapters.spark_ivm.consistency.publish import Log, Runner
from dbt.adapters.spark_ivm.delta.confs import (
    STAGE_SETTINGS,
    committing,
    under,
)
from dbt.adapters.spark_ivm.delta.errors import error_summary
from dbt.adapters.spark_ivm.delta.history import (
    ESTIMATED_ROWS_KEY,
    METADATA_MARKER,
    RECOMPUTED_MARKER,
)
from dbt.adapters.spark_ivm.delta.tables import (
    CHANGE_FEED_PROPERTY,
    DELTA_PROTOCOL_PROPERTY,
    describe_detail,
    may_have_deletion_vectors,
    turn_on_change_feed,
)
from dbt.adapters.spark_ivm.refresh import handoff
from dbt.adapters.spark_ivm.refresh.schema_changes import normal_type
from dbt.adapters.spark_ivm.refresh.upstreams import properties
from ivm_compiler import TableName, emit, layout, names, row_difference
from ivm_compiler.sql import DIALECT


@dataclass(frozen=True)
class Written:
    """A fallback table written in place: the rows it changed, and how it handed them on."""

    inserted: int
    deleted: int
    chosen: handoff.HandOff
    # Set when no row differed, so nothing was written.
    nothing: str | None = None


@dataclass
class FallbackTable:
    """The model's table under ivm_fallback, and the ivm models reading it."""

    runner: Runner
    log: Log
    model: str
    table: TableName
    sql: str
    # A relation's columns (dbt's answer).
    columns: Callable[[TableName], list[tuple[str, str]]]
    # The SELECT an upstream ivm model refreshed in this run will be shown
    # by once its group publishes; None where its view shows it (reading_staged).
    staged_select: Callable[[TableName], exp.Query | None] = lambda table: None
    # No other client shares the connection's Spark session (StateWrites.own_session):
    # its commit metadata needs no lock.
    own_session: bool = False

    def query(self) -> exp.Query | str:
        """The query computing the table's rows; else why its SQL cannot be used here."""
        computed = self._computed
        return computed if isinstance(computed, str) else computed[0]

    def build_sql(self) -> str | None:
        """What the materialization builds the table with, where it is not the model's SQL.

        None: the model's SQL, which reads no unpublished state (or does not
        parse here, and is then built as dbt compiled it).
        """
        computed = self._computed
        if isinstance(computed, str) or not computed[1]:
            return None
        return computed[0].sql(dialect=DIALECT)

    @cached_property
    def _computed(self) -> tuple[exp.Query, list[TableName]] | str:
        """The query parsed and its staged upstreams resolved, once per run (both uses read it)."""
        try:
            query = parse_one(self.sql, read=DIALECT)
        except ParseError as error:
            return f"its SQL does not parse as one query here ({error_summary(error)})"
        if not isinstance(query, exp.Query):
            return "its SQL is not one query"
        return reading_staged(query, self.staged_select)

    def properties_after_build(self, read_by_ivm_models: bool) -> dict[str, str]:
        """What the table carries once the materialization built it.

        Its query, which ivm_matches_query compares it with (emit.QUERY_PROPERTY),
        and, for ivm readers, its change feed, which they read.
        """
        return {
            emit.QUERY_PROPERTY: self.sql,
            **({CHANGE_FEED_PROPERTY: "true"} if read_by_ivm_models else {}),
        }

    def write_in_place(
        self, readers: Sequence[str], histories: Callable[[], Sequence[handoff.Reader]]
    ) -> Written | str:
        """The query's rows written over the table as their difference; else why it is rebuilt."""
        query = self.query()
        if isinstance(query, str):
            return query
        found = self._columns(query)
        if isinstance(found, str):
            return found
        shown = properties(self.runner, self.table)
        if DELTA_PROTOCOL_PROPERTY not in shown:
            return "it is not a Delta table, which cannot be written in place"
        if shown.get(CHANGE_FEED_PROPERTY, "false").lower() != "true":
            self.log.info(
                f"{self.model}: turning on the change data feed of {self.table}, which ivm "
                "models read"
            )
            self.runner.execute(turn_on_change_feed(self.table))
        if shown.get(emit.QUERY_PROPERTY) != self.sql:
            # The SQL changed with its columns kept: the test compares with the new one.
            self.runner.execute(
                emit.set_properties(self.table, "TABLE", {emit.QUERY_PROPERTY: self.sql})
            )
        # Its readers' change is not known before the difference is computed,
        # and a fallback table keeps no history of its writes.
        chosen = handoff.choose(readers, histories, None, None)
        if not chosen.merges:
            self.runner.execute(row_difference.overwrite(self.table, query))
            return Written(inserted=0, deleted=0, chosen=chosen)
        vectors = may_have_deletion_vectors(shown)
        return self._write_difference(query, found, readers, histories, vectors)

    def _columns(self, query: exp.Query) -> list[str] | str:
        """The query's columns, if the table has exactly them; else why it is rebuilt."""
        _, rows = self.runner.query(f"DESCRIBE QUERY {query.sql(dialect=DIALECT)}")
        wanted = [(str(r[0]), str(r[1])) for r in rows]
        have = [(name, str(kind)) for name, kind in self.columns(self.table)]
        if [(n.lower(), normal_type(t)) for n, t in wanted] != [
            (n.lower(), normal_type(t)) for n, t in have
        ]:
            return "its query's columns are not the table's"
        if any("map<" in kind.lower() for _, kind in wanted):
            return "it has a MAP column, by which rows cannot be compared"
        return [name for name, _ in wanted]

    def _write_difference(
        self,
        query: exp.Query,
        columns: list[str],
        readers: Sequence[str],
        histories: Callable[[], Sequence[handoff.Reader]],
        vectors: bool,
    ) -> Written:
        """The difference staged and counted, then merged, or the table overwritten if large.

        Counted, the difference is the change its readers would apply: under
        handoff.MERGED_CHANGE_ROWS copies they all apply it, so it is merged;
        past that a whole-row MERGE rewrites most of the table's files and
        readers recompute by their estimates, so an overwrite costs less
        (warehouse scale 1500: a 21,475-row difference merged in 42.6 s where
        the model's own rebuild took 12.7 s). The overwrite writes the table's
        rows the difference leaves and its rows' new copies
        (row_difference.overwrite_with_difference): it ran the query again,
        which at scale 6000 cost as much as the difference (46.8 of the
        batch's 506 executor CPU s; caching the query's rows for both took
        longer than running it twice, bench/micro/fallback_write.py). It
        records the difference's size for its readers
        (delta.history.ESTIMATED_ROWS_KEY), who would otherwise sum the whole
        table to size it.

        A large table (layout.DELETION_VECTOR_STATE_BYTES) gets deletion
        vectors before its first large difference (`vectors`: it has them),
        and is then always merged: the MERGE marks the changed rows' old
        copies deleted and appends their new ones, rewriting no file, and
        its change feed is the difference, which the readers apply as it is.
        An overwrite wrote all the table's rows and every reader summed them
        again (the warehouse at scale 6000: a 21,541-row difference of a
        1.8 M-row table, overwritten, then summed by `mart_quartile_summary`).
        """
        stage = f"{names.STAGED_PREFIX}{uuid.uuid4().hex}_difference"
        try:
            # Kept as analyzed: the query reads views that other threads'
            # groups re-point meanwhile, and a stage kept as text is analyzed
            # anew at each read, misses its cache and is computed again (the
            # warehouse's count and overwrite each recomputed it, 13.1 CPU s).
            with under(self.runner, STAGE_SETTINGS):
                self.runner.execute(
                    row_difference.stage_difference(self.table, query, columns, stage)
                )
            _, answer = self.runner.query(row_difference.count_difference(stage))
            rows, inserted, deleted = (int(v) for v in answer[0])
            if rows == 0:
                chosen = handoff.choose(readers, histories, 0, None)
                return Written(0, 0, chosen, nothing="no row of it differs from its query's")
            if not vectors and inserted + deleted >= handoff.MERGED_CHANGE_ROWS and readers:
                vectors = self._vectors_if_large()
            chosen = handoff.choose(
                readers, histories, inserted + deleted, None, deletion_vectors=vectors
            )
            if chosen.merges:
                self.runner.execute(row_difference.merge_difference(self.table, stage, columns))
            else:
                self._overwrite(
                    row_difference.overwrite_with_difference(self.table, stage, columns),
                    estimated_rows=inserted + deleted,
                )
            return Written(inserted=inserted, deleted=deleted, chosen=chosen)
        finally:
            for statement in emit.drop_staged(stage):
                self.runner.execute(statement)

    def _vectors_if_large(self) -> bool:
        """Deletion vectors turned on where the table is large (layout.deletion_vectors_pay)."""
        columns, rows = self.runner.query(describe_detail(self.table))
        found = dict(zip(columns, rows[0])).get("sizeInBytes")
        size = None if found is None else int(found)
        if size is None or not layout.deletion_vectors_pay(size):
            return False
        self.log.info(
            f"{self.model}: turning on deletion vectors of {self.table} ({size:,} bytes), "
            "so that a large difference is merged without rewriting its files"
        )
        self.runner.execute(
            emit.set_properties(self.table, "TABLE", {layout.DELETION_VECTORS_PROPERTY: "true"})
        )
        return True

    def _overwrite(self, statement: str, estimated_rows: int) -> None:
        """The table overwritten by `statement`, its commit saying how many rows its readers change."""
        metadata = {METADATA_MARKER: 1, RECOMPUTED_MARKER: True, ESTIMATED_ROWS_KEY: estimated_rows}
        with committing(self.runner, metadata, shared_session=not self.own_session):
            self.runner.execute(statement)

    def rebuilt_because(self, reason: str) -> None:
        self.log.info(
            f"{self.model}: building {self.table} anew, so the ivm models reading it rebuild "
            f"once: {reason}"
        )


def reading_staged(
    query: exp.Query, staged_select: Callable[[TableName], exp.Query | None]
) -> tuple[exp.Query, list[TableName]]:
    """`query` with each relation that has a staged state read through that state's SELECT.

    `staged_select` answers, for a relation the query reads, the SELECT its
    group will publish as its view (None: read it as it is). Each such
    relation becomes a derived table under the name the query reads it by.

    >>> staged = {TableName("s", "up"): parse_one("SELECT k FROM s.up__state VERSION AS OF 7")}
    >>> query = parse_one("SELECT u.k FROM s.up AS u JOIN s.other ON u.k = other.k")
    >>> rewritten, read = reading_staged(query, staged.get)
    >>> rewritten.sql(dialect="spark")
    'SELECT u.k FROM (SELECT k FROM s.up__state VERSION AS OF 7) AS u JOIN s.other ON u.k = other.k'
    >>> [str(t) for t in read]
    ['s.up']
    """
    query = query.copy()
    read: list[TableName] = []
    for table in list(query.find_all(exp.Table)):
        if not table.args.get("db"):
            continue  # a CTE's name, or a relation of the current schema dbt never renders
        name = TableName(db=table.text("db"), name=table.name)
        select = staged_select(name)
        if select is None:
            continue
        alias = table.alias or table.name
        table.replace(
            exp.Subquery(this=select.copy(), alias=exp.TableAlias(this=exp.to_identifier(alias)))
        )
        if name not in read:
            read.append(name)
    return query, read


def describe_write(written: Written) -> str:
    """The fallback result's handoff phrase: what changed, and how it reached the readers."""
    if written.nothing is not None:
        return f"{written.nothing}, so nothing was written"
    if not written.inserted and not written.deleted:
        return written.chosen.describe()
    how = "written in place" if written.chosen.merges else "the table overwritten"
    return f"{written.chosen.describe()} (+{written.inserted} -{written.deleted} rows, {how})"
