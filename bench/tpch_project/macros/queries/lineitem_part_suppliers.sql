{#-
  Not TPC-H: a DISTINCT over lineitem, which (part, supplier) pairs were ever
  shipped (about SF * 800,000 rows); each is kept with its multiplicity.
-#}
{% macro lineitem_part_suppliers() %}
select distinct
    l_partkey,
    l_suppkey
from {{ source('tpch', 'lineitem') }}
{% endmacro %}
