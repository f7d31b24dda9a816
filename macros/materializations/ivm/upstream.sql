{#-
  How each dbt node a model reads is materialized, by "schema.identifier".
  The refresh rebuilds an ivm model whenever a 'table' or 'seed' it reads was
  replaced (see WHOLESALE_MATERIALIZATIONS in
  dbt/adapters/spark_ivm/refresh/decision.py), and names the model in errors
  about its upstreams.
-#}
{% macro ivm_upstream_materializations(node) %}
  {%- set upstream = {} -%}
  {%- for node_id in node.depends_on.nodes if node_id in graph.nodes -%}
    {%- set parent = graph.nodes[node_id] -%}
    {%- do upstream.update({parent.schema ~ '.' ~ (parent.alias or parent.name): parent.config.materialized}) -%}
  {%- endfor -%}
  {{ return(upstream) }}
{% endmacro %}
