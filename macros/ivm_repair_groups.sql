{#-
  dbt run-operation ivm_repair_groups

  Finishes every consistency-group commit that was decided (its row is in the
  commit log) but whose views did not all move because a run stopped midway.
  Every `dbt run` that refreshes an ivm model does this first on its own; this
  command does it without refreshing anything.
-#}
{% macro ivm_repair_groups() %}
  {%- if execute -%}
    {{ log(adapter.ivm_repair_groups(), info=True) }}
  {%- endif -%}
{% endmacro %}
