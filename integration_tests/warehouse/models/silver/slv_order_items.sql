-- Order lines with their net amount after discount.
select
    order_id,
    line_no,
    product_id,
    quantity,
    cast(quantity * unit_price * (1 - discount) as decimal(14, 2)) as net_amount
from {{ ref('brz_order_items') }}
