/* idempotency--0.4.0--0.5.0.sql: update from 0.4.0 to 0.5.0 */

\echo Use "ALTER EXTENSION idempotency UPDATE TO '0.5.0'" to load this file. \quit

-- Each feature keeps its own section below, in the order of the 0.5.0
-- install script's additions.

-- == review fixes (issue 21) ==

-- == recovery points (issue 19) ==

-- == outbox (issue 18) ==

-- == Citus (issue 17) ==
