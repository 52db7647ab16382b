/* placeholder */
typedef int rn_gated_placeholder;
