-- Selection/projection that keeps the key: paid order lines with their amount.
select
    line_id,
    customer_id,
    quantity * unit_price as amount,
    status
from {{ source('shop', 'order_lines') }}
where status = 'paid'
