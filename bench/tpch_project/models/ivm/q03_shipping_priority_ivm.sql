{{ q03_shipping_priority() }}
