/* placeholder */
typedef int rn_sandwich_placeholder;
