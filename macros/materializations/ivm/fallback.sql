{#-
  The table an ivm model is built as when its query cannot be maintained and it
  sets ivm_fallback='full_refresh': a Delta table unless the model names another
  file_format, replaced in one commit on every run (ivm models that ref() it
  pin it like any Delta table, and read it again in full after each build).
  dbt-spark's own table DDL clauses (options, partitioning, location, comment)
  apply as they do to a 'table' model.
-#}
{% macro ivm_fallback_table_as(relation, existing_relation, compiled_code) %}
  {%- set file_format = config.get('file_format') or 'delta' -%}
  {%- if file_format not in ('delta', 'iceberg') and existing_relation is not none -%}
    {#- Only Delta and Iceberg tables can be replaced in place. -#}
    {%- do adapter.drop_relation(existing_relation) -%}
  {%- endif -%}
  {{ 'create or replace table' if file_format in ('delta', 'iceberg') else 'create table' }} {{ relation }}
  using {{ file_format }}
  {{ options_clause() }}
  {{ tblproperties_clause() }}
  {{ partition_cols(label="partitioned by") }}
  {{ clustered_cols(label="clustered by") }}
  {{ location_clause() }}
  {{ comment_clause() }}
  as
  {{ compiled_code }}
{% endmacro %}
