{#-
  Generic test: an ivm model equals its own query, as a bag, evaluated with
  every source at the version the state the view shows reflects (the view
  property spark_ivm.query_at_versions; the oracle of the project). The view
  of a consistency group member that refreshed but waits for its group still
  shows the group's last committed state, and is checked against that.
  Exact columns must be equal, duplicates counted; FLOAT and DOUBLE columns
  equal within relative_tolerance (default 1e-9) plus absolute_tolerance
  (default 0), as a refresh and a recomputation add floating-point values in
  different orders (dbt/adapters/spark_ivm/operations/comparison.py;
  docs/ivm-matches-query.md). A failure returns one row with how many rows are
  missing from the model, how many are extra, and both row counts.
  Usage (schema.yml):  data_tests: [dbt_spark_ivm.ivm_matches_query]
  or, with tolerances:
    data_tests:
      - dbt_spark_ivm.ivm_matches_query:
          arguments:
            relative_tolerance: 1.0e-9
            absolute_tolerance: 1.0e-6
-#}
{% test ivm_matches_query(model, relative_tolerance=1e-9, absolute_tolerance=0) %}
  {%- if execute -%}
    {{ adapter.ivm_comparison_query(model, relative_tolerance, absolute_tolerance) }}
  {%- else -%}
    select 1 as rows_missing_from_model where false
  {%- endif -%}
{% endtest %}
