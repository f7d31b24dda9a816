"""A source's SHOW TBLPROPERTIES, read once for the compile and the pin (pins.Pins.properties)."""

from __future__ import annotations

import logging

from dbt.adapters.spark_ivm.refresh.pins import InvocationPins, Pins
from ivm_compiler import TableName

SOURCE = TableName("raw", "orders")
MODEL = TableName("marts", "revenue")


class Properties:
    """A runner answering SHOW TBLPROPERTIES, counting the statements per table."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def query(self, sql: str):
        assert sql.startswith("SHOW TBLPROPERTIES"), sql
        self.read.append(sql.split()[-1].replace("`", ""))
        return ["key", "value"], [["delta.minReaderVersion", "1"]]

    def execute(self, sql: str) -> None:
        raise AssertionError(sql)


def pins(runner: Properties, invocation: InvocationPins | None = None) -> Pins:
    return Pins(
        runner=runner,
        log=logging.getLogger("test"),
        model="m",
        target=TableName("marts", "m"),
        upstream_materializations={str(MODEL): "ivm"},
        invocation=invocation,
    )


def test_a_refresh_reads_each_relations_properties_once():
    runner = Properties()
    refresh = pins(runner)
    for _ in range(2):
        assert refresh.properties(SOURCE) == {"delta.minReaderVersion": "1"}
        refresh.properties(MODEL)
    assert runner.read == ["raw.orders", "marts.revenue"]


def test_a_sources_properties_serve_the_invocations_other_models_a_models_do_not():
    runner = Properties()
    invocation = InvocationPins("i")
    pins(runner, invocation).properties(SOURCE)
    pins(runner, invocation).properties(MODEL)
    later = pins(runner, invocation)
    later.properties(SOURCE)
    later.properties(MODEL)
    # A dbt model may be rebuilt by an earlier model of the same invocation.
    assert runner.read == ["raw.orders", "marts.revenue", "marts.revenue"]


def test_a_state_is_read_anew():
    runner = Properties()
    refresh = pins(runner, InvocationPins("i"))
    state = TableName("marts", "revenue__ivm_state")
    refresh.properties(state, share=False)
    refresh.properties(state, share=False)
    assert runner.read == ["marts.revenue__ivm_state"] * 2
