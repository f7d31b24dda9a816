-- A LEFT JOIN kept incrementally: every customer, with its paid lines if it has
-- any. A customer without one shows NULLs, and that padded row disappears when
-- its first paid line arrives (and comes back when its last one goes).
select
    c.customer_id,
    c.segment,
    count(l.line_id) as paid_lines,
    sum(l.quantity * l.unit_price) as paid_revenue
from {{ source('shop', 'customers') }} c
left join {{ source('shop', 'order_lines') }} l
    on c.customer_id = l.customer_id and l.status = 'paid'
group by c.customer_id, c.segment
