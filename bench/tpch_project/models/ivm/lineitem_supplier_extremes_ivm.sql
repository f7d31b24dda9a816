{# MIN/MAX keep their pre-aggregation merged: never a log (ivm_state_form). #}
{{ config(ivm_group=var('bench_ivm_group', none), ivm_state_form='merged') }}
{{ lineitem_supplier_extremes() }}
