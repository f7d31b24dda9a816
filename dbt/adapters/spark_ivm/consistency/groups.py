"""Consistency groups: ivm models that share sources refresh from one snapshot and publish together.

The multiple-view-consistency paper's relevant view set: views whose
definitions reach a common source must reflect the same source state
whenever a reader can see them. Here the views are ivm models, and for one
dbt invocation:

- the group is the set of selected ivm models connected by shared inputs
  (a source, a non-ivm model, or an ivm model of the group that another
  member reads); `ivm_group: <name>` puts models in a named group instead,
  and `ivm_group: none` keeps a model on its own;
- every input of the group is pinned once, when its first member starts
  (relations outside the dbt graph are pinned by the member that reads them);
- each member writes its new state (a Delta commit the relation users query
  does not show yet: the view reads its state table at a fixed version);
- when the last member has written, one append to the commit log table (an
  atomic Delta commit) decides the group's new state, and every member's view
  is then re-pointed to its new state version (metadata only, no data moves).

Holding each member's change until every member's is in, then committing
them together, is the paper's Painting algorithm with Delta versions as the
action lists.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ivm_compiler import TableName

# The ivm_group value that keeps a model out of every group.
NO_GROUP = "none"


@dataclass(frozen=True)
class Member:
    """A selected ivm model as the dbt graph describes it."""

    model_id: str
    name: str
    relation: TableName
    # Every relation it reads (sources and models), lower-case "schema.name".
    inputs: frozenset[str]
    # Its ivm_group config: a name, NO_GROUP, or None (grouped by shared inputs).
    group: str | None = None
    # (input, what it is): 'source', or the materialization of the model read.
    input_kinds: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Group:
    name: str
    # Members in the order dbt's graph lists them.
    members: tuple[Member, ...]

    @property
    def inputs(self) -> frozenset[str]:
        """The relations the group reads that are not its own members."""
        own = {str(m.relation).lower() for m in self.members}
        return frozenset(i for m in self.members for i in m.inputs if i not in own)

    @property
    def base_inputs(self) -> dict[str, str]:
        """Inputs that are sources or non-ivm models (pinned together), with their kind."""
        own = {str(m.relation).lower() for m in self.members}
        return {
            key: kind
            for m in self.members
            for key, kind in m.input_kinds
            if key not in own and kind != "ivm"
        }

    def member(self, model_id: str) -> Member:
        return next(m for m in self.members if m.model_id == model_id)


def consistency_groups(members: Iterable[Member]) -> dict[str, Group]:
    """model_id -> its group: connected components over shared inputs, or named groups.

    >>> def m(name, inputs, group=None):
    ...     return Member(f"model.p.{name}", name, TableName("a", name), frozenset(inputs), group)
    >>> groups = consistency_groups([
    ...     m("x", {"raw.src"}), m("y", {"raw.src", "raw.dim"}), m("z", {"raw.other"}),
    ...     m("w", {"a.y"}), m("solo", {"raw.src"}, "none"), m("n1", {"raw.q"}, "nightly"),
    ...     m("n2", {"raw.r"}, "nightly")])
    >>> sorted({g.name: [x.name for x in g.members] for g in groups.values()}.items())
    ... # doctest: +NORMALIZE_WHITESPACE
    [('nightly', ['n1', 'n2']), ('solo', ['solo']), ('y', ['x', 'y', 'w']), ('z', ['z'])]
    """
    members = list(members)
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for member in members:
        node = f"member:{member.model_id}"
        find(node)
        if member.group == NO_GROUP:
            continue
        if member.group:
            union(node, f"group:{member.group}")
            continue
        # A member is reachable through its own relation (an ivm model read by
        # another member) and through every relation it reads.
        union(node, f"relation:{str(member.relation).lower()}")
        for relation in member.inputs:
            union(node, f"relation:{relation}")

    components: dict[str, list[Member]] = {}
    for member in members:
        components.setdefault(find(f"member:{member.model_id}"), []).append(member)
    groups: dict[str, Group] = {}
    for component in components.values():
        named = {m.group for m in component if m.group and m.group != NO_GROUP}
        # A default group is named after its alphabetically last member, so the
        # name stays the same from one run to the next while the members do.
        name = named.pop() if named else max(m.name for m in component)
        group = Group(name=name, members=tuple(component))
        for member in component:
            groups[member.model_id] = group
    return groups


def why_grouped(group: Group, model_id: str) -> list[str]:
    """Why a member is in its group: phrases completing "because it ..." (ivm_explain).

    >>> def m(name, inputs, group=None):
    ...     return Member(f"model.p.{name}", name, TableName("a", name), frozenset(inputs), group)
    >>> groups = consistency_groups([m("x", {"raw.src"}), m("y", {"raw.src", "raw.dim"}),
    ...     m("w", {"a.y"}), m("z", {"raw.other"})])
    >>> why_grouped(groups["model.p.y"], "model.p.y")
    ['reads raw.src, as x does', 'is read by w']
    >>> why_grouped(groups["model.p.z"], "model.p.z")
    ['shares no input with another selected ivm model']
    """
    member = group.member(model_id)
    if member.group == NO_GROUP:
        return ["has ivm_group: none, which keeps it on its own"]
    others = [m for m in group.members if m.model_id != model_id]
    if member.group:
        return [f"has ivm_group: {member.group} (in its config, or its folder's +ivm_group)"]
    if not others:
        return ["shares no input with another selected ivm model"]
    reasons = []
    own = {str(m.relation).lower(): m for m in others}
    for relation in sorted(member.inputs):
        if relation in own:
            reasons.append(f"reads {own[relation].name}, a member")
            continue
        sharing = sorted(m.name for m in others if relation in m.inputs)
        if sharing:
            verb = "does" if len(sharing) == 1 else "do"
            reasons.append(f"reads {relation}, as {', '.join(sharing)} {verb}")
    relation = str(member.relation).lower()
    # Every member of a default group shares a relation with another member
    # directly: the group is built from exactly these links.
    return reasons + [
        f"is read by {m.name}" for m in sorted(others, key=lambda m: m.name) if relation in m.inputs
    ]


@dataclass
class Staged:
    """A member's refreshed state, written but not yet shown by its view."""

    model_id: str
    relation: TableName
    state: TableName
    state_version: int
    # CREATE OR REPLACE VIEW reading the state at state_version (with docs, properties);
    # its SELECT reads the member at this state (the strict read path).
    view_sql: str
    action: str
    seconds: float
    source_versions: dict[str, int]
    # Whether the view already reads state_version (nothing to re-point).
    published: bool = False
    # The statements that point the existing view at state_version.
    publish_sql: tuple[str, ...] = ()


@dataclass
class GroupProgress:
    """One group's run: its pins, its staged members, whether one failed."""

    group: Group
    pins: dict[str, Any] = field(default_factory=dict)
    # Its members as the members reading them pinned them (refresh/pins.py).
    member_pins: dict[str, Any] = field(default_factory=dict)
    staged: dict[str, Staged] = field(default_factory=dict)
    withdrawn: set[str] = field(default_factory=set)
    failed: str | None = None
    started: float = field(default_factory=time.monotonic)
    committed: bool = False
    # Groups whose states refreshed in this run, not yet published when a
    # member of this one read them (GroupRun.staged_upstream): this group
    # publishes after them, and not at all if one of them does not.
    after: set[str] = field(default_factory=set)

    @property
    def waiting(self) -> set[str]:
        """Members that have neither staged nor withdrawn."""
        return {m.model_id for m in self.group.members} - set(self.staged) - self.withdrawn

    @property
    def complete(self) -> bool:
        return self.failed is None and not self.waiting


class GroupRun:
    """The groups of one dbt invocation, shared by every thread's materializations."""

    def __init__(self, invocation_id: str, groups: Mapping[str, Group]) -> None:
        self.invocation_id = invocation_id
        self._groups = dict(groups)
        self._progress: dict[str, GroupProgress] = {}
        self.lock = threading.RLock()
        self.repaired = False
        # Fallback tables written in this run from states not yet published
        # (refresh/fallback.py), with the groups of those states: an ivm model
        # reading such a table publishes after those groups, as if it had read
        # their states itself.
        self._written_from_staged: dict[str, set[str]] = {}

    def progress(self, model_id: str) -> GroupProgress | None:
        group = self._groups.get(model_id)
        if group is None:
            return None
        with self.lock:
            return self._progress.setdefault(group.name, GroupProgress(group=group))

    def progresses(self) -> list[GroupProgress]:
        """Every group of the run that has started."""
        with self.lock:
            return list(self._progress.values())

    def staged_upstream(self, relation: TableName) -> tuple[GroupProgress, Staged] | None:
        """An ivm model of the run refreshed but not yet published by its group, with that group.

        A reader in another group reads it at its refreshed state, so that one
        dbt invocation carries a change through every layer whatever order
        its threads run the models in (dbt starts a reader once the models it
        refs have finished, not once their group has published); the reader's
        group then publishes only after this one (Publisher). None where the
        model is not a member of this run, has not refreshed, or its group has
        already published or will publish nothing.
        """
        key = str(relation).lower()
        with self.lock:
            for group in {g.name: g for g in self._groups.values()}.values():
                member = next((m for m in group.members if str(m.relation).lower() == key), None)
                if member is None:
                    continue
                progress = self._progress.get(group.name)
                if progress is None or progress.committed or progress.failed is not None:
                    return None
                staged = progress.staged.get(member.model_id)
                if staged is None or staged.published:
                    return None
                return progress, staged
        return None

    def published_in_run(self, relation: TableName) -> int | None:
        """The state version this run's group commit showed `relation` at, if it moved its view.

        A reader that read the view's text before that commit (at compile)
        and pins after it must read this version, not the text's.
        """
        key = str(relation).lower()
        with self.lock:
            for progress in self._progress.values():
                if not progress.committed or progress.failed is not None:
                    continue
                member = next(
                    (m for m in progress.group.members if str(m.relation).lower() == key), None
                )
                staged = progress.staged.get(member.model_id) if member else None
                if staged is not None and not staged.published:
                    return staged.state_version
        return None

    def written_from_staged(self, table: TableName, groups: Iterable[str]) -> None:
        """Record that a fallback table was computed from these groups' unpublished states."""
        with self.lock:
            self._written_from_staged.setdefault(str(table).lower(), set()).update(groups)

    def staged_groups_behind(self, table: TableName) -> set[str]:
        """The groups whose unpublished states `table` was written from in this run."""
        with self.lock:
            return set(self._written_from_staged.get(str(table).lower(), ()))


def members_from_graph(graph: Mapping[str, Any], selected: Iterable[str]) -> list[Member]:
    """The selected ivm models of dbt's flat graph, with the relations each reads."""
    nodes = graph.get("nodes", {})
    sources = graph.get("sources", {})

    def relation_of(node: Mapping[str, Any], identifier_key: str) -> str:
        name = node.get(identifier_key) or node.get("name")
        return f"{node.get('schema')}.{name}".lower()

    members = []
    for model_id in selected:
        node = nodes.get(model_id)
        if not node or node.get("resource_type") != "model":
            continue
        config = node.get("config") or {}
        if config.get("materialized") != "ivm":
            continue
        kinds = []
        for parent_id in (node.get("depends_on") or {}).get("nodes", []):
            if parent_id in sources:
                kinds.append((relation_of(sources[parent_id], "identifier"), "source"))
            elif parent_id in nodes:
                parent = nodes[parent_id]
                materialized = str((parent.get("config") or {}).get("materialized", ""))
                kinds.append((relation_of(parent, "alias"), materialized))
        group = config.get("ivm_group")
        members.append(
            Member(
                model_id=model_id,
                name=str(node.get("name")),
                relation=TableName(
                    db=str(node.get("schema")), name=str(node.get("alias") or node.get("name"))
                ),
                inputs=frozenset(key for key, _ in kinds),
                group=None if group is None else str(group),
                input_kinds=tuple(kinds),
            )
        )
    return members
