{#-
  Not TPC-H: a grouped MIN/MAX over lineitem, per supplier (SF * 10,000 groups).
  Deleting a supplier's current first or last shipment must find the next one,
  which the ivm state answers from its (group, value, count) pre-aggregation.
-#}
{% macro lineitem_supplier_extremes() %}
select
    l_suppkey,
    count(*) as line_count,
    min(l_shipdate) as first_shipdate,
    max(l_shipdate) as last_shipdate,
    max(l_discount) as max_discount
from {{ source('tpch', 'lineitem') }}
group by l_suppkey
{% endmacro %}
