-- Current products no delivered order ever had a line of: NOT EXISTS over a
-- join (its subquery kept as a plan node of its own, docs/supported-sql.md).
select p.product_id, p.product_name, p.category
from {{ ref('dim_products') }} p
where not exists (
    select 1
    from {{ ref('slv_order_items') }} i
    join {{ ref('slv_orders') }} o on i.order_id = o.order_id
    where o.status = 'delivered' and i.product_id = p.product_id
)
