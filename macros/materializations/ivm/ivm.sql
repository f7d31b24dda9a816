{#-
  The ivm materialization: incremental view maintenance over Delta change data feeds.

  A recipe, as dbt's own materializations are: hooks, one call into Python that
  runs the whole refresh (compile, pin, decide, apply; see
  dbt/adapters/spark_ivm/refresh/recipe.py), grants, docs, hooks. The model's
  relation is a view over the Delta table `<model>__ivm_state`, which keeps the
  model's rows with their bookkeeping columns. The graph and the selection let
  the adapter place the model in its consistency group
  (dbt/adapters/spark_ivm/consistency/groups.py): models sharing sources
  publish together when the last of them has refreshed.
-#}
{% materialization ivm, adapter='spark_ivm' %}
  {%- set target_relation = this.incorporate(type='view') -%}
  {%- set existing_relation = load_cached_relation(this) -%}
  {%- set grant_config = config.get('grants') -%}

  {{ run_hooks(pre_hooks) }}

  {#- persist_docs goes into the view's own definition (Spark cannot comment a view's columns later). -#}
  {%- set docs = {
        'relation': model.description if config.persist_relation_docs() else none,
        'columns': model.columns if config.persist_column_docs() else {}} -%}

  {%- set result = adapter.ivm_refresh(
        relation=target_relation,
        sql=sql,
        model_id=model['unique_id'],
        config=config.model.config,
        full_refresh=should_full_refresh(),
        docs=docs,
        upstream=ivm_upstream_materializations(model),
        graph=graph,
        selected=selected_resources,
        invocation_id=invocation_id) -%}

  {%- if result.is_table -%}
    {#- The query cannot be maintained and the model asked to be recomputed instead. -#}
    {%- set target_relation = this.incorporate(type='table') -%}
  {%- endif -%}
  {%- if result.builds_table -%}
    {#- A first build, or one the table cannot take in place (refresh/fallback.py). -#}
    {%- set previous_table = load_cached_relation(this) -%}
    {% call statement('main') -%}
      {{ ivm_fallback_table_as(target_relation, previous_table, result.table_sql or sql) }}
    {%- endcall %}
    {% do adapter.ivm_set_table_properties(target_relation, result.table_properties) %}
  {%- endif -%}
  {#- The refresh's own account, also of a fallback table built or written in place. -#}
  {{ store_raw_result(name='main', message=result.message, code=result.code, rows_affected=result.rows_affected) }}

  {%- set should_revoke = should_revoke(existing_relation, full_refresh_mode=result.replaced_relation) -%}
  {% do apply_grants(target_relation, grant_config, should_revoke=should_revoke) %}
  {%- if result.is_table -%}
    {% do persist_docs(target_relation, model) %}
  {%- endif -%}

  {{ run_hooks(post_hooks) }}

  {{ return({'relations': [target_relation]}) }}
{% endmaterialization %}
