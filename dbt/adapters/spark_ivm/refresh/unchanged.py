"""The no-change shortcut: a view that already shows its query at every source's pin.

Each publication records on the model's view what its state reflects
(`SOURCES_PROPERTY`: every source's version and the commit time that tells
the table from a re-created one, as the state's commit metadata records
them) and what the model was compiled from (`KEY_PROPERTY`, `refresh_key`:
its SQL, its settings, the materializations of the models it reads, the
plugin and state format). A refresh with the view's key whose sources are
still at those versions has nothing to apply. It knows so from the view's
properties and text, the sources' pins and the properties of upstream ivm
models' views alone (an upstream of another consistency group is read at
the state its view shows, and that view's own record, hashed by
`upstream_digest`, says which rows those are): no compile (DESCRIBE QUERYs,
dbt's listing of the sources, 0.2-0.5 s of Python) and no read of the
state's history (a Spark job, 0.2-0.5 s even on an unchanged table).
Anything else takes the whole path (recipe.py), which decides the same in
these cases.

Why the view's record and not the state's: the view reads its state at a
fixed version, and a Delta version never changes, so what the view shows
is the query at the recorded source versions whatever was written to the
state since (a group member staged and not yet published, an UPDATE by
hand); the whole path deals with such writes at the next change. The
view's text must read the version its properties name: an ALTER VIEW by
hand would otherwise go unseen.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from sqlglot import exp, parse_one

from dbt.adapters.spark_ivm.__version__ import version as plugin_version
from dbt.adapters.spark_ivm.consistency.publish import Runner
from dbt.adapters.spark_ivm.delta.tables import SourceSnapshot, source_identity, versions_of
from dbt.adapters.spark_ivm.refresh.decision import NO_SOURCE_COMMITS, ONLY_PRESERVING_COMMITS
from dbt.adapters.spark_ivm.refresh.state_history import table_name_of
from dbt.adapters.spark_ivm.refresh.upstreams import properties, version_read, view_text
from dbt.adapters.spark_ivm.settings import RefreshSettings
from ivm_compiler import InvalidSource, TableName, emit
from ivm_compiler.compile import STATE_FORMAT_VERSION
from ivm_compiler.sql import DIALECT

# The view properties a publication writes besides emit's.
KEY_PROPERTY = "spark_ivm.refresh_key"
SOURCES_PROPERTY = "spark_ivm.published_sources"
# Marks a source entry that only the model's plan nodes read: the refresh's
# result names the model's own sources only.
THROUGH_NODES = "through_nodes"
# An upstream ivm model's entry: what its view showed (upstream_digest).
UPSTREAM = "upstream"

# How a refresh reads each source, as the check is told (recipe.py): a plain
# Delta table (and a model built by ivm_fallback, a table written in place) is
# pinned; an ivm model of another consistency group is read at the state its
# view shows. Anything else (a `table` or `seed` model, a member of the
# model's own group) takes the whole path.
SOURCE = "source"
PUBLISHED = "published"

# Settings that never change what a refresh compiles: a full refresh never
# takes the shortcut, a view with docs is recreated on every run, and the
# readers only weigh how a recompute writes (refresh/handoff.py).
_NOT_KEYED = frozenset({"full_refresh", "docs", "readers"})


def refresh_key(
    sql: str, settings: RefreshSettings, upstream_materializations: Mapping[str, str]
) -> str:
    """What a model's plan is compiled from, hashed: equal keys compile equal plans.

    >>> key = refresh_key("select 1", RefreshSettings(), {})
    >>> key == refresh_key("select 1", RefreshSettings(full_refresh=True), {})
    True
    >>> key == refresh_key("select 2", RefreshSettings(), {})
    False
    """
    described = {
        "plugin": plugin_version,
        "state_format": STATE_FORMAT_VERSION,
        "sql": sql,
        "settings": {
            f.name: getattr(settings, f.name) for f in fields(settings) if f.name not in _NOT_KEYED
        },
        "upstream": sorted((k.lower(), v) for k, v in upstream_materializations.items()),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def upstream_digest(view_properties: Mapping[str, str]) -> str | None:
    """What an ivm model's view shows, hashed: its state version and the record behind it.

    Equal digests mean equal rows: the same key and source versions give the
    same query over the same source snapshots (None: a view without a record).

    >>> shown = {KEY_PROPERTY: "k", SOURCES_PROPERTY: "{}", emit.STATE_VERSION_PROPERTY: "3"}
    >>> upstream_digest(shown) == upstream_digest({**shown, emit.STATE_VERSION_PROPERTY: "4"})
    False
    >>> upstream_digest({emit.STATE_VERSION_PROPERTY: "3"}) is None
    True
    """
    names = (emit.STATE_VERSION_PROPERTY, KEY_PROPERTY, SOURCES_PROPERTY)
    parts = [view_properties.get(name) for name in names]
    if any(part is None for part in parts):
        return None
    return hashlib.sha256("\n".join(str(part) for part in parts).encode()).hexdigest()[:32]


def sources_property(
    recorded: Sequence[SourceSnapshot],
    read: Iterable[TableName],
    upstreams: Mapping[TableName, Mapping[str, str]] | None = None,
) -> str:
    """SOURCES_PROPERTY's value: each recorded source's identity.

    `read`: the model's own sources; `upstreams`: the view properties of the
    upstream ivm models among them, as the compile read them. An upstream's
    digest is recorded only where it was read at the state its view showed
    (not a member of the same group read at the state it had just written).
    """
    own = {str(table).lower() for table in read}
    shown = {str(table).lower(): p for table, p in (upstreams or {}).items()}
    entries: dict[str, dict[str, Any]] = {}
    for source in recorded:
        entry = source_identity(source)
        key = str(source.table).lower()
        if key not in own:
            entry[THROUGH_NODES] = True
        view = shown.get(key, {})
        digest = upstream_digest(view)
        if digest is not None and view[emit.STATE_VERSION_PROPERTY] == str(source.version):
            entry[UPSTREAM] = digest
        entries[str(source.table)] = entry
    return json.dumps(entries, sort_keys=True)


@dataclass(frozen=True)
class Publication:
    """What a model's view says it shows, from its properties."""

    state_version: int
    sources: Mapping[TableName, Mapping[str, Any]]

    @classmethod
    def of(cls, view_properties: Mapping[str, str], key: str) -> Publication | str:
        """The view's record when it was published from `key`; else why it cannot tell."""
        if view_properties.get(KEY_PROPERTY) != key:
            return "its view was published from other SQL or settings, or by another plugin version"
        recorded = view_properties.get(SOURCES_PROPERTY)
        shown = view_properties.get(emit.STATE_VERSION_PROPERTY)
        if recorded is None or shown is None:
            return "its view does not record the versions it shows"
        return cls(
            state_version=int(shown),
            sources={table_name_of(name): e for name, e in json.loads(recorded).items()},
        )

    @property
    def read(self) -> list[TableName]:
        """The sources the model itself reads (not only through its plan nodes)."""
        return [t for t, entry in self.sources.items() if not entry.get(THROUGH_NODES)]


@dataclass(frozen=True)
class Unchanged:
    """A model whose view shows its query at every source's pin: NO_CHANGE, and why."""

    publication: Publication
    # The version each source is read at now (the pin, or an upstream's shown state).
    versions: Mapping[TableName, int]
    reason: str
    # The view's text, which a consistency group's commit records for the member.
    view_sql: str


def compare(
    entries: Mapping[TableName, Mapping[str, Any]],
    pinned: Mapping[TableName, SourceSnapshot],
) -> str | None:
    """Why the pins differ from the recorded entries (None: no change); pure.

    A source is unchanged at its recorded version, or after it with only
    commits that keep its rows (OPTIMIZE, VACUUM, property changes), and only
    when the history tells it is the same table (delta.tables.SourceSnapshot.same_table).
    """
    preserving = False
    for table, entry in entries.items():
        snapshot = pinned[table]
        recorded = int(entry["version"])
        if snapshot.same_table(entry) is not True:
            return f"{table} may not be the table recorded at version {recorded}"
        if snapshot.version == recorded:
            continue
        if snapshot.version > recorded and snapshot.only_preserving_data_after(recorded):
            preserving = True
            continue
        return f"{table} is at version {snapshot.version}, recorded at {recorded}"
    return ONLY_PRESERVING_COMMITS if preserving else None


def compare_upstream(
    table: TableName, entry: Mapping[str, Any], shown: Mapping[str, str]
) -> str | None:
    """Why an upstream ivm model's view shows other rows than recorded (None: the same); pure."""
    digest = upstream_digest(shown)
    if digest is None or digest != entry.get(UPSTREAM):
        return f"the upstream ivm model {table} shows another state than recorded"
    return None


def check(
    runner: Runner,
    target: TableName,
    state: TableName,
    view_properties: Mapping[str, str],
    key: str,
    pin: Callable[[TableName], SourceSnapshot],
    read_as: Callable[[TableName], str],
    upstream_properties: dict[TableName, dict[str, str]] | None = None,
) -> Unchanged | str:
    """NO_CHANGE from the view's record, or why the refresh must take the whole path.

    Besides the view's properties (which the whole path reads too): the
    sources' pins (which it reuses, as do the invocation's other models),
    the properties of upstream ivm models' views (kept in
    `upstream_properties` for the whole path's compile), and, only when all
    match, the view's text.
    """
    publication = Publication.of(view_properties, key)
    if isinstance(publication, str):
        return publication
    ways = {table: read_as(table) for table in publication.sources}
    others = [f"{t} ({way})" for t, way in ways.items() if way not in (SOURCE, PUBLISHED)]
    if others:
        return f"it reads {', '.join(others)}, which the whole path pins"
    sources = {t: e for t, e in publication.sources.items() if ways[t] == SOURCE}
    try:
        pinned = {table: pin(table) for table in sources}
    except InvalidSource as invalid:
        return str(invalid)
    differs = compare(sources, pinned)
    if differs is not None and differs != ONLY_PRESERVING_COMMITS:
        return differs
    versions = versions_of(pinned)
    for table, entry in publication.sources.items():
        if ways[table] == PUBLISHED:
            shown = properties(runner, table)
            if upstream_properties is not None:
                upstream_properties[table] = shown
            upstream = compare_upstream(table, entry, shown)
            if upstream is not None:
                return upstream
            versions[table] = int(entry["version"])
    text = view_text(runner, target)
    view = parse_one(text, read=DIALECT) if text else None
    if view is None or version_read(view, state) != publication.state_version:
        return f"its view does not read {state} at the version its properties name"
    return Unchanged(
        publication=publication,
        versions=versions,
        reason=differs or NO_SOURCE_COMMITS,
        view_sql=exp.Create(this=target.to_table(), kind="VIEW", replace=True, expression=view).sql(
            dialect=DIALECT
        ),
    )
