{#- TPC-H Q14, promotion effect (DATE = 1995-09-01). -#}
{% macro q14_promotion_effect() %}
select
    100.00 * sum(case
        when p_type like 'PROMO%' then l_extendedprice * (1 - l_discount)
        else 0
    end) / sum(l_extendedprice * (1 - l_discount)) as promo_revenue
from
    {{ source('tpch', 'lineitem') }},
    {{ source('tpch', 'part') }}
where l_partkey = p_partkey
    and l_shipdate >= date '1995-09-01'
    and l_shipdate < date '1995-09-01' + interval '1' month
{% endmacro %}
