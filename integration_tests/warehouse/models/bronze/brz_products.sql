-- Typed product versions with a normalised category.
select
    product_id,
    trim(product_name) as product_name,
    lower(category) as category,
    cast(list_price as decimal(10, 2)) as list_price,
    updated_at
from {{ source('raw', 'products') }}
where product_id is not null
