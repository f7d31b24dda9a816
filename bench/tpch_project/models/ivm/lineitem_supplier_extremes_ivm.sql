{{ lineitem_supplier_extremes() }}
