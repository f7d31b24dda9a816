-- The product dimension: current products with a price band.
select
    product_id,
    product_name,
    category,
    list_price,
    case
        when list_price >= 100 then 'premium'
        when list_price >= 20 then 'standard'
        else 'budget'
    end as price_band
from {{ ref('slv_products') }}
