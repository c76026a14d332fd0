/*-------------------------------------------------------------------------
 *
 * keycitus.c
 *	  The key store on Citus (stores floor): the statements on a key table
 *	  Citus distributes, through Citus's route or on the key's shard when it
 *	  is on this node, and their plans.
 *
 * Design: the relation this node sees is a shell whose rows live in
 * shards, perhaps on another node.  Only SQL reaches the rows, and Citus
 * routes each statement to the shard of the key (the key is the
 * distribution column).  The key lock (keylock.c) is local to one node, so
 * on Citus it is not what serialises a key: the shard's primary key is.
 * begin() claims a key (SS_CLAIM: an in_progress row, INSERT ... ON
 * CONFLICT DO NOTHING, uncommitted until the transaction ends: a
 * concurrent claim from any node waits for it on the shard) or locks the
 * existing row (SS_LOCK: SELECT ... FOR UPDATE on the shard).  A write is
 * an upsert, a checkpoint an UPDATE by the owner's name.  The owner column
 * is idempotency.roleref there: see IDEM_OWNER_EQ_CITUS.
 *
 * On the node that holds the key's shard the same statements run on the
 * shard table itself (idem_store_shard(); shard.c says when that is safe),
 * as plain prepared statements without Citus's planner, as the table's
 * owner: one set of plans per shard, whose texts name the shard.
 *
 * A call whose key's shard is on another node is carried there whole
 * (keyroute.c) and takes this shard path there: no role but the owner
 * writes the table.  Through Citus's route a statement runs as
 * the caller (runas.c: idem_run_as), which only reads succeed at (the
 * caller may SELECT its rows; a write there would be refused, 42501).  The
 * statements name the recovery point columns only when the table has them
 * (the _RP variants).
 *
 * Locking: the shard's metadata lock while its plans run (shard.c); row
 * locks on the shard.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * The statements
 * ---------------------------------------------------------------------
 */
/*
 * Citus: claim a key with an in_progress row; a row there wins.  $13 is the
 * new row's derive_seed (a table served on Citus is 0.6.0's: distribute()
 * ran after the update).
 */
static const char *const sql_claim =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until, derive_seed)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
" ON CONFLICT DO NOTHING";

/*
 * Citus: a write is an upsert, which names the owner only as a value (Citus
 * refuses the owner-by-name comparison in an UPDATE: a STABLE function of
 * a column), and a value of type regrole travels by name.  A retry or the
 * end of the work keeps the recovery point; new work over an expired row
 * (the _rp variant, on a table that has the columns) clears it.
 */
#define UPSERT_CITUS \
"INSERT INTO idempotency.idempotency_key AS k" \
"  (owner, scope, key, status, request_hash, response, retryable, attempts," \
"   created_at, updated_at, expires_at, locked_until, derive_seed)" \
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)" \
" ON CONFLICT (key, scope, owner) DO UPDATE" \
"   SET status = EXCLUDED.status, request_hash = EXCLUDED.request_hash," \
"       response = EXCLUDED.response, retryable = EXCLUDED.retryable," \
"       attempts = EXCLUDED.attempts, created_at = EXCLUDED.created_at," \
"       updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at," \
"       locked_until = EXCLUDED.locked_until"

static const char *const sql_upsert_citus = UPSERT_CITUS;
static const char *const sql_upsert_citus_rp =
UPSERT_CITUS ", recovery_point = NULL, recovery_state = NULL,"
"       derive_seed = EXCLUDED.derive_seed";

/* Citus: the owner by name (a text column there: see distribute()) */
static const char *const sql_select_citus =
SELECT_BASE FROM_KEYS KEY_WHERE_CITUS;
static const char *const sql_select_citus_rp =
SELECT_BASE SELECT_RP FROM_KEYS KEY_WHERE_CITUS;

/* Citus: the same reads, locking the row on the shard */
static const char *const sql_select_lock =
SELECT_BASE FROM_KEYS KEY_WHERE_CITUS "   FOR UPDATE OF k";
static const char *const sql_select_lock_rp =
SELECT_BASE SELECT_RP FROM_KEYS KEY_WHERE_CITUS "   FOR UPDATE OF k";

/*
 * Citus: checkpoint() by the owner's name (the column is text there, so
 * this is no function of a column, which Citus would refuse in an UPDATE)
 */
static const char *const sql_checkpoint_citus =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6"
KEY_WHERE_CITUS;

/* Citus: forget() (ops.c), on the key's shard */
static const char *const sql_delete_citus =
"DELETE FROM idempotency.idempotency_key AS k"
KEY_WHERE_CITUS;

/* the statements by CitusStmt */
static const char *const citus_sql[SS_N] = {
	sql_claim, sql_select_citus, sql_select_citus_rp, sql_select_lock,
	sql_select_lock_rp, sql_upsert_citus, sql_upsert_citus_rp,
	sql_checkpoint_citus, sql_delete_citus
};

/*
 * Citus, the key's shard on this node (shard.c): the same statements on
 * the shard table itself, as the table's owner, one set of plans per shard
 * (the text names the shard).  See the file comment.
 */
struct ShardPlans
{
	int64		shard;			/* hash key */
	Oid			relid;			/* the shard table when planned */
	char	   *sql[SS_N];		/* texts naming it (TopMemoryContext) */
	SPIPlanPtr	plans[SS_N];
};

static HTAB *shard_plans = NULL;

/* through Citus's route: one plan per statement */
static SPIPlanPtr route_plans[SS_N];

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
/* run statement k on the shard of sp (inside SPI), as the table's owner */
static uint64
shard_run(ShardPlans *sp, CitusStmt k, int nargs, Oid *argtypes,
		  Datum *values, const char *nulls, int expect_rc)
{
	if (sp->sql[k] == NULL)
	{
		const char *shell = "idempotency.idempotency_key";
		const char *tmpl = citus_sql[k];
		const char *at = strstr(tmpl, shell);
		char	   *nsp = get_namespace_name(get_rel_namespace(sp->relid));
		char	   *rel = get_rel_name(sp->relid);
		StringInfoData buf;

		if (at == NULL || nsp == NULL || rel == NULL)
			elog(ERROR, "shard " INT64_FORMAT " of idempotency.idempotency_key is gone", sp->shard);
		initStringInfo(&buf);
		appendBinaryStringInfo(&buf, tmpl, at - tmpl);
		appendStringInfoString(&buf, quote_qualified_identifier(nsp, rel));
		appendStringInfoString(&buf, at + strlen(shell));
		sp->sql[k] = MemoryContextStrdup(TopMemoryContext, buf.data);
		pfree(buf.data);
	}
	return idem_run_as(true, &sp->plans[k], sp->sql[k], nargs, argtypes, values,
					   nulls, expect_rc);
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */
/*
 * Citus: the plans for key id's shard when the shard is on this node (its
 * metadata lock then held: shard.c), else NULL (Citus's route).  The key
 * table must be resolved.
 */
ShardPlans *
idem_store_shard(const KeyId *id)
{
	Oid			shard_relid;
	int64		shard;
	bool		found;
	ShardPlans *sp;

	shard = idem_local_shard(idem_store.relid, id, &shard_relid);
	if (shard == 0)
		return NULL;
	if (shard_plans == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(ShardPlans);
		shard_plans = hash_create("idempotency shard plans", 32, &ctl,
								  HASH_ELEM | HASH_BLOBS);
	}
	sp = hash_search(shard_plans, &shard, HASH_ENTER, &found);
	if (!found)
	{
		memset(sp->sql, 0, sizeof(sp->sql));
		memset(sp->plans, 0, sizeof(sp->plans));
		sp->relid = shard_relid;
	}
	if (sp->relid != shard_relid)
	{
		/* the shard table was made anew (moved away and back): plan again */
		for (int i = 0; i < SS_N; i++)
			if (sp->plans[i] != NULL)
			{
				SPI_freeplan(sp->plans[i]);
				sp->plans[i] = NULL;
			}
		sp->relid = shard_relid;
	}
	return sp;
}

/*
 * Run statement k (inside SPI) on the shard of sp, or through Citus's route
 * as the caller when sp is NULL.
 */
uint64
idem_store_citus_run(ShardPlans *sp, CitusStmt k, int nargs, Oid *argtypes,
					 Datum *values, const char *nulls, int expect_rc)
{
	if (sp != NULL)
		return shard_run(sp, k, nargs, argtypes, values, nulls, expect_rc);
	return idem_run_as(false, &route_plans[k], citus_sql[k], nargs, argtypes,
					   values, nulls, expect_rc);
}
