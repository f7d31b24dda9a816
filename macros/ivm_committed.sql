{#-
  {{ ivm_committed(ref('model')) }}

  Reads an ivm model at its consistency group's last committed state, in
  place of the relation: every model read this way in one dbt invocation
  shows the same group commit, even while the group's views are moving to a
  newer one (strict reads: docs/consistency-groups.md). Put it where the
  relation would go and give it an alias:

    select t.n, sum(g.n) from {{ ivm_committed(ref('total')) }} as t
    cross join {{ ivm_committed(ref('by_g')) }} as g group by t.n

  Pass the ref() itself, so dbt knows the dependency. A model no group commit
  names (a group of one, or ivm_group: 'none') is read as it is: its view is
  its only committed state.
-#}
{% macro ivm_committed(relation) %}
  {%- if not execute -%}
    {{- return(relation) -}}
  {%- endif -%}
  {{- return(adapter.ivm_committed(relation, invocation_id)) -}}
{% endmacro %}
