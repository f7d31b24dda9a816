-- Lifetime value per customer over orders not cancelled.
select
    customer_id,
    count(*) as orders,
    sum(order_total) as lifetime_value,
    min(order_date) as first_order_date,
    max(order_date) as last_order_date
from {{ ref('fct_orders') }}
where status <> 'cancelled'
group by customer_id
