-- Each quartile beside its segment's total (the second level below the
-- refused model): an aggregating CTE, a plan node of its own, joined back.
with by_segment as (
    select segment, sum(quartile_value) as segment_value
    from {{ ref('mart_quartile_summary') }}
    group by segment
)
select s.segment, s.spend_quartile, s.customers, s.quartile_value, b.segment_value
from {{ ref('mart_quartile_summary') }} s
join by_segment b on s.segment = b.segment
