{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ q05_local_supplier_volume() }}
