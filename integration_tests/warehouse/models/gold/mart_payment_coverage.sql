-- Each order with what has been paid for it: an aggregating CTE (a plan node)
-- LEFT JOINed to the orders.
with paid as (
    select order_id, sum(amount) as paid_amount, count(*) as payments
    from {{ ref('fct_payments') }}
    group by order_id
)
select
    o.order_id,
    o.order_total,
    coalesce(p.paid_amount, 0) as paid_amount,
    coalesce(p.payments, 0) as payments
from {{ ref('fct_orders') }} o
left join paid p on o.order_id = p.order_id
