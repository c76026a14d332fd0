/*-------------------------------------------------------------------------
 *
 * outbox_inflight.c
 *	  The SQL-callable readers of the outbox claims that outbox_claims.c
 *	  keeps in shared memory: for the claim statements (outbox_relay.c)
 *	  and the view outbox_in_flight (outbox_counts.c reads the counts).
 *
 *	idempotency._outbox_claimed(id)			claimed, and its claim not lapsed?
 *	idempotency._outbox_attempt(id, claim)	the claim's attempt of id
 *	idempotency._outbox_claim(id)			the claim that holds id
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"

/* _outbox_claimed(id) -> is id claimed, its claim not lapsed? */
PG_FUNCTION_INFO_V1(idempotency_outbox_claimed);

Datum
idempotency_outbox_claimed(PG_FUNCTION_ARGS)
{
	IdemOutboxClaim c;

	PG_RETURN_BOOL(idem_outbox_claim_read(PG_GETARG_INT64(0), &c) &&
				   c.until > GetCurrentTimestamp());
}

/* _outbox_attempt(id, claim) -> the claim's attempt of id, NULL unless it holds id */
PG_FUNCTION_INFO_V1(idempotency_outbox_attempt);

Datum
idempotency_outbox_attempt(PG_FUNCTION_ARGS)
{
	IdemOutboxClaim c;
	pg_uuid_t  *token = PG_GETARG_UUID_P(1);

	if (!idem_outbox_claim_read(PG_GETARG_INT64(0), &c) ||
		memcmp(&c.token, token, sizeof(pg_uuid_t)) != 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(c.attempt);
}

/*
 * _outbox_claim(id) -> (claim, claimed_until, attempt) of the claim in
 * shared memory that holds id, lapsed or not (NULLs: none); for the view
 * outbox_in_flight.  A token alone lets nobody ack: ack() also checks the
 * caller's right to consume the message's topic; still, it is shown only
 * to whom the topic is visible (as _outbox_counts), not to any caller who
 * guesses message ids.
 */
PG_FUNCTION_INFO_V1(idempotency_outbox_claim);

Datum
idempotency_outbox_claim(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	IdemOutboxClaim c;
	Datum		values[3] = {0, 0, 0};
	bool		nulls[3] = {true, true, true};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "_outbox_claim must return a row");
	/* another role's message: nothing (the function takes any id) */
	if (idem_outbox_claim_read(PG_GETARG_INT64(0), &c) && idem_outbox_topic_visible(c.topic_id))
	{
		pg_uuid_t  *token = palloc(sizeof(pg_uuid_t));

		*token = c.token;
		values[0] = UUIDPGetDatum(token);
		values[1] = TimestampTzGetDatum(c.until);
		values[2] = Int32GetDatum(c.attempt);
		nulls[0] = nulls[1] = nulls[2] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
