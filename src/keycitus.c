/*-------------------------------------------------------------------------
 *
 * keycitus.c
 *	  Citus (citus floor, below the key store): whether a table is
 *	  distributed, whether a key's shard is on this node, and the key
 *	  table's statements on Citus (keycitus.h).
 *
 * Used by the key store (keystore.c) for the key table and by the files
 * that ask whether a table is distributed (lifecycle.c, insert_once.c,
 * outbox_publish.c).  Without Citus every answer is "not distributed" and
 * "not local", and nothing else here runs.  Why each part: src/README.md,
 * "Citus in detail".
 *
 * Locking: the shard's metadata lock in ShareLock, through Citus's own
 * code, before a statement runs on a local shard (held to the
 * transaction's end, so a shard move waits); row locks on the shard.
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
#include "executor/spi.h"
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
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "compat.h"
#include "idempotency.h"
#include "keycitus.h"

/* =====================================================================
 * Citus: is the shard that holds a key on this node?
 *
 * On Citus a key's row lives in one shard table on one node, and a
 * statement on the distributed table costs several times one on the
 * shard.  When the key's shard is here, the statements below run on
 * the shard table itself; this section says when that is safe.  The shard
 * comes from Citus (get_shard_id_for_distribution_column), its placement
 * from pg_dist_placement, compared with pg_dist_local_group.  Each backend
 * caches the verdict per shard until Citus's own invalidation, believed
 * only under the lock below.  Without Citus every answer is "not local".
 * How the lock is reached on each Citus build and why the cache is safe:
 * src/README.md, "Citus in detail".
 *
 * Locking: if the placement looks local, the shard's metadata lock is
 * taken in ShareLock through Citus's own code (the lock a shard move takes
 * ExclusiveLock on every node before it switches the placement), held to
 * the transaction's end, and the placement read again.  So a move waits
 * for a transaction that wrote to the local shard, and one that comes
 * after the move takes Citus's route.
 *
 * =====================================================================
 */
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
/* pg_dist_partition.partmethod of a hash-distributed table */
#define CITUS_DISTRIBUTE_BY_HASH 'h'
/* Citus's ADV_LOCKTAG_CLASS_CITUS_COLOCATED_SHARDS_METADATA (resource_lock.h) */
#define CITUS_LOCK_CLASS_COLOCATED_SHARDS_METADATA 8
/* a table with more shards is locked through Citus each time */
#define MAX_TAG_SHARDS 1024

#if PG_VERSION_NUM >= 170000
#define HELD_BY_ME(tag, mode) LockHeldByMe(tag, mode, false)
#else
#define HELD_BY_ME(tag, mode) LockHeldByMe(tag, mode)
#endif

/* looked up once per session */
static bool resolved = false;
static FmgrInfo shard_fn;		/* get_shard_id_for_distribution_column */
static bool have_fn = false;

/* Citus's catalogs (looked up once per session; reset if they change) */
static Oid	placement_rel = InvalidOid;
static Oid	placement_index = InvalidOid;
static AttrNumber att_shard,
			att_state,
			att_group;
static Oid	local_group_rel = InvalidOid;
static AttrNumber att_local_group;
static Oid	dist_shard_rel = InvalidOid;
static Oid	dist_shard_relid_index = InvalidOid;
static AttrNumber att_shard_relid,
			att_shard_id,
			att_shard_min;
static Oid	partition_rel = InvalidOid;
static AttrNumber att_part_relid,
			att_part_method,
			att_part_colocation;

/* this node's group, kept until pg_dist_local_group changes */
static bool group_known = false;
static int32 group_cached = -1;

/*
 * What this backend knows of a shard: its placement here and the shard
 * table, and the tag of Citus's metadata lock on it.  Valid while gen is
 * cache_gen: idem_shard_inval() moves cache_gen on every invalidation Citus
 * sends when a placement, a shard or a table's distribution changes (its
 * triggers on pg_dist_placement, pg_dist_shard and pg_dist_partition
 * invalidate the distributed table's relcache entry, which its own metadata
 * cache depends on too).  See idem_local_shard().
 */
typedef struct ShardEntry
{
	int64		shard;			/* hash key */
	uint64		gen;			/* valid while cache_gen is this */
	Oid			relid;			/* the distributed table */
	bool		local;			/* an active placement in this node's group */
	Oid			shard_relid;	/* its shard table here (when local) */

	/*
	 * The tag Citus's LockShardDistributionMetadata takes for the shard:
	 * computed (co-location id, index of the shard among the table's shards
	 * sorted by hash range) and used only once seen to be the lock Citus's
	 * own call took (tag_state 1); -1: not such a table, or not the tag (call
	 * Citus each time); 0: not seen yet.
	 */
	int			tag_state;
	LOCKTAG		tag;
} ShardEntry;

static HTAB *shard_cache = NULL;
static uint64 cache_gen = 1;

/* the distributed tables of cached shards (invalidations for them count) */
#define MAX_CACHED_TABLES 4
static Oid	cached_tables[MAX_CACHED_TABLES];
static int	n_cached_tables = 0;

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
 * A relcache invalidation (from keystore.c's callback: the server has only
 * ten callback slots, and Citus takes several).  Citus's triggers on
 * pg_dist_placement and pg_dist_shard invalidate the distributed table's
 * entry (CitusInvalidateRelcacheByShardId), the one on pg_dist_local_group
 * that catalog's: either ends what this file knows of shards.  Only
 * counters move here (no catalog access in a callback).
 */
void
idem_shard_inval(Oid relid)
{
	bool		stale = relid == InvalidOid || relid == placement_rel ||
		relid == local_group_rel || relid == dist_shard_rel ||
		relid == partition_rel || n_cached_tables > MAX_CACHED_TABLES;

	for (int i = 0; !stale && i < n_cached_tables; i++)
		stale = relid == cached_tables[i];
	if (!stale)
		return;
	cache_gen++;
	n_cached_tables = 0;
	group_known = false;
	if (relid == InvalidOid || relid == placement_rel || relid == local_group_rel ||
		relid == dist_shard_rel || relid == partition_rel)
		placement_rel = InvalidOid; /* look the catalogs up again */
}

/* find Citus's catalogs, their indexes and columns */
static bool
catalogs(void)
{
	if (OidIsValid(placement_rel))
		return true;
	placement_index = get_relname_relid("pg_dist_placement_shardid_index", PG_CATALOG_NAMESPACE);
	local_group_rel = get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE);
	dist_shard_rel = get_relname_relid("pg_dist_shard", PG_CATALOG_NAMESPACE);
	dist_shard_relid_index = get_relname_relid("pg_dist_shard_logical_relid_index", PG_CATALOG_NAMESPACE);
	partition_rel = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	placement_rel = get_relname_relid("pg_dist_placement", PG_CATALOG_NAMESPACE);
	if (!OidIsValid(placement_rel) || !OidIsValid(placement_index) ||
		!OidIsValid(local_group_rel) || !OidIsValid(dist_shard_rel) ||
		!OidIsValid(dist_shard_relid_index) || !OidIsValid(partition_rel))
	{
		placement_rel = InvalidOid;
		return false;
	}
	att_shard = get_attnum(placement_rel, "shardid");
	att_state = get_attnum(placement_rel, "shardstate");
	att_group = get_attnum(placement_rel, "groupid");
	att_local_group = get_attnum(local_group_rel, "groupid");
	att_shard_relid = get_attnum(dist_shard_rel, "logicalrelid");
	att_shard_id = get_attnum(dist_shard_rel, "shardid");
	att_shard_min = get_attnum(dist_shard_rel, "shardminvalue");
	att_part_relid = get_attnum(partition_rel, "logicalrelid");
	att_part_method = get_attnum(partition_rel, "partmethod");
	att_part_colocation = get_attnum(partition_rel, "colocationid");
	if (att_shard == InvalidAttrNumber || att_state == InvalidAttrNumber ||
		att_group == InvalidAttrNumber || att_local_group == InvalidAttrNumber ||
		att_shard_relid == InvalidAttrNumber || att_shard_id == InvalidAttrNumber ||
		att_shard_min == InvalidAttrNumber || att_part_relid == InvalidAttrNumber ||
		att_part_method == InvalidAttrNumber || att_part_colocation == InvalidAttrNumber)
	{
		placement_rel = InvalidOid;
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
	uint64		gen = cache_gen;

	if (group_known)
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
	/* kept unless an invalidation came while it was read */
	group_cached = group;
	group_known = gen == cache_gen;
	return group;
}

/* has shard an active placement in group? */
static bool
placement_in(int64 shard, int32 group)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tup;
	bool		local = false;

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

/*
 * The tag of Citus's metadata lock on shard of hash-distributed table relid
 * (SET_LOCKTAG_COLOCATED_SHARDS_METADATA_RESOURCE: database, the shard's
 * index among the table's shards sorted by hash range, co-location id,
 * class 8); false for another kind of table.  Only a candidate: see
 * lock_entry().
 */
static bool
lock_tag_of(Oid relid, int64 shard, LOCKTAG *tag)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tup;
	bool		hash = false;
	int32		colocation = 0;
	int32		mins[MAX_TAG_SHARDS];
	int			n = 0;
	bool		found = false;
	int32		min = 0;
	int			index = 0;

	rel = table_open(partition_rel, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		n1,
					n2,
					n3;
		Datum		r = heap_getattr(tup, att_part_relid, RelationGetDescr(rel), &n1);
		Datum		m = heap_getattr(tup, att_part_method, RelationGetDescr(rel), &n2);
		Datum		c = heap_getattr(tup, att_part_colocation, RelationGetDescr(rel), &n3);

		if (n1 || DatumGetObjectId(r) != relid)
			continue;
		hash = !n2 && !n3 && DatumGetChar(m) == CITUS_DISTRIBUTE_BY_HASH &&
			DatumGetInt32(c) != 0;
		colocation = n3 ? 0 : DatumGetInt32(c);
		break;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!hash)
		return false;

	rel = table_open(dist_shard_rel, AccessShareLock);
	ScanKeyInit(&skey, att_shard_relid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, dist_shard_relid_index, true, NULL, 1, &skey);
	while (HeapTupleIsValid(tup = systable_getnext(scan)) && n < MAX_TAG_SHARDS)
	{
		bool		n1,
					n2;
		Datum		id = heap_getattr(tup, att_shard_id, RelationGetDescr(rel), &n1);
		Datum		m = heap_getattr(tup, att_shard_min, RelationGetDescr(rel), &n2);
		char	   *txt;

		if (n1 || n2)
		{
			n = MAX_TAG_SHARDS; /* an uninitialized interval: give up */
			break;
		}
		txt = TextDatumGetCString(m);
		mins[n] = pg_strtoint32(txt);
		pfree(txt);
		if (DatumGetInt64(id) == shard)
		{
			found = true;
			min = mins[n];
		}
		n++;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (!found || n >= MAX_TAG_SHARDS)
		return false;
	for (int i = 0; i < n; i++)
		if (mins[i] < min)
			index++;
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) index, (uint32) colocation,
						 CITUS_LOCK_CLASS_COLOCATED_SHARDS_METADATA);
	return true;
}

/*
 * What this backend knows of shard of relid (see ShardEntry), read again
 * when an invalidation has come since.  Read without the shard's lock, so
 * only a hint until lock_entry() (which processes the invalidations that a
 * move committed before the lock was granted) finds it still valid.
 */
static ShardEntry *
shard_entry(Oid relid, int64 shard)
{
	static ShardEntry scratch;
	ShardEntry *e;
	bool		found;
	uint64		gen;
	int32		group;
	ShardEntry	fresh;

	if (shard_cache == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(int64);
		ctl.entrysize = sizeof(ShardEntry);
		shard_cache = hash_create("idempotency shard placements", 64, &ctl,
								  HASH_ELEM | HASH_BLOBS);
	}
	e = hash_search(shard_cache, &shard, HASH_FIND, NULL);
	if (e != NULL && e->gen == cache_gen && e->relid == relid)
		return e;

	/*
	 * Read it.  Any invalidation while it is read (catalog access processes
	 * them) may concern what was read: then it is used once, not kept.
	 */
	gen = cache_gen;
	memset(&fresh, 0, sizeof(fresh));
	fresh.shard = shard;
	fresh.relid = relid;
	fresh.tag_state = -1;
	if (catalogs() && (group = local_group()) >= 0)
	{
		fresh.local = placement_in(shard, group);
		if (fresh.local)
		{
			char	   *relname = get_rel_name(relid);

			if (relname != NULL)
			{
				char	   *name = psprintf("%s_" INT64_FORMAT, relname, shard);

				fresh.shard_relid = get_relname_relid(name, get_rel_namespace(relid));
				pfree(name);
				pfree(relname);
			}
			fresh.local = OidIsValid(fresh.shard_relid);
			if (fresh.local && lock_tag_of(relid, shard, &fresh.tag))
				fresh.tag_state = 0;
		}
	}
	if (gen != cache_gen)
	{
		scratch = fresh;
		scratch.gen = 0;
		return &scratch;
	}
	/* keep it: a table whose invalidations count */
	found = false;
	for (int i = 0; i < Min(n_cached_tables, MAX_CACHED_TABLES) && !found; i++)
		found = cached_tables[i] == relid;
	if (!found)
	{
		if (n_cached_tables < MAX_CACHED_TABLES)
			cached_tables[n_cached_tables] = relid;
		n_cached_tables++;		/* past the end: every invalidation counts */
	}
	e = hash_search(shard_cache, &shard, HASH_ENTER, &found);
	*e = fresh;
	e->gen = gen;
	return e;
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
 * ends, through Citus: LockShardDistributionMetadata itself where citus.so
 * exports it, else lock_shard_metadata() (see src/README.md, "Citus in
 * detail").
 */
static void
lock_citus(int64 shard)
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
 * The same lock for the shard of cached entry e: by its tag once that is
 * known to be Citus's (e->tag_state 1, a LockAcquire), else through Citus,
 * learning the tag: if the call took the computed tag (not held before,
 * held after), that is the tag Citus takes for the shard; if it took
 * something else, it is not.  Then the invalidations that came while it
 * waited (a move that committed before the lock was granted): true if e is
 * still valid, false if it must be read again (and, its tag perhaps stale,
 * the lock taken through Citus).
 */
static bool
lock_entry(ShardEntry *e)
{
	uint64		gen = e->gen;
	bool		held = false;

	if (e->tag_state == 1)
		(void) LockAcquire(&e->tag, ShareLock, false, false);
	else
	{
		if (e->tag_state == 0)
			held = HELD_BY_ME(&e->tag, ShareLock);
		lock_citus(e->shard);
		/* (not if the call's catalog access brought an invalidation) */
		if (e->tag_state == 0 && !held && gen != 0 && gen == cache_gen)
			e->tag_state = HELD_BY_ME(&e->tag, ShareLock) ? 1 : -1;
	}
	AcceptInvalidationMessages();
	return gen != 0 && gen == cache_gen;
}

/*
 * If the shard of key id of Citus table relid (distributed by "key") is on
 * this node, return its id, with the shard's metadata lock taken in
 * ShareLock until the transaction ends, and set *shard_relid to the shard
 * table; else 0 (take Citus's route).  See src/README.md, "Citus in
 * detail".
 *
 * The placement and the shard table are cached per shard (shard_entry()),
 * and the cache is trusted only under the lock: a move takes the lock in
 * ExclusiveLock before it switches the placement and holds it until it
 * commits, and its commit sends the invalidation (Citus's triggers) before
 * it releases the lock; so once the lock is granted and the invalidations
 * are processed, an entry still valid was read after any move that could
 * concern it, and none can start until this transaction ends.  An entry
 * that is not valid then is read again, under the lock (as Citus's
 * executor reads the placement after its lock).
 */
int64
idem_local_shard(Oid relid, const KeyId *id, Oid *shard_relid)
{
	int64		shard;
	bool		known;
	ShardEntry *e;

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
		 * A placement elsewhere needs no lock (the statements go Citus's way,
		 * which locks for itself).  One that looks local: the lock, each time
		 * (a rolled-back subtransaction may have released it), then the
		 * placement as it is under the lock.
		 */
		e = shard_entry(relid, shard);
		if (e->local && !lock_entry(e))
		{
			/* changed: Citus's own lock, and all read again under it */
			lock_citus(shard);
			AcceptInvalidationMessages();
			e = shard_entry(relid, shard);
		}
		if (e->local)
			*shard_relid = e->shard_relid;
		else
			shard = 0;
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
	return shard;
}

/*
 * Is relid a table Citus knows (distributed, reference or Citus-managed
 * local): a row of pg_dist_partition, which Citus keeps on the coordinator
 * and, with its metadata synced, on every worker?  false when Citus is not
 * installed (no pg_dist_partition).  Reads the catalog table directly (no
 * SQL); callers cache the answer.  For the key store, lifecycle.c, insert_once.c,
 * outbox_publish.c.
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

/* =====================================================================
 * The key table's statements on Citus: the statements on a key table
 * Citus distributes, through Citus's route or on the key's shard when it
 * is on this node, and their plans.
 *
 * Design: the relation this node sees is a shell whose rows live in
 * shards, perhaps on another node.  Only SQL reaches the rows, and Citus
 * routes each statement to the shard of the key (the key is the
 * distribution column).  The key lock (keystore.c) is local to one node, so
 * on Citus it is not what serialises a key: the shard's primary key is.
 * begin() claims a key (SS_CLAIM: an in_progress row, INSERT ... ON
 * CONFLICT DO NOTHING, uncommitted until the transaction ends: a
 * concurrent claim from any node waits for it on the shard) or locks the
 * existing row (SS_LOCK: SELECT ... FOR UPDATE on the shard).  A write is
 * an upsert, a checkpoint an UPDATE by the owner's name.  The owner column
 * is idempotency.roleref there: see IDEM_OWNER_EQ_CITUS.
 *
 * On the node that holds the key's shard the same statements run on the
 * shard table itself (idem_store_shard(); the section above says when that is safe),
 * as plain prepared statements without Citus's planner, as the table's
 * owner: one set of plans per shard, whose texts name the shard.
 *
 * A call whose key's shard is on another node is carried there whole
 * (keystore.c) and takes this shard path there: no role but the owner
 * writes the table.  Through Citus's route a statement runs as
 * the caller (runas.c: idem_run_as), which only reads succeed at (the
 * caller may SELECT its rows; a write there would be refused, 42501).  The
 * statements name the recovery point columns only when the table has them
 * (the _RP variants).
 *
 * Locking: the shard's metadata lock while its plans run (above); row
 * locks on the shard.
 *
 * =====================================================================
 */
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
 * Citus, the key's shard on this node (above): the same statements on
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
 * metadata lock then held: above), else NULL (Citus's route).  The key
 * table must be resolved.
 */
ShardPlans *
idem_store_shard(Oid relid, const KeyId *id)
{
	Oid			shard_relid;
	int64		shard;
	bool		found;
	ShardPlans *sp;

	shard = idem_local_shard(relid, id, &shard_relid);
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
