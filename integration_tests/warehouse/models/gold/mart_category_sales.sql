-- Sales per category: MIN/MAX and COUNT(DISTINCT) through pre-aggregations.
select
    category,
    sum(net_amount) as revenue,
    min(net_amount) as smallest_line,
    max(net_amount) as largest_line,
    count(distinct customer_id) as customers
from {{ ref('fct_order_lines') }}
group by category
