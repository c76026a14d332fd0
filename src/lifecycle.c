/*-------------------------------------------------------------------------
 *
 * lifecycle.c
 *	  Expiry and purge, one-time tokens, consumer deduplication.
 *
 * purge(): a batch per table locks up to n expired rows FOR UPDATE SKIP
 * LOCKED, returns their (tableoid, ctid) to C, and deletes them one
 * relation at a time by a TID scan that rechecks expiry and owner: only
 * row locks, never a wait for another transaction's row, linear in the
 * batch.  On Citus a batch is a DELETE ... WHERE pk IN (SELECT ... LIMIT n)
 * planned afresh.  Delivered outbox messages are purged likewise, adding
 * them to their topics' purged_* counters.  The SQL function purges one
 * batch of the caller's rows; the worker (worker.c) every role's,
 * idem_purge_expired().
 *
 * Tokens: issue_token() inserts a random uuid, consume_token() deletes it
 * (the row lock decides the one consumer).  first_seen(): INSERT ... ON
 * CONFLICT DO NOTHING into seen_message.
 *
 * Every statement runs as the tables' owner (runas.c) with the caller's
 * role as a parameter; on Citus on the row's shard, on its node
 * (keystore.c).  The two purge statements, why each, and the tokens and
 * seen messages on Citus: src/README.md, "Expiry and purge".
 *
 * Locking: row locks only: a batch's FOR UPDATE SKIP LOCKED (and its
 * topic rows', SKIP LOCKED); on Citus a batch waits for a locked row and
 * rechecks it.  A consumer's DELETE and a first_seen() insert wait as any
 * DELETE or unique insert does.
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
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "idempotency.h"
#include "keystore.h"
#include "lifecycle.h"
#include "outbox_counts.h"
#include "stats.h"

/* ---------------------------------------------------------------------
 * purge
 * ---------------------------------------------------------------------
 */
static const char *const purge_tables[PURGE_NTABLES] = {
	"idempotency_key", "token", "seen_message", "outbox_message"
};
#define PURGE_OUTBOX 3			/* delivered outbox messages:
								 * purge_outbox_*_sql */

/*
 * [table][0 = one role, 1 = every role]: the batch's locking SELECT and its
 * DELETE; none on Citus (planned afresh)
 */
static SPIPlanPtr purge_lock_plans[PURGE_NTABLES][2];
static SPIPlanPtr purge_delete_plans[PURGE_NTABLES][2];

/* each table's primary key, for the Citus statement */
static const char *const purge_keys[PURGE_NTABLES] = {
	"key, scope, owner", "token", "message_id, scope, owner",
	NULL						/* outbox_message: never distributed */
};

/* a batch: lock up to $2 expired rows, skipping those another transaction holds */
static const char *const purge_lock_sql =
"SELECT s.tableoid, s.ctid FROM idempotency.%s AS s"
" WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
" LIMIT $2 FOR UPDATE SKIP LOCKED";

/*
 * then delete them, one relation ($3) at a time: a TID scan of the batch's
 * row positions ($2), which PostgreSQL sorts once; each row it fetches is
 * checked against a constant, so the statement is linear in its batch
 */
static const char *const purge_delete_sql =
"DELETE FROM idempotency.%s AS t"
" WHERE t.ctid OPERATOR(pg_catalog.=) ANY ($2)"
"   AND t.tableoid OPERATOR(pg_catalog.=) $3"
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
 * Delivered outbox messages (expires_at is set by ack()).  Their purge also
 * adds them to their topics' purged_* counters (idempotency.outbox_stats
 * keeps counting them; outbox_counts.c), so a batch first locks the topic rows of
 * the first $2 expired messages, skipping any another transaction holds (a
 * role's open alter_topic() or drop_topic()), and then locks only messages
 * of the topics it holds.  The messages of a held topic wait for a later
 * batch; the counter UPDATE never waits.
 */
static const char *const purge_outbox_lock_sql =
"WITH tp AS MATERIALIZED ("
"  SELECT p.id FROM idempotency.outbox_topic AS p"
"   WHERE p.id IN (SELECT c.topic_id FROM ("
"           SELECT s.topic_id FROM idempotency.outbox_message AS s"
"            WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
"            LIMIT $2) AS c)"
"   FOR NO KEY UPDATE OF p SKIP LOCKED)"
" SELECT s.tableoid, s.ctid FROM idempotency.outbox_message AS s"
"  WHERE s.expires_at OPERATOR(pg_catalog.<=) $1 %s"
"    AND s.topic_id IN (SELECT tp.id FROM tp)"
"  LIMIT $2 FOR UPDATE OF s SKIP LOCKED";

static const char *const purge_outbox_delete_sql =
"WITH d AS ("
" DELETE FROM idempotency.outbox_message AS t"
"  WHERE t.ctid OPERATOR(pg_catalog.=) ANY ($2)"
"    AND t.tableoid OPERATOR(pg_catalog.=) $3"
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

/* a locked row of a batch: its relation (a partition, perhaps) and position */
typedef struct PurgeRow
{
	Oid			rel;
	ItemPointerData tid;
} PurgeRow;

/*
 * One batch of table i (not on Citus): lock, then delete by relation.
 * values[0] is now, values[1] the batch size, values[2] the owner when
 * !all.  Returns the rows deleted.
 */
static int64
purge_batch(int i, int all, Datum *values)
{
	Oid			lock_types[3] = {TIMESTAMPTZOID, INT4OID, REGROLEOID};
	Oid			del_types[4] = {TIMESTAMPTZOID, TIDARRAYOID, OIDOID, REGROLEOID};
	Datum		del_values[4];
	const char *s_owner = all ? "" : "AND s.owner OPERATOR(pg_catalog.=) $3";
	const char *t_owner = all ? "" : "AND t.owner OPERATOR(pg_catalog.=) $4";
	char	   *sql = NULL;
	PurgeRow   *rows;
	Datum	   *tids;
	uint64		n,
				k;
	int64		deleted = 0;
	bool		done_rel;

	/* lock the batch (the statement text is made only to prepare it) */
	if (purge_lock_plans[i][all] == NULL)
		sql = i == PURGE_OUTBOX ?
			psprintf(purge_outbox_lock_sql, s_owner, s_owner) :
			psprintf(purge_lock_sql, purge_tables[i], s_owner);
	n = idem_run_as_owner(&purge_lock_plans[i][all], sql, all ? 2 : 3,
						  lock_types, values, NULL, SPI_OK_SELECT);
	if (sql)
		pfree(sql);
	sql = NULL;
	if (n == 0)
		return 0;
	rows = palloc(n * sizeof(PurgeRow));
	for (k = 0; k < n; k++)
	{
		HeapTuple	tup = SPI_tuptable->vals[k];
		bool		isnull;

		rows[k].rel = DatumGetObjectId(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull)),
						&rows[k].tid);
	}
	SPI_freetuptable(SPI_tuptable);

	/*
	 * delete them, one relation at a time (one on a plain table, one per
	 * partition the batch touched on a partitioned one); rel becomes
	 * InvalidOid once a row's relation is done
	 */
	tids = palloc(n * sizeof(Datum));
	del_values[0] = values[0];
	if (!all)
		del_values[3] = values[2];
	do
	{
		Oid			rel = InvalidOid;
		int			m = 0;
		ArrayType  *arr;

		done_rel = true;
		for (k = 0; k < n; k++)
		{
			if (!OidIsValid(rows[k].rel))
				continue;
			if (!OidIsValid(rel))
				rel = rows[k].rel;
			if (rows[k].rel != rel)
			{
				done_rel = false;	/* another relation: a later round */
				continue;
			}
			tids[m++] = PointerGetDatum(&rows[k].tid);
			rows[k].rel = InvalidOid;
		}
		if (m == 0)
			break;
		arr = construct_array(tids, m, TIDOID, sizeof(ItemPointerData), false,
							  TYPALIGN_SHORT);
		del_values[1] = PointerGetDatum(arr);
		del_values[2] = ObjectIdGetDatum(rel);
		if (purge_delete_plans[i][all] == NULL)
			sql = i == PURGE_OUTBOX ? psprintf(purge_outbox_delete_sql, t_owner) :
				psprintf(purge_delete_sql, purge_tables[i], t_owner);
		if (i == PURGE_OUTBOX)
		{
			bool		isnull;

			/* SELECT count(*) FROM d: the rows deleted */
			idem_run_as_owner(&purge_delete_plans[i][all], sql, all ? 3 : 4,
							  del_types, del_values, NULL, SPI_OK_SELECT);
			deleted += DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 1, &isnull));
			SPI_freetuptable(SPI_tuptable);
		}
		else
			deleted += idem_run_as_owner(&purge_delete_plans[i][all], sql, all ? 3 : 4,
										 del_types, del_values, NULL, SPI_OK_DELETE);
		if (sql)
			pfree(sql);
		sql = NULL;
		pfree(arr);
	} while (!done_rel);
	pfree(tids);
	pfree(rows);
	return deleted;
}

/*
 * Acked outbox messages are counted in shared memory (outbox_counts.c: ack
 * deletes them at once); write those counts into their topics' purged_*
 * columns, those of owner's topics (InvalidOid: every role's, the worker).
 * Taking them leaves in shared memory a delta of this transaction that
 * cancels them for the snapshots that see this write, and only them; so
 * outbox_stats counts every message once, and a purge rolled back (after
 * PREPARE too) loses nothing.  A topic row another transaction holds (an
 * open alter_topic() or drop_topic()) is skipped: its counts are given back
 * at once and wait for the next purge.  A dropped topic's counts are
 * dropped.
 */
#define PURGE_COUNT_TOPICS 1000
static SPIPlanPtr plan_outbox_counts = NULL;

static void
purge_outbox_counts(Oid owner)
{
	int32	   *topic_ids = palloc(PURGE_COUNT_TOPICS * sizeof(int32));
	int64	   *delivered = palloc(PURGE_COUNT_TOPICS * sizeof(int64));
	int64	   *retried = palloc(PURGE_COUNT_TOPICS * sizeof(int64));
	int			n;
	Datum	   *d_ids;
	Datum	   *d_delivered;
	Datum	   *d_retried;
	Oid			types[4] = {INT4ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, REGROLEOID};
	Datum		values[4];
	uint64		done;
	uint64		k;
	int			i;
	bool	   *written;

	n = idem_outbox_counts_take(owner, topic_ids, delivered, retried, PURGE_COUNT_TOPICS);
	if (n == 0)
		return;
	d_ids = palloc(n * sizeof(Datum));
	d_delivered = palloc(n * sizeof(Datum));
	d_retried = palloc(n * sizeof(Datum));
	for (i = 0; i < n; i++)
	{
		d_ids[i] = Int32GetDatum(topic_ids[i]);
		d_delivered[i] = Int64GetDatum(delivered[i]);
		d_retried[i] = Int64GetDatum(retried[i]);
	}
	values[0] = PointerGetDatum(construct_array(d_ids, n, INT4OID, 4, true, TYPALIGN_INT));
	values[1] = PointerGetDatum(construct_array(d_delivered, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[2] = PointerGetDatum(construct_array(d_retried, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[3] = ObjectIdGetDatum(owner);

	/*
	 * $4: the owner whose topics these are, 0 for every role's; a dropped
	 * topic's counts (no row in outbox_topic) go too
	 */
	done = idem_run_as_owner(&plan_outbox_counts,
							 "WITH a AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1),"
							 "             pg_catalog.unnest($2), pg_catalog.unnest($3)) AS a(id, d, r)),"
							 " tp AS MATERIALIZED ("
							 "  SELECT p.id FROM idempotency.outbox_topic AS p"
							 "   WHERE p.id OPERATOR(pg_catalog.=) ANY ($1)"
							 "     AND ($4 OPERATOR(pg_catalog.=) 0 OR p.owner OPERATOR(pg_catalog.=) $4)"
							 "   FOR NO KEY UPDATE OF p SKIP LOCKED),"
							 " u AS ("
							 " UPDATE idempotency.outbox_topic AS p"
							 "    SET purged_delivered = p.purged_delivered OPERATOR(pg_catalog.+) a.d,"
							 "        purged_retries = p.purged_retries OPERATOR(pg_catalog.+) a.r"
							 "   FROM a"
							 "  WHERE p.id OPERATOR(pg_catalog.=) a.id"
							 "    AND p.id IN (SELECT tp.id FROM tp)"
							 " RETURNING p.id)"
							 " SELECT u.id FROM u"
							 " UNION ALL"
							 " SELECT a.id FROM a WHERE NOT EXISTS ("
							 "   SELECT 1 FROM idempotency.outbox_topic AS g"
							 "    WHERE g.id OPERATOR(pg_catalog.=) a.id)",
							 4, types, values, NULL, SPI_OK_SELECT);
	written = palloc0(n * sizeof(bool));
	for (k = 0; k < done; k++)
	{
		bool		isnull;
		int32		id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[k],
													 SPI_tuptable->tupdesc, 1, &isnull));

		for (i = 0; i < n; i++)
			if (topic_ids[i] == id)
				written[i] = true;
	}

	/*
	 * the counts of a topic row another transaction holds wait for the next
	 * purge
	 */
	for (i = 0; i < n; i++)
		if (!written[i])
			idem_outbox_counts_put_back(topic_ids[i], delivered[i], retried[i]);
}

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

		counts[i] = 0;
		if (OidIsValid(nsp))
			relid = get_relname_relid(purge_tables[i], nsp);
		if (!OidIsValid(relid))
			continue;			/* an older version of the extension */

		values[0] = TimestampTzGetDatum(now);
		values[1] = Int32GetDatum(batch_size);
		values[2] = ObjectIdGetDatum(owner);
		/* outbox_message is not distributed by distribute(): local everywhere */
		if (i == PURGE_OUTBOX || !idem_citus_table(relid))
		{
			if (i == PURGE_OUTBOX)
				purge_outbox_counts(owner);
			counts[i] = purge_batch(i, all, values);
			total += counts[i];
			continue;
		}
		if (!all)
		{
			argtypes[2] = REGROLEOID;	/* the owner by roleref */
			values[2] = ObjectIdGetDatum(owner);
		}
		sql = psprintf(purge_sql_citus, purge_tables[i], purge_keys[i],
					   purge_keys[i], purge_tables[i],
					   all ? "" : "AND " IDEM_OWNER_EQ_CITUS("s.owner", "$3"));
		counts[i] = idem_run_as_owner_once(sql, all ? 2 : 3, argtypes, values,
										   NULL, SPI_OK_DELETE);
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
	static SPIPlanPtr route = NULL;
	bool		stored;
	uint64		n = 0;

	/*
	 * The token is made here and passed in, not read back from RETURNING:
	 * what a DBA's trigger or column type does to the stored value cannot
	 * change what the caller is given, and a trigger that skips the row is an
	 * error, not a token that was never stored.
	 */
	values[0] = token;
	values[1] = ObjectIdGetDatum(GetUserId());
	values[2] = CStringGetTextDatum(scope);
	values[3] = TimestampTzGetDatum(now);
	values[4] = TimestampTzGetDatum(expires_at);

	if (idem_table_distributed(IDEM_TABLE_TOKEN))
	{
		/*
		 * Citus: a token whose shard is on this node, stored there as the
		 * extension's owner; after 16 draws (a node with none of them: the
		 * coordinator) the call is carried to the node of the last one drawn,
		 * which draws its own (keystore.c).  Each draw lands on a given
		 * node's shards with the share of the shards it holds; the node a
		 * call was carried to holds one, so it draws until it finds one
		 * (carrying it on would be a nested distributed query, which Citus
		 * refuses): 4096 draws miss a node holding 1 of 100 shards with
		 * probability 1e-18.
		 */
		int			draws = idem_route_arrived() ? 4096 : 16;

		argtypes[1] = REGROLEOID;
		values[1] = ObjectIdGetDatum(GetUserId());
		stored = false;
		for (int i = 0; i < draws && !stored; i++)
		{
			char	   *s;

			if (i > 0)
				token = DirectFunctionCall1(gen_random_uuid, (Datum) 0);
			values[0] = token;
			s = DatumGetCString(DirectFunctionCall1(uuid_out, token));
			SPI_connect();
			stored = idem_shard_exec(IDEM_TABLE_TOKEN, s, strlen(s), "idempotency.token",
									 "INSERT INTO idempotency.token (token, owner, scope, created_at, expires_at)"
									 " VALUES ($1, $2, $3, $4, $5)",
									 5, argtypes, values, NULL, SPI_OK_INSERT, &n);
			SPI_finish();
		}
		if (!stored)
			return idem_route_call(fcinfo, IDEM_ROUTE_TOKENS, token, &route);
	}
	else
	{
		SPI_connect();
		n = idem_run_as_owner(&plan_issue,
							  "INSERT INTO idempotency.token (token, owner, scope, created_at, expires_at)"
							  " VALUES ($1, $2, $3, $4, $5)",
							  5, argtypes, values, NULL, SPI_OK_INSERT);
		SPI_finish();
	}
	if (n != 1)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("the token was not stored in table idempotency.token"),
				 errdetail("A trigger on the table skipped the row.")));
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
	static SPIPlanPtr route = NULL;
	char	   *s;
	uint64		n = 0;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);	/* an unknown token */
	/* Citus: the token's shard on another node: the call runs there */
	s = DatumGetCString(DirectFunctionCall1(uuid_out, PG_GETARG_DATUM(0)));
	if (idem_route_table(IDEM_TABLE_TOKEN, s, strlen(s)))
		return idem_route_call(fcinfo, IDEM_ROUTE_TOKENS, PG_GETARG_DATUM(0), &route);

	values[0] = PG_GETARG_DATUM(0);
	values[1] = ObjectIdGetDatum(GetUserId());
	values[2] = CStringGetTextDatum(scope);
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());

	SPI_connect();
	if (idem_table_distributed(IDEM_TABLE_TOKEN))
	{
		/*
		 * Citus: the owner as a roleref (role oids differ between nodes;
		 * keycitus.h: IDEM_OWNER_EQ_CITUS)
		 */
		argtypes[1] = REGROLEOID;
		values[1] = ObjectIdGetDatum(GetUserId());
		if (!idem_shard_exec(IDEM_TABLE_TOKEN, s, strlen(s), "idempotency.token",
							 CONSUME_SQL(IDEM_OWNER_EQ_CITUS), 4, argtypes, values,
							 NULL, SPI_OK_DELETE, &n))
			elog(ERROR, "idempotency: the shard of token %s left this node", s);
		consumed = n > 0;
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

#define SEEN_INSERT_SQL \
	"INSERT INTO idempotency.seen_message AS m" \
	"  (owner, scope, message_id, first_seen_at, expires_at)" \
	" VALUES ($1, $2, $3, $4, $5)" \
	" ON CONFLICT (owner, scope, message_id) DO NOTHING"

/*
 * On Citus, the re-arm is an upsert, which names the owner only as a value
 * (role oids differ between nodes; keycitus.h: IDEM_OWNER_EQ_CITUS)
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
	static SPIPlanPtr route = NULL;

	/* Citus: the message id's shard on another node: the call runs there */
	if (idem_route_table(IDEM_TABLE_SEEN, id.key, id.key_len))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(1), &route);
	values[0] = ObjectIdGetDatum(id.owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id.scope, id.scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id.key, id.key_len));
	values[3] = TimestampTzGetDatum(now);
	values[4] = TimestampTzGetDatum(idem_expiry(fcinfo, 2, now));

	SPI_connect();
	if (idem_table_distributed(IDEM_TABLE_SEEN))
	{
		/*
		 * Citus: on the shard, here, as the extension's owner; the owner as a
		 * roleref (role oids differ between nodes; keycitus.h:
		 * IDEM_OWNER_EQ_CITUS). Seen before: an upsert that re-arms it only
		 * if expired.
		 */
		uint64		n = 0;

		if (!idem_shard_exec(IDEM_TABLE_SEEN, id.key, id.key_len, "idempotency.seen_message",
							 SEEN_INSERT_SQL, 5, argtypes, values, NULL, SPI_OK_INSERT, &n))
			elog(ERROR, "idempotency: the shard of %s left this node", idem_describe_key(&id));
		first = n > 0;
		if (!first)
		{
			(void) idem_shard_exec(IDEM_TABLE_SEEN, id.key, id.key_len, "idempotency.seen_message",
								   REARM_SQL_CITUS, 5, argtypes, values, NULL, SPI_OK_INSERT, &n);
			first = n > 0;
		}
	}
	else
	{
		first = idem_run_as_owner(&plan_seen_insert, SEEN_INSERT_SQL,
								  5, argtypes, values, NULL, SPI_OK_INSERT) > 0;
		if (!first)				/* seen before: first again only if expired */
			first = idem_run_as_owner(&plan_seen_rearm, REARM_SQL(IDEM_OWNER_EQ),
									  5, argtypes, values, NULL, SPI_OK_UPDATE) > 0;
	}
	SPI_finish();
	PG_RETURN_BOOL(first);
}
