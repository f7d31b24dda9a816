{#-
  dbt run-operation ivm_explain --args '{model: <model name>}'

  Logs the plan the compiler chose for a built ivm model (view class,
  consistency level, sources and versions, auxiliary state and its size) and
  the SQL of each refresh step, and writes that SQL to
  target/ivm_explain/<model>/. It explains the SQL the model was last built
  from (the view's spark_ivm.query property).
-#}
{% macro ivm_explain(model) %}
  {%- if execute -%}
    {%- set found = graph.nodes.values() | selectattr('resource_type', 'equalto', 'model')
                    | selectattr('name', 'equalto', model) | list -%}
    {%- if not found -%}
      {{ exceptions.raise_compiler_error("ivm_explain: this project has no model named '" ~ model ~ "'") }}
    {%- endif -%}
    {%- set node = found[0] -%}
    {%- if node.config.materialized != 'ivm' -%}
      {{ exceptions.raise_compiler_error("ivm_explain: model '" ~ model ~ "' is materialized as '" ~ node.config.materialized ~ "', not 'ivm'") }}
    {%- endif -%}
    {%- set relation = api.Relation.create(database=node.database, schema=node.schema,
                                           identifier=node.alias or node.name, type='view') -%}
    {{ log(adapter.ivm_explain(relation, node.unique_id, ivm_upstream_materializations(node), graph), info=True) }}
  {%- endif -%}
{% endmacro %}
