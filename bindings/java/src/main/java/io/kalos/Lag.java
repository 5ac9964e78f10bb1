package io.kalos;

/**
 * How far behind its log the replica that answered a stale-read recall was (cluster mode,
 * {@link RecallOptions#withAllowStale()}; see {@link Kalos#lastLag()}). Both 0 on a single host and
 * for an up-to-date replica.
 *
 * @param entries log entries known to be in the shard's stream and not applied
 * @param ms milliseconds since the replica's host last heard from the log (0 while connected)
 */
public record Lag(long entries, long ms) {}
