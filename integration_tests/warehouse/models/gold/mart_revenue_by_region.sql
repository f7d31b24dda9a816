-- Revenue per sales region (NULL: customers of an unknown country).
select c.region, count(*) as orders, sum(o.order_total) as revenue
from {{ ref('fct_orders') }} o
join {{ ref('dim_customers') }} c on o.customer_id = c.customer_id
where o.status <> 'cancelled'
group by c.region
