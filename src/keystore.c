/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  Reading and writing rows of idempotency.idempotency_key.
 *
 * Design: the table may be as the extension made it, or changed by a DBA
 * (a trigger, a CHECK constraint, an index built concurrently, a column
 * type, hash partitioning).  Whatever it is, a row is written under every
 * rule the executor enforces on an INSERT or UPDATE, and read back in the
 * types the guard works with.  Two paths, chosen per table shape (cached
 * until the table changes):
 *
 *	fast   the table is a plain heap with exactly the shipped columns and
 *		   types, no triggers and no rules.  Lookups probe the primary key
 *		   directly (index_beginscan): no parser, planner or executor on
 *		   the path every request takes.  A new row goes through the
 *		   executor's simple-relation insert, as logical replication apply
 *		   writes rows: NOT NULL and CHECK constraints, every index that
 *		   is ready for inserts (so CREATE INDEX CONCURRENTLY and REINDEX
 *		   CONCURRENTLY stay consistent), expression and partial indexes,
 *		   exclusion constraints.
 *	SQL    anything else (a partitioned table, a changed column type or
 *		   domain, triggers, rules, extra columns with defaults): prepared
 *		   SELECT and INSERT statements, which PostgreSQL routes to
 *		   partitions and whose values it coerces to the column types
 *		   (length limits and domain constraints included); the SELECT
 *		   casts every column back to the type the guard expects.
 *
 *	Citus  the table is distributed by Citus (it is in pg_dist_partition,
 *		   which Citus keeps on the coordinator and on every worker): the
 *		   relation this node sees is a shell whose rows live in shards,
 *		   perhaps on another node.  Only SQL reaches the rows, so the SQL
 *		   path is taken, and Citus routes each statement to the shard of
 *		   the key (the key is the distribution column).  The key lock
 *		   (keylock.c) is local to one node, so on Citus it is not what
 *		   serialises a key: the shard's primary key is.  begin() claims a
 *		   key with idem_keystore_claim() (an in_progress row, INSERT ... ON
 *		   CONFLICT DO NOTHING, uncommitted until the transaction ends: a
 *		   concurrent claim from any node waits for it on the shard) or
 *		   locks the existing row with idem_keystore_lock() (SELECT ... FOR
 *		   UPDATE on the shard).  Detected once and cached like the path
 *		   (Citus invalidates the table's relcache entry when it changes
 *		   pg_dist_partition).  On the node that holds the key's shard the
 *		   same statements run on the shard table itself (local_shard(),
 *		   shard_run(); shard.c says when that is safe), as plain prepared
 *		   statements without Citus's planner.  The owner column is text
 *		   (role names) there: see IDEM_OWNER_EQ_CITUS.
 *
 * Updates (a retry, the end of a lease, a checkpoint) are always a
 * prepared UPDATE (on Citus an upsert, and a checkpoint an UPDATE by the
 * owner's name: see the SQL below).
 *
 * Versions: the recovery point columns (recovery_point, recovery_state)
 * came with 0.5.0.  A 0.4.0 table (before or during ALTER EXTENSION
 * UPDATE) has neither; it is served as before (fast path included, with
 * the statements that do not name them), and checkpoint() refuses (55000)
 * until the update adds them.  On Citus the same: the Citus statements
 * name the recovery point columns only when the table has them.
 * Every statement is schema-qualified, every operator OPERATOR(pg_catalog.=),
 * every value a parameter; it runs as the extension's owner (runas.c) for
 * the caller's own role only.  Every write refuses a read-only transaction
 * and a hot standby (25006).  Errors raised underneath name the key and
 * the table (an error context).
 *
 * Locking: writers hold the key lock (keylock.c), so no other
 * begin()/complete()/fail() writes the same key concurrently.  begin()'s
 * first lookup runs without it: it only acts on a live finished key, which
 * changes only by expiring.
 *
 * Isolation: under READ COMMITTED every lookup sees the latest committed
 * state.  Under REPEATABLE READ and SERIALIZABLE the row may have changed
 * after the transaction's snapshot; the lookup then compares with the
 * latest committed version and raises a serialization failure (40001), so
 * the client retries and gets the stored answer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */

/* the columns the guard reads and writes, in $n order of the statements */
typedef enum StoreCol
{
	COL_OWNER, COL_SCOPE, COL_KEY, COL_STATUS, COL_REQUEST_HASH, COL_RESPONSE,
	COL_RETRYABLE, COL_ATTEMPTS, COL_CREATED_AT, COL_UPDATED_AT,
	COL_EXPIRES_AT, COL_LOCKED_UNTIL,
	/* since 0.5.0 (recovery points); a 0.4.0 table has none of them */
	COL_RECOVERY_POINT, COL_RECOVERY_STATE,
	/* since 0.6.0 (derive_key()'s per-key seed); a 0.5.0 table has none */
	COL_DERIVE_SEED, NUM_COLS
} StoreCol;

/* the columns every version has (the row written by INSERT and UPDATE) */
#define NUM_BASE_COLS COL_RECOVERY_POINT

static const char *const col_names[NUM_COLS] = {
	"owner", "scope", "key", "status", "request_hash", "response", "retryable",
	"attempts", "created_at", "updated_at", "expires_at", "locked_until",
	"recovery_point", "recovery_state", "derive_seed"
};

static Oid	col_types[NUM_COLS] = {
	REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BOOLOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	TEXTOID, JSONBOID, BYTEAOID
};

/* NOT NULL as shipped: the fast path relies on it */
static const bool col_notnull[NUM_COLS] = {
	true, true, true, true, false, false, false, true, true, true, true, false,
	false, false, false
};

static Oid	store_relid = InvalidOid;	/* idempotency.idempotency_key */
static bool store_fast = false;			/* see the file comment */
static bool store_recovery = false;		/* has the recovery point columns */
static bool store_seed = false;			/* has derive_seed (0.6.0) */
static bool store_citus = false;		/* distributed by Citus (ditto) */

/* the other tables: distributed by Citus?  (idem_table_distributed) */
static const char *const table_names[IDEM_NTABLES] = {
	"token", "seen_message", "state_machine"
};
static Oid	table_relid[IDEM_NTABLES];	/* InvalidOid: not looked yet */
static bool table_citus[IDEM_NTABLES];
static AttrNumber store_attnums[NUM_COLS];

static SPIPlanPtr plan_select = NULL;
static SPIPlanPtr plan_select_rp = NULL;
static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_update = NULL;
static SPIPlanPtr plan_update_rp = NULL;
static SPIPlanPtr plan_checkpoint = NULL;
static SPIPlanPtr plan_select_citus = NULL;	/* Citus */
static SPIPlanPtr plan_upsert_citus = NULL;
static SPIPlanPtr plan_select_lock = NULL;
static SPIPlanPtr plan_claim = NULL;
static SPIPlanPtr plan_select_citus_rp = NULL;
static SPIPlanPtr plan_select_lock_rp = NULL;
static SPIPlanPtr plan_upsert_citus_rp = NULL;
static SPIPlanPtr plan_checkpoint_citus = NULL;

#define KEY_WHERE \
	" WHERE " IDEM_OWNER_EQ("k.owner", "$1") \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

/* on Citus: the owner by name (idempotency.h) */
#define KEY_WHERE_CITUS \
	" WHERE " IDEM_OWNER_EQ_CITUS("k.owner", "$1") \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

/* columns in StoredKey order, cast to the types the guard reads */
#define SELECT_BASE \
"SELECT k.status::pg_catalog.text, k.request_hash::pg_catalog.bytea," \
"       k.response::pg_catalog.jsonb, k.retryable::pg_catalog.bool," \
"       k.attempts::pg_catalog.int4, k.created_at::pg_catalog.timestamptz," \
"       k.expires_at::pg_catalog.timestamptz," \
"       k.locked_until::pg_catalog.timestamptz, k.xmin," \
"       k.updated_at::pg_catalog.timestamptz"

/* the recovery point (columns 11 and 12), since 0.5.0 */
#define SELECT_RP \
", k.recovery_point::pg_catalog.text, k.recovery_state::pg_catalog.jsonb"
#define FROM_KEYS "  FROM idempotency.idempotency_key AS k"

static const char *const sql_select = SELECT_BASE FROM_KEYS KEY_WHERE;
static const char *const sql_select_rp = SELECT_BASE SELECT_RP FROM_KEYS KEY_WHERE;

/* Citus: claim a key with an in_progress row; a row there wins */
static const char *const sql_claim =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
" ON CONFLICT DO NOTHING";

static const char *const sql_insert =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

#define UPDATE_BASE \
"UPDATE idempotency.idempotency_key AS k" \
"   SET status = $4, request_hash = $5, response = $6, retryable = $7," \
"       attempts = $8, created_at = $9, updated_at = $10, expires_at = $11," \
"       locked_until = $12"

/* a retry or the end of the work: the recovery point stays */
static const char *const sql_update = UPDATE_BASE KEY_WHERE;

/* new work over an expired row: its recovery point goes too */
static const char *const sql_update_rp =
UPDATE_BASE ", recovery_point = NULL, recovery_state = NULL" KEY_WHERE;

/* checkpoint(): the recovery point of a held lease */
static const char *const sql_checkpoint =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6" KEY_WHERE;

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
"   created_at, updated_at, expires_at, locked_until)" \
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)" \
" ON CONFLICT (key, scope, owner) DO UPDATE" \
"   SET status = EXCLUDED.status, request_hash = EXCLUDED.request_hash," \
"       response = EXCLUDED.response, retryable = EXCLUDED.retryable," \
"       attempts = EXCLUDED.attempts, created_at = EXCLUDED.created_at," \
"       updated_at = EXCLUDED.updated_at, expires_at = EXCLUDED.expires_at," \
"       locked_until = EXCLUDED.locked_until"

static const char *const sql_upsert_citus = UPSERT_CITUS;
static const char *const sql_upsert_citus_rp =
UPSERT_CITUS ", recovery_point = NULL, recovery_state = NULL";

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

/*
 * Citus, the key's shard on this node (shard.c): the same Citus statements
 * on the shard table itself, as the table's owner, one set of plans per
 * shard (the text names the shard).  See the file comment.
 */
typedef enum ShardStmt
{
	SS_CLAIM, SS_SELECT, SS_SELECT_RP, SS_LOCK, SS_LOCK_RP, SS_UPSERT,
	SS_UPSERT_RP, SS_CHECKPOINT, SS_N
} ShardStmt;

static const char *const shard_tmpl[SS_N] = {
	sql_claim, sql_select_citus, sql_select_citus_rp, sql_select_lock,
	sql_select_lock_rp, sql_upsert_citus, sql_upsert_citus_rp,
	sql_checkpoint_citus
};

typedef struct ShardPlans
{
	int64		shard;			/* hash key */
	Oid			relid;			/* the shard table when planned */
	char	   *sql[SS_N];		/* texts naming it (TopMemoryContext) */
	SPIPlanPtr	plans[SS_N];
} ShardPlans;

static HTAB *shard_plans = NULL;

/* what an error context callback says */
typedef struct StoreErrorArg
{
	const KeyId *id;
	const char *doing;			/* "reading", "storing" */
} StoreErrorArg;

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
static void
keystore_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == store_relid)
		store_relid = InvalidOid;
	for (int i = 0; i < IDEM_NTABLES; i++)
		if (relid == InvalidOid || relid == table_relid[i])
			table_relid[i] = InvalidOid;
	idem_shard_inval(relid);
}

static void
store_error_context(void *arg)
{
	StoreErrorArg *a = (StoreErrorArg *) arg;

	errcontext("%s %s in table idempotency.idempotency_key",
			   a->doing, idem_describe_key(a->id));
}

static void
bad_table(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table idempotency.idempotency_key cannot hold idempotency keys"),
			 errdetail_internal("%s", detail),
			 errhint("Restore the table as the extension's install script creates it, or see the README (\"Partitioning the key table\").")));
}

/*
 * Is relid a table Citus knows (distributed, reference or Citus-managed
 * local): a row of pg_dist_partition, which Citus keeps on the coordinator
 * and, with its metadata synced, on every worker?  false when Citus is not
 * installed (no pg_dist_partition).  Reads the catalog table directly (no
 * SQL); callers cache the answer.  For keystore.c and lifecycle.c.
 */
bool
idem_citus_table(Oid relid)
{
	Oid			catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	AttrNumber	att;
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	bool		found;

	if (!OidIsValid(catalog))
		return false;
	att = get_attnum(catalog, "logicalrelid");
	if (att == InvalidAttrNumber)
		return false;
	rel = table_open(catalog, AccessShareLock);
	ScanKeyInit(&skey, att, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &skey);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * On Citus a table's owner column is an idempotency.roleref (see
 * IDEM_OWNER_EQ_CITUS).  A table distributed by hand, without distribute(),
 * still has a regrole there (Citus copies it in binary: another node's
 * oid), and one distributed by 0.5.0 a text name (a renamed role's key is
 * not found, a new role of the old name finds it): refuse both rather than
 * compare oids of another node or names.
 */
static void
citus_owner_check(Oid relid, const char *table)
{
	AttrNumber	att = get_attnum(relid, "owner");
	Oid			type;
	Oid			nsp;

	if (att == InvalidAttrNumber)
		return;
	type = get_atttype(relid, att);
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp) &&
		type == GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								CStringGetDatum("roleref"), ObjectIdGetDatum(nsp)))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table idempotency.%s is distributed by Citus, but its owner column is of type %s", table,
					format_type_be(type)),
			 errdetail("On Citus the owner column is idempotency.roleref: role oids differ from node to node (a regrole copied in binary names another role), and a role's name changes with ALTER ROLE ... RENAME (a text owner pays a renamed role's retry twice)."),
			 errhint("On the coordinator, run SELECT idempotency.distribute(); it converts the column.")));
}

/*
 * Is table t of the extension known to Citus?  Then its statements compare
 * owners by name (IDEM_OWNER_EQ_CITUS).  Cached until the table changes;
 * false when it does not exist (an older version of the extension).
 */
bool
idem_table_distributed(IdemTable t)
{
	if (!OidIsValid(table_relid[t]))
	{
		Oid			nsp;
		Oid			relid;

		idem_relcache_watch();
		nsp = get_namespace_oid("idempotency", true);
		relid = OidIsValid(nsp) ? get_relname_relid(table_names[t], nsp) : InvalidOid;
		if (!OidIsValid(relid))
			return false;
		table_citus[t] = idem_citus_table(relid);
		if (table_citus[t])
			citus_owner_check(relid, table_names[t]);
		table_relid[t] = relid;
	}
	return table_citus[t];
}

/*
 * Find the table, check that it can hold keys, and choose the path (see
 * the file comment).  Cached until the table changes.
 */
static void
store_resolve(void)
{
	Oid			nsp,
				relid = InvalidOid;
	Relation	rel;
	TupleDesc	td;
	int			ncols = 0;
	bool		fast;
	bool		citus;
	int			want;
	Oid			pk = InvalidOid;

	if (OidIsValid(store_relid))
		return;
	idem_relcache_watch();
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp))
		relid = get_relname_relid("idempotency_key", nsp);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key does not exist"),
				 errhint("Run CREATE EXTENSION idempotency in this database.")));

	rel = relation_open(relid, AccessShareLock);
	td = RelationGetDescr(rel);
	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		bad_table("It is not a table.");
	citus = idem_citus_table(relid);
	if (citus)
		citus_owner_check(relid, "idempotency_key");
	fast = rel->rd_rel->relkind == RELKIND_RELATION &&
		rel->trigdesc == NULL && rel->rd_rules == NULL && !citus;
	for (int i = 0; i < td->natts; i++)
		if (!TupleDescAttr(td, i)->attisdropped)
			ncols++;
	/*
	 * The recovery point columns came with 0.5.0: without both of them (a
	 * 0.4.0 table, before or during ALTER EXTENSION UPDATE) the guard works
	 * as before and checkpoint() asks for the update.
	 */
	store_recovery = get_attnum(relid, col_names[COL_RECOVERY_POINT]) > 0 &&
		get_attnum(relid, col_names[COL_RECOVERY_STATE]) > 0;
	/*
	 * derive_seed came with 0.6.0: a 0.5.0 table (during ALTER EXTENSION
	 * UPDATE) is served without it, and derive_key() asks for the update.
	 * The SQL path never names it (its DEFAULT draws the seed); the fast
	 * path writes one (idem_unique128).
	 */
	store_seed = store_recovery && get_attnum(relid, col_names[COL_DERIVE_SEED]) > 0;
	want = store_seed ? NUM_COLS : store_recovery ? COL_DERIVE_SEED : NUM_BASE_COLS;
	fast = fast && ncols == want;
	for (int i = 0; i < want; i++)
	{
		AttrNumber	att = get_attnum(relid, col_names[i]);
		Form_pg_attribute a;

		if (att == InvalidAttrNumber || att < 0)
			bad_table(psprintf("It has no column \"%s\".", col_names[i]));
		a = TupleDescAttr(td, att - 1);
		/* a domain, a typmod or another type: SQL coerces, we do not */
		if (a->atttypid != col_types[i] || a->atttypmod != -1)
			fast = false;
		/* the probe reads these without a null check */
		if (!a->attnotnull && col_notnull[i])
			fast = false;
		store_attnums[i] = att;
	}
	/* the probe needs a btree primary key on exactly (owner, scope, key) */
	if (fast)
	{
		pk = IDEM_PRIMARY_KEY_INDEX(rel);
		fast = OidIsValid(pk);
	}
	if (fast)
	{
		Relation	index = index_open(pk, AccessShareLock);
		int			seen = 0;

		fast = index->rd_rel->relam == BTREE_AM_OID &&
			index->rd_index->indnkeyatts == 3;
		for (int i = 0; fast && i < 3; i++)
		{
			AttrNumber	att = index->rd_index->indkey.values[i];

			if (att == store_attnums[COL_OWNER])
				seen |= 1;
			else if (att == store_attnums[COL_SCOPE])
				seen |= 2;
			else if (att == store_attnums[COL_KEY])
				seen |= 4;
		}
		fast = fast && seen == 7;
		index_close(index, AccessShareLock);
	}
	relation_close(rel, NoLock);
	store_fast = fast;
	store_citus = citus;
	store_relid = relid;
}

/*
 * Open the key table with lockmode, after any change to it that taking the
 * lock revealed (another session's ALTER TABLE or ALTER EXTENSION UPDATE
 * may have committed since store_resolve() looked).
 */
static Relation
store_open(LOCKMODE lockmode)
{
	for (;;)
	{
		Oid			relid;
		Relation	rel;

		store_resolve();
		relid = store_relid;
		rel = table_open(relid, lockmode);
		if (store_relid == relid)
			return rel;
		/* invalidated while we waited for the lock: look again */
		table_close(rel, lockmode);
	}
}

static void
key_values(const KeyId *id, Datum *values)
{
	values[0] = ObjectIdGetDatum(id->owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id->scope, id->scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id->key, id->key_len));
}

/* 25006 unless this transaction may write */
static void
check_writable(const KeyId *id)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot store %s during recovery", idem_describe_key(id)),
				 errdetail("This server is a hot standby; it can replay finished keys but not store new ones."),
				 errhint("Send requests that do work to the primary server.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot store %s in a read-only transaction", idem_describe_key(id))));
}

/*
 * Citus: the plans for key id's shard when the shard is on this node (its
 * metadata lock then held: shard.c), else NULL (Citus's route).  The key
 * table must be resolved.
 */
static ShardPlans *
local_shard(const KeyId *id)
{
	Oid			shard_relid;
	int64		shard;
	bool		found;
	ShardPlans *sp;

	shard = idem_local_shard(store_relid, id, &shard_relid);
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

/* run statement k on the shard of sp (inside SPI), as the table's owner */
static uint64
shard_run(ShardPlans *sp, ShardStmt k, int nargs, Oid *argtypes,
		  Datum *values, const char *nulls, int expect_rc)
{
	if (sp->sql[k] == NULL)
	{
		const char *shell = "idempotency.idempotency_key";
		const char *tmpl = shard_tmpl[k];
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
 * Fast path: the primary key probe and the executor insert
 * ---------------------------------------------------------------------
 */

/*
 * Probe the primary key for key id under snapshot snap.  Returns whether a
 * row is visible; fills *out (response copied into outcxt) and *xmin.
 */
static bool
probe(Relation heap, const KeyId *id, Snapshot snap, StoredKey *out,
	  MemoryContext outcxt, TransactionId *xmin)
{
	Relation	index;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	bool		found;

	/*
	 * The primary key as the relcache knows it now that the table is locked
	 * (store_resolve() checked its columns).
	 */
	index = index_open(IDEM_PRIMARY_KEY_INDEX(heap), AccessShareLock);
	slot = table_slot_create(heap, NULL);

	for (int i = 0; i < 3; i++)
	{
		AttrNumber	att = index->rd_index->indkey.values[i];
		const char *val;
		int			len;

		if (att == store_attnums[COL_OWNER])
		{
			ScanKeyInit(&skey[i], i + 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(id->owner));
			continue;
		}
		if (att == store_attnums[COL_SCOPE])
		{
			val = id->scope;
			len = id->scope_len;
		}
		else if (att == store_attnums[COL_KEY])
		{
			val = id->key;
			len = id->key_len;
		}
		else
			elog(ERROR, "primary key of idempotency.idempotency_key changed under us");
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i], F_TEXTEQ,
							   PointerGetDatum(cstring_to_text_with_len(val, len)));
	}
	scan = IDEM_INDEX_BEGINSCAN(heap, index, snap, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found && out != NULL)
	{
		bool		isnull;
		Datum		d;
		char	   *status;

#define COL(c) slot_getattr(slot, store_attnums[c], &isnull)
		memset(out, 0, sizeof(StoredKey));
		out->found = true;
		status = TextDatumGetCString(COL(COL_STATUS));
		out->status = status[0];	/* i(n_progress), c(ompleted), f(ailed) */
		pfree(status);
		d = COL(COL_REQUEST_HASH);
		if (!isnull)
		{
			bytea	   *h = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(h) == FINGERPRINT_LEN)
			{
				out->has_hash = true;
				memcpy(out->request_hash, VARDATA_ANY(h), FINGERPRINT_LEN);
			}
		}
		d = COL(COL_RESPONSE);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			out->response = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = COL(COL_RETRYABLE);
		out->retryable = isnull ? false : DatumGetBool(d);
		out->attempts = DatumGetInt32(COL(COL_ATTEMPTS));
		out->created_at = DatumGetTimestampTz(COL(COL_CREATED_AT));
		out->updated_at = DatumGetTimestampTz(COL(COL_UPDATED_AT));
		out->expires_at = DatumGetTimestampTz(COL(COL_EXPIRES_AT));
		d = COL(COL_LOCKED_UNTIL);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (store_recovery)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			d = COL(COL_RECOVERY_POINT);
			if (!isnull)
				out->recovery_point = DatumGetTextPCopy(d);
			d = COL(COL_RECOVERY_STATE);
			if (!isnull)
				out->recovery_state = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
#undef COL
	}
	if (found)
	{
		bool		isnull;

		*xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
													  &isnull));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	return found;
}

/*
 * Insert a row through the executor's simple-relation insert (the way
 * logical replication apply does): constraints, index readiness, every
 * index.  Only on the fast path: no triggers, rules or partitions, and
 * values already of the columns' types.  values/nulls are in $n order.
 */
static void
exec_insert(Relation rel, Datum *values, const char *nulls)
{
	TupleDesc	td = RelationGetDescr(rel);
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri;
	TupleTableSlot *slot;

	/* allocated by the server, never by us (compat.h: the ABI trap) */
	rri = IDEM_NEW_RESULT_REL(estate, rel);
	estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(rri, false);

	slot = ExecInitExtraTupleSlot(estate, td, &TTSOpsVirtual);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * td->natts);
	for (int i = 0; i < NUM_BASE_COLS; i++)
	{
		slot->tts_values[store_attnums[i] - 1] = values[i];
		slot->tts_isnull[store_attnums[i] - 1] = nulls[i] == 'n';
	}
	if (store_seed)
	{
		/* what the column's DEFAULT draws on the SQL path: version 1, 16 fresh bytes */
		bytea	   *seed = palloc(VARHDRSZ + 1 + 16);

		SET_VARSIZE(seed, VARHDRSZ + 1 + 16);
		VARDATA(seed)[0] = 1;
		idem_unique128((uint8 *) VARDATA(seed) + 1);
		slot->tts_values[store_attnums[COL_DERIVE_SEED] - 1] = PointerGetDatum(seed);
		slot->tts_isnull[store_attnums[COL_DERIVE_SEED] - 1] = false;
	}
	ExecStoreVirtualTuple(slot);
	IDEM_SIMPLE_INSERT(rri, estate, slot);

	idem_free_result_rel(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}

/* ---------------------------------------------------------------------
 * SQL path
 * ---------------------------------------------------------------------
 */

/*
 * Look key id up with the prepared SELECT under snapshot snap (InvalidSnapshot:
 * SPI's own, as for any statement).  Returns whether a row was found.
 */
static bool
sql_probe(const KeyId *id, Snapshot snap, StoredKey *out, MemoryContext outcxt,
		  TransactionId *xmin, bool lock)
{
	Oid			argtypes[3] = {REGROLEOID, TEXTOID, TEXTOID};
	Datum		values[3];
	uint64		n;
	HeapTuple	tup;
	TupleDesc	td;
	bool		isnull;
	Datum		d;

	ShardPlans *sp = NULL;

	key_values(id, values);
	if (store_citus)
	{
		/* the owner by name (idempotency.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		values[0] = idem_owner_ref(id->owner);
		sp = local_shard(id);
	}
	SPI_connect();
	if (sp != NULL)
		n = shard_run(sp, lock ? (store_recovery ? SS_LOCK_RP : SS_LOCK) :
					  (store_recovery ? SS_SELECT_RP : SS_SELECT),
					  3, argtypes, values, NULL, SPI_OK_SELECT);
	else if (lock && store_recovery)
		n = idem_run_as(false, &plan_select_lock_rp, sql_select_lock_rp, 3,
						argtypes, values, NULL, SPI_OK_SELECT);
	else if (lock)
		n = idem_run_as(false, &plan_select_lock, sql_select_lock, 3, argtypes,
						values, NULL, SPI_OK_SELECT);
	else if (store_citus && store_recovery)
		n = idem_run_as(false, &plan_select_citus_rp, sql_select_citus_rp, 3,
						argtypes, values, NULL, SPI_OK_SELECT);
	else if (store_citus)
		n = idem_run_as(false, &plan_select_citus, sql_select_citus, 3, argtypes,
						values, NULL, SPI_OK_SELECT);
	else if (store_recovery)
		n = idem_run_as_owner_snap(&plan_select_rp, sql_select_rp, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	else
		n = idem_run_as_owner_snap(&plan_select, sql_select, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	if (n > 1)
		bad_table(psprintf("It holds " UINT64_FORMAT " rows for one key: its primary key on (key, scope, owner) is missing.", n));
	if (n == 0)
	{
		SPI_finish();
		return false;
	}
	tup = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	*xmin = DatumGetTransactionId(SPI_getbinval(tup, td, 9, &isnull));
	if (out != NULL)
	{
		char	   *status;

		memset(out, 0, sizeof(StoredKey));
		out->found = true;
		d = SPI_getbinval(tup, td, 1, &isnull);
		if (isnull)
			bad_table("A row has a null status.");
		status = TextDatumGetCString(d);
		out->status = status[0];
		d = SPI_getbinval(tup, td, 2, &isnull);
		if (!isnull)
		{
			bytea	   *h = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(h) == FINGERPRINT_LEN)
			{
				out->has_hash = true;
				memcpy(out->request_hash, VARDATA_ANY(h), FINGERPRINT_LEN);
			}
		}
		d = SPI_getbinval(tup, td, 3, &isnull);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			out->response = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = SPI_getbinval(tup, td, 4, &isnull);
		out->retryable = isnull ? false : DatumGetBool(d);
		d = SPI_getbinval(tup, td, 5, &isnull);
		out->attempts = isnull ? 1 : DatumGetInt32(d);
		d = SPI_getbinval(tup, td, 6, &isnull);
		out->created_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 10, &isnull);
		out->updated_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 7, &isnull);
		if (isnull)
			bad_table("A row has a null expires_at.");
		out->expires_at = DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 8, &isnull);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (store_recovery)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			d = SPI_getbinval(tup, td, 11, &isnull);
			if (!isnull)
				out->recovery_point = DatumGetTextPCopy(d);
			d = SPI_getbinval(tup, td, 12, &isnull);
			if (!isnull)
				out->recovery_state = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
	}
	SPI_finish();
	return true;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/*
 * Read the stored row of key id (expired or not) into *out; the response
 * is copied into outcxt.
 *
 * With the snapshot rules of an SQL statement: the command counter is
 * advanced (so this transaction's own earlier writes are seen) and the
 * transaction snapshot is taken (fresh under READ COMMITTED).  Under
 * REPEATABLE READ and SERIALIZABLE the latest committed version is
 * compared too (see the file comment).
 *
 * No privileges are checked: like the rest of this file, the lookup acts
 * as the table's owner, for the caller's own role only.
 */
static void
keystore_read(const KeyId *id, StoredKey *out, MemoryContext outcxt,
			  bool check_latest, bool lock)
{
	TransactionId xmin = InvalidTransactionId;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading"};
	Relation	heap;

	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	heap = store_open(AccessShareLock);
	memset(out, 0, sizeof(StoredKey));
	if (store_fast)
	{
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		UpdateActiveSnapshotCommandId();
		(void) probe(heap, id, GetActiveSnapshot(), out, outcxt, &xmin);
		PopActiveSnapshot();
	}
	else
		(void) sql_probe(id, InvalidSnapshot, out, outcxt, &xmin, lock);

	/*
	 * On Citus the row lives on the shard's node, where a locking read
	 * raises the serialization failure itself; a local snapshot says
	 * nothing about it.
	 */
	if (check_latest && IsolationUsesXactSnapshot() && !store_citus)
	{
		TransactionId latest_xmin = InvalidTransactionId;
		bool		latest;

		if (store_fast)
			latest = probe(heap, id, GetLatestSnapshot(), NULL, outcxt, &latest_xmin);
		else
			latest = sql_probe(id, GetLatestSnapshot(), NULL, outcxt,
							   &latest_xmin, false);
		if (latest != out->found || (latest && latest_xmin != xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent use of %s",
							idem_describe_key(id)),
					 errdetail("Another transaction stored a result for this key after this transaction took its snapshot."),
					 errhint("Retry the transaction; it will see the stored result.")));
	}
	table_close(heap, NoLock);
	error_context_stack = errcb.previous;
}

void
idem_keystore_lookup(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, true, false);
}

/*
 * The same read for looking only (lookup()): no comparison with the latest
 * committed version, since nothing is decided on it.
 */
void
idem_keystore_peek(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, false, false);
}

/*
 * Is the key table distributed by Citus?  Then a key's serialization point
 * is its shard's primary key (idem_keystore_claim(), idem_keystore_lock()),
 * not the node-local key lock.  Cached (see the file comment).
 */
bool
idem_keystore_distributed(const KeyId *id)
{
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading"};

	if (OidIsValid(store_relid))
		return store_citus;
	/* a table that cannot hold keys is reported as the read would */
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	store_resolve();
	error_context_stack = errcb.previous;
	return store_citus;
}

/*
 * The lookup of idem_keystore_lookup() locking the row where it lives
 * (SELECT ... FOR UPDATE): on Citus, a transaction that holds the row
 * (a claim or a lock from any node) is waited for, and the row read is
 * the latest committed one.  Without Citus, the same as the lookup (the
 * key lock serialises).
 */
void
idem_keystore_lock(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, true, idem_keystore_distributed(id));
}

/*
 * Store the outcome of held key h: an UPDATE when a row (perhaps expired)
 * was there at begin(), else an INSERT.  An UPDATE that finds nothing
 * (the expired row was purged meanwhile) falls back to the INSERT.
 */
static void
row_values(const HeldKey *h, const char *status, Jsonb *response,
		   bool retryable_null, bool retryable, Datum *values, char *nulls)
{
	bytea	   *hash;

	memset(nulls, ' ', NUM_COLS);
	key_values(&h->id, values);
	values[COL_STATUS] = CStringGetTextDatum(status);
	if (h->has_hash)
	{
		hash = palloc(VARHDRSZ + FINGERPRINT_LEN);
		SET_VARSIZE(hash, VARHDRSZ + FINGERPRINT_LEN);
		memcpy(VARDATA(hash), h->request_hash, FINGERPRINT_LEN);
		values[COL_REQUEST_HASH] = PointerGetDatum(hash);
	}
	else
		nulls[COL_REQUEST_HASH] = 'n';
	if (response)
		values[COL_RESPONSE] = JsonbPGetDatum(response);
	else
		nulls[COL_RESPONSE] = 'n';
	values[COL_RETRYABLE] = BoolGetDatum(retryable);
	if (retryable_null)
		nulls[COL_RETRYABLE] = 'n';
	values[COL_ATTEMPTS] = Int32GetDatum(h->attempts);
	values[COL_CREATED_AT] = TimestampTzGetDatum(h->created_at);
	values[COL_UPDATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[COL_EXPIRES_AT] = TimestampTzGetDatum(h->expires_at);
	values[COL_LOCKED_UNTIL] = TimestampTzGetDatum(h->locked_until);
	if (h->locked_until == 0)
		nulls[COL_LOCKED_UNTIL] = 'n';
}

void
idem_keystore_write(const HeldKey *h, const char *status, Jsonb *response,
					bool retryable_null, bool retryable)
{
	Datum		values[NUM_COLS];
	char		nulls[NUM_COLS];
	bool		connected = false;
	bool		done = false;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {&h->id, "storing"};

	check_writable(&h->id);
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, status, response, retryable_null, retryable, values, nulls);

	store_resolve();
	if (store_citus)
	{
		ShardPlans *sp = local_shard(&h->id);

		/* the row this transaction claimed or locked, or a new one */
		SPI_connect();
		connected = true;
		if (sp != NULL)
			done = shard_run(sp, h->reset_point && store_recovery ? SS_UPSERT_RP : SS_UPSERT,
							 NUM_BASE_COLS, col_types, values, nulls, SPI_OK_INSERT) > 0;
		else if (h->reset_point && store_recovery)
			done = idem_run_as(false, &plan_upsert_citus_rp, sql_upsert_citus_rp,
							   NUM_BASE_COLS, col_types, values, nulls,
							   SPI_OK_INSERT) > 0;
		else
			done = idem_run_as(false, &plan_upsert_citus, sql_upsert_citus,
							   NUM_BASE_COLS, col_types, values, nulls,
							   SPI_OK_INSERT) > 0;
	}
	else if (h->row_exists)
	{
		SPI_connect();
		connected = true;
		if (h->reset_point && store_recovery)
			done = idem_run_as_owner(&plan_update_rp, sql_update_rp, NUM_BASE_COLS,
									 col_types, values, nulls, SPI_OK_UPDATE) > 0;
		else
			done = idem_run_as_owner(&plan_update, sql_update, NUM_BASE_COLS,
									 col_types, values, nulls, SPI_OK_UPDATE) > 0;
	}
	if (!done)
	{
		Relation	rel = store_open(RowExclusiveLock);

		if (store_fast)
		{
			SavedUser	saved;

			/* as the SQL path would: a DBA's CHECK or index functions run as the owner */
			idem_as_owner(&saved);
			exec_insert(rel, values, nulls);
			idem_as_caller(&saved);
		}
		table_close(rel, NoLock);
		if (!store_fast)
		{
			if (!connected)
				SPI_connect();
			connected = true;
			if (idem_run_as_owner(&plan_insert, sql_insert, NUM_BASE_COLS, col_types,
								  values, nulls, SPI_OK_INSERT) != 1)
				ereport(ERROR,
						(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
						 errmsg("%s was not stored in table idempotency.idempotency_key",
								idem_describe_key(&h->id)),
						 errdetail("A trigger or rule on the table skipped the row, so a duplicate could not find it.")));
		}
	}
	if (connected)
		SPI_finish();
	error_context_stack = errcb.previous;
}

/*
 * derive_key(): the seed and creation time of key id's live row (the
 * caller's own: run as the extension's owner for that owner only; on Citus
 * through Citus's route, by the owner's name).  Returns false when no live
 * row is visible: never stored (a single-transaction key before its
 * complete()), rolled back, expired, or another role's.  The seed is
 * copied into the caller's memory context.  A table from before 0.6.0 has
 * no seeds: 0.5.0's derivation (the role's name, any key) serves until
 * the update.
 */
static SPIPlanPtr plan_seed = NULL;
static SPIPlanPtr plan_seed_citus = NULL;

#define SELECT_SEED \
"SELECT k.derive_seed::pg_catalog.bytea, k.created_at::pg_catalog.timestamptz" \
FROM_KEYS
#define LIVE_SEED "   AND k.expires_at OPERATOR(pg_catalog.>) $4"

bool
idem_keystore_seed(const KeyId *id, bytea **seed, TimestampTz *created_at)
{
	Oid			argtypes[4] = {REGROLEOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	MemoryContext cxt = CurrentMemoryContext;
	bool		found = false;
	uint64		n;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading the derive seed of"};

	store_resolve();
	if (!store_seed)
	{
		/*
		 * A 0.5.0 table (the library updated, the extension not yet): derive
		 * as 0.5.0 did, from the role's name now, which is the version 0
		 * seed the update will freeze into every row.
		 */
		const char *name = GetUserNameFromId(id->owner, false);
		int			len = strlen(name);

		/* version 0, a frozen created_at of 0 that matches, the name */
		*seed = palloc0(VARHDRSZ + 9 + len);
		SET_VARSIZE(*seed, VARHDRSZ + 9 + len);
		memcpy(VARDATA(*seed) + 9, name, len);
		*created_at = 0;
		return true;
	}
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	key_values(id, values);
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	SPI_connect();
	if (store_citus)
	{
		argtypes[0] = REGROLEOID;
		values[0] = idem_owner_ref(id->owner);
		n = idem_run_as(false, &plan_seed_citus,
						SELECT_SEED KEY_WHERE_CITUS LIVE_SEED, 4, argtypes,
						values, NULL, SPI_OK_SELECT);
	}
	else
		n = idem_run_as_owner(&plan_seed, SELECT_SEED KEY_WHERE LIVE_SEED, 4,
							  argtypes, values, NULL, SPI_OK_SELECT);
	if (n == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d = SPI_getbinval(tup, td, 1, &isnull);

		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			*seed = DatumGetByteaPCopy(d);
			MemoryContextSwitchTo(old);
			*created_at = DatumGetTimestampTz(SPI_getbinval(tup, td, 2, &isnull));
			found = true;
		}
	}
	SPI_finish();
	error_context_stack = errcb.previous;
	return found;
}

/*
 * Whether the key table has the recovery point columns (0.5.0 and later):
 * checkpoint() needs them.
 */
bool
idem_keystore_has_recovery(void)
{
	store_resolve();
	return store_recovery;
}

/*
 * checkpoint(): set the recovery point and state of key id, whose lease
 * the caller holds (the key lock too: guard.c's lease holder check; on
 * Citus the row lock on the shard).  In the caller's transaction, as the extension's
 * owner (on Citus as the caller, like every Citus statement).  Returns the
 * rows updated (1, or 0 if the row is gone, which the locks rule out).
 */
uint64
idem_keystore_checkpoint(const KeyId *id, text *point, Jsonb *state)
{
	Oid			argtypes[6] = {REGROLEOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID,
							   TIMESTAMPTZOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	uint64		n;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "storing the recovery point of"};

	check_writable(id);
	if (!idem_keystore_has_recovery())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key has no recovery point columns"),
				 errdetail("The library is version 0.5.0 or later; the extension's SQL objects are older."),
				 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	key_values(id, values);
	values[3] = PointerGetDatum(point);
	if (state)
		values[4] = JsonbPGetDatum(state);
	else
		nulls[4] = 'n';
	values[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	store_resolve();
	sp = store_citus ? local_shard(id) : NULL;
	SPI_connect();
	if (store_citus)
	{
		/* the owner by name (idempotency.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		values[0] = idem_owner_ref(id->owner);
	}
	if (sp != NULL)
		n = shard_run(sp, SS_CHECKPOINT, 6, argtypes, values, nulls, SPI_OK_UPDATE);
	else if (store_citus)
		n = idem_run_as(false, &plan_checkpoint_citus, sql_checkpoint_citus, 6,
						argtypes, values, nulls, SPI_OK_UPDATE);
	else
		n = idem_run_as_owner(&plan_checkpoint, sql_checkpoint, 6, argtypes,
							  values, nulls, SPI_OK_UPDATE);
	SPI_finish();
	error_context_stack = errcb.previous;
	return n;
}

/*
 * Citus: claim key h->id for this transaction with an in_progress row
 * (INSERT ... ON CONFLICT DO NOTHING, routed to the key's shard).  Returns
 * true when the row was inserted: until this transaction ends, a claim of
 * the same key from any node waits for it on the shard's primary key, and
 * then finds the row this transaction left (or none, after a rollback).
 * false when a committed row is there (perhaps committed while we waited):
 * the caller locks and reads it (idem_keystore_lock()).  The new row has
 * no recovery point (the columns' default).
 */
bool
idem_keystore_claim(const HeldKey *h)
{
	Datum		values[NUM_COLS];
	char		nulls[NUM_COLS];
	bool		inserted;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {&h->id, "claiming"};

	check_writable(&h->id);
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, "in_progress", NULL, true, false, values, nulls);
	store_resolve();
	sp = local_shard(&h->id);
	SPI_connect();
	if (sp != NULL)
		inserted = shard_run(sp, SS_CLAIM, NUM_BASE_COLS, col_types, values,
							 nulls, SPI_OK_INSERT) > 0;
	else
		inserted = idem_run_as(false, &plan_claim, sql_claim, NUM_BASE_COLS,
							   col_types, values, nulls, SPI_OK_INSERT) > 0;
	SPI_finish();
	error_context_stack = errcb.previous;
	return inserted;
}

/* from _PG_init: our relcache callback */
void
idem_keystore_init(void)
{
	idem_relcache_add(keystore_relcache);
}
