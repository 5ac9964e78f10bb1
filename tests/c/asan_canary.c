/*
 * A check of scripts/sanitize.sh itself: the caller claims a whole kalos_options but
 * allocated a 4-byte heap block. Against the AddressSanitizer build of libkalos.so this must stop with a
 * heap-buffer-overflow report from inside the library; if it exits normally, the library was
 * not instrumented and the sanitizer run proves nothing.
 */
#include <stdlib.h>

#include "kalos.h"

int main(void) {
    struct kalos_options *o = malloc(4);
    kalos_options_init(o, sizeof *o);
    free(o);
    return 0;
}
