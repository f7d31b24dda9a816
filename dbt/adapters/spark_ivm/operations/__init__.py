"""What a user calls beside a refresh: run-operations and the oracle test's query.

explain.py answers `dbt run-operation ivm_explain` (the plan, the state's size,
every refresh statement, also written under target/); comparison.py builds the
query of the `ivm_matches_query` test (a model against its query, as bags,
floating-point columns within tolerances); housekeeping.py finds the orphaned
state `dbt run-operation ivm_orphans` lists, and drops with `drop: true`. impl.py
reaches each through an `@available` method; none of them writes a model's state.
"""
