/*-------------------------------------------------------------------------
 *
 * outbox_publish.c
 *	  publish() (features floor): a message stored in the caller's
 *	  transaction, and its message id.
 *
 * The write path of the outbox, one call per neighbour: the topic, the
 * caller's right, a keyed message's lock and the row id come from
 * outbox_topics.c in one call (idem_outbox_publish_topic(): so per key, id
 * order is commit order), the message id is 128 fresh bits, and the row is
 * stored as the extension's owner: through the executor's simple-relation
 * insert when idempotency.outbox_message has the shipped shape (below),
 * else one prepared INSERT through SPI.  The topic's relays are woken at
 * commit (wakeup.c: shared memory, and NOTIFY for a topic created with
 * notify => true).
 *
 * Locking: the topic's lock shared and the message key's lock, both until
 * the transaction ends (outbox_topics.c); RowExclusiveLock on
 * outbox_message, as the INSERT takes it, until the transaction ends.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"
#include "outbox_topics.h"
#include "wakeup.h"

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
/*
 * The message id: 128 fresh bits (keystore.c: idem_unique128, a per-process
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

/* headers when none are given: '{}', built once per backend */
static Datum
empty_headers(void)
{
	static Jsonb *empty = NULL;

	if (empty == NULL)
	{
		Jsonb	   *j = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")));
		Jsonb	   *copy = MemoryContextAlloc(TopMemoryContext, VARSIZE(j));

		memcpy(copy, j, VARSIZE(j));
		empty = copy;
	}
	return JsonbPGetDatum(empty);
}

/* ---------------------------------------------------------------------
 * The fast path: the row through the executor's simple-relation insert
 * ---------------------------------------------------------------------
 */
/*
 * The shipped shape of outbox_message, column by column in table order
 * (what a new install and every upgrade leave).  owner and published_by
 * are idempotency.roleref (0.6.0; regrole before, as they stay until
 * ALTER EXTENSION UPDATE runs), both an oid on disk.
 * Anything else (a column added, dropped, retyped or moved, a trigger, a
 * rule, forced row security, a partitioned or foreign table, a table
 * Citus distributes) takes the SPI INSERT, which honours all of it.
 */
#define MSG_NATTS 16
static const struct
{
	const char *name;
	Oid			type;			/* InvalidOid: idempotency.roleref */
}			msg_cols[MSG_NATTS] = {
	{"id", INT8OID}, {"topic_id", INT4OID}, {"owner", InvalidOid},
	{"message_id", UUIDOID}, {"message_key", TEXTOID}, {"payload", JSONBOID},
	{"headers", JSONBOID}, {"state", TEXTOID}, {"attempts", INT4OID},
	{"available_at", TIMESTAMPTZOID}, {"claim", UUIDOID},
	{"published_at", TIMESTAMPTZOID}, {"published_by", InvalidOid},
	{"last_error", JSONBOID}, {"delivered_at", TIMESTAMPTZOID},
	{"expires_at", TIMESTAMPTZOID}
};

/* where outbox_message was last seen (checked again on every open) */
static Oid	msg_nsp = InvalidOid;
static Oid	msg_relid = InvalidOid;
static Oid	msg_roleref = InvalidOid;
static bool msg_citus = false;	/* distributed by hand: asked once per table */

/*
 * Open idempotency.outbox_message for an insert (RowExclusiveLock, as the
 * INSERT would take) if it has the shipped shape; NULL (nothing held)
 * otherwise.  The relation's state is read from the relcache on every
 * call, so a trigger, rule or column change made since is seen at once.
 */
static Relation
message_open_fast(void)
{
	Relation	rel = NULL;
	TupleDesc	td;

	if (OidIsValid(msg_relid))
		rel = try_table_open(msg_relid, RowExclusiveLock);
	if (rel != NULL && (rel->rd_rel->relnamespace != msg_nsp ||
						strcmp(RelationGetRelationName(rel), "outbox_message") != 0))
	{
		table_close(rel, RowExclusiveLock);
		rel = NULL;
	}
	if (rel == NULL)
	{
		/* first call, or the table was dropped, renamed or re-created */
		msg_nsp = get_namespace_oid("idempotency", true);
		msg_relid = OidIsValid(msg_nsp) ? get_relname_relid("outbox_message", msg_nsp) :
			InvalidOid;
		msg_roleref = OidIsValid(msg_nsp) ?
			GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid, CStringGetDatum("roleref"),
							ObjectIdGetDatum(msg_nsp)) : InvalidOid;
		if (!OidIsValid(msg_relid))
			return NULL;		/* SPI says what is missing */
		msg_citus = idem_citus_table(msg_relid);
		rel = table_open(msg_relid, RowExclusiveLock);
	}
	td = RelationGetDescr(rel);
	if (rel->rd_rel->relkind != RELKIND_RELATION || rel->trigdesc != NULL ||
		rel->rd_rules != NULL || rel->rd_rel->relforcerowsecurity ||
		td->natts != MSG_NATTS || msg_citus)
		goto slow;
	for (int i = 0; i < MSG_NATTS; i++)
	{
		Form_pg_attribute a = TupleDescAttr(td, i);
		Oid			want;

		/*
		 * a roleref column of a type this session has not seen: made by ALTER
		 * EXTENSION UPDATE since the lookup above (a session of the update
		 * window, which saw 0.5.0's regrole columns and no type)
		 */
		if (!OidIsValid(msg_cols[i].type) && a->atttypid != REGROLEOID &&
			a->atttypid != msg_roleref)
			msg_roleref = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
										  CStringGetDatum("roleref"),
										  ObjectIdGetDatum(msg_nsp));
		want = OidIsValid(msg_cols[i].type) ? msg_cols[i].type : msg_roleref;
		if (a->attisdropped || a->attgenerated ||
			(a->atttypid != want &&
			 !(want == msg_roleref && a->atttypid == REGROLEOID)) ||
			strcmp(NameStr(a->attname), msg_cols[i].name) != 0)
			goto slow;
	}
	return rel;

slow:
	table_close(rel, RowExclusiveLock);
	return NULL;
}

/*
 * Store the message row (values/nulls in table order) in rel as the
 * extension's owner (runas.c: NOT NULL and CHECK constraints, every index
 * that is ready for inserts).
 */
static void
message_insert_fast(Relation rel, const Datum *values, const bool *nulls)
{
	idem_insert_as_owner(rel, values, nulls);
	table_close(rel, NoLock);	/* RowExclusiveLock until the transaction ends */
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
 * the key's lock (keyed messages), the row id from the sequence, a fresh
 * message id, the row (fast path or SPI: see above), the commit's wake-up.
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
	Datum		message_id;
	Datum		headers;
	Relation	rel;

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

	/*
	 * the topic, a keyed message's lock, then the row id ("Order per message
	 * key")
	 */
	id = idem_outbox_publish_topic(topic, PG_GETARG_TEXT_PP(0),
								   PG_ARGISNULL(2) ? NULL : PG_GETARG_TEXT_PP(2), &t);
	message_id = message_uuid(CurrentMemoryContext);
	headers = PG_ARGISNULL(3) ? empty_headers() : PG_GETARG_DATUM(3);

	rel = message_open_fast();
	if (rel != NULL)
	{
		Datum		row[MSG_NATTS] = {0};
		bool		isnull[MSG_NATTS] = {false};

		row[0] = Int64GetDatum(id);
		row[1] = Int32GetDatum(t.id);
		row[2] = ObjectIdGetDatum(t.owner);
		row[3] = message_id;
		row[4] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
		isnull[4] = PG_ARGISNULL(2);
		row[5] = PG_GETARG_DATUM(1);
		row[6] = headers;
		row[7] = CStringGetTextDatum("pending");
		row[8] = Int32GetDatum(0);	/* attempts: the column's DEFAULT */
		row[9] = TimestampTzGetDatum(available);
		isnull[10] = true;		/* claim */
		row[11] = TimestampTzGetDatum(now);
		row[12] = ObjectIdGetDatum(GetUserId());	/* the caller, before the
													 * switch */
		isnull[13] = isnull[14] = isnull[15] = true;	/* last_error,
														 * delivered_at,
														 * expires_at */
		message_insert_fast(rel, row, isnull);
	}
	else
	{
		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum(t.id);
		values[2] = ObjectIdGetDatum(t.owner);
		values[3] = message_id;
		values[4] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
		nulls[4] = PG_ARGISNULL(2) ? 'n' : ' ';
		values[5] = PG_GETARG_DATUM(1);
		values[6] = headers;
		values[7] = TimestampTzGetDatum(available);
		values[8] = TimestampTzGetDatum(now);
		values[9] = ObjectIdGetDatum(GetUserId());
		values[10] = CStringGetTextDatum("pending");
		SPI_connect();
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
	}

	idem_wake_at_commit(t.id, topic, t.notify);
	PG_RETURN_DATUM(message_id);
}
