/*-------------------------------------------------------------------------
 *
 * outbox_publish.c
 *	  publish() (features floor): a message stored in the caller's
 *	  transaction, and its message id.
 *
 * Design: the hot path of the outbox.  The topic and the caller's right
 * come from the backend's cache (outbox.c), a keyed message takes its
 * key's lock before it draws its row id from the sequence (so per key, id
 * order is commit order: see outbox.c), the message id is 128 fresh bits,
 * and one prepared INSERT stores the row as the extension's owner.  The
 * topic's relays are woken at commit (wakeup.c; and outbox_notify.c's NOTIFY
 * for a topic created with notify => true).
 *
 * Locking: the topic's lock shared and the message key's lock, both until
 * the transaction ends (outbox.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox.h"

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
/*
 * The message id: 128 fresh bits (keyid.c: idem_unique128, a per-process
 * SipHash stream keyed by pg_strong_random) as a version 4 UUID.  Nothing
 * a template clone, a restored dump or a rewound sequence copies enters it,
 * so two databases never issue the same id (as 0.5.0 did, from the row id
 * and the database's lock secret); far cheaper than gen_random_uuid()
 * (pg_strong_random on every call).
 */
static Datum
message_uuid(MemoryContext cxt)
{
	pg_uuid_t  *u = MemoryContextAlloc(cxt, sizeof(pg_uuid_t));

	idem_unique128(u->data);
	u->data[6] = (u->data[6] & 0x0f) | 0x40;	/* version 4 */
	u->data[8] = (u->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
	return UUIDPGetDatum(u);
}

/* ---------------------------------------------------------------------
 * publish
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_publish = NULL;

/*
 * publish(topic, payload, message_key, headers, deliver_after) -> message id
 *
 * The hot path: the topic and the caller's right from the backend's cache,
 * the key's lock (keyed messages), the row id from the sequence, the
 * message id from the row id, one prepared INSERT, one NOTIFY.
 */
PG_FUNCTION_INFO_V1(idempotency_publish);

Datum
idempotency_publish(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[11] = {INT8OID, INT4OID, REGROLEOID, UUIDOID, TEXTOID, JSONBOID,
	JSONBOID, TIMESTAMPTZOID, TIMESTAMPTZOID, REGROLEOID, TEXTOID};
	Datum		values[11];
	char		nulls[11] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz available = now;
	Topic		t;
	int64		id;
	MemoryContext caller_cxt;

	idem_outbox_not_null(fcinfo, 1, "payload");
	if (!PG_ARGISNULL(3) && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(3)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("A message's headers are {\"name\": \"value\", ...}.")));
	if (!PG_ARGISNULL(4))
	{
		idem_outbox_check_interval(PG_GETARG_INTERVAL_P(4), "deliver_after", false);
		available = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															TimestampTzGetDatum(now),
															PG_GETARG_DATUM(4)));
	}

	caller_cxt = CurrentMemoryContext;
	SPI_connect();
	idem_outbox_topic_for_publish(topic, &t);

	/* keyed: the key's lock before the id (outbox.c: "Order per message key") */
	if (!PG_ARGISNULL(2))
		idem_outbox_key_lock(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(2));
	/* the lookup may have reset the sequence's cached OID */
	id = nextval_internal(idem_outbox_message_seq(), false);

	values[0] = Int64GetDatum(id);
	values[1] = Int32GetDatum(t.id);
	values[2] = ObjectIdGetDatum(t.owner);
	/* returned after SPI_finish(): allocated in the caller's context */
	values[3] = message_uuid(caller_cxt);
	values[4] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[4] = PG_ARGISNULL(2) ? 'n' : ' ';
	values[5] = PG_GETARG_DATUM(1);
	values[6] = PG_ARGISNULL(3) ? DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")) :
		PG_GETARG_DATUM(3);
	values[7] = TimestampTzGetDatum(available);
	values[8] = TimestampTzGetDatum(now);
	values[9] = ObjectIdGetDatum(GetUserId());
	values[10] = CStringGetTextDatum("pending");
	if (idem_run_as_owner(&plan_publish,
						  "INSERT INTO idempotency.outbox_message"
						  "  (id, topic_id, owner, message_id, message_key, payload, headers,"
						  "   available_at, published_at, published_by, state)"
						  " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
						  11, argtypes, values, nulls, SPI_OK_INSERT) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("the message was not stored in table idempotency.outbox_message"),
				 errdetail("A trigger on the table skipped the row.")));
	SPI_finish();

	idem_wake_at_commit(t.id);	/* wakeup.c: wait_for() */
	if (t.notify)
		idem_outbox_notify(topic);
	PG_RETURN_DATUM(values[3]);
}
