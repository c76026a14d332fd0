/*-------------------------------------------------------------------------
 *
 * lifecycle.c
 *	  Expiry and purge, one-time tokens, consumer deduplication.
 *
 * purge: every table of the extension has owner and expires_at columns and
 * an index on expires_at.  One batch is one statement per table:
 *
 *	  WITH l AS (SELECT tableoid, ctid ... WHERE expires_at <= now [AND owner = r]
 *				 LIMIT n FOR UPDATE SKIP LOCKED)
 *	  DELETE ... WHERE ctid = ANY (l's ctids)				-- a TID scan
 *				   AND (tableoid, ctid) = ANY (l's pairs)	-- only rows l locked
 *				   AND expires_at <= now [AND owner = r]
 *
 * so a batch takes only row locks, never waits for a row another
 * transaction has locked, and rechecks the expiry (and owner) of each row
 * it deletes.  A ctid is unique only within one table: on a partitioned key
 * table (the README's recipe) another partition has a row at the same
 * ctid, perhaps another role's, perhaps locked by another transaction, so
 * the DELETE matches the pair (tableoid, ctid), which the filter checks
 * before the row is locked: it never touches, nor waits for, a row the
 * batch did not lock.
 * A begin() that found an expired row and later writes it copes with the
 * row vanishing (idem_keystore_write falls back to INSERT).  The SQL function
 * purges one batch of the caller's own rows; the background worker
 * (worker.c) purges every role's rows, a committed batch at a time.
 *
 * On Citus (a table in pg_dist_partition, idem_citus_table()) Citus cannot
 * run the ctid statement above (ctids are per shard, and a locking
 * subquery over many shards is not routable).  There a batch is
 *
 *	  DELETE ... WHERE (primary key) IN (SELECT primary key ... WHERE
 *									   expires_at <= now LIMIT n)
 *				  AND expires_at <= now
 *
 * which Citus plans in two steps (the subquery's rows gathered first, then
 * one DELETE per shard), planned afresh with its values each time (Citus
 * cannot split a generic plan).  It does not skip locked rows: it waits for a
 * transaction that holds one (a begin() retrying an expired key), then
 * rechecks the expiry and leaves a row that was renewed.  Asked per batch,
 * so a table distributed while the worker runs is purged the new way.
 *
 * Delivered outbox messages (outbox.c) are purged the same way by one
 * statement that also adds them to their topics' purged_* counters.
 *
 * Tokens: issue_token() inserts a random uuid; consume_token() deletes it.
 * Concurrent consumers serialise on the row lock of the DELETE: exactly one
 * deletes it, the others then find nothing.  A rolled-back consumer gives
 * the token back.
 *
 * first_seen(): INSERT ... ON CONFLICT DO NOTHING into seen_message.  A
 * second delivery waits for the first one's transaction like any unique
 * insert, then finds the row (false) or, if the first rolled back, inserts
 * it (true).  A redelivery writes nothing; an expired entry is re-armed by
 * an UPDATE guarded by its expiry.
 *
 * All statements run as the tables' owner (runas.c) with the
 * caller's role as a parameter, schema-qualified, prepared once and kept.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "idempotency.h"

/* ---------------------------------------------------------------------
 * purge
 * ---------------------------------------------------------------------
 */
static const char *const purge_tables[PURGE_NTABLES] = {
	"idempotency_key", "token", "seen_message", "outbox_message"
};
#define PURGE_OUTBOX 3			/* delivered outbox messages: purge_outbox_sql */

/* [table][0 = one role, 1 = every role]; none on Citus (planned afresh) */
static SPIPlanPtr purge_plans[PURGE_NTABLES][2];

/* each table's primary key, for the Citus statement */
static const char *const purge_keys[PURGE_NTABLES] = {
	"key, scope, owner", "token", "message_id, scope, owner",
	NULL						/* outbox_message: never distributed */
};

static const char *const purge_sql =
"WITH l AS MATERIALIZED ("
"  SELECT s.tableoid AS rel, s.ctid AS tid FROM idempotency.%s AS s"
"   WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
"   LIMIT $2 FOR UPDATE SKIP LOCKED)"
" DELETE FROM idempotency.%s AS t"
" WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT l.tid FROM l))"
"   AND (t.tableoid, t.ctid) OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT (l.rel, l.tid) FROM l))"
"   AND t.expires_at OPERATOR(pg_catalog.<=) $1 %s";

/* Citus: by primary key (see the file comment) */
static const char *const purge_sql_citus =
"DELETE FROM idempotency.%s AS t"
" WHERE (%s) IN ("
"         SELECT %s FROM idempotency.%s AS s"
"          WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
"          LIMIT $2)"
"   AND t.expires_at OPERATOR(pg_catalog.<=) $1";

/*
 * Delivered outbox messages (expires_at is set by ack()): the same batch,
 * and the deleted messages are added to their topics' purged_* counters
 * so idempotency.outbox_stats keeps counting them (outbox.c).
 */
static const char *const purge_outbox_sql =
"WITH l AS MATERIALIZED ("
"  SELECT s.tableoid AS rel, s.ctid AS tid FROM idempotency.outbox_message AS s"
"   WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
"   LIMIT $2 FOR UPDATE SKIP LOCKED),"
" d AS ("
" DELETE FROM idempotency.outbox_message AS t"
"  WHERE t.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT l.tid FROM l))"
"    AND (t.tableoid, t.ctid) OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT (l.rel, l.tid) FROM l))"
"    AND t.expires_at OPERATOR(pg_catalog.<=) $1 %s"
" RETURNING t.topic_id, t.attempts),"
" u AS ("
" UPDATE idempotency.outbox_topic AS p"
"    SET purged_delivered = p.purged_delivered OPERATOR(pg_catalog.+) a.n,"
"        purged_retries = p.purged_retries OPERATOR(pg_catalog.+) a.r"
"   FROM (SELECT d.topic_id, pg_catalog.count(*) AS n,"
"                pg_catalog.sum(GREATEST(d.attempts OPERATOR(pg_catalog.-) 1, 0)) AS r"
"           FROM d GROUP BY d.topic_id) AS a"
"  WHERE p.id OPERATOR(pg_catalog.=) a.topic_id)"
" SELECT pg_catalog.count(*) FROM d";

/*
 * Delete at most batch_size expired rows from each table of the extension
 * that exists, of role owner (InvalidOid: of every role).  Caller is inside
 * SPI_connect().  counts[i] gets the rows deleted from purge_tables[i];
 * returns the sum.
 */
int64
idem_purge_expired(Oid owner, int batch_size, TimestampTz now, int64 *counts)
{
	Oid			nsp = get_namespace_oid("idempotency", true);
	int64		total = 0;
	int			i;

	for (i = 0; i < PURGE_NTABLES; i++)
	{
		int			all = OidIsValid(owner) ? 0 : 1;
		Oid			argtypes[3] = {TIMESTAMPTZOID, INT4OID, REGROLEOID};
		Datum		values[3];
		char	   *sql;
		Oid			relid = InvalidOid;
		int			citus;

		counts[i] = 0;
		if (OidIsValid(nsp))
			relid = get_relname_relid(purge_tables[i], nsp);
		if (!OidIsValid(relid))
			continue;			/* an older version of the extension */
		citus = idem_citus_table(relid) ? 1 : 0;

		values[0] = TimestampTzGetDatum(now);
		values[1] = Int32GetDatum(batch_size);
		values[2] = ObjectIdGetDatum(owner);
		if (i == PURGE_OUTBOX)
		{
			bool		isnull;

			/* not distributed by distribute(): a local table everywhere */
			sql = psprintf(purge_outbox_sql,
						   all ? "" : "AND s.owner OPERATOR(pg_catalog.=) $3",
						   all ? "" : "AND t.owner OPERATOR(pg_catalog.=) $3");
			idem_run_as_owner(&purge_plans[i][all], sql, all ? 2 : 3, argtypes,
							  values, NULL, SPI_OK_SELECT);
			counts[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
			pfree(sql);
			total += counts[i];
			continue;
		}
		if (citus && !all)
		{
			argtypes[2] = REGROLEOID;	/* the owner by roleref */
			values[2] = idem_owner_ref(owner);
		}
		if (citus)
			sql = psprintf(purge_sql_citus, purge_tables[i], purge_keys[i],
						   purge_keys[i], purge_tables[i],
						   all ? "" : "AND " IDEM_OWNER_EQ_CITUS("s.owner", "$3"));
		else
			sql = psprintf(purge_sql, purge_tables[i],
						   all ? "" : "AND s.owner OPERATOR(pg_catalog.=) $3",
						   purge_tables[i],
						   all ? "" : "AND t.owner OPERATOR(pg_catalog.=) $3");
		if (citus)
			counts[i] = idem_run_as_owner_once(sql, all ? 2 : 3, argtypes, values,
											   NULL, SPI_OK_DELETE);
		else
			counts[i] = idem_run_as_owner(&purge_plans[i][all], sql, all ? 2 : 3,
										  argtypes, values, NULL, SPI_OK_DELETE);
		pfree(sql);
		total += counts[i];
	}
	idem_stats_add(GetUserId(), "", 0, IDEM_STAT_PURGED, total);	/* the purger's */
	return total;
}

/* purge(batch_size): delete up to batch_size of the caller's expired rows per table */
PG_FUNCTION_INFO_V1(idempotency_purge);

Datum
idempotency_purge(PG_FUNCTION_ARGS)
{
	int32		batch_size = PG_GETARG_INT32(0);
	int64		counts[PURGE_NTABLES];
	int64		total;

	if (batch_size < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be at least 1")));
	SPI_connect();
	total = idem_purge_expired(GetUserId(), batch_size,
						  GetCurrentTransactionStartTimestamp(), counts);
	SPI_finish();
	PG_RETURN_INT64(total);
}

/* ---------------------------------------------------------------------
 * one-time tokens
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_issue = NULL;
static SPIPlanPtr plan_consume = NULL;
static SPIPlanPtr plan_consume_citus = NULL;

#define CONSUME_SQL(owner_eq) \
	"DELETE FROM idempotency.token AS t" \
	" WHERE t.token OPERATOR(pg_catalog.=) $1" \
	"   AND " owner_eq("t.owner", "$2") \
	"   AND t.scope OPERATOR(pg_catalog.=) $3" \
	"   AND t.expires_at OPERATOR(pg_catalog.>) $4"

/* issue_token(scope, ttl) -> uuid: a token that consume_token() accepts once */
PG_FUNCTION_INFO_V1(idempotency_issue_token);

Datum
idempotency_issue_token(PG_FUNCTION_ARGS)
{
	char	   *scope = idem_scope_arg(fcinfo, 0);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz expires_at = idem_expiry(fcinfo, 1, now);
	Oid			argtypes[5] = {UUIDOID, REGROLEOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		values[5];
	Datum		token = DirectFunctionCall1(gen_random_uuid, (Datum) 0);

	/*
	 * The token is made here and passed in, not read back from RETURNING:
	 * what a DBA's trigger or column type does to the stored value cannot
	 * change what the caller is given, and a trigger that skips the row is
	 * an error, not a token that was never stored.
	 */
	values[0] = token;
	values[1] = ObjectIdGetDatum(GetUserId());
	values[2] = CStringGetTextDatum(scope);
	values[3] = TimestampTzGetDatum(now);
	values[4] = TimestampTzGetDatum(expires_at);

	SPI_connect();
	if (idem_run_as(!idem_table_distributed(IDEM_TABLE_TOKEN), &plan_issue,
						  "INSERT INTO idempotency.token (token, owner, scope, created_at, expires_at)"
						  " VALUES ($1, $2, $3, $4, $5)",
						  5, argtypes, values, NULL, SPI_OK_INSERT) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("the token was not stored in table idempotency.token"),
				 errdetail("A trigger on the table skipped the row.")));
	SPI_finish();
	PG_RETURN_DATUM(token);
}

/* consume_token(token, scope) -> true exactly once; false when used, expired or unknown */
PG_FUNCTION_INFO_V1(idempotency_consume_token);

Datum
idempotency_consume_token(PG_FUNCTION_ARGS)
{
	char	   *scope = idem_scope_arg(fcinfo, 1);
	Oid			argtypes[4] = {UUIDOID, REGROLEOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	bool		consumed;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);	/* an unknown token */

	values[0] = PG_GETARG_DATUM(0);
	values[1] = ObjectIdGetDatum(GetUserId());
	values[2] = CStringGetTextDatum(scope);
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());

	SPI_connect();
	if (idem_table_distributed(IDEM_TABLE_TOKEN))
	{
		/* Citus: the owner as a roleref (role oids differ between nodes; idempotency.h) */
		argtypes[1] = REGROLEOID;
		values[1] = idem_owner_ref(GetUserId());
		consumed = idem_run_as(false, &plan_consume_citus, CONSUME_SQL(IDEM_OWNER_EQ_CITUS),
							   4, argtypes, values, NULL, SPI_OK_DELETE) > 0;
	}
	else
		consumed = idem_run_as_owner(&plan_consume, CONSUME_SQL(IDEM_OWNER_EQ),
									 4, argtypes, values, NULL, SPI_OK_DELETE) > 0;
	SPI_finish();
	PG_RETURN_BOOL(consumed);
}

/* ---------------------------------------------------------------------
 * consumer dedup
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_seen_insert = NULL;
static SPIPlanPtr plan_seen_rearm = NULL;
static SPIPlanPtr plan_seen_rearm_citus = NULL;

/*
 * On Citus, the re-arm is an upsert, which names the owner only as a value
 * (role oids differ between nodes; idempotency.h)
 */
#define REARM_SQL_CITUS \
	"INSERT INTO idempotency.seen_message AS m" \
	"  (owner, scope, message_id, first_seen_at, expires_at)" \
	" VALUES ($1, $2, $3, $4, $5)" \
	" ON CONFLICT (owner, scope, message_id) DO UPDATE" \
	"   SET first_seen_at = EXCLUDED.first_seen_at, expires_at = EXCLUDED.expires_at" \
	" WHERE m.expires_at OPERATOR(pg_catalog.<=) EXCLUDED.first_seen_at"

#define REARM_SQL(owner_eq) \
	"UPDATE idempotency.seen_message AS m" \
	"   SET first_seen_at = $4, expires_at = $5" \
	" WHERE " owner_eq("m.owner", "$1") \
	"   AND m.scope OPERATOR(pg_catalog.=) $2" \
	"   AND m.message_id OPERATOR(pg_catalog.=) $3" \
	"   AND m.expires_at OPERATOR(pg_catalog.<=) $4"

/* first_seen(scope, message_id, ttl) -> true the first time, false for a redelivery */
PG_FUNCTION_INFO_V1(idempotency_first_seen);

Datum
idempotency_first_seen(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 1, 0, "message id");
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Oid			argtypes[5] = {REGROLEOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		values[5];
	bool		first;

	values[0] = ObjectIdGetDatum(id.owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id.scope, id.scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id.key, id.key_len));
	values[3] = TimestampTzGetDatum(now);
	values[4] = TimestampTzGetDatum(idem_expiry(fcinfo, 2, now));

	SPI_connect();
	first = idem_run_as(!idem_table_distributed(IDEM_TABLE_SEEN), &plan_seen_insert,
						 "INSERT INTO idempotency.seen_message AS m"
						 "  (owner, scope, message_id, first_seen_at, expires_at)"
						 " VALUES ($1, $2, $3, $4, $5)"
						 " ON CONFLICT (owner, scope, message_id) DO NOTHING",
						 5, argtypes, values, NULL, SPI_OK_INSERT) > 0;
	if (!first && idem_table_distributed(IDEM_TABLE_SEEN))
		first = idem_run_as(false, &plan_seen_rearm_citus, REARM_SQL_CITUS,
								  5, argtypes, values, NULL, SPI_OK_INSERT) > 0;
	else if (!first)			/* seen before: first again only if expired */
		first = idem_run_as_owner(&plan_seen_rearm, REARM_SQL(IDEM_OWNER_EQ),
								  5, argtypes, values, NULL, SPI_OK_UPDATE) > 0;
	SPI_finish();
	PG_RETURN_BOOL(first);
}
