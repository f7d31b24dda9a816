-- Projection that drops the key: duplicates are kept, one row per source line.
select customer_id, status
from {{ source('shop', 'order_lines') }}
