-- Products ranked by revenue within their category (RANK and DENSE_RANK).
select
    product_id,
    category,
    revenue,
    rank() over (partition by category order by revenue desc) as category_rank,
    dense_rank() over (partition by category order by units desc) as units_rank
from {{ ref('mart_product_revenue') }}
