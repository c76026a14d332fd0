/*-------------------------------------------------------------------------
 *
 * outbox_topics.c
 *	  The outbox's topics (features floor): create_topic(), alter_topic(),
 *	  drop_topic(), and the grants of a topic to other roles,
 *	  grant_topic() and revoke_topic().
 *
 * Design: a topic belongs to the role that created it; only its owner
 * changes, drops or shares it.  Every change invalidates every backend's
 * publish() cache (outbox.c: idem_outbox_topics_changed()).  Dropping a
 * topic waits for the transactions that publish to it and holds off new
 * ones (see "Dropping a topic" in outbox.c).  A topic whose owner was
 * dropped belongs to no role: it exists for nobody (outbox.c's lookup, the
 * grant policy), and create_topic() of its name drops it, with its grants
 * and messages, and creates the new one.
 *
 * Locking: drop_topic() takes the topic's lock ExclusiveLock until the
 * transaction ends; row locks of the rows a statement changes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox.h"

/* ---------------------------------------------------------------------
 * Topics
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_create = NULL;
static SPIPlanPtr plan_orphan = NULL;
static SPIPlanPtr plan_orphan_messages = NULL;
static SPIPlanPtr plan_orphan_left = NULL;
static SPIPlanPtr plan_orphan_drop = NULL;
static SPIPlanPtr plan_alter = NULL;
static SPIPlanPtr plan_pending = NULL;
static SPIPlanPtr plan_drop_messages = NULL;
static SPIPlanPtr plan_drop_left = NULL;
static SPIPlanPtr plan_drop = NULL;
static SPIPlanPtr plan_grant = NULL;
static SPIPlanPtr plan_revoke = NULL;

/*
 * Drop topic if its owner no longer exists, with its grants and messages
 * (as drop_topic(force) would), so that create_topic() can take its name;
 * returns whether it did.  The row is locked first, then the topic's lock
 * is taken as drop_topic() takes it: a publisher whose transaction began
 * before the owner was dropped still holds the topic, and its messages
 * are deleted after its commit (40001 when this transaction's snapshot
 * cannot see them, as in drop_topic()).  Inside SPI_connect().
 */
static bool
drop_orphan(const char *topic)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;

	values[0] = CStringGetTextDatum(topic);
	if (idem_run_as_owner(&plan_orphan,
						  "SELECT t.id FROM idempotency.outbox_topic AS t"
						  " WHERE t.name OPERATOR(pg_catalog.=) $1"
						  "   AND NOT " OUTBOX_ROLE_EXISTS("t.owner")
						  " FOR UPDATE OF t",
						  1, argtypes, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	argtypes[0] = INT4OID;
	values[0] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	(void) idem_outbox_topic_lock(DatumGetInt32(values[0]), ExclusiveLock);
	idem_run_as_owner(&plan_orphan_messages,
					  "DELETE FROM idempotency.outbox_message AS m"
					  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	if (IsolationUsesXactSnapshot() &&
		idem_run_as_owner_snap(&plan_orphan_left,
							   "SELECT 1 FROM idempotency.outbox_message AS m"
							   " WHERE m.topic_id OPERATOR(pg_catalog.=) $1 LIMIT 1",
							   1, argtypes, values, NULL, SPI_OK_SELECT,
							   GetLatestSnapshot()) > 0)
		idem_outbox_topic_serialization_failure(topic, "A message was published to topic", "publish()");
	idem_run_as_owner(&plan_orphan_drop,
					  "DELETE FROM idempotency.outbox_topic AS t"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	idem_owners_topic_gone(DatumGetInt32(values[0]));
	return true;
}

/*
 * create_topic(topic, max_attempts, backoff_base, backoff_max, retention) -> id
 * (a name held by a topic whose owner was dropped is taken over)
 */
PG_FUNCTION_INFO_V1(idempotency_create_topic);

Datum
idempotency_create_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[7] = {TEXTOID, REGROLEOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		values[7];
	int			i;
	bool		isnull;
	int32		id;

	for (i = 1; i <= 5; i++)
		idem_outbox_not_null(fcinfo, i, i == 1 ? "max_attempts" : i == 2 ? "backoff_base" :
							 i == 3 ? "backoff_max" : i == 4 ? "retention" : "notify");
	if (PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1")));
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(2), "backoff_base", false);
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(3), "backoff_max", false);
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(4), "retention", false);

	values[0] = CStringGetTextDatum(topic);
	values[1] = ObjectIdGetDatum(GetUserId());
	for (i = 1; i <= 5; i++)
		values[i + 1] = PG_GETARG_DATUM(i);
	SPI_connect();
	for (i = 0;; i++)
	{
		if (idem_run_as_owner(&plan_create,
							  "INSERT INTO idempotency.outbox_topic AS t"
							  "  (name, owner, max_attempts, backoff_base, backoff_max, retention, notify)"
							  " VALUES ($1, $2, $3, $4, $5, $6, $7)"
							  " ON CONFLICT (name) DO NOTHING RETURNING t.id",
							  7, argtypes, values, NULL, SPI_OK_INSERT_RETURNING) > 0)
			break;
		if (i > 0 || !drop_orphan(topic))
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("topic \"%s\" already exists", topic),
					 errdetail("Topic names are shared by every role of the database.")));
	}
	id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	idem_outbox_topics_changed();
	SPI_finish();
	PG_RETURN_INT32(id);
}

/* alter_topic(topic, max_attempts, backoff_base, backoff_max, retention): NULL keeps */
PG_FUNCTION_INFO_V1(idempotency_alter_topic);

Datum
idempotency_alter_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[6] = {INT4OID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	Topic		t;
	int			i;

	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1")));
	for (i = 2; i <= 4; i++)
		if (!PG_ARGISNULL(i))
			idem_outbox_check_interval(PG_GETARG_INTERVAL_P(i),
									   i == 2 ? "backoff_base" : i == 3 ? "backoff_max" : "retention", false);
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	for (i = 1; i <= 5; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	idem_run_as_owner(&plan_alter,
					  "UPDATE idempotency.outbox_topic AS t"
					  "   SET max_attempts = COALESCE($2, t.max_attempts),"
					  "       backoff_base = COALESCE($3, t.backoff_base),"
					  "       backoff_max = COALESCE($4, t.backoff_max),"
					  "       retention = COALESCE($5, t.retention),"
					  "       notify = COALESCE($6, t.notify)"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  6, argtypes, values, nulls, SPI_OK_UPDATE);
	idem_outbox_topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* drop_topic(topic, force): the caller's topic with its grants and messages */
PG_FUNCTION_INFO_V1(idempotency_drop_topic);

Datum
idempotency_drop_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	bool		force = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
	Oid			argtypes[1] = {INT4OID};
	Datum		values[1];
	Topic		t;

	SPI_connect();
	for (;;)
	{
		Topic		now;

		(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
		/* wait for the publishers' transactions; hold off new ones */
		(void) idem_outbox_topic_lock(t.id, ExclusiveLock);
		/* another drop_topic() may have committed meanwhile */
		if (idem_outbox_topic_lookup(topic, RIGHT_OWN, &now, GetLatestSnapshot(), true) &&
			now.id == t.id)
			break;
		if (IsolationUsesXactSnapshot())
			idem_outbox_topic_serialization_failure(topic, "Topic was dropped", "drop_topic()");
	}
	values[0] = Int32GetDatum(t.id);
	if (!force)
	{
		bool		isnull;
		int64		n;

		idem_run_as_owner(&plan_pending,
						  "SELECT pg_catalog.count(*) FROM idempotency.outbox_message AS m"
						  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1"
						  "   AND m.state OPERATOR(pg_catalog.=) 'pending'",
						  1, argtypes, values, NULL, SPI_OK_SELECT);
		n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		if (n > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_IN_USE),
					 errmsg("topic \"%s\" has undelivered messages", topic),
					 errdetail_plural("%lld message of the topic is not delivered yet.",
									  "%lld messages of the topic are not delivered yet.",
									  (unsigned long) n, (long long) n),
					 errhint("Use drop_topic(topic, force => true) to drop them too.")));
	}
	idem_run_as_owner(&plan_drop_messages,
					  "DELETE FROM idempotency.outbox_message AS m"
					  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);

	/*
	 * With the lock, READ COMMITTED's statements saw every message that will
	 * ever have been published to the topic.  A transaction snapshot may not
	 * have: a message committed since would outlive its topic.
	 */
	if (IsolationUsesXactSnapshot() &&
		idem_run_as_owner_snap(&plan_drop_left,
							   "SELECT 1 FROM idempotency.outbox_message AS m"
							   " WHERE m.topic_id OPERATOR(pg_catalog.=) $1 LIMIT 1",
							   1, argtypes, values, NULL, SPI_OK_SELECT,
							   GetLatestSnapshot()) > 0)
		idem_outbox_topic_serialization_failure(topic, "A message was published to topic", "publish()");
	idem_run_as_owner(&plan_drop,
					  "DELETE FROM idempotency.outbox_topic AS t"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	idem_owners_topic_gone(t.id);
	idem_outbox_topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* grant_topic(topic, grantee, publish, consume): share one of the caller's topics */
PG_FUNCTION_INFO_V1(idempotency_grant_topic);

Datum
idempotency_grant_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[5] = {INT4OID, REGROLEOID, REGROLEOID, BOOLOID, BOOLOID};
	Datum		values[5];
	Topic		t;

	idem_outbox_not_null(fcinfo, 1, "grantee");
	idem_outbox_not_null(fcinfo, 2, "publish");
	idem_outbox_not_null(fcinfo, 3, "consume");
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = ObjectIdGetDatum(t.owner);
	values[3] = PG_GETARG_DATUM(2);
	values[4] = PG_GETARG_DATUM(3);
	idem_run_as_owner(&plan_grant,
					  "INSERT INTO idempotency.outbox_grant AS g"
					  "  (topic_id, grantee, topic_owner, can_publish, can_consume)"
					  " VALUES ($1, $2, $3, $4, $5)"
					  " ON CONFLICT (topic_id, grantee) DO UPDATE"
					  "   SET can_publish = excluded.can_publish, can_consume = excluded.can_consume",
					  5, argtypes, values, NULL, SPI_OK_INSERT);
	idem_outbox_topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* revoke_topic(topic, grantee) -> whether the role had a grant */
PG_FUNCTION_INFO_V1(idempotency_revoke_topic);

Datum
idempotency_revoke_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[2] = {INT4OID, REGROLEOID};
	Datum		values[2];
	Topic		t;
	bool		found;

	idem_outbox_not_null(fcinfo, 1, "grantee");
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = PG_GETARG_DATUM(1);
	found = idem_run_as_owner(&plan_revoke,
							  "DELETE FROM idempotency.outbox_grant AS g"
							  " WHERE g.topic_id OPERATOR(pg_catalog.=) $1"
							  "   AND g.grantee OPERATOR(pg_catalog.=) $2",
							  2, argtypes, values, NULL, SPI_OK_DELETE) > 0;
	idem_outbox_topics_changed();
	SPI_finish();
	PG_RETURN_BOOL(found);
}
