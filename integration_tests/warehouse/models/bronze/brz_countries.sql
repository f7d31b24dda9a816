-- Country reference data keyed by the upper-case ISO code.
select
    upper(country_code) as country_code,
    country_name,
    region
from {{ source('raw', 'countries') }}
