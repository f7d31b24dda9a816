-- Customers with three or more orders (HAVING: groups cross the threshold both ways).
select customer_id, count(*) as orders
from {{ ref('fct_orders') }}
group by customer_id
having count(*) >= 3
