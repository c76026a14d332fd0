/*-------------------------------------------------------------------------
 *
 * shard.c
 *	  Citus: is the shard that holds a key on this node?
 *
 * Design: on Citus the key table is a shell; a key's row lives in one shard
 * (a plain table named <table>_<shardid> in the same schema) on one node.
 * Statements on the shell go through Citus's planner and executor even when
 * the shard is local (a delegated once() call runs on the shard's node), and
 * that costs several times a plain statement.  When the key's shard is on
 * this node, keycitus.c runs its statements on the shard table itself: the
 * same rows, the same primary key as the serialization point, no Citus
 * planning.  This file says when that is safe.
 *
 * The shard of a key comes from Citus itself
 * (pg_catalog.get_shard_id_for_distribution_column: its metadata cache and
 * hash function, no SQL).  Its placement is read from pg_dist_placement
 * (shardid index) and compared with this node's group
 * (pg_dist_local_group).
 *
 * Locking: Citus's own writes take the shard's metadata lock in ShareLock
 * before they look at its placement (citus_custom_scan.c:
 * AcquireMetadataLocks), and a shard move or split takes it in ExclusiveLock
 * on every node before it switches the placement (BlockWritesToShardList).
 * We do the same: if the placement looks local, take that lock through
 * Citus's own code, so the tag is the one Citus computes (held until the
 * transaction ends), and read the placement again.  Citus built for
 * PostgreSQL 15 exports LockShardDistributionMetadata from citus.so, which
 * we call directly; a Citus built for 16 or later hides it
 * (-fvisibility=hidden), and there we call its SQL-callable
 * lock_shard_metadata(lockmode, shardids[]) through the function manager
 * (PG_FUNCTION_INFO_V1, so exported whatever the visibility; it checks that
 * the caller owns the table, so it runs as the extension's owner, and then
 * calls LockShardDistributionMetadata).  Either way the lock is the one a
 * move's BlockWritesToShardList takes (test/citus/run checks it in pg_locks
 * on every major).  So a move waits for a
 * transaction that wrote to the local shard, and a transaction that comes
 * after the move finds the placement gone and takes Citus's route.  The
 * verdict is remembered for the rest of the transaction (the lock keeps it
 * true).
 *
 * Without Citus (no such function or catalog) every answer is "not local".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "compat.h"
#include "idempotency.h"

/*
 * Citus's LockShardDistributionMetadata(shardid, mode) (resource_lock.c,
 * exported by citus.so): the lock its writes and its shard moves take.  For
 * a hash-distributed table in a co-location group the tag is (co-location
 * id, shard index) of class ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA,
 * not the shard id: a lock of our own on the shard id never met a move's
 * ExclusiveLock, so a write went into the old shard while it was copied
 * (a key paid twice: test/citus/run, "a move waits for ...").
 */
typedef void (*CitusLockMetadataFn) (int64 shardid, LOCKMODE mode);
static CitusLockMetadataFn citus_lock_metadata = NULL;
/* else (Citus for PostgreSQL 16+): pg_catalog.lock_shard_metadata(int, bigint[]) */
static FmgrInfo lock_sql_fn;
static bool have_lock_sql = false;
/* pg_dist_placement.shardstate of an active placement */
#define CITUS_SHARD_STATE_ACTIVE 1

/* looked up once per session */
static bool resolved = false;
static FmgrInfo shard_fn;			/* get_shard_id_for_distribution_column */
static bool have_fn = false;

/* Citus's catalogs (looked up once per session; reset if they change) */
static Oid	placement_rel = InvalidOid;
static Oid	placement_index = InvalidOid;
static AttrNumber att_shard,
			att_state,
			att_group;
static Oid	local_group_rel = InvalidOid;
static AttrNumber att_local_group;
/* this node's group, read once per transaction */
static LocalTransactionId group_lxid = InvalidLocalTransactionId;
static int32 group_cached = -1;

/* the verdict of this transaction for one key */
static LocalTransactionId last_lxid = InvalidLocalTransactionId;
static Oid	last_relid = InvalidOid;
static char *last_key = NULL;
static int	last_key_len = 0;
static int64 last_shard = 0;

static void
resolve(void)
{
	Oid			argtypes[2] = {REGCLASSOID, ANYOID};
	Oid			fn;
	MemoryContext old;
	FuncExpr   *expr;

	if (resolved)
		return;
	fn = LookupFuncName(list_make2(makeString("pg_catalog"),
								   makeString("get_shard_id_for_distribution_column")),
						2, argtypes, true);
	if (OidIsValid(fn))
		citus_lock_metadata = (CitusLockMetadataFn)
			load_external_function("citus", "LockShardDistributionMetadata", false, NULL);
	if (OidIsValid(fn) && citus_lock_metadata == NULL)
	{
		Oid			lock_argtypes[2] = {INT4OID, INT8ARRAYOID};
		Oid			lockfn = LookupFuncName(list_make2(makeString("pg_catalog"),
													   makeString("lock_shard_metadata")),
											2, lock_argtypes, true);

		if (OidIsValid(lockfn))
		{
			fmgr_info_cxt(lockfn, &lock_sql_fn, TopMemoryContext);
			have_lock_sql = true;
		}
	}
	if (OidIsValid(fn) && (citus_lock_metadata != NULL || have_lock_sql))
	{
		old = MemoryContextSwitchTo(TopMemoryContext);
		fmgr_info_cxt(fn, &shard_fn, TopMemoryContext);
		/* its second argument is "any": it reads the type from the call */
		expr = makeFuncExpr(fn, INT8OID,
							list_make2(makeConst(REGCLASSOID, -1, InvalidOid, 4,
												 (Datum) 0, true, true),
									   makeConst(TEXTOID, -1, C_COLLATION_OID, -1,
												 (Datum) 0, true, false)),
							InvalidOid, C_COLLATION_OID, COERCE_EXPLICIT_CALL);
		shard_fn.fn_expr = (Node *) expr;
		MemoryContextSwitchTo(old);
		have_fn = true;
	}
	resolved = true;
}

/*
 * A relcache invalidation (from keytable.c's callback: the server has only
 * ten callback slots, and Citus takes several)
 */
void
idem_shard_inval(Oid relid)
{
	if (relid == InvalidOid || relid == placement_rel || relid == local_group_rel)
	{
		placement_rel = InvalidOid;
		local_group_rel = InvalidOid;
		group_lxid = InvalidLocalTransactionId;
	}
}

/* find pg_dist_placement, its shardid index and pg_dist_local_group */
static bool
catalogs(void)
{
	if (OidIsValid(placement_rel) && OidIsValid(local_group_rel))
		return true;
	placement_rel = get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
	placement_index = get_relname_relid("pg_dist_placement_shardid_index", PG_CATALOG_NAMESPACE);
	local_group_rel = get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
	if (!OidIsValid(placement_rel) || !OidIsValid(placement_index) ||
		!OidIsValid(local_group_rel))
	{
		placement_rel = local_group_rel = InvalidOid;
		return false;
	}
	att_shard = get_attnum(placement_rel, "shardid");
	att_state = get_attnum(placement_rel, "shardstate");
	att_group = get_attnum(placement_rel, "groupid");
	att_local_group = get_attnum(local_group_rel, "groupid");
	if (att_shard == InvalidAttrNumber || att_state == InvalidAttrNumber ||
		att_group == InvalidAttrNumber || att_local_group == InvalidAttrNumber)
	{
		placement_rel = local_group_rel = InvalidOid;
		return false;
	}
	return true;
}

/* this node's group (pg_dist_local_group.groupid), -1 when unknown */
static int32
local_group(void)
{
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tup;
	int32		group = -1;

	if (group_lxid == IDEM_MY_LXID)
		return group_cached;
	rel = table_open(local_group_rel, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, att_local_group, RelationGetDescr(rel), &isnull);

		if (!isnull)
			group = DatumGetInt32(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	group_cached = group;
	group_lxid = IDEM_MY_LXID;
	return group;
}

/* has shard an active placement in this node's group? */
static bool
placement_local(int64 shard)
{
	int32		group;
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tup;
	bool		local = false;

	if (!catalogs())
		return false;
	group = local_group();
	if (group < 0)
		return false;
	rel = table_open(placement_rel, AccessShareLock);
	ScanKeyInit(&skey, att_shard, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(shard));
	scan = systable_beginscan(rel, placement_index, true, NULL, 1, &skey);
	while (!local && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		null_state,
					null_group;
		Datum		state = heap_getattr(tup, att_state, RelationGetDescr(rel), &null_state);
		Datum		grp = heap_getattr(tup, att_group, RelationGetDescr(rel), &null_group);

		local = !null_state && !null_group &&
			DatumGetInt32(state) == CITUS_SHARD_STATE_ACTIVE &&
			DatumGetInt32(grp) == group;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return local;
}

/* the shard of key (the distribution value) of distributed table relid */
static int64
shard_of(Oid relid, const char *key, int key_len)
{
	LOCAL_FCINFO(fcinfo, 2);
	Datum		result;
	SavedUser	saved;

	InitFunctionCallInfoData(*fcinfo, &shard_fn, 2, C_COLLATION_OID, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(relid);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = PointerGetDatum(cstring_to_text_with_len(key, key_len));
	fcinfo->args[1].isnull = false;
	/* it checks SELECT on the table: the extension's owner has it */
	idem_as_owner(&saved);
	result = FunctionCallInvoke(fcinfo);
	idem_as_caller(&saved);
	if (fcinfo->isnull)
		return 0;
	return DatumGetInt64(result);
}

/*
 * Citus's shard metadata lock on shard in ShareLock, until the transaction
 * ends: LockShardDistributionMetadata itself where citus.so exports it, else
 * through lock_shard_metadata() (see the file comment).
 */
static void
lock_shard_metadata(int64 shard)
{
	LOCAL_FCINFO(fcinfo, 2);
	Datum		elem = Int64GetDatum(shard);
	ArrayType  *shards;
	SavedUser	saved;

	if (citus_lock_metadata != NULL)
	{
		citus_lock_metadata(shard, ShareLock);
		return;
	}
	shards = construct_array(&elem, 1, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
	InitFunctionCallInfoData(*fcinfo, &lock_sql_fn, 2, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = Int32GetDatum(ShareLock);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = PointerGetDatum(shards);
	fcinfo->args[1].isnull = false;
	/* it checks that the caller owns the table: the extension's owner does */
	idem_as_owner(&saved);
	(void) FunctionCallInvoke(fcinfo);
	idem_as_caller(&saved);
	pfree(shards);
}

/*
 * If the shard of key id of Citus table relid (distributed by "key") is on
 * this node, return its id, with the shard's metadata lock taken in
 * ShareLock until the transaction ends, and set *shard_relid to the shard
 * table; else 0 (take Citus's route).  See the file comment.
 */
int64
idem_local_shard(Oid relid, const KeyId *id, Oid *shard_relid)
{
	int64		shard;
	char	   *relname;
	char	   *name;
	bool		known;

	*shard_relid = InvalidOid;
	resolve();
	if (!have_fn)
		return 0;
	known = last_lxid == IDEM_MY_LXID && last_relid == relid &&
		last_key_len == id->key_len && memcmp(last_key, id->key, id->key_len) == 0;
	shard = known ? last_shard : shard_of(relid, id->key, id->key_len);
	if (shard != 0)
	{
		/*
		 * A placement elsewhere needs no lock (the statements go Citus's
		 * way, which locks for itself).  One that looks local: the lock
		 * first, then the placement again (as Citus's executor does),
		 * each time: the lock is held until the transaction ends, so a
		 * placement read under it stays true, but a rolled-back
		 * subtransaction may have released it.
		 */
		if (!known && !placement_local(shard))
			shard = 0;			/* not here: Citus's route, no lock needed */
		else
		{
			lock_shard_metadata(shard);
			if (!placement_local(shard))
				shard = 0;
		}
	}
	if (!known)
	{
		if (last_key)
			pfree(last_key);
		last_key = MemoryContextAlloc(TopMemoryContext, Max(id->key_len, 1));
		memcpy(last_key, id->key, id->key_len);
		last_key_len = id->key_len;
		last_relid = relid;
		last_lxid = IDEM_MY_LXID;
	}
	/* (a placement gone after the lock: not local for the rest of it) */
	last_shard = shard;
	if (shard == 0)
		return 0;
	relname = get_rel_name(relid);
	if (relname == NULL)
		return 0;
	name = psprintf("%s_" INT64_FORMAT, relname, shard);
	*shard_relid = get_relname_relid(name, get_rel_namespace(relid));
	pfree(name);
	pfree(relname);
	return OidIsValid(*shard_relid) ? shard : 0;
}
