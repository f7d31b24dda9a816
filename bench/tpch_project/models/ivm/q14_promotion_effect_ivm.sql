{{ q14_promotion_effect() }}
