-- Grouped aggregates, with NULL customers grouped together as Spark does.
select
    customer_id,
    count(*) as lines,
    count(discount) as discounted_lines,
    sum(quantity * unit_price) as revenue,
    avg(unit_price) as avg_unit_price,
    sum(discount) as total_discount
from {{ source('shop', 'order_lines') }}
group by customer_id
