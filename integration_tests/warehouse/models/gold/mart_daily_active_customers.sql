-- Distinct ordering customers per day.
select order_date, count(distinct customer_id) as active_customers
from {{ ref('fct_orders') }}
group by order_date
