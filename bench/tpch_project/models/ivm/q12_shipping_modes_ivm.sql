{{ q12_shipping_modes() }}
