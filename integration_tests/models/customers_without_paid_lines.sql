-- A set operation through per-operand counts: customers with no paid order line.
select customer_id from {{ source('shop', 'customers') }}
except
select customer_id from {{ source('shop', 'order_lines') }} where status = 'paid'
