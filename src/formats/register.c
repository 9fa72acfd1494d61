/* register.c — placeholder: fills no compute operations yet. */
#include "formats/formats.h"

void kiln_formats_register(kiln_type_info *table) { (void)table; }
