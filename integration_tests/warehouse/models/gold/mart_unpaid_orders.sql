-- Open orders with no settled payment (NOT IN with Spark's NULL rules).
select order_id, customer_id, order_total
from {{ ref('fct_orders') }}
where status <> 'cancelled'
    and order_id not in (select order_id from {{ ref('fct_payments') }})
