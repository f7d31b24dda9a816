"""config.py: ivm_* model configs are checked before any SQL runs."""

from __future__ import annotations

import re
from typing import Any

import pytest
from dbt_common.exceptions import CompilationError

from dbt.adapters.spark_ivm import config
from dbt.adapters.spark_ivm.config import IVM_CONFIGS, validate_model_config
from dbt.adapters.spark_ivm.settings import RefreshSettings

MODEL = "model.shop.orders_by_customer"


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({}, id="no_config"),
        pytest.param(
            {"materialized": "ivm", "schema": "analytics", "tags": ["x"]}, id="dbt_configs"
        ),
        pytest.param({"ivm_fallback": None}, id="fallback_unset"),
        pytest.param({"ivm_fallback": "full_refresh"}, id="fallback_full_refresh"),
        pytest.param({"ivm_group": "nightly-marts_2"}, id="group_named"),
        pytest.param({"ivm_group": "none"}, id="group_opted_out"),
        pytest.param({"ivm_strategy": "auto"}, id="strategy_auto"),
        pytest.param({"ivm_strategy": "incremental"}, id="strategy_incremental"),
        pytest.param({"ivm_strategy": "recompute"}, id="strategy_recompute"),
        pytest.param({"ivm_strategy": None}, id="strategy_unset"),
        pytest.param({"ivm_join_state": "none"}, id="join_state_none"),
        pytest.param({"ivm_join_state": "auto"}, id="join_state_auto"),
        pytest.param({"ivm_join_state": "all"}, id="join_state_all"),
        pytest.param({"ivm_join_state": ["c", "o"]}, id="join_state_aliases"),
        pytest.param({"ivm_window_order_unique": True}, id="window_order_unique"),
        pytest.param({"ivm_window_order_unique": False}, id="window_order_not_unique"),
        pytest.param({"ivm_extreme_values": 1}, id="extreme_values_one"),
        pytest.param({"ivm_extreme_values": 200}, id="extreme_values_many"),
        pytest.param({"ivm_extreme_values": "all"}, id="extreme_values_all"),
        # Only the ivm_ prefix is ours; other adapters' configs pass through.
        pytest.param({"fallback": "anything", "file_format": "delta"}, id="foreign_configs"),
    ],
)
def test_valid_configs(config: dict[str, Any]) -> None:
    validate_model_config(MODEL, config)


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("ivm_fallbak", "ivm_fallback"),
        ("ivm_falback", "ivm_fallback"),
        ("ivm_fallbacks", "ivm_fallback"),
        ("ivm_full_back", "ivm_fallback"),
    ],
)
def test_unknown_config_with_a_close_match_suggests_it(key: str, suggestion: str) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"materialized": "ivm", key: "full_refresh"})
    message = str(raised.value)
    assert f"Model '{MODEL}'" in message
    assert f"unknown config {key!r}" in message
    assert f"did you mean {suggestion!r}?" in message
    assert "Known ivm configs: " + ", ".join(sorted(IVM_CONFIGS)) + "." in message


@pytest.mark.parametrize("key", ["ivm_refresh_interval", "ivm_x"])
def test_unknown_config_without_a_close_match_lists_the_known_ones(key: str) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {key: True})
    message = str(raised.value)
    assert f"unknown config {key!r}" in message
    assert "did you mean" not in message
    assert "Known ivm configs: " + ", ".join(sorted(IVM_CONFIGS)) + "." in message


@pytest.mark.parametrize("value", ["full", "FULL_REFRESH", "table", "", True, 1, ["full_refresh"]])
def test_bad_fallback_value(value: object) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_fallback": value})
    message = str(raised.value)
    assert f"Model '{MODEL}'" in message
    # Names what was given and what is accepted.
    assert f"ivm_fallback={value!r} is not valid" in message
    assert re.search(r"it must be one of: 'full_refresh', or unset\.", message)


def test_unknown_key_is_reported_before_a_bad_value() -> None:
    with pytest.raises(CompilationError, match="unknown config 'ivm_fallbak'"):
        validate_model_config(MODEL, {"ivm_fallback": "nope", "ivm_fallbak": "full_refresh"})


@pytest.mark.parametrize("value", ["", "two words", "a;drop table x", 3, True, ["g"]])
def test_bad_group_value(value: object) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_group": value})
    message = str(raised.value)
    assert f"Model '{MODEL}': ivm_group={value!r} is not valid" in message
    assert "a group name (letters, digits, _ and -), 'none', or unset." in message


@pytest.mark.parametrize("value", ["Auto", "full", "", 1, ["auto"]])
def test_bad_strategy_value(value: object) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_strategy": value})
    message = str(raised.value)
    assert f"Model '{MODEL}': ivm_strategy={value!r} is not valid" in message
    assert "one of: 'auto', 'incremental', 'recompute', or unset (auto)." in message


@pytest.mark.parametrize("value", ["All", "c", "", [], [""], ["c", 1], True])
def test_bad_join_state_value(value: object) -> None:
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_join_state": value})
    message = str(raised.value)
    assert f"Model '{MODEL}': ivm_join_state={value!r} is not valid" in message
    assert "one of: 'none', 'auto', 'all', a list of the model's table aliases" in message


@pytest.mark.parametrize("value", ["true", "yes", 1, 0])
def test_window_order_unique_must_be_a_boolean(value: object) -> None:
    # 'true' (a quoted string in YAML) must not pass as true, nor 0 as false.
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_window_order_unique": value})
    message = str(raised.value)
    assert f"Model '{MODEL}': ivm_window_order_unique={value!r} is not valid" in message
    assert "true or false (unset: false)" in message


@pytest.mark.parametrize("value", [0, -3, 2.5, "16", "ALL", True])
def test_extreme_values_must_be_a_positive_whole_number_or_all(value: object) -> None:
    # True is an int to Python, and '16' a string to YAML: neither passes.
    with pytest.raises(CompilationError) as raised:
        validate_model_config(MODEL, {"ivm_extreme_values": value})
    message = str(raised.value)
    assert f"Model '{MODEL}': ivm_extreme_values={value!r} is not valid" in message
    assert "a whole number of at least 1, 'all', or unset (16)" in message


@pytest.mark.parametrize(("configured", "kept"), [(None, 16), (1, 1), (40, 40), ("all", None)])
def test_extreme_values_reach_the_compiler_as_a_number_or_none(
    configured: object, kept: int | None
) -> None:
    config = {} if configured is None else {"ivm_extreme_values": configured}
    assert RefreshSettings.from_config(config).extreme_values == kept


@pytest.mark.parametrize(
    "name",
    ["bad`; drop table src; --", "with space", "semi;colon", "quote'", "", "ünïcode"],
)
def test_relation_names_spark_cannot_store_or_dbt_spark_would_paste_are_refused(
    name: str,
) -> None:
    with pytest.raises(CompilationError, match=r"Model 'model\.p\.m': alias .* letters, digits"):
        config.validate_relation_name("model.p.m", "alias", name)
    with pytest.raises(CompilationError, match=r"schema .* is not a valid name for Spark"):
        config.validate_schema_name(name)


@pytest.mark.parametrize("name", ["Hostile_Totals", "analytics_2", "_x", None])
def test_plain_relation_names_pass(name: str | None) -> None:
    config.validate_relation_name("model.p.m", "schema", name)
    config.validate_schema_name(name)


def test_every_error_the_plugin_raises_about_a_model_has_one_base() -> None:
    from dbt.adapters.spark_ivm.refresh.schema_changes import ModelColumnsChanged
    from dbt.adapters.spark_ivm.refresh.writes import ConcurrentRefresh
    from ivm_compiler import InvalidSource, IvmError, NotMaintainable, TableName

    raised = [
        NotMaintainable("m", "a PIVOT"),
        InvalidSource("m", "raw.src", "is not a Delta table", "convert it"),
        ConcurrentRefresh("m", TableName("s", "m__ivm_state"), RuntimeError("x")),
        ModelColumnsChanged("m", [("a", "int")], [("a", "bigint")]),
    ]
    for error in raised:
        assert isinstance(error, IvmError)
        assert error.model == "m" and "'m'" in str(error) and "Fix:" in str(error)
