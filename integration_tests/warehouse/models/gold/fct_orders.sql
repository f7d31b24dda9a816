-- One row per order with its line count and total.
select
    order_id,
    customer_id,
    order_date,
    status,
    count(*) as line_count,
    sum(net_amount) as order_total
from {{ ref('fct_order_lines') }}
group by order_id, customer_id, order_date, status
