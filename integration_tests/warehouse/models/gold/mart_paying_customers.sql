-- Customers who both ordered and paid (INTERSECT through per-operand counts).
select customer_id from {{ ref('fct_orders') }}
intersect
select customer_id from {{ ref('fct_payments') }}
