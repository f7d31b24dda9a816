"""The benchmarked models: each query is one dbt macro, built as a `table` model and as an `ivm` model.

The query text lives in ``bench/tpch_project/macros/queries/<name>.sql``; the two
models ``<name>_table`` and ``<name>_ivm`` only call it, so both ways always run
the same SQL.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchModel:
    name: str
    title: str
    # The TPC-H tables the query reads: a batch that changes none of them leaves
    # the model unchanged (its ivm refresh should then find no change).
    reads: tuple[str, ...]

    @property
    def table_model(self) -> str:
        return f"{self.name}_table"

    @property
    def ivm_model(self) -> str:
        return f"{self.name}_ivm"


MODELS: tuple[BenchModel, ...] = (
    BenchModel("q01_pricing_summary", "Q1 pricing summary", ("lineitem",)),
    BenchModel("q03_shipping_priority", "Q3 shipping priority", ("customer", "orders", "lineitem")),
    BenchModel(
        "q05_local_supplier_volume",
        "Q5 local supplier volume",
        ("customer", "orders", "lineitem", "supplier", "nation", "region"),
    ),
    BenchModel("q06_forecast_revenue_change", "Q6 forecast revenue change", ("lineitem",)),
    BenchModel(
        "q10_returned_item_reporting",
        "Q10 returned item reporting",
        ("customer", "orders", "lineitem", "nation"),
    ),
    BenchModel("q12_shipping_modes", "Q12 shipping modes", ("orders", "lineitem")),
    BenchModel("q14_promotion_effect", "Q14 promotion effect", ("lineitem", "part")),
    BenchModel("lineitem_supplier_extremes", "MIN/MAX per supplier", ("lineitem",)),
    BenchModel("lineitem_part_suppliers", "DISTINCT part/supplier", ("lineitem",)),
)

MODELS_BY_NAME = {model.name: model for model in MODELS}


def select_models(names: list[str] | None) -> tuple[BenchModel, ...]:
    """The catalog's models named (all when ``names`` is empty), in catalog order."""
    if not names:
        return MODELS
    unknown = sorted(set(names) - set(MODELS_BY_NAME))
    if unknown:
        raise ValueError(
            f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS_BY_NAME)}"
        )
    return tuple(model for model in MODELS if model.name in names)
