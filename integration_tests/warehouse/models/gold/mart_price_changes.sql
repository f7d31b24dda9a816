-- Price changes per product, from the LAG history.
select
    product_id,
    count(*) as changes,
    max(list_price - previous_price) as largest_increase,
    min(list_price - previous_price) as largest_cut
from {{ ref('slv_product_prices') }}
where previous_price is not null
group by product_id
