"""Identifiers and literals for the harness's SQL statements.

The harness's statements are fixed texts (loads, change batches, checks) with
only names and paths filled in; names are quoted by sqlglot, so a schema prefix
given on the command line cannot change what a statement does.
"""

from __future__ import annotations

from pathlib import Path

from sqlglot import exp


def table(schema: str, name: str) -> str:
    """`schema`.`name`, quoted for Spark."""
    return exp.table_(name, db=schema, quoted=True).sql(dialect="spark")


def schema(name: str) -> str:
    return exp.to_identifier(name, quoted=True).sql(dialect="spark")


def parquet_file(path: Path) -> str:
    """A FROM clause item reading one parquet file: parquet.`path`."""
    text = str(path)
    if "`" in text:
        raise ValueError(f"a path with a backtick cannot be read through SQL: {text}")
    return f"parquet.`{text}`"
