"""Which join inputs keep a join state (`ivm_join_state`), and keeping them current.

The compiler says which inputs can keep one and emits its SQL
(ivm_compiler/join_states.py); this module decides, creates, brings each
join state to a refresh's pinned source version, and hands the MERGE the
reads that stand in for partner reads.

`ivm_join_state`:
- 'none' (default): partners are read from their sources. Measured on the
  TPC-H benchmark, a join state cost more to keep than it saved when its
  input changed in every batch (bench/README.md); it pays for a large input
  that changes rarely, read with a narrow projection or a selective filter.
- 'auto': at a build, keep one for each input whose source is at least
  AUTO_MIN_BYTES and whose projection keeps at most AUTO_MAX_COLUMN_SHARE of
  its columns, or that the model filters by a condition of its own. Later
  refreshes keep it while its source changes rarely: once the source changed
  in AUTO_DROP_CHANGED of the model's last AUTO_DROP_WINDOW refreshes, the
  join state costs a MERGE nearly every refresh and is dropped (logged).
- 'all': every input that can keep one.
- a list of aliases: those inputs (an alias that cannot keep one is an error).

Each join state commit records the source version its rows hold (commit
metadata, like a state's), so a refresh reads it at the commit of the
version the telescoping sum asks for, and a refresh that failed after
bringing it forward leaves nothing wrong: the next one finds the older
commit in its history, or rebuilds the join state from the source.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any, Protocol

from dbt_common.exceptions import CompilationError

from dbt.adapters.spark_ivm.consistency.publish import Log
from dbt.adapters.spark_ivm.delta.history import describe_history, load_metadata
from dbt.adapters.spark_ivm.delta.records import commit_metadata
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, show_tables_like
from dbt.adapters.spark_ivm.settings import JoinStateSetting
from ivm_compiler import TableName, emit, key_bounds
from ivm_compiler import join_states as compiler
from ivm_compiler.changes import JoinReads
from ivm_compiler.plan import ViewPlan
from ivm_compiler.reads import VersionRange

NONE, AUTO, ALL = JoinStateSetting.NONE, JoinStateSetting.AUTO, JoinStateSetting.ALL
SETTINGS = tuple(JoinStateSetting)

# 'auto': a source smaller than this is read directly (a small dimension's
# scan costs less than a MERGE into its join state).
AUTO_MIN_BYTES = 1 << 30
# 'auto': the share of a source's columns a join state may keep and still be
# worth its upkeep (TPC-H Q3 reads 4 of lineitem's 16 columns).
AUTO_MAX_COLUMN_SHARE = 0.25

# 'auto': a kept join state whose source changed in this many of the model's
# last AUTO_DROP_WINDOW refreshes is dropped (measured on TPC-H SF 1, inputs
# that changed in every refresh made the join refreshes 2.4-3x slower).
AUTO_DROP_CHANGED = 3
AUTO_DROP_WINDOW = 4

# Commits of a join state read to find the one of a source version.
HISTORY_LIMIT = 20


class Runner(Protocol):
    def execute(self, sql: str) -> None: ...

    def query(self, sql: str) -> tuple[list[str], Sequence[Sequence[Any]]]: ...


@dataclass(frozen=True)
class Commit:
    """One join state commit: its Delta version, and the source version its rows hold."""

    version: int
    source_version: int
    guard: str
    fingerprint: str


@dataclass(frozen=True)
class SourceFacts:
    """What 'auto' weighs: the source's size and how many columns it has."""

    size_bytes: int
    column_count: int


def _no_commit() -> None:
    raise RuntimeError("JoinStates needs a commit runner to write a join state")


@dataclass
class JoinStates:
    runner: Runner
    log: Log
    model: str
    target: TableName
    setting: str | list[str] = NONE
    relation_exists: Callable[[TableName], str | None] = lambda table: None
    drop_relation: Callable[[TableName, str], None] = lambda table, kind: None
    relation_created: Callable[[TableName, str], None] = lambda table, kind: None
    source_facts: Callable[[TableName], SourceFacts | None] = lambda table: None
    # Runs one committing statement with commit metadata attached (Refresh._commit).
    commit: Callable[[str, dict[str, Any]], Any] = lambda statement, metadata: _no_commit()
    # The source versions the model's recent refresh commits recorded, oldest first.
    recent_refreshes: Callable[[], list[dict[TableName, int]]] = list

    # -- which inputs ----------------------------------------------------------

    def chosen(self, plan: ViewPlan, building: bool) -> list[compiler.JoinInput]:
        """The inputs that keep a join state in this refresh.

        'auto' decides at a build only; an incremental refresh keeps the join
        states that exist. An alias in a list that cannot keep one stops the
        refresh before it writes anything.
        """
        possible = compiler.candidates(plan)
        if isinstance(self.setting, list):
            by_alias = {c.alias: c for c in possible}
            unknown = [a for a in self.setting if a.lower() not in by_alias]
            if unknown:
                can = ", ".join(sorted(by_alias)) or "none of its inputs"
                raise CompilationError(
                    f"Model '{self.model}': ivm_join_state names "
                    f"{', '.join(repr(a) for a in unknown)}, which cannot keep a join state "
                    f"(inputs that can: {can}; a join state needs an inner join of plain "
                    "sources, no set operation or window, and no floating-point, map, "
                    "array or struct column read). Fix: list only those aliases, or set "
                    "ivm_join_state to 'auto' or 'none'."
                )
            return [by_alias[a.lower()] for a in dict.fromkeys(self.setting)]
        if self.setting == ALL:
            return possible
        if self.setting == AUTO:
            if building:
                return [c for c in possible if self._pays(c)]
            existing = [c for c in possible if self.relation_exists(c.relation(self.target))]
            return [c for c in existing if self._still_pays(c)] if existing else []
        return []

    def _still_pays(self, join_input: compiler.JoinInput) -> bool:
        """'auto': whether a kept join state's source changes rarely enough to keep it."""
        recorded = self.recent_refreshes()[-AUTO_DROP_WINDOW - 1 :]
        versions = [r.get(join_input.table) for r in recorded]
        changed = sum(1 for a, b in pairwise(versions) if a is not None and a != b)
        if changed < AUTO_DROP_CHANGED:
            return True
        self.log.info(
            f"{self.model}: ivm_join_state 'auto' drops the join state of "
            f"{join_input.alias!r}: {join_input.table} changed in {changed} of the model's "
            f"last {len(versions) - 1} refreshes, so it would cost a MERGE nearly every refresh"
        )
        return False

    def _pays(self, join_input: compiler.JoinInput) -> bool:
        facts = self.source_facts(join_input.table)
        if facts is None or facts.size_bytes < AUTO_MIN_BYTES:
            return False
        narrow = len(join_input.columns) <= AUTO_MAX_COLUMN_SHARE * max(facts.column_count, 1)
        return narrow or join_input.filtered

    # -- build -------------------------------------------------------------------

    def build(self, plan: ViewPlan, pinned: dict[TableName, SourceSnapshot]) -> None:
        """(Re)create the chosen join states at the build's versions; drop the others."""
        kept = self.chosen(plan, building=True)
        for join_input in kept:
            self._create(join_input, pinned[join_input.table], None, "the model was built")
        self.drop_others(keep=kept)

    def drop_others(self, keep: Sequence[compiler.JoinInput] = ()) -> None:
        """Drop the model's join states but those in `keep`."""
        if self.target.db is None:
            return
        prefix = f"{self.target.name}{compiler.JOIN_STATE_INFIX}".lower()
        current = {str(c.relation(self.target).name).lower() for c in keep}
        columns, rows = self.runner.query(show_tables_like(self.target.db, f"{prefix}*"))
        for row in rows:
            name = str(row[columns.index("tableName")]).lower()
            if name in current or not name.startswith(prefix):
                continue
            stale = TableName(db=self.target.db, name=name)
            self.log.info(f"{self.model}: dropping the join state {stale}, no longer kept")
            self.drop_relation(stale, "table")

    def drop_unkept(self, plan: ViewPlan, kept: Sequence[compiler.JoinInput]) -> None:
        """After a refresh: drop the join states of inputs no longer kept (the setting changed)."""
        names_kept = {c.alias for c in kept}
        for join_input in compiler.candidates(plan):
            relation = join_input.relation(self.target)
            if join_input.alias not in names_kept and self.relation_exists(relation) is not None:
                self.log.info(f"{self.model}: dropping the join state {relation}, no longer kept")
                self.drop_relation(relation, "table")

    # -- refresh -----------------------------------------------------------------

    def prepare(
        self,
        plan: ViewPlan,
        windows: dict[TableName, VersionRange],
        pinned: dict[TableName, SourceSnapshot],
        bounds: key_bounds.Bounds | None = None,
    ) -> tuple[JoinReads, list[compiler.JoinInput]]:
        """Bring each kept join state to its pinned version; its reads at both window ends.

        Returns the reads and the join states kept, so the caller can drop
        the ones no longer kept after its MERGE.
        """
        kept = self.chosen(plan, building=False)
        reads: dict[str, dict[int, Any]] = {}
        for join_input in kept:
            window = windows[join_input.table]
            relation = join_input.relation(self.target)
            at_recorded, latest = self.locate(join_input, relation, window)
            if (
                at_recorded is None
                or latest is None
                or latest.fingerprint != join_input.fingerprint
                or latest.source_version > window.pinned
            ):
                if latest is None:
                    reason = "it did not exist"
                elif latest.fingerprint != join_input.fingerprint:
                    reason = "the columns or conditions it keeps changed"
                else:
                    reason = f"it held no commit of {join_input.table} version {window.recorded}"
                at_recorded = self._create(
                    join_input, pinned[join_input.table], window.recorded, reason
                )
                latest = at_recorded
            at_pinned = latest
            if latest.source_version < window.pinned:
                at_pinned = self._upkeep(
                    join_input,
                    pinned[join_input.table],
                    _upkeep_range(latest.source_version, window),
                    latest,
                    # The probe's bounds hold for the refresh's window; an upkeep
                    # from a later version (after a failed refresh) reads a
                    # part of it, whose keys lie within them too.
                    bounds,
                )
            reads[join_input.alias] = {
                window.recorded: compiler.read(join_input, relation, at_recorded.version),
                window.pinned: compiler.read(join_input, relation, at_pinned.version),
            }
        return reads, kept

    def locate(
        self, join_input: compiler.JoinInput, relation: TableName, window: VersionRange
    ) -> tuple[Commit | None, Commit | None]:
        """The join state's commit holding the window's recorded version, and its newest.

        Read-only (explain shows what prepare would do from the same answer).
        """
        commits = self.history(join_input, relation)
        at_recorded = next((c for c in commits if c.source_version == window.recorded), None)
        return at_recorded, commits[0] if commits else None

    def history(self, join_input: compiler.JoinInput, relation: TableName) -> list[Commit]:
        """The join state's commits, newest first (none if it does not exist)."""
        if self.relation_exists(relation) is None:
            return []
        columns, rows = self.runner.query(describe_history(relation, HISTORY_LIMIT))
        found = []
        for row in sorted(rows, key=lambda r: -int(r[columns.index("version")])):
            metadata = load_metadata(row[columns.index("userMetadata")])
            if metadata is None or str(metadata.get("state")).lower() != str(relation):
                continue
            source = (metadata.get("sources") or {}).get(str(join_input.table).lower())
            if not source:
                continue
            found.append(
                Commit(
                    version=int(row[columns.index("version")]),
                    source_version=int(source["version"]),
                    guard=str(metadata.get("guard")),
                    fingerprint=str(metadata.get("fingerprint")),
                )
            )
        return found

    def _create(
        self,
        join_input: compiler.JoinInput,
        source: SourceSnapshot,
        version: int | None,
        reason: str,
    ) -> Commit:
        """CREATE OR REPLACE a join state at `version` of its source (None: the pinned one)."""
        relation = join_input.relation(self.target)
        version = source.version if version is None else version
        guard = uuid.uuid4().hex
        self.log.info(
            f"{self.model}: building the join state {relation} of input "
            f"{join_input.alias!r} at {join_input.table} version {version} ({reason})"
        )
        self.commit(
            emit.create_join_state(join_input, relation, version, guard),
            self._metadata(relation, source, version, join_input.fingerprint, guard),
        )
        self.relation_created(relation, "table")
        return Commit(self._latest_version(relation), version, guard, join_input.fingerprint)

    def _upkeep(
        self,
        join_input: compiler.JoinInput,
        source: SourceSnapshot,
        window: VersionRange,
        latest: Commit,
        bounds: key_bounds.Bounds | None = None,
    ) -> Commit:
        """One guarded MERGE of the source's change rows in `window` into the join state."""
        relation = join_input.relation(self.target)
        guard = uuid.uuid4().hex
        self.log.debug(
            f"{self.model}: bringing the join state {relation} from {join_input.table} "
            f"version {window.recorded} to {window.pinned}"
        )
        self.commit(
            emit.merge_join_state(
                join_input, relation, window, emit.Guard(read=latest.guard, write=guard), bounds
            ),
            self._metadata(relation, source, window.pinned, join_input.fingerprint, guard),
        )
        return Commit(self._latest_version(relation), window.pinned, guard, join_input.fingerprint)

    def _metadata(
        self,
        relation: TableName,
        source: SourceSnapshot,
        version: int,
        fingerprint: str,
        guard: str,
    ) -> dict[str, Any]:
        """A join state commit's metadata: the source version its rows hold, and its guard."""
        # The pin's size is of the pinned version, not this one: not recorded.
        at_version = replace(source, version=version, size_bytes=None)
        return commit_metadata(guard, relation, fingerprint, [at_version], guard=guard)

    def _latest_version(self, relation: TableName) -> int:
        columns, rows = self.runner.query(describe_history(relation, limit=1))
        return int(rows[0][columns.index("version")])


def _upkeep_range(held: int, window: VersionRange) -> VersionRange:
    """The source's versions a join state holding `held` is brought over to `window`'s pin.

    From the window's recorded version, as a refresh after a successful one
    finds it, the upkeep reads the change from the refresh's stage of it,
    if it staged one (emit.stage_feeds: the columns the model reads, which
    hold the join state's), where it would read the feed once more.

    >>> _upkeep_range(4, VersionRange(4, 6, staged="s")).staged
    's'
    >>> _upkeep_range(5, VersionRange(4, 6, staged="s"))
    VersionRange(recorded=5, pinned=6)
    """
    upkeep = VersionRange(recorded=held, pinned=window.pinned)
    return replace(upkeep, staged=window.staged) if held == window.recorded else upkeep
