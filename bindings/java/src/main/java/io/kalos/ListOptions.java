package io.kalos;

/**
 * What {@link Kalos#list} and {@link Kalos#listPage} list: the live memories in some namespaces
 * whose metadata fields match a filter, with ids greater than a cursor. Immutable; {@code with*}
 * return copies. {@link #ALL} lists every memory from the smallest id.
 */
public final class ListOptions {
    /** Every namespace, no filter, from the smallest id, the handle's default deadline. */
    public static final ListOptions ALL = new ListOptions(null, null, false, 0, 0);

    final long[] namespaces;
    final byte[] filter;
    final boolean hasAfter;
    final long after;
    final long timeoutMs;

    private ListOptions(long[] namespaces, byte[] filter, boolean hasAfter, long after, long timeoutMs) {
        this.namespaces = namespaces;
        this.filter = filter;
        this.hasAfter = hasAfter;
        this.after = after;
        this.timeoutMs = timeoutMs;
    }

    /** Only memories in these namespaces (at most 64); null = all. */
    public ListOptions withNamespaces(long... ns) {
        return new ListOptions(ns == null ? null : ns.clone(), filter, hasAfter, after, timeoutMs);
    }

    /** Only memories whose metadata fields match {@code f} (null = no filter); encoded here. */
    public ListOptions withFilter(Filter f) {
        return new ListOptions(namespaces, f == null ? null : f.encode(), hasAfter, after, timeoutMs);
    }

    /**
     * Only ids greater than {@code id} (compared unsigned): the cursor, the last id of the
     * previous page.
     */
    public ListOptions withAfter(long id) {
        return new ListOptions(namespaces, filter, true, id, timeoutMs);
    }

    /** From the smallest id again (no cursor). */
    public ListOptions fromStart() {
        return new ListOptions(namespaces, filter, false, 0, timeoutMs);
    }

    /** Deadline of each request in ms (0 = the handle's default). */
    public ListOptions withTimeoutMs(long ms) {
        return new ListOptions(namespaces, filter, hasAfter, after, ms);
    }
}
