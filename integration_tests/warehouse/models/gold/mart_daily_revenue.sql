-- Revenue per order day, cancelled orders left out.
select order_date, count(*) as orders, sum(order_total) as revenue
from {{ ref('fct_orders') }}
where status <> 'cancelled'
group by order_date
