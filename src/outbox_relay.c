/*-------------------------------------------------------------------------
 *
 * outbox_relay.c
 *	  The outbox's relay API (features floor): claim(), ack(), nack(),
 *	  release() and redrive().
 *
 * A message's life and the order per key: src/README.md, "The outbox".
 * claim() hands out ready pending messages with a fresh claim token;
 * ack/nack/release name the claim token, so a relay whose claim was taken
 * over can no longer change the message.  Each operation calls each
 * neighbour once: the topic (outbox_topics.c), the claims in shared memory
 * (outbox_claims.c), the acked counts (outbox_counts.c) and the vacuum's
 * count (outbox_vacuum.c), the wake-ups (wakeup.c).
 *
 * Redrive: a redriven message takes a new row id, drawn after its key's
 * lock like a published one (its message_id stays), so it queues behind
 * every message of its key, and one of them that is out keeps it waiting
 * (with its old id it went out beside it).
 *
 * Where a claim lives (outbox_claims.c says who needs which): in shared
 * memory, the library preloaded, where claim() locks the rows it hands out
 * and writes none, and ack() deletes them; else in the rows (0.5.0's way,
 * and the portable edition's), by the statements here.  With shared memory
 * the window is an index scan in C (outbox_claims.c), which also enters
 * each locked row in shared memory for the claims beyond it.  Between a
 * new library and ALTER EXTENSION UPDATE the database has the previous
 * release's SQL objects, without the functions through which these
 * statements read claims in shared memory (_outbox_claimed,
 * _outbox_attempt): there claims stay in the rows, as the release whose
 * objects they are kept them (idem_outbox_claims_shared()), and the
 * statements used then name no function of the extension.  A claim
 * written into its row is honoured after the update too.
 *
 * Locking: concurrent claims skip each other's locked rows (FOR UPDATE
 * SKIP LOCKED) and re-check state and available_at on the row they lock;
 * redrive() takes the message key's lock (outbox_topics.c) until the
 * transaction ends; row locks of the messages a statement updates.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_claims.h"
#include "outbox_counts.h"
#include "outbox_topics.h"
#include "outbox_vacuum.h"
#include "wakeup.h"

#define CLAIM_MAX_BATCH 10000
#define CLAIM_WINDOW_MIN 64		/* ready messages a claim looks at first */

/* ---------------------------------------------------------------------
 * Relays
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_claim = NULL;
static SPIPlanPtr plan_ack = NULL;
static SPIPlanPtr plan_nack = NULL;
static SPIPlanPtr plan_release = NULL;
static SPIPlanPtr plan_redrive = NULL;
static SPIPlanPtr plan_redrive_pick = NULL;

/*
 * the caller may consume the message's topic: the condition ack etc. share
 * (a grant counts only while the topic's owner exists)
 */
#define MAY_CONSUME \
	"   AND t.id OPERATOR(pg_catalog.=) m.topic_id" \
	"   AND (t.owner OPERATOR(pg_catalog.=) $3" \
	"        OR (EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g" \
	"                     WHERE g.topic_id OPERATOR(pg_catalog.=) t.id" \
	"                       AND g.grantee OPERATOR(pg_catalog.=) $3" \
	"                       AND g.can_consume)" \
	"            AND " OUTBOX_ROLE_EXISTS("t.owner") "))"

/*
 * The claim statements.  Both lock candidates FOR UPDATE SKIP LOCKED in
 * availability order, re-check state and available_at on the locked row,
 * and update it (a lapsed claim at max_attempts: dead instead), after a
 * CTE "cand": ids of ready messages that are unkeyed or the earliest
 * pending message of their key.  They return the outbox_claim columns and
 * whether the message was claimed (false: it went dead; claim_run() counts
 * those and the claim runs again for the places they took).
 */
#define CLAIM_SQL_REST \
	", c AS (" \
	" UPDATE idempotency.outbox_message AS m" \
	"    SET attempts = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN m.attempts" \
	"                   ELSE m.attempts OPERATOR(pg_catalog.+) 1 END," \
	"        claim = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN NULL ELSE $3 END," \
	"        available_at = $4," \
	"        state = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN 'dead' ELSE 'pending' END," \
	"        last_error = CASE WHEN m.claim IS NULL THEN m.last_error" \
	"                     ELSE '{\"error\": \"visibility timeout: the claim lapsed without ack or nack\"}'::pg_catalog.jsonb END" \
	"  WHERE m.id OPERATOR(pg_catalog.=) ANY (ARRAY(" \
	"        SELECT r.id FROM idempotency.outbox_message AS r" \
	"         WHERE r.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT cand.id FROM cand))" \
	"           AND r.state OPERATOR(pg_catalog.=) 'pending'" \
	"           AND r.available_at OPERATOR(pg_catalog.<=) $5" \
	"         ORDER BY r.available_at, r.id" \
	"         LIMIT $2 FOR UPDATE SKIP LOCKED))" \
	"    AND m.state OPERATOR(pg_catalog.=) 'pending'" \
	"    AND m.available_at OPERATOR(pg_catalog.<=) $5" \
	" RETURNING m.id, m.message_id, m.message_key, m.payload, m.headers," \
	"           m.attempts, m.published_at, m.state)" \
	" SELECT c.id, c.message_id, $7, c.message_key, c.payload, c.headers," \
	"        c.attempts, c.published_at, $3, $4," \
	"        c.state OPERATOR(pg_catalog.=) 'pending'" \
	"   FROM c ORDER BY c.id"

/*
 * The window: the first $8 ready messages in availability order (max(64, 4 x batch_size)), those
 * that are unkeyed or their key's earliest pending message.  Enough almost
 * always; without the bound a claim would look at every message of a
 * key's backlog (each one blocked behind the key's head) whenever fewer
 * than batch_size messages are claimable.
 */
#define CLAIM_WINDOW(UNCLAIMED) \
	"cand AS (" \
	" SELECT w.id FROM (SELECT w0.id, w0.message_key FROM idempotency.outbox_message AS w0" \
	"                    WHERE w0.topic_id OPERATOR(pg_catalog.=) $1" \
	"                      AND w0.state OPERATOR(pg_catalog.=) 'pending'" \
	"                      AND w0.available_at OPERATOR(pg_catalog.<=) $5" \
	UNCLAIMED("w0") \
	"                    ORDER BY w0.available_at, w0.id LIMIT $8) AS w" \
	"  WHERE w.message_key IS NULL OR NOT EXISTS (" \
	"        SELECT 1 FROM idempotency.outbox_message AS p" \
	"         WHERE p.topic_id OPERATOR(pg_catalog.=) $1" \
	"           AND p.message_key OPERATOR(pg_catalog.=) w.message_key" \
	"           AND p.state OPERATOR(pg_catalog.=) 'pending'" \
	"           AND p.id OPERATOR(pg_catalog.<) w.id))"

/*
 * Beyond the window (it was full, the claim was not): the earliest pending
 * message of every key, found by skipping through the key index one key
 * at a time (cost: the number of keys with pending messages, not of
 * messages), and the ready unkeyed messages from their own index.  So a
 * key's backlog never holds up other keys' messages.
 */
#define CLAIM_BEYOND(UNCLAIMED) \
	"k(key) AS (" \
	" (SELECT s.message_key FROM idempotency.outbox_message AS s" \
	"   WHERE s.topic_id OPERATOR(pg_catalog.=) $1 AND s.state OPERATOR(pg_catalog.=) 'pending'" \
	"     AND s.message_key IS NOT NULL" \
	"   ORDER BY s.message_key LIMIT 1)" \
	" UNION ALL" \
	" SELECT (SELECT s.message_key FROM idempotency.outbox_message AS s" \
	"          WHERE s.topic_id OPERATOR(pg_catalog.=) $1 AND s.state OPERATOR(pg_catalog.=) 'pending'" \
	"            AND s.message_key OPERATOR(pg_catalog.>) k.key" \
	"          ORDER BY s.message_key LIMIT 1)" \
	"   FROM k WHERE k.key IS NOT NULL)," \
	" cand AS (" \
	" SELECT (SELECT h.id FROM idempotency.outbox_message AS h" \
	"          WHERE h.topic_id OPERATOR(pg_catalog.=) $1 AND h.state OPERATOR(pg_catalog.=) 'pending'" \
	"            AND h.message_key OPERATOR(pg_catalog.=) k.key" \
	"          ORDER BY h.id LIMIT 1) AS id" \
	"   FROM k WHERE k.key IS NOT NULL AND $8 OPERATOR(pg_catalog.>) 0" \
	" UNION ALL" \
	" (SELECT u.id FROM idempotency.outbox_message AS u" \
	"   WHERE u.topic_id OPERATOR(pg_catalog.=) $1 AND u.state OPERATOR(pg_catalog.=) 'pending'" \
	"     AND u.message_key IS NULL AND u.available_at OPERATOR(pg_catalog.<=) $5" \
	UNCLAIMED("u") \
	"   ORDER BY u.available_at, u.id LIMIT $2))"

/*
 * With claims in shared memory the window is scanned in C (outbox_claims.c,
 * the same rules without the statement); this statement
 * is its fallback for a table not of the shipped shape.  It locks the candidates that
 * no live claim holds, FOR UPDATE SKIP LOCKED, and write nothing; the
 * caller enters each one in shared memory.  The lock makes a message that
 * an ack deleted (or a nack changed) after this statement's snapshot was
 * taken drop out (or be re-checked on its newest version), and keeps a
 * second claimer off the row until this transaction ends.  The last
 * column: the row still carries a durable claim (written by 0.5.0, or
 * without the library preloaded), which lapsed.  The candidates are locked
 * in the window's order (availability), one primary-key probe each, until
 * $2 are locked: no sort, so a batch of 100 fetches about 100 rows, not the
 * whole window of 400 (bench (b): a third of the claim's time).
 */
#define CLAIM_SQL_LOCK \
	", c AS (" \
	" SELECT r.id, r.message_id, r.message_key, r.payload, r.headers," \
	"        r.attempts, r.published_at, r.claim IS NOT NULL AS durable" \
	"   FROM pg_catalog.unnest(ARRAY(SELECT cand.id FROM cand)) AS u(id)" \
	"   JOIN idempotency.outbox_message AS r ON r.id OPERATOR(pg_catalog.=) u.id" \
	"  WHERE r.state OPERATOR(pg_catalog.=) 'pending'" \
	"    AND r.available_at OPERATOR(pg_catalog.<=) $5" \
	"    AND NOT idempotency._outbox_claimed(r.id)" \
	"  LIMIT $2 FOR UPDATE OF r SKIP LOCKED)" \
	" SELECT c.id, c.message_id, $7, c.message_key, c.payload, c.headers," \
	"        c.attempts, c.published_at, $3, $4, c.durable" \
	"   FROM c ORDER BY c.id"

/*
 * Beyond the window the candidates come in key order (the heads of the
 * keys, then the unkeyed messages), not in availability order: there they
 * are sorted, or the first keys in key order would always go first and a
 * key late in key order could wait for as long as they have backlogs.
 */
#define CLAIM_SQL_LOCK_SORTED \
	", c AS (" \
	" SELECT r.id, r.message_id, r.message_key, r.payload, r.headers," \
	"        r.attempts, r.published_at, r.claim IS NOT NULL AS durable" \
	"   FROM idempotency.outbox_message AS r" \
	"  WHERE r.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT cand.id FROM cand))" \
	"    AND r.state OPERATOR(pg_catalog.=) 'pending'" \
	"    AND r.available_at OPERATOR(pg_catalog.<=) $5" \
	"    AND NOT idempotency._outbox_claimed(r.id)" \
	"  ORDER BY r.available_at, r.id" \
	"  LIMIT $2 FOR UPDATE OF r SKIP LOCKED)" \
	" SELECT c.id, c.message_id, $7, c.message_key, c.payload, c.headers," \
	"        c.attempts, c.published_at, $3, $4, c.durable" \
	"   FROM c ORDER BY c.id"

/*
 * Not held by a live claim in shared memory (with them), or nothing (without
 * them: the rows carry every claim, which their available_at keeps out)
 */
#define UNCLAIMED_SHARED(A) "     AND NOT idempotency._outbox_claimed(" A ".id)"
#define UNCLAIMED_ROWS(A) ""

static const char *const claim_window_sql =
"WITH RECURSIVE " CLAIM_WINDOW(UNCLAIMED_ROWS) CLAIM_SQL_REST;
static const char *const claim_beyond_sql =
"WITH RECURSIVE " CLAIM_BEYOND(UNCLAIMED_ROWS) CLAIM_SQL_REST;
static const char *const claim_window_lock_sql =
"WITH RECURSIVE " CLAIM_WINDOW(UNCLAIMED_SHARED) CLAIM_SQL_LOCK;
static const char *const claim_beyond_lock_sql =
"WITH RECURSIVE " CLAIM_BEYOND(UNCLAIMED_SHARED) CLAIM_SQL_LOCK_SORTED;

/* was the window full?  (then messages beyond it may be claimable) */
#define WINDOW_FULL(UNCLAIMED) \
	"SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>=) $3 FROM (" \
	" SELECT 1 FROM idempotency.outbox_message AS w0" \
	"  WHERE w0.topic_id OPERATOR(pg_catalog.=) $1" \
	"    AND w0.state OPERATOR(pg_catalog.=) 'pending'" \
	"    AND w0.available_at OPERATOR(pg_catalog.<=) $2" \
	UNCLAIMED("w0") \
	"  LIMIT $3) AS w"

static SPIPlanPtr plan_claim_lock = NULL;
static SPIPlanPtr plan_claim_beyond_lock = NULL;

static SPIPlanPtr plan_claim_beyond = NULL;
static SPIPlanPtr plan_window_full = NULL;
static SPIPlanPtr plan_window_full_rows = NULL;

/*
 * Run a claim statement for up to remaining messages: the claimed ones go
 * to the result, and the statement runs again as long as some of those it
 * took went dead instead (each run turns at least one message dead, so
 * this ends) and fewer than remaining were claimed.  Returns how many were
 * claimed.
 */
static int32
claim_run(SPIPlanPtr *plan, const char *sql, Oid *argtypes, Datum *values,
		  int32 remaining, ReturnSetInfo *rsinfo)
{
	int32		claimed = 0;

	for (;;)
	{
		uint64		n;
		uint64		i;
		uint64		dead = 0;

		values[1] = Int32GetDatum(remaining - claimed);
		n = idem_run_as_owner(plan, sql, 8, argtypes, values, NULL, SPI_OK_SELECT);
		for (i = 0; i < n; i++)
		{
			Datum		cols[11];
			bool		nulls[11];

			heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, cols, nulls);
			if (!DatumGetBool(cols[10]))
			{
				dead++;
				continue;
			}
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
			claimed++;
		}
		if (dead == 0 || claimed >= remaining)
			return claimed;
	}
}

/*
 * claim(topic, batch_size, visibility) -> the claimed messages (outbox_claim)
 *
 * See src/README.md, "The outbox", for the order and the concurrency.
 * First from the window (CLAIM_WINDOW); when that was full of blocked
 * messages and gave fewer than batch_size, also from beyond it
 * (CLAIM_BEYOND).
 */
PG_FUNCTION_INFO_V1(idempotency_claim);

Datum
idempotency_claim(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			argtypes[8] = {INT4OID, INT4OID, UUIDOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT4OID, TEXTOID, INT4OID};
	Datum		values[8];
	TimestampTz now = GetCurrentTimestamp();
	int32		batch;
	int32		window;
	Topic		t;
	IdemClaimShare share;
	int32		n;
	bool		shared;
	bool		full = false;
	bool		full_known = false;

	idem_outbox_not_null(fcinfo, 1, "batch_size");
	idem_outbox_not_null(fcinfo, 2, "visibility");
	batch = PG_GETARG_INT32(1);
	if (batch < 1 || batch > CLAIM_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", CLAIM_MAX_BATCH)));
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(2), "visibility", true);
	idem_init_materialized_srf(fcinfo);
	window = Max(CLAIM_WINDOW_MIN, batch * 4);

	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_CONSUME, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = Int32GetDatum(batch);
	values[2] = DirectFunctionCall1(gen_random_uuid, (Datum) 0);
	values[3] = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
									PG_GETARG_DATUM(2));
	values[4] = TimestampTzGetDatum(now);
	values[5] = Int32GetDatum(t.max_attempts);
	values[6] = CStringGetTextDatum(topic);
	values[7] = Int32GetDatum(window);
	shared = idem_outbox_claims_shared();
	share.owner = t.owner;
	share.limited = shared && !superuser_arg(t.owner);
	share.held = -1;
	share.counted = 0;
	share.made = 0;
	n = -1;
	if (shared)
		n = idem_outbox_claim_scan(values, batch, rsinfo, &full, &share);
	if (n >= 0)
		full_known = true;
	else if (shared)
		n = idem_outbox_claim_run_shared(&plan_claim_lock, claim_window_lock_sql, argtypes,
										 values, batch, rsinfo, &share);
	else
		n = claim_run(&plan_claim, claim_window_sql, argtypes, values, batch, rsinfo);

	if (n < batch && !full_known)
	{
		Oid			wtypes[3] = {INT4OID, TIMESTAMPTZOID, INT4OID};
		Datum		wvalues[3];
		bool		isnull;

		wvalues[0] = values[0];
		wvalues[1] = values[4];
		wvalues[2] = values[7];
		if (shared)
			idem_run_as_owner(&plan_window_full, WINDOW_FULL(UNCLAIMED_SHARED),
							  3, wtypes, wvalues, NULL, SPI_OK_SELECT);
		else
			idem_run_as_owner(&plan_window_full_rows, WINDOW_FULL(UNCLAIMED_ROWS),
							  3, wtypes, wvalues, NULL, SPI_OK_SELECT);
		full = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	if (n < batch && full && shared)
		(void) idem_outbox_claim_run_shared(&plan_claim_beyond_lock, claim_beyond_lock_sql,
											argtypes, values, batch - n, rsinfo, &share);
	else if (n < batch && full)
		(void) claim_run(&plan_claim_beyond, claim_beyond_sql, argtypes, values,
						 batch - n, rsinfo);
	SPI_finish();
	return (Datum) 0;
}

/*
 * What ack, nack and release do with the rows their statement returned
 * (m.id, t.id, t.name, t.notify, m.attempts, durable: the row carried the
 * claim itself, t.owner): with claims in shared memory, end each claim's
 * entry when the transaction commits, and count an ack's messages delivered
 * (outbox_counts.c).
 */
#define ENDS_NOTHING 0			/* claims in the rows: the statement did it
								 * all */
#define ENDS_ACK 1
#define ENDS_CLAIM 2

/*
 * Run one of the statements that change the claimed messages (ack, nack,
 * release): $1 claim, $2 ids, $3 the caller, $4 now, then extra.  Returns
 * how many rows it returned.
 */
static int32
claimed_update(SPIPlanPtr *plan, const char *sql, int expect,
			   FunctionCallInfo fcinfo,
			   int nextra, Oid *extratypes, Datum *extra, char *extranulls,
			   int ends, bool notify)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *topic = NULL;
	int32		topic_id = 0;
	bool		topic_notify = false;
	Oid			topic_owner = InvalidOid;
	int64		retried = 0;
	int64	   *ids;
	int32	   *attempts;
	bool	   *durable;
	Oid			gen = InvalidOid;
	Oid			argtypes[6] = {UUIDOID, INT8ARRAYOID, REGROLEOID, TIMESTAMPTZOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	pg_uuid_t  *token;
	int			i;
	uint64		n;
	uint64		k;

	idem_outbox_not_null(fcinfo, 0, "claim");
	values[0] = PG_GETARG_DATUM(0);
	token = DatumGetUUIDP(values[0]);
	values[1] = idem_outbox_ids_arg(fcinfo, 1);
	values[2] = ObjectIdGetDatum(GetUserId());
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	for (i = 0; i < nextra; i++)
	{
		argtypes[4 + i] = extratypes[i];
		values[4 + i] = extra[i];
		nulls[4 + i] = extranulls[i];
	}
	SPI_connect();
	n = idem_run_as_owner(plan, sql, 4 + nextra, argtypes, values, nulls, expect);
	ids = palloc(Max(n, 1) * sizeof(int64));
	attempts = palloc(Max(n, 1) * sizeof(int32));
	durable = palloc(Max(n, 1) * sizeof(bool));
	for (k = 0; k < n; k++)
	{
		HeapTuple	tup = SPI_tuptable->vals[k];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		ids[k] = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		attempts[k] = DatumGetInt32(SPI_getbinval(tup, desc, 5, &isnull));
		durable[k] = DatumGetBool(SPI_getbinval(tup, desc, 6, &isnull));
		if (k == 0)
		{
			/*
			 * messages of one claim share its topic: (id, name, notify,
			 * owner)
			 */
			topic_id = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
			topic = MemoryContextStrdup(cxt, SPI_getvalue(tup, desc, 3));
			topic_notify = DatumGetBool(SPI_getbinval(tup, desc, 4, &isnull));
			topic_owner = DatumGetObjectId(SPI_getbinval(tup, desc, 7, &isnull));
		}
	}
	/* the claims in shared memory end at commit; an ack's retries */
	if (ends != ENDS_NOTHING && n > 0)
		retried = idem_outbox_claims_end(token, (int) n, ids, attempts, durable,
										 ends == ENDS_ACK, &gen);

	/*
	 * ack: the messages delivered, as the snapshots that see the delete see
	 * them
	 */
	if (ends == ENDS_ACK && n > 0)
		idem_outbox_count_acked(gen, topic_id, topic_owner, (int64) n, retried);
	SPI_finish();
	if (ends == ENDS_ACK)
		idem_outbox_vacuum_count((int64) n);	/* outbox_vacuum.c: n dead
												 * rows */
	if (notify && topic != NULL)
		idem_wake_at_commit(topic_id, topic, topic_notify);
	return (int32) n;
}

/* the statements' RETURNING list (see claimed_update()) */
#define CLAIMED_RETURNING \
	" RETURNING m.id, t.id, t.name, t.notify, m.attempts, m.claim IS NOT NULL, t.owner"

/*
 * Which messages the claim $1 holds: with claims in shared memory, those
 * whose entry names it, and those whose row does (a durable claim).
 */
#define HELD_BY_CLAIM \
	"   AND (m.claim OPERATOR(pg_catalog.=) $1" \
	"        OR idempotency._outbox_attempt(m.id, $1) IS NOT NULL)"
/* the claim's attempt: the row's (durable claim) or the entry's */
#define CLAIM_ATTEMPT \
	"COALESCE(CASE WHEN m.claim OPERATOR(pg_catalog.=) $1 THEN m.attempts END," \
	" idempotency._outbox_attempt(m.id, $1))"

static SPIPlanPtr plan_ack_delete = NULL;
static SPIPlanPtr plan_nack_shared = NULL;
static SPIPlanPtr plan_release_shared = NULL;

/*
 * ack(claim, ids) -> how many of the claim's messages were delivered
 *
 * With claims in shared memory the row is deleted (one dead row version
 * per message, no index entry added), and counted delivered in shared
 * memory until the purge adds the counts to its topic's row
 * (outbox_counts.c).  Without: it becomes 'delivered' until the purge.
 */
PG_FUNCTION_INFO_V1(idempotency_ack);

Datum
idempotency_ack(PG_FUNCTION_ARGS)
{
	if (idem_outbox_claims_shared())
		PG_RETURN_INT32(claimed_update(&plan_ack_delete,
									   "DELETE FROM idempotency.outbox_message AS m"
									   " USING idempotency.outbox_topic AS t"
									   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
									   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
									   HELD_BY_CLAIM
									   MAY_CONSUME
									   CLAIMED_RETURNING,
									   SPI_OK_DELETE_RETURNING,
									   fcinfo, 0, NULL, NULL, NULL, ENDS_ACK, false));
	PG_RETURN_INT32(claimed_update(&plan_ack,
								   "UPDATE idempotency.outbox_message AS m"
								   "   SET state = 'delivered', claim = NULL, delivered_at = $4,"
								   "       expires_at = $4 OPERATOR(pg_catalog.+) t.retention"
								   "  FROM idempotency.outbox_topic AS t"
								   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
								   "   AND m.claim OPERATOR(pg_catalog.=) $1"
								   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
								   MAY_CONSUME
								   CLAIMED_RETURNING,
								   SPI_OK_UPDATE_RETURNING,
								   fcinfo, 0, NULL, NULL, NULL, ENDS_NOTHING, false));
}

/*
 * The default backoff, backoff_base * 2^(attempt - 1) capped at backoff_max,
 * is capped before it is doubled: the product is computed only when
 * backoff_max / 2^(attempt - 1) exceeds backoff_base, so it is below
 * backoff_max and cannot leave the interval's range (10 hours * 2^30 did).
 */
#define BACKOFF_FACTOR(A) \
	"pg_catalog.power(2::pg_catalog.float8," \
	" LEAST(GREATEST(" A " OPERATOR(pg_catalog.-) 1, 0), 30)::pg_catalog.float8)"

#define NACK_SQL(A, HELD) \
	"UPDATE idempotency.outbox_message AS m" \
	"   SET claim = NULL, last_error = $5, attempts = " A "," \
	"       state = CASE WHEN " A " OPERATOR(pg_catalog.>=) t.max_attempts" \
	"               THEN 'dead' ELSE 'pending' END," \
	"       available_at = $4 OPERATOR(pg_catalog.+) COALESCE($6," \
	"           CASE WHEN t.backoff_max OPERATOR(pg_catalog./) " BACKOFF_FACTOR(A) \
	"                     OPERATOR(pg_catalog.<=) t.backoff_base" \
	"           THEN t.backoff_max" \
	"           ELSE LEAST(t.backoff_max, t.backoff_base OPERATOR(pg_catalog.*) " BACKOFF_FACTOR(A) ") END)" \
	"  FROM idempotency.outbox_topic AS t" \
	" WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)" \
	HELD \
	"   AND m.state OPERATOR(pg_catalog.=) 'pending'" \
	MAY_CONSUME \
	CLAIMED_RETURNING

/* nack(claim, ids, error, retry_in) -> how many were given back (or went dead) */
PG_FUNCTION_INFO_V1(idempotency_nack);

Datum
idempotency_nack(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {JSONBOID, INTERVALOID};
	Datum		extra[2];
	char		nulls[2];

	if (!PG_ARGISNULL(3))
		idem_outbox_check_interval(PG_GETARG_INTERVAL_P(3), "retry_in", false);
	extra[0] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[0] = PG_ARGISNULL(2) ? 'n' : ' ';
	extra[1] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[1] = PG_ARGISNULL(3) ? 'n' : ' ';
	if (idem_outbox_claims_shared())
		PG_RETURN_INT32(claimed_update(&plan_nack_shared,
									   NACK_SQL(CLAIM_ATTEMPT, HELD_BY_CLAIM),
									   SPI_OK_UPDATE_RETURNING,
									   fcinfo, 2, types, extra, nulls, ENDS_CLAIM, false));
	PG_RETURN_INT32(claimed_update(&plan_nack,
								   NACK_SQL("m.attempts", "   AND m.claim OPERATOR(pg_catalog.=) $1"),
								   SPI_OK_UPDATE_RETURNING,
								   fcinfo, 2, types, extra, nulls, ENDS_NOTHING, false));
}

/*
 * release(claim, ids) -> how many were given back unattempted (other relays
 * are woken).  A claim in shared memory just ends (the row never counted
 * it); a durable one is written back.
 */
PG_FUNCTION_INFO_V1(idempotency_release);

Datum
idempotency_release(PG_FUNCTION_ARGS)
{
	int32		n = claimed_update(&plan_release,
								   "UPDATE idempotency.outbox_message AS m"
								   "   SET claim = NULL, available_at = $4,"
								   "       attempts = GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0)"
								   "  FROM idempotency.outbox_topic AS t"
								   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
								   "   AND m.claim OPERATOR(pg_catalog.=) $1"
								   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
								   MAY_CONSUME
								   CLAIMED_RETURNING,
								   SPI_OK_UPDATE_RETURNING,
								   fcinfo, 0, NULL, NULL, NULL, ENDS_NOTHING, true);

	if (idem_outbox_claims_shared())
		n += claimed_update(&plan_release_shared,
							"SELECT m.id, t.id, t.name, t.notify, m.attempts, false"
							"  FROM idempotency.outbox_message AS m, idempotency.outbox_topic AS t"
							" WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
							"   AND idempotency._outbox_attempt(m.id, $1) IS NOT NULL"
							"   AND m.state OPERATOR(pg_catalog.=) 'pending'"
							MAY_CONSUME
							" FOR NO KEY UPDATE OF m",
							SPI_OK_SELECT,
							fcinfo, 0, NULL, NULL, NULL, ENDS_CLAIM, true);
	PG_RETURN_INT32(n);
}

/*
 * redrive(topic, ids) -> how many dead messages were made pending again
 *
 * A redriven message goes to the back of its key: it takes a new row id
 * (its message_id stays), drawn after its key's lock as publish() draws
 * one, so it is claimed only after every message of its key published
 * before the redrive, and a message of the key that is out (claimed, not
 * yet acked) keeps it waiting.  Without that, its old, smaller id let the
 * claim hand it out beside the one in flight.  The dead messages are
 * locked first (FOR UPDATE): a concurrent redrive of them waits, then finds
 * them pending.
 */
PG_FUNCTION_INFO_V1(idempotency_redrive);

Datum
idempotency_redrive(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[3] = {INT4OID, INT8ARRAYOID, TIMESTAMPTZOID};
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	Oid			utypes[3] = {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID};
	Datum		uvalues[3];
	Datum	   *old_ids;
	Datum	   *new_ids;
	Topic		t;
	uint64		n;
	uint64		i;

	if (!PG_ARGISNULL(1))
		values[1] = idem_outbox_ids_arg(fcinfo, 1);
	else
	{
		values[1] = (Datum) 0;
		nulls[1] = 'n';
	}
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_CONSUME, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[2] = TimestampTzGetDatum(GetCurrentTimestamp());
	n = idem_run_as_owner(&plan_redrive_pick,
						  "SELECT m.id, m.message_key FROM idempotency.outbox_message AS m"
						  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1"
						  "   AND m.state OPERATOR(pg_catalog.=) 'dead'"
						  "   AND ($2 IS NULL OR m.id OPERATOR(pg_catalog.=) ANY ($2))"
						  " ORDER BY m.id FOR UPDATE",
						  2, argtypes, values, nulls, SPI_OK_SELECT);
	if (n == 0)
	{
		SPI_finish();
		PG_RETURN_INT32(0);
	}

	/* in id order: the key's lock, then the new id (see publish()) */
	old_ids = palloc(n * sizeof(Datum));
	new_ids = palloc(n * sizeof(Datum));
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		Datum		key;

		old_ids[i] = SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull);
		key = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
		new_ids[i] = Int64GetDatum(idem_outbox_next_id(PG_GETARG_TEXT_PP(0),
													   isnull ? NULL : DatumGetTextPP(key)));
	}
	uvalues[0] = PointerGetDatum(construct_array(old_ids, (int) n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	uvalues[1] = PointerGetDatum(construct_array(new_ids, (int) n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	uvalues[2] = values[2];
	n = idem_run_as_owner(&plan_redrive,
						  "UPDATE idempotency.outbox_message AS m"
						  "   SET id = r.new_id, state = 'pending', attempts = 0, claim = NULL,"
						  "       available_at = $3"
						  "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS r(old_id, new_id)"
						  " WHERE m.id OPERATOR(pg_catalog.=) r.old_id"
						  "   AND m.state OPERATOR(pg_catalog.=) 'dead'",
						  3, utypes, uvalues, NULL, SPI_OK_UPDATE);
	SPI_finish();
	if (n > 0)
		idem_wake_at_commit(t.id, topic, t.notify);
	PG_RETURN_INT32((int32) n);
}
