-- One row per order line of a current order and a known product (a three-way join).
select
    i.order_id,
    i.line_no,
    o.customer_id,
    o.order_date,
    o.status,
    p.category,
    i.product_id,
    i.quantity,
    i.net_amount
from {{ ref('slv_order_items') }} i
join {{ ref('slv_orders') }} o on i.order_id = o.order_id
join {{ ref('slv_products') }} p on i.product_id = p.product_id
