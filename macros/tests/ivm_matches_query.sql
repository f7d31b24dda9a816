{#-
  Generic test: an ivm model equals its own query, as a bag, evaluated with
  every source at the version the state the view shows reflects (the view
  property spark_ivm.query_at_versions; the oracle of the project). The view
  of a consistency group member that refreshed but waits for its group still
  shows the group's last committed state, and is checked against that. EXCEPT ALL both ways, so duplicate rows
  count; a failure returns one row with how many rows are missing from the
  model, how many are extra, and both row counts.
  Usage (schema.yml):  data_tests: [dbt_spark_ivm.ivm_matches_query]
-#}
{% test ivm_matches_query(model) %}
  {%- set query = adapter.ivm_model_query(model) if execute else 'select 1' -%}
  with maintained as (
      select * from {{ model }}
  ),
  recomputed as (
      {{ query }}
  ),
  missing_from_model as (
      select * from recomputed except all select * from maintained
  ),
  extra_in_model as (
      select * from maintained except all select * from recomputed
  ),
  counts as (
      select
          (select count(*) from missing_from_model) as rows_missing_from_model,
          (select count(*) from extra_in_model) as rows_extra_in_model,
          (select count(*) from maintained) as model_rows,
          (select count(*) from recomputed) as query_rows
  )
  select * from counts
  where rows_missing_from_model > 0 or rows_extra_in_model > 0
{% endtest %}
