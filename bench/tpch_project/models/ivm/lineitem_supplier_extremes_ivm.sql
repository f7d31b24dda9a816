{{ config(ivm_group=var('bench_ivm_group', none)) }}
{{ lineitem_supplier_extremes() }}
