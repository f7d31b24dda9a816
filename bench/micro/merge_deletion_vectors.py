"""One logged refresh's MERGE replayed on copies of its state, without and with deletion vectors (issue 54, item 1).

A MERGE without deletion vectors copies every file holding a row it
changes; a day's change spread over a state's key range touches them all,
so it rewrites the state whole. With vectors it marks the changed rows
deleted and writes only them anew. This measured what they save on one
state before states got them (ivm_compiler/layout.py chooses by the
state's size).

Input: the refresh's statements as the dbt log holds them (its `SET`s, the
`CACHE TABLE` stages and the `MERGE` last), separated by lines of `;;`,
and the state's version before that MERGE. Each round re-creates both
copies from that version (change data feed on, as states read by ivm
models have it), runs the stages and times the MERGE alone; both copies
must end with the same rows.

    PYTHONPATH=bench .venv/bin/python bench/micro/merge_deletion_vectors.py \\
        --runtime integration_tests/warehouse/.spark_ivm \\
        --state warehouse.mart_customer_ltv__ivm_state --version 0 --statements ltv.sql

Measured 2026-12-05 (bench/results/issue54/merge-deletion-vectors-1500.txt):
`mart_customer_ltv`'s batch-1 MERGE at warehouse scale 1500, 3.68 M state
rows, 17,735 changed: 14.5-18.5 s without vectors, 6.6-8.1 s with them (the same rows).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tpch_bench.spark_session import start_session

from ivm_compiler.layout import DELETION_VECTORS_PROPERTY as VECTORS
from ivm_compiler.sql import TableName


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", required=True, help="the embedded runtime's directory")
    parser.add_argument("--state", required=True, help="schema.table of the state")
    parser.add_argument("--version", type=int, required=True, help="its version before the MERGE")
    parser.add_argument("--statements", required=True, type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    spark, _ = start_session(Path(args.runtime))

    statements = args.statements.read_text().split("\n;;\n")
    schema, name = args.state.split(".")
    state = TableName(schema, name).sql()
    rows = spark.sql(f"SELECT COUNT(*) FROM {state} VERSION AS OF {args.version}").first()[0]
    print(f"{args.state} at version {args.version}: {rows:,} rows")
    for round_number in range(args.rounds):
        for form, vectors in (("without", "false"), ("with", "true")):
            copy = TableName(schema, f"bench_dv_copy_{form}").sql()
            spark.sql(
                f"CREATE OR REPLACE TABLE {copy} USING DELTA TBLPROPERTIES "
                f"('delta.enableChangeDataFeed'='true', '{VECTORS}'='{vectors}') "
                f"AS SELECT * FROM {state} VERSION AS OF {args.version}"
            )
            for statement in statements[:-1]:
                spark.sql(statement.replace(state, copy))
            started = time.monotonic()
            metrics = spark.sql(statements[-1].replace(state, copy)).first()
            seconds = time.monotonic() - started
            for statement in statements:
                if statement.startswith("CACHE TABLE"):
                    stage = statement.split("`")[1]
                    spark.sql(f"UNCACHE TABLE IF EXISTS `{stage}`")
                    spark.sql(f"DROP VIEW IF EXISTS `{stage}`")
            spark.sql("RESET")
            answer = spark.sql(f"SELECT COUNT(*), SUM(HASH(*)) FROM {copy}").first()
            print(
                f"round {round_number + 1} {form} deletion vectors: MERGE {seconds:.2f} s, "
                f"{metrics['num_affected_rows']:,} rows changed; "
                f"after it {answer[0]:,} rows, hash sum {answer[1]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
