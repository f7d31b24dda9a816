"""SparkIvmAdapter: dbt-spark plus the few methods the ivm materialization calls.

Everything dbt-spark does is inherited unchanged. The ivm materialization
reaches Python through `ivm_refresh`, which runs a whole refresh (refresh/recipe.py)
and returns what it did; refusals become dbt CompilationErrors here, at the
adapter boundary, before any SQL has changed data.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path
from typing import Any

from dbt.adapters.base import available
from dbt.adapters.base.relation import AdapterTrackingRelationInfo, BaseRelation
from dbt.adapters.contracts.relation import RelationConfig, RelationType
from dbt.adapters.events.logging import AdapterLogger
from dbt.adapters.spark.connections import SparkConnectionMethod
from dbt.adapters.spark.impl import SparkAdapter
from dbt_common.exceptions import CompilationError, DbtRuntimeError

from dbt.adapters.spark_ivm import __version__
from dbt.adapters.spark_ivm.config import (
    validate_model_config,
    validate_relation_name,
    validate_schema_name,
)
from dbt.adapters.spark_ivm.connections import SparkIvmConnectionManager
from dbt.adapters.spark_ivm.consistency.groups import (
    GroupRun,
    consistency_groups,
    members_from_graph,
)
from dbt.adapters.spark_ivm.consistency.publish import COMMIT_LOG_NAME, Publisher
from dbt.adapters.spark_ivm.consistency.strict import StrictReads
from dbt.adapters.spark_ivm.delta.confs import SINGLE_SESSION_CONF, conf_value, read_conf
from dbt.adapters.spark_ivm.delta.tables import CHANGE_FEED_PROPERTY, DELTA_PROTOCOL_PROPERTY
from dbt.adapters.spark_ivm.engine import Engine, engine_of
from dbt.adapters.spark_ivm.operations import comparison
from dbt.adapters.spark_ivm.operations.explain import explain, group_lines, write_statements
from dbt.adapters.spark_ivm.operations.housekeeping import (
    Relation,
    find_orphans,
    ivm_models,
    model_schemas,
    report,
)
from dbt.adapters.spark_ivm.refresh.pins import InvocationPins
from dbt.adapters.spark_ivm.refresh.recipe import (
    ConcurrentRefresh,
    Refresh,
    RefreshResult,
    Relations,
)
from dbt.adapters.spark_ivm.refresh.schema_changes import ModelColumnsChanged
from dbt.adapters.spark_ivm.refresh.state_history import table_name_of
from dbt.adapters.spark_ivm.settings import Action, RefreshSettings
from ivm_compiler import InvalidSource, NotMaintainable, TableName, names
from ivm_compiler.emit import (
    QUERY_AT_VERSIONS_PROPERTY,
    QUERY_PROPERTY,
    STATE_PROPERTY,
    ViewDocs,
    set_properties,
)
from ivm_compiler.errors import StateFormRefused

logger = AdapterLogger("SparkIvm")

# The consistency groups of the running invocation (dbt creates adapters anew
# between invocations in one process, so this lives at module level).
_GROUP_RUNS: dict[str, GroupRun] = {}
_GROUP_RUNS_LOCK = threading.Lock()
# Whether the Thrift server at (host, port) serves every connection from one
# Spark session (delta.confs.SINGLE_SESSION_CONF), read once per process.
_SHARED_SESSION: dict[tuple[str, int], bool] = {}
_SHARED_SESSION_LOCK = threading.Lock()
# The sources pinned in the running invocation, shared by its models (refresh/pins.py).
_INVOCATION_PINS: dict[str, InvocationPins] = {}
_INVOCATION_PINS_LOCK = threading.Lock()
# The strict reads of the running invocation: one commit per group (consistency/strict.py).
_STRICT_READS: dict[str, StrictReads] = {}
_STRICT_READS_LOCK = threading.Lock()

STATE_SUFFIX = names.STATE_SUFFIX


class SparkIvmAdapter(SparkAdapter):
    ConnectionManager = SparkIvmConnectionManager

    @classmethod
    def type(cls) -> str:
        return "spark_ivm"

    @classmethod
    def get_adapter_run_info(cls, config: RelationConfig) -> AdapterTrackingRelationInfo:
        # The base derives the module from the class name (dbt.adapters.sparkivm);
        # report dbt-spark's tracking info under our own name and version.
        # (dbt-common's frozen dataclass declares __hash__ abstract; it is generated.)
        return AdapterTrackingRelationInfo(  # type: ignore[abstract]
            adapter_name="spark_ivm",
            base_adapter_version=import_module("dbt.adapters.__about__").version,
            adapter_version=__version__.version,
            model_adapter_details=cls._get_adapter_specific_run_info(config),
        )

    @available
    def ivm_state_relation(self, relation: BaseRelation) -> BaseRelation:
        """The Delta table holding the model's rows and bookkeeping columns."""
        return relation.incorporate(
            path={"identifier": f"{relation.identifier}{STATE_SUFFIX}"}, type="table"
        )

    @available
    def ivm_refresh(
        self,
        relation: BaseRelation,
        sql: str,
        model_id: str,
        config: dict[str, Any],
        full_refresh: bool,
        docs: dict[str, Any] | None = None,
        upstream: dict[str, str] | None = None,
        graph: dict[str, Any] | None = None,
        selected: list[str] | None = None,
        invocation_id: str | None = None,
    ) -> RefreshResult:
        """Bring the ivm model up to date with its sources; see refresh/recipe.py for the protocol.

        `graph` (dbt's flat graph), `selected` (the invocation's selected
        resources) and `invocation_id` place the model in its consistency group.
        """
        validate_model_config(model_id, config)
        validate_relation_name(model_id, "schema", relation.schema)
        validate_relation_name(model_id, "alias", relation.identifier)
        settings = _read_settings(config, graph, model_id, full_refresh, _view_docs(docs))
        group_run = self._group_run(graph, selected, invocation_id)
        publisher = Publisher(
            runner=_AdapterRunner(self),
            log=logger,
            model=model_id,
            commit_log=self._commit_log(),
            group_run=group_run,
            progress=group_run.progress(model_id) if group_run else None,
            relation_exists=lambda table: self._relation_type(relation, table),
            own_session=self._own_session(),
        )
        refresh = self._refresh_of(
            relation, sql, model_id, upstream, settings, publisher, _invocation_pins(invocation_id)
        )
        if group_run is not None and not group_run.repaired:
            with group_run.lock:
                if not group_run.repaired:
                    publisher.repair()
                    group_run.repaired = True
        try:
            result = refresh.run()
        except NotMaintainable as refusal:
            publisher.fail(refusal)
            raise CompilationError(str(refusal)) from refusal
        except InvalidSource as invalid:
            publisher.fail(invalid)
            raise DbtRuntimeError(str(invalid)) from invalid
        except (ConcurrentRefresh, ModelColumnsChanged) as stopped:
            publisher.fail(stopped)
            raise DbtRuntimeError(str(stopped)) from stopped
        except Exception as error:
            publisher.fail(error)
            raise
        if result.action is not Action.FALLBACK:
            self.cache_added(self.ivm_state_relation(relation))
        logger.info(f"{model_id}: {result.message} in {result.seconds:.2f}s")
        return result

    @available
    def ivm_set_table_properties(self, relation: BaseRelation, properties: dict[str, str]) -> None:
        """Set a fallback table's properties once the materialization built it.

        Its query (what ivm_matches_query compares it with) and, where ivm
        models read it, its change feed (refresh/fallback.py); the change feed
        only on a Delta table.
        """
        shown = self._view_properties(relation)
        wanted = {
            key: value
            for key, value in properties.items()
            if key != CHANGE_FEED_PROPERTY or DELTA_PROTOCOL_PROPERTY in shown
        }
        if wanted and any(shown.get(key) != value for key, value in wanted.items()):
            self.execute(set_properties(_table_name(relation), "TABLE", wanted), fetch=False)

    def list_relations_without_caching(self, schema_relation: BaseRelation) -> list[Any]:
        """dbt-spark's SHOW TABLE EXTENDED IN <schema>, after refusing a schema name it
        would paste into SQL raw: dbt lists the schemas of a project's models before
        any model runs, so a schema config carrying SQL reaches Spark here first."""
        validate_schema_name(schema_relation.schema)
        return super().list_relations_without_caching(schema_relation)

    def create_schema(self, relation: BaseRelation) -> None:
        """dbt-spark's CREATE SCHEMA, after refusing a name it would paste into SQL raw."""
        validate_schema_name(relation.schema)
        super().create_schema(relation)

    @available
    def ivm_repair_groups(self) -> str:
        """Finish group commits whose views did not all move (run-operation ivm_repair_groups)."""
        log = self._commit_log()
        anchor = self.Relation.create(schema=log.db, identifier=log.name, type=RelationType.Table)
        publisher = Publisher(
            runner=_AdapterRunner(self),
            log=logger,
            model="ivm_repair_groups",
            commit_log=log,
            relation_exists=lambda table: self._relation_type(anchor, table),
            own_session=self._own_session(),
        )
        repaired = publisher.repair()
        return f"ivm_repair_groups: {repaired} unfinished group commit(s) finished (log: {log})"

    @available
    def ivm_committed(self, relation: BaseRelation, invocation_id: str) -> str:
        """A relation to read `relation` at its consistency group's last committed state.

        Backs the ivm_committed macro: a parenthesised SELECT of the member at
        the commit this invocation reads its group at, or the relation itself
        when no group commit names it.
        """
        with _STRICT_READS_LOCK:
            reads = _STRICT_READS.get(invocation_id)
            if reads is None:
                _STRICT_READS.clear()
                reads = _STRICT_READS[invocation_id] = StrictReads(invocation_id)
        log = self._commit_log()
        name = _table_name(relation)
        with _STRICT_READS_LOCK:  # one choice of commit per group, even with threads
            read = reads.read(
                runner=_AdapterRunner(self),
                log=logger,
                commit_log=log,
                commit_log_exists=self._relation_type(relation, log) is not None,
                relation=name,
                state=_table_name(self.ivm_state_relation(relation)),
            )
        if read.commit is None:
            logger.debug(f"ivm_committed({name}): read as is: {read.reason}")
        else:
            logger.debug(
                f"ivm_committed({name}): group {read.commit.group!r} "
                f"at commit {read.commit.commit_id[:12]}"
            )
        return read.sql

    @available
    def ivm_orphans(self, graph: dict[str, Any], drop: bool = False) -> str:
        """List (and with drop, remove) ivm relations of models that are no ivm models now."""
        schemas = model_schemas(graph) | {str(self.config.credentials.schema)}
        relations: list[Relation] = []
        state_read_by: dict[TableName, TableName] = {}
        for schema in sorted(schemas):
            anchor = self.Relation.create(schema=schema)
            for found in self.list_relations_without_caching(anchor):
                name = _table_name(found)
                kind = "view" if str(found.type) == "view" else "table"
                relations.append(Relation(name, kind))
                if kind == "view":
                    state = self._view_properties(found).get(STATE_PROPERTY)
                    if state:
                        state_name = table_name_of(state)
                        state_read_by[name] = TableName(state_name.db or schema, state_name.name)
        orphans = find_orphans(relations, ivm_models(graph), state_read_by)
        if drop:
            for orphan in orphans:
                self._drop(
                    self.Relation.create(schema=orphan.relation.name.db),
                    orphan.relation.name,
                    orphan.relation.kind,
                )
        return report(orphans, dropped=drop)

    def _commit_log(self) -> TableName:
        """The group commit log: one Delta table in the profile's schema."""
        return TableName(db=str(self.config.credentials.schema), name=COMMIT_LOG_NAME)

    def _group_run(
        self, graph: dict[str, Any] | None, selected: list[str] | None, invocation_id: str | None
    ) -> GroupRun | None:
        """The invocation's consistency groups, computed once from the graph and selection."""
        if graph is None or selected is None or invocation_id is None:
            return None
        with _GROUP_RUNS_LOCK:
            run = _GROUP_RUNS.get(invocation_id)
            if run is None:
                groups = consistency_groups(members_from_graph(graph, selected))
                run = GroupRun(invocation_id, groups)
                # One dbt invocation at a time per process; keep only the newest.
                _GROUP_RUNS.clear()
                _GROUP_RUNS[invocation_id] = run
            return run

    @available
    def ivm_explain(
        self,
        relation: BaseRelation,
        model_id: str,
        upstream: dict[str, str] | None = None,
        graph: dict[str, Any] | None = None,
    ) -> str:
        """The plan, state size and refresh SQL of a built ivm model; also written under target/.

        With dbt's `graph`, also the model's consistency group in a run of every
        ivm model of the project, and why it is in it.
        """
        # The model's settings as its refresh reads them: the state's form
        # and join states change the plan and the statements explain shows.
        config = ((graph or {}).get("nodes", {}).get(model_id) or {}).get("config") or {}
        settings = _read_settings(config, graph, model_id)
        refresh = self._refresh_of(
            relation, self._model_sql(relation), model_id, upstream, settings
        )
        group = None
        if graph is not None:
            every_ivm_model = [
                node_id
                for node_id, node in graph.get("nodes", {}).items()
                if (node.get("config") or {}).get("materialized") == "ivm"
            ]
            group = consistency_groups(members_from_graph(graph, every_ivm_model)).get(model_id)
        try:
            explanation = explain(refresh, group_lines(group, model_id))
        except (NotMaintainable, StateFormRefused) as refusal:
            raise CompilationError(str(refusal)) from refusal
        except InvalidSource as invalid:
            raise DbtRuntimeError(str(invalid)) from invalid
        directory = (
            Path(self.config.project_root)
            / self.config.target_path
            / "ivm_explain"
            / str(relation.identifier)
        )
        written = write_statements(explanation, directory)
        sections = [explanation.text]
        for path in written:
            sections.append(f"-- {path}\n{path.read_text().rstrip()}")
        return "\n\n".join(sections)

    def _refresh_of(
        self,
        relation: BaseRelation,
        sql: str,
        model_id: str,
        upstream: dict[str, str] | None,
        settings: RefreshSettings | None = None,
        publisher: Publisher | None = None,
        invocation_pins: InvocationPins | None = None,
    ) -> Refresh:
        state = self.ivm_state_relation(relation)
        return Refresh(
            runner=publisher.runner if publisher else _AdapterRunner(self),
            log=logger,
            model=model_id,
            sql=sql,
            target=_table_name(relation),
            state=_table_name(state),
            settings=settings or RefreshSettings(),
            relations=Relations(
                exists=lambda table: self._relation_type(relation, table),
                drop=lambda table, kind: self._drop(relation, table, kind),
                columns=lambda table: self._source_columns(relation, table),
                created=lambda table, kind: self.cache_added(_relation_at(relation, table, kind)),
            ),
            upstream_materializations={
                str(name).lower(): str(materialized)
                for name, materialized in (upstream or {}).items()
            },
            publisher=publisher,
            invocation_pins=invocation_pins,
            own_session=self._own_session(),
            engine=self._engine,
        )

    def _engine(self) -> Engine:
        """The Spark and Delta the connection talks to (engine.py), asked once per process.

        The embedded runtime is one Spark per process; a Thrift server is one
        per host and port.
        """
        credentials = self.config.credentials
        key = (str(credentials.method), str(credentials.host), credentials.port)
        return engine_of(key, lambda sql: _AdapterRunner(self).query(sql)[1])

    def _own_session(self) -> bool:
        """Whether no other client shares the connection's Spark session (StateWrites.own_session).

        A Spark Thrift Server gives each connection a session of its own unless
        it runs with singleSession; the embedded runtime gives each connection
        one too (runtime/sessions.py).
        """
        credentials = self.config.credentials
        if credentials.method == SparkConnectionMethod.SESSION:
            return True
        if credentials.method != SparkConnectionMethod.THRIFT:
            return False
        key = (str(credentials.host), int(credentials.port))
        with _SHARED_SESSION_LOCK:
            shared = _SHARED_SESSION.get(key)
        if shared is None:
            answer = _AdapterRunner(self).query(read_conf(SINGLE_SESSION_CONF))
            value = conf_value(*answer)
            shared = (value or "false").strip().lower() == "true"
            with _SHARED_SESSION_LOCK:
                _SHARED_SESSION[key] = shared
        return not shared

    @available
    def ivm_model_query(self, relation: BaseRelation) -> str:
        """What an ivm model's view must equal (for ivm_matches_query).

        The model's query with every source read at the version the shown
        state reflects; for a view built before versions were recorded on it,
        the model's compiled SQL as its last build recorded it.
        """
        properties = self._view_properties(relation)
        return properties.get(QUERY_AT_VERSIONS_PROPERTY) or self._model_sql(relation, properties)

    @available
    def ivm_comparison_query(
        self,
        relation: BaseRelation,
        relative_tolerance: float = comparison.DEFAULT_RELATIVE_TOLERANCE,
        absolute_tolerance: float = 0.0,
    ) -> str:
        """The ivm_matches_query test's query: one row when the model differs from its query.

        FLOAT and DOUBLE columns are compared within the tolerances (operations/comparison.py).
        """
        try:
            tolerance = comparison.tolerance(str(relation), relative_tolerance, absolute_tolerance)
        except ValueError as error:
            raise CompilationError(str(error)) from None
        columns = [(c.name, c.dtype) for c in self.get_columns_in_relation(relation)]
        return comparison.query(str(relation), self.ivm_model_query(relation), columns, tolerance)

    def _model_sql(self, relation: BaseRelation, properties: dict[str, str] | None = None) -> str:
        """The compiled SQL an ivm model's view was last built from."""
        properties = self._view_properties(relation) if properties is None else properties
        if QUERY_PROPERTY not in properties:
            raise CompilationError(
                f"{relation} has no recorded query (property {QUERY_PROPERTY}); this applies "
                "to models materialized as 'ivm' that have been built at least once."
            )
        return properties[QUERY_PROPERTY]

    def _view_properties(self, relation: BaseRelation) -> dict[str, str]:
        name = _table_name(relation)
        _, table = self.execute(f"SHOW TBLPROPERTIES {name.sql()}", fetch=True)
        return {str(row[0]): str(row[1]) for row in table.rows}

    def _relation_type(self, anchor: BaseRelation, table: TableName) -> str | None:
        relation = _relation_at(anchor, table, "table")
        # Spark relations have no database: dbt-spark's get_relation takes None
        # there (and reads schema and identifier as given), though its signature says str.
        found = self.get_relation(
            database=None,  # type: ignore[arg-type]
            schema=relation.schema,  # type: ignore[arg-type]
            identifier=relation.identifier,  # type: ignore[arg-type]
        )
        if found is None:
            return None
        return str(found.type) if found.type else "table"

    def _drop(self, anchor: BaseRelation, table: TableName, kind: str) -> None:
        self.drop_relation(_relation_at(anchor, table, kind))

    def _source_columns(self, anchor: BaseRelation, table: TableName) -> list[tuple[str, str]]:
        relation = _relation_at(anchor, table, "table")
        return [(column.column, column.dtype) for column in self.get_columns_in_relation(relation)]


class _AdapterRunner:
    """Runs the refresh's SQL through dbt's connection, so every statement is logged by dbt."""

    def __init__(self, adapter: SparkIvmAdapter) -> None:
        self._adapter = adapter

    def query(self, sql: str) -> tuple[list[str], Sequence[Sequence[Any]]]:
        _, table = self._adapter.execute(sql, fetch=True)
        return list(table.column_names), [list(row.values()) for row in table.rows]

    def execute(self, sql: str) -> None:
        self._adapter.execute(sql, fetch=False)


def _invocation_pins(invocation_id: str | None) -> InvocationPins | None:
    """The invocation's shared source pins (None outside a dbt invocation)."""
    if invocation_id is None:
        return None
    with _INVOCATION_PINS_LOCK:
        pins = _INVOCATION_PINS.get(invocation_id)
        if pins is None:
            # One dbt invocation at a time per process; keep only the newest.
            _INVOCATION_PINS.clear()
            pins = _INVOCATION_PINS[invocation_id] = InvocationPins(invocation_id)
        return pins


def _ivm_readers(graph: dict[str, Any] | None, model_id: str) -> tuple[str, ...] | None:
    """The ivm models of the project that ref this one, as "schema.identifier".

    Its state keeps a change feed only for them, and their refresh histories
    weigh how a recompute of it hands its change on (refresh/handoff.py).
    None without dbt's graph: then one is assumed to read it.
    """
    if graph is None:
        return None
    return tuple(
        sorted(
            f"{node.get('schema')}.{node.get('alias') or node.get('name')}"
            for node in (graph.get("nodes") or {}).values()
            if (node.get("config") or {}).get("materialized") == "ivm"
            and model_id in (node.get("depends_on") or {}).get("nodes", [])
        )
    )


def _read_settings(
    config: dict[str, Any],
    graph: dict[str, Any] | None,
    model_id: str,
    full_refresh: bool = False,
    docs: ViewDocs | None = None,
) -> RefreshSettings:
    """A model's refresh settings, with the ivm models reading it from dbt's graph."""
    readers = _ivm_readers(graph, model_id)
    return RefreshSettings.from_config(
        config,
        full_refresh,
        docs,
        change_feed=readers is None or bool(readers),
        readers=readers or (),
    )


def _view_docs(docs: dict[str, Any] | None) -> ViewDocs | None:
    """persist_docs settings from the materialization -> what the view carries (None: nothing)."""
    if not docs:
        return None
    columns = {
        str(name): str(column.get("description") or "")
        for name, column in (docs.get("columns") or {}).items()
    }
    description = docs.get("relation") or None
    if description is None and not any(columns.values()):
        return None
    return ViewDocs(description=description, columns=columns)


def _relation_at(anchor: BaseRelation, table: TableName, kind: str) -> BaseRelation:
    """A dbt relation for a table the refresh names (unqualified names live in the model's schema)."""
    return anchor.incorporate(
        path={"schema": table.db or anchor.schema, "identifier": table.name}, type=kind
    )


def _table_name(relation: BaseRelation) -> TableName:
    return TableName(db=relation.schema or None, name=str(relation.identifier))
