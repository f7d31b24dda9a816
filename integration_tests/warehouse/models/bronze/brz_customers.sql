-- Typed, cleaned customer change records: one row per version the source sent.
select
    customer_id,
    trim(full_name) as full_name,
    lower(trim(email)) as email,
    upper(country_code) as country_code,
    coalesce(segment, 'unknown') as segment,
    updated_at
from {{ source('raw', 'customers') }}
where customer_id is not null
