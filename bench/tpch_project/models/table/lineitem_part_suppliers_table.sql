{{ lineitem_part_suppliers() }}
