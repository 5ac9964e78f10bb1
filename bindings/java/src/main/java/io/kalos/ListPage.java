package io.kalos;

/** One page of {@link Kalos#listPage}: ids in ascending (unsigned) order and what remains. */
public final class ListPage {
    /** The ids of the page (unsigned 64-bit values in Java longs), ascending. */
    public final long[] ids;
    /** How many memories match after the page's last id (when the page was read). */
    public final long remaining;
    private final boolean last;

    ListPage(long[] ids, long remaining, int limit) {
        this.ids = ids;
        this.remaining = remaining;
        this.last = ids.length < limit || remaining == 0;
    }

    /** True when no page follows this one (fewer ids than asked for, or none remaining). */
    public boolean isLast() {
        return last;
    }
}
