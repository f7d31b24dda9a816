{#-
  Generic test: an ivm model equals its own query evaluated now, as a bag.

  The query is the model's compiled SQL as its last build recorded it on the
  view (property spark_ivm.query). EXCEPT ALL both ways, so duplicate rows
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
