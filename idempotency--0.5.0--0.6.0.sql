/* idempotency--0.5.0--0.6.0.sql: update from 0.5.0 to 0.6.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.6.0'" to load this file. \quit

-- Each concern of the second review (issue 25) keeps its own section below,
-- so that work on one does not touch the lines of another.

-- == outbox (issue 25, findings 1-3, 7, 8) ==

-- == purge (issue 25, findings 6, 9) ==
-- No SQL change: the purge's statements are in src/lifecycle.c, the launcher's
-- bound per database in src/worker.c (setting idempotency.purge_timeout).

-- == identity (issue 25, findings 4, 5) ==
