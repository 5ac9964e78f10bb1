/*
 * A check of scripts/sanitize.sh itself: two threads have the library initialise one
 * kalos_options at once, with nothing ordering them, which is a data race inside libkalos.so.
 * Against the ThreadSanitizer build of the library this must be reported from
 * kalos_options_init; if it exits without a report, the library was not instrumented and the
 * sanitizer run proves nothing.
 */
#include <pthread.h>
#include <stddef.h>

#include "kalos.h"

static kalos_options shared;

static void *init(void *arg) {
    (void)arg;
    kalos_options_init(&shared, sizeof shared);
    return NULL;
}

int main(void) {
    pthread_t a, b;
    pthread_create(&a, NULL, init, NULL);
    pthread_create(&b, NULL, init, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}
