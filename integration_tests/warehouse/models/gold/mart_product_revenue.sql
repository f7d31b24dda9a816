-- Revenue and units per product.
select product_id, category, sum(net_amount) as revenue, sum(quantity) as units
from {{ ref('fct_order_lines') }}
group by product_id, category
