-- Which categories sell in which countries (DISTINCT over a join).
select distinct l.category, c.country_code
from {{ ref('fct_order_lines') }} l
join {{ ref('dim_customers') }} c on l.customer_id = c.customer_id
