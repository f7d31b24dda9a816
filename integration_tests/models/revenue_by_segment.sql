-- An inner join of facts to a dimension, grouped; MIN/MAX/COUNT(DISTINCT) through
-- pre-aggregation. Both sides change in the example's batch.
select
    c.segment,
    count(*) as lines,
    count(distinct l.customer_id) as customers,
    sum(l.quantity * l.unit_price) as revenue,
    min(l.unit_price) as lowest_price,
    max(l.unit_price) as highest_price
from {{ source('shop', 'order_lines') }} l
join {{ source('shop', 'customers') }} c on l.customer_id = c.customer_id
where l.status <> 'cancelled'
group by c.segment
