{{ q10_returned_item_reporting() }}
