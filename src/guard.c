/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  idempotency.begin(), complete() and fail(): the key guard.
 *
 * Design (single-transaction mode):
 *
 *	begin(key)	  1. validate the key (IK003) and fingerprint the request
 *				  2. take the key lock (keylock.c), waiting at most
 *					 idempotency.lock_wait (IK002)
 *				  3. read the stored row (one SPI SELECT)
 *				  4. decide: replay a completed or permanently failed key
 *					 (and give the lock back: a replay writes nothing),
 *					 retry a retryably failed one, or start a new one;
 *					 a different request fingerprint is IK001
 *				  Nothing is written at begin: other transactions are kept
 *				  out by the lock, not by a row, so a first-time request
 *				  writes its row once, at complete().
 *
 *	complete()/	  write the row (one SPI INSERT, or an UPDATE when a row was
 *	fail()		  there) for a key this transaction began (else IK004).
 *
 *	COMMIT		  fails while a begun key is unfinished (heldkeys.c).
 *
 * So a first-time request costs one SELECT and one INSERT; a replay one
 * SELECT and no write at all.
 *
 * Locking: the key lock is held from begin() to the end of the transaction
 * (or of the subtransaction that took it, if that one rolls back).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idempotency.h"

#define DESCRIBE_MAX_BYTES 100

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/* s, clipped to DESCRIBE_MAX_BYTES at a character boundary */
static void
append_clipped(StringInfo buf, const char *s, int len)
{
	if (len <= DESCRIBE_MAX_BYTES)
		appendBinaryStringInfo(buf, s, len);
	else
	{
		appendBinaryStringInfo(buf, s, pg_mbcliplen(s, len, DESCRIBE_MAX_BYTES));
		appendStringInfoString(buf, "...");
	}
}

/* "idempotency key "k"" or "idempotency key "k" in scope "s"", for messages */
char *
describe_key(const KeyId *id)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "idempotency key \"");
	append_clipped(&buf, id->key, id->key_len);
	appendStringInfoChar(&buf, '"');
	if (id->scope_len > 0)
	{
		appendStringInfoString(&buf, " in scope \"");
		append_clipped(&buf, id->scope, id->scope_len);
		appendStringInfoChar(&buf, '"');
	}
	return buf.data;
}

static void
check_length(const char *what, const char *s, int len)
{
	int			nchars = pg_mbstrlen_with_len(s, len);

	if (nchars > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency %s is too long", what),
				 errdetail("The %s has %d characters; idempotency.max_key_length allows %d.",
						   what, nchars, idem_max_key_length)));
}

/* Validate arguments keyarg/scopearg and build the key's identity (IK003). */
static KeyId
make_keyid(FunctionCallInfo fcinfo, int keyarg, int scopearg)
{
	KeyId		id;

	if (PG_ARGISNULL(keyarg))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency key must not be null")));
	if (PG_ARGISNULL(scopearg))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency scope must not be null"),
				 errhint("Use '' (the default) for no scope.")));

	id.key = text_to_cstring(PG_GETARG_TEXT_PP(keyarg));
	id.key_len = strlen(id.key);
	id.scope = text_to_cstring(PG_GETARG_TEXT_PP(scopearg));
	id.scope_len = strlen(id.scope);

	if (id.key_len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency key must not be empty")));
	check_length("key", id.key, id.key_len);
	check_length("scope", id.scope, id.scope_len);
	if (id.key_len + id.scope_len > MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency key is too long"),
				 errdetail("Key and scope take %d bytes together; at most %d are allowed.",
						   id.key_len + id.scope_len, MAX_KEY_BYTES)));

	id.owner = GetUserId();
	id.hash = hash_bytes_extended((const unsigned char *) id.scope, id.scope_len,
								  (uint64) id.owner);
	id.hash = hash_bytes_extended((const unsigned char *) id.key, id.key_len,
								  id.hash);
	return id;
}

static char *
hex_prefix(const uint8 *h)
{
	return psprintf("%02x%02x%02x%02x%02x%02x", h[0], h[1], h[2], h[3], h[4], h[5]);
}

static Datum
make_result(FunctionCallInfo fcinfo, const char *outcome, const char *status,
			Jsonb *response, int32 attempts, TimestampTz created_at)
{
	TupleDesc	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};

	if (tupdesc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		TupleDesc	td;

		if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(td));
		fcinfo->flinfo->fn_extra = tupdesc;
		MemoryContextSwitchTo(old);
	}
	values[0] = CStringGetTextDatum(outcome);
	values[1] = CStringGetTextDatum(status);
	if (response)
		values[2] = JsonbPGetDatum(response);
	else
		nulls[2] = true;
	values[3] = Int32GetDatum(attempts);
	values[4] = TimestampTzGetDatum(created_at);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/* begin(key, request, scope, ttl, lease) -> (outcome, status, response, attempts, created_at) */
PG_FUNCTION_INFO_V1(idempotency_begin);

Datum
idempotency_begin(PG_FUNCTION_ARGS)
{
	KeyId		id = make_keyid(fcinfo, 0, 2);
	HeldKey    *held;
	HeldKey		proto;
	StoredKey	stored;
	bool		has_hash = false;
	uint8		hash[FINGERPRINT_LEN];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at;
	bool		took_lock;
	bool		row_there;
	bool		live;
	MemoryContext caller_cxt = CurrentMemoryContext;

	if (!PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("lease mode is not available in this version of idempotency"),
				 errhint("Call begin() without lease and finish the work in the same transaction.")));

	if (PG_ARGISNULL(3))
		expires_at = now + (TimestampTz) idem_default_ttl_s * USECS_PER_SEC;
	else
	{
		Interval   *ttl = PG_GETARG_INTERVAL_P(3);

		expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															 TimestampTzGetDatum(now),
															 IntervalPGetDatum(ttl)));
		if (expires_at <= now)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("ttl must be positive")));
	}

	held = held_lookup(&id);
	if (held && held->state == HELD_BEGUN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
				 errmsg("%s is already in progress in this transaction", describe_key(&id)),
				 errdetail("This transaction began it and has not completed or failed it yet."),
				 errhint("Call idempotency.complete() or idempotency.fail() before beginning it again.")));

	if (!PG_ARGISNULL(1))
	{
		idem_fingerprint(PG_GETARG_JSONB_P(1), hash);
		has_hash = true;
	}

	took_lock = keylock_acquire(&id);

	SPI_connect();
	keystore_lookup(&id, &stored, caller_cxt);
	SPI_finish();

	/* an expired row behaves as absent, but is still there to overwrite */
	row_there = stored.found;
	live = stored.found && stored.expires_at > now;

	if (live && has_hash && stored.has_hash &&
		memcmp(hash, stored.request_hash, FINGERPRINT_LEN) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_REUSED),
				 errmsg("%s was already used with a different request", describe_key(&id)),
				 errdetail("The stored request fingerprint starts %s, this request's starts %s.",
						   hex_prefix(stored.request_hash), hex_prefix(hash)),
				 errhint("Use a new idempotency key for a new request (HTTP 422).")));

	if (live &&
		(stored.status == 'c' || (stored.status == 'f' && !stored.retryable)))
	{
		/* replay: nothing to write, so nothing to keep others out of */
		if (took_lock)
			keylock_release(&id);
		PG_RETURN_DATUM(make_result(fcinfo, "replay",
									stored.status == 'c' ? "completed" : "failed",
									stored.response, stored.attempts,
									stored.created_at));
	}

	/*
	 * new or retry: this transaction now owns the work.  A live row that is
	 * not finished (a retryable failure, or an in_progress row left behind)
	 * is retried; anything else starts afresh.
	 */
	memset(&proto, 0, sizeof(proto));
	proto.id = id;
	proto.state = HELD_BEGUN;
	proto.expires_at = expires_at;
	proto.row_exists = row_there;
	if (live)
	{
		proto.attempts = stored.attempts + 1;
		proto.created_at = stored.created_at;
	}
	else
	{
		proto.attempts = 1;
		proto.created_at = now;
	}
	if (has_hash)
	{
		proto.has_hash = true;
		memcpy(proto.request_hash, hash, FINGERPRINT_LEN);
	}
	else if (live && stored.has_hash)
	{
		proto.has_hash = true;
		memcpy(proto.request_hash, stored.request_hash, FINGERPRINT_LEN);
	}
	held_push(&proto);

	if (live)
		PG_RETURN_DATUM(make_result(fcinfo, "retry", "in_progress",
									stored.response, proto.attempts,
									proto.created_at));
	PG_RETURN_DATUM(make_result(fcinfo, "new", "in_progress", NULL, 1, now));
}

/* shared body of complete() and fail() */
static void
finish_key(FunctionCallInfo fcinfo, HeldState newstate, Jsonb *payload,
		   bool retryable)
{
	KeyId		id = make_keyid(fcinfo, 0, 2);
	HeldKey    *held = held_lookup(&id);
	HeldKey		next;
	const char *fn = newstate == HELD_COMPLETED ? "complete" : "fail";

	if (held == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s is not held by this transaction", describe_key(&id)),
				 errdetail("%s() needs a begin() in the same transaction, by the same role, that returned new or retry.", fn),
				 errhint("A begin() inside a savepoint that was rolled back no longer holds its key.")));
	if (held->state != HELD_BEGUN)
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s is not held by this transaction", describe_key(&id)),
				 errdetail("This transaction already %s it.",
						   held->state == HELD_COMPLETED ? "completed" : "failed")));

	SPI_connect();
	keystore_write(held, newstate == HELD_COMPLETED ? "completed" : "failed",
				   payload, newstate == HELD_COMPLETED, retryable);
	SPI_finish();

	next = *held;
	next.state = newstate;
	next.row_exists = true;
	held_push(&next);
}

/* complete(key, response, scope): store the result of a held key */
PG_FUNCTION_INFO_V1(idempotency_complete);

Datum
idempotency_complete(PG_FUNCTION_ARGS)
{
	finish_key(fcinfo, HELD_COMPLETED,
			   PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1), false);
	PG_RETURN_VOID();
}

/* fail(key, error, scope, retryable): store the failure of a held key */
PG_FUNCTION_INFO_V1(idempotency_fail);

Datum
idempotency_fail(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("retryable must not be null")));
	finish_key(fcinfo, HELD_FAILED,
			   PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1),
			   PG_GETARG_BOOL(3));
	PG_RETURN_VOID();
}
