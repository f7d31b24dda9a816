-- Each customer's running spend over their orders (a running total per partition).
-- Left without ivm_window_order_unique: each refresh warns that the ORDER BY
-- does not name every column, the check a declared unique order skips.
select
    customer_id,
    order_id,
    order_date,
    order_total,
    sum(order_total) over (
        partition by customer_id
        order by order_date, order_id
        rows between unbounded preceding and current row
    ) as running_spend
from {{ ref('fct_orders') }}
