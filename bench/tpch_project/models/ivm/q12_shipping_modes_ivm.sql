{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q12_shipping_modes() }}
