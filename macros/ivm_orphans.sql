{#-
  dbt run-operation ivm_orphans [--args '{drop: true}']

  Lists the ivm relations left behind by models that are no longer ivm
  models of this project (deleted, renamed, or materialized another way):
  their `<model>__ivm_*` tables and the views reading them. Nothing else is
  ever touched. With drop: true it drops them. Run it from the project that
  owns the schemas: models of another project sharing a schema would look
  orphaned from here.
-#}
{% macro ivm_orphans(drop=false) %}
  {%- if execute -%}
    {{ log(adapter.ivm_orphans(graph, drop), info=True) }}
  {%- endif -%}
{% endmacro %}
