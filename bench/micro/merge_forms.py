"""Two or more forms of one MERGE timed on copies of one state, which must end with the same rows.

Shared by the MERGE design studies (partition_merge.py, merge_key_list.py):
each round re-creates a copy of the base state per form (deletion vectors
and the change feed on, as the adapter writes states of warehouse size),
times that form's MERGE alone, then compares every copy with the first
form's as bags; a difference fails the run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

PROPERTIES = "'delta.enableChangeDataFeed'='true', 'delta.enableDeletionVectors'='true'"


def time_forms(  # type: ignore[no-untyped-def]
    spark, base: str, forms: Mapping[str, Callable[[str], str]], rounds: int
) -> dict[str, list[float]]:
    """Seconds per form and round; `forms` maps a name to its MERGE into a given copy."""
    copies = {form: f"{base}_{form}" for form in forms}
    times: dict[str, list[float]] = {form: [] for form in forms}
    for round_number in range(rounds):
        for form, statement in forms.items():
            spark.sql(
                f"CREATE OR REPLACE TABLE {copies[form]} USING DELTA "
                f"TBLPROPERTIES ({PROPERTIES}) AS SELECT * FROM {base}"
            )
            started = time.monotonic()
            spark.sql(statement(copies[form]))
            times[form].append(time.monotonic() - started)
            print(f"round {round_number + 1} {form}: {times[form][-1]:.2f} s", flush=True)
        first, *others = copies.values()
        for other in others:
            differ = spark.sql(
                f"SELECT COUNT(*) FROM ((SELECT * FROM {first} EXCEPT ALL SELECT * FROM {other}) "
                f"UNION ALL (SELECT * FROM {other} EXCEPT ALL SELECT * FROM {first}))"
            ).first()[0]
            if differ:
                raise SystemExit(f"{first} and {other} differ in {differ} rows")
    for form, seconds in times.items():
        print(f"{form}: median {statistics.median(seconds):.2f} s of {seconds}")
    return times
