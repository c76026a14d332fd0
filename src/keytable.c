/*-------------------------------------------------------------------------
 *
 * keytable.c
 *	  The key store's table (stores floor): which table holds the keys, its
 *	  shape, and the path every read and write takes (keystore.h).
 *
 * The table may be as shipped or changed by a DBA (a trigger, a CHECK
 * constraint, a column type, hash partitioning); a row is written under
 * every rule the executor enforces, and read back in the guard's types.
 * The path is chosen per table shape and cached in idem_store until the
 * table's relcache invalidation: fast (a plain heap of the shipped columns
 * and types, no triggers or rules, btree primary key: keyfast.c), SQL
 * (anything else: prepared statements in keyread.c and keywrite.c, which
 * PostgreSQL routes and coerces) or Citus (the table is in
 * pg_dist_partition: keycitus.c; idem_table_distributed() asks the same of
 * the other tables).  Also here: whether the table has the columns of
 * 0.5.0 (recovery) and 0.6.0 (derive_seed), a new row's derive seed
 * (idem_store_new_seed()), and what every statement shares (its error
 * context, the 25006 refusal, the key's values as $1..$3).  Why each
 * path, and the older table versions: src/README.md, "The key table's
 * paths and versions".
 *
 * Locking: AccessShareLock on the table (and its primary key) while its
 * shape is read; idem_store_open() takes the caller's lock and looks again
 * when taking it revealed a change.
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
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */

static const char *const col_names[NUM_COLS] = {
	"owner", "scope", "key", "status", "request_hash", "response", "retryable",
	"attempts", "created_at", "updated_at", "expires_at", "locked_until",
	"recovery_point", "recovery_state", "derive_seed"
};

Oid			idem_store_col_types[NUM_COLS] = {
	REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BOOLOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	TEXTOID, JSONBOID, BYTEAOID
};

Oid			idem_store_write_types[NUM_SEED_ARGS] = {
	REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BOOLOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BYTEAOID
};

/* NOT NULL as shipped: the fast path relies on it */
static const bool col_notnull[NUM_COLS] = {
	true, true, true, true, false, false, false, true, true, true, true, false,
	false, false, false
};

KeyStore	idem_store = {InvalidOid};	/* idempotency.idempotency_key */

/* the other tables: distributed by Citus?  (idem_table_distributed) */
static const char *const table_names[IDEM_NTABLES] = {
	"token", "seen_message", "state_machine"
};
static Oid	table_relid[IDEM_NTABLES];	/* InvalidOid: not looked yet */
static bool table_citus[IDEM_NTABLES];

/* ---------------------------------------------------------------------
 * For the key store's files (keystore.h)
 * ---------------------------------------------------------------------
 */
/*
 * The tag of the derive secret new seeds carry (idem_store_new_seed()):
 * the first 8 bytes of the SHA-256 of the oldest row of
 * idempotency.derive_secret, read once per backend (read_secret_tag()).
 * Any row's tag would do (a seed names its own secret), so rows a
 * restore adds later need no invalidation; the table's relcache
 * invalidation (DROP EXTENSION, TRUNCATE) reads it again.
 */
#define SEED_TAG_LEN 8
#define SEED_RANDOM_LEN 16
static Oid	tag_relid = InvalidOid; /* InvalidOid: not read yet */
static bool tag_found;
static uint8 tag_bytes[SEED_TAG_LEN];

static void
keystore_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == idem_store.relid)
		idem_store.relid = InvalidOid;
	if (relid == InvalidOid || relid == tag_relid)
		tag_relid = InvalidOid;
	for (int i = 0; i < IDEM_NTABLES; i++)
		if (relid == InvalidOid || relid == table_relid[i])
			table_relid[i] = InvalidOid;
	idem_shard_inval(relid);
}

/*
 * The number of td's live column name (InvalidAttrNumber: none), as
 * get_attnum() answers it, from a descriptor the caller has open: no
 * catalog lookup.
 */
static AttrNumber
column_of(TupleDesc td, const char *name)
{
	for (int i = 0; i < td->natts; i++)
	{
		Form_pg_attribute a = TupleDescAttr(td, i);

		if (!a->attisdropped && strcmp(NameStr(a->attname), name) == 0)
			return a->attnum;
	}
	return InvalidAttrNumber;
}

/* error context callback of a statement on the table (arg: StoreErrorArg) */
void
idem_store_error_context(void *arg)
{
	StoreErrorArg *a = (StoreErrorArg *) arg;

	errcontext("%s %s in table idempotency.idempotency_key",
			   a->doing, idem_describe_key(a->id));
}

/* 55000: the table cannot hold keys, for the reason detail says */
void
idem_store_bad_table(const char *detail)
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
 * SQL); callers cache the answer.  For the key store, lifecycle.c, insert_once.c.
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

/* the oid of type idempotency.roleref (InvalidOid before 0.6.0) */
static Oid
roleref_type(Oid nsp)
{
	return OidIsValid(nsp) ?
		GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
						CStringGetDatum("roleref"), ObjectIdGetDatum(nsp)) :
		InvalidOid;
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
	if (OidIsValid(nsp) && type == roleref_type(nsp))
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
 * The tag of the oldest secret of idempotency.derive_secret (by created_at,
 * then secret), as SELECT substr(sha256(secret), 1, 8) ... ORDER BY
 * created_at, secret LIMIT 1 reads it, with the transaction's snapshot:
 * a scan of the table's few rows, without the parser, planner or SPI, and
 * no user code (the extension's own table, read as its owner would).
 * false when the table has no row.
 */
static bool
read_secret_tag(Oid relid, uint8 *tag)
{
	Relation	rel = table_open(relid, AccessShareLock);
	TupleDesc	td = RelationGetDescr(rel);
	AttrNumber	att_secret = column_of(td, "secret");
	AttrNumber	att_created = column_of(td, "created_at");
	Snapshot	snap = RegisterSnapshot(GetTransactionSnapshot());
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
	bytea	   *best = NULL;
	TimestampTz best_at = 0;
	bool		best_at_null = false;

	if (att_secret <= 0 || att_created <= 0 ||
		TupleDescAttr(td, att_secret - 1)->atttypid != BYTEAOID ||
		TupleDescAttr(td, att_created - 1)->atttypid != TIMESTAMPTZOID)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.derive_secret holds no usable secret"),
				 errdetail("Its columns must be secret bytea and created_at timestamptz.")));
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, att_secret, &isnull);
		bytea	   *secret;
		bool		at_null;
		TimestampTz at;
		int			cmp;

		if (isnull)
			continue;
		secret = DatumGetByteaPP(d);
		at = DatumGetTimestampTz(slot_getattr(slot, att_created, &at_null));
		if (best == NULL)
			cmp = -1;
		else if (at_null != best_at_null)
			cmp = at_null ? 1 : -1; /* NULLS LAST, as ORDER BY */
		else if (!at_null && at != best_at)
			cmp = at < best_at ? -1 : 1;
		else
		{
			int			len = VARSIZE_ANY_EXHDR(secret);
			int			best_len = VARSIZE_ANY_EXHDR(best);

			/* bytea order: memcmp of the common prefix, then the shorter */
			cmp = memcmp(VARDATA_ANY(secret), VARDATA_ANY(best), Min(len, best_len));
			if (cmp == 0)
				cmp = len < best_len ? -1 : len > best_len ? 1 : 0;
		}
		if (cmp < 0)
		{
			if (best != NULL)
				pfree(best);
			best = DatumGetByteaPCopy(d);
			best_at = at;
			best_at_null = at_null;
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snap);
	table_close(rel, AccessShareLock);
	if (best == NULL)
		return false;
	{
		IdemSha256	sha;
		uint8		digest[PG_SHA256_DIGEST_LENGTH];

		idem_sha256_init(&sha);
		idem_sha256_update(&sha, VARDATA_ANY(best), VARSIZE_ANY_EXHDR(best));
		idem_sha256_final(&sha, digest);
		memcpy(tag, digest, SEED_TAG_LEN);
		explicit_bzero(VARDATA_ANY(best), VARSIZE_ANY_EXHDR(best));
		pfree(best);
	}
	return true;
}

/*
 * derive_key()'s seed for a row written now (recovery.c): version 2, the
 * tag of a derive secret (the one it derives with), 16 fresh bytes; version
 * 1 (16 fresh bytes, the oldest secret) when the secret table is empty,
 * and on Citus, where the secret is a reference table that a call carried
 * to a shard's node may not read (a distributed query from a query on a
 * shard) and every node shares the coordinator's one secret.
 */
bytea *
idem_store_new_seed(void)
{
	bytea	   *seed;
	uint8	   *p;

	if (idem_store.citus)
	{
		seed = palloc(VARHDRSZ + 1 + SEED_RANDOM_LEN);
		SET_VARSIZE(seed, VARHDRSZ + 1 + SEED_RANDOM_LEN);
		VARDATA(seed)[0] = 1;
		idem_unique128((uint8 *) VARDATA(seed) + 1);
		return seed;
	}
	if (!OidIsValid(tag_relid))
	{
		Oid			nsp = get_namespace_oid("idempotency", true);
		Oid			rel = OidIsValid(nsp) ? get_relname_relid("derive_secret", nsp) : InvalidOid;

		idem_relcache_watch();
		tag_found = OidIsValid(rel) && read_secret_tag(rel, tag_bytes);
		tag_relid = rel;
	}
	seed = palloc(VARHDRSZ + 1 + SEED_TAG_LEN + SEED_RANDOM_LEN);
	p = (uint8 *) VARDATA(seed);
	if (tag_found)
	{
		*p++ = 2;
		memcpy(p, tag_bytes, SEED_TAG_LEN);
		p += SEED_TAG_LEN;
	}
	else
		*p++ = 1;
	idem_unique128(p);
	SET_VARSIZE(seed, VARHDRSZ + (p + SEED_RANDOM_LEN - (uint8 *) VARDATA(seed)));
	return seed;
}

/* the table t (InvalidOid when absent); after idem_table_distributed(t) */
Oid
idem_table_relid(IdemTable t)
{
	(void) idem_table_distributed(t);
	return table_relid[t];
}

/*
 * Find the table, check that it can hold keys, and choose the path (see
 * the file comment).  Cached until the table changes.
 */
void
idem_store_resolve(void)
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

	if (OidIsValid(idem_store.relid))
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
		idem_store_bad_table("It is not a table.");
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
	idem_store.recovery = column_of(td, col_names[COL_RECOVERY_POINT]) > 0 &&
		column_of(td, col_names[COL_RECOVERY_STATE]) > 0;

	/*
	 * derive_seed came with 0.6.0: a 0.5.0 table (during ALTER EXTENSION
	 * UPDATE) is served without it, and derive_key() derives as 0.5.0 did.
	 * Both paths write a new row's seed (idem_store_new_seed()): the column
	 * has no DEFAULT, so that the rows a dump of 0.5.0 restores have none.
	 */
	idem_store.seed = idem_store.recovery && column_of(td, col_names[COL_DERIVE_SEED]) > 0;
	want = idem_store.seed ? NUM_COLS : idem_store.recovery ? COL_DERIVE_SEED : NUM_BASE_COLS;
	fast = fast && ncols == want;
	for (int i = 0; i < want; i++)
	{
		AttrNumber	att = column_of(td, col_names[i]);
		Form_pg_attribute a;

		if (att == InvalidAttrNumber || att < 0)
			idem_store_bad_table(psprintf("It has no column \"%s\".", col_names[i]));
		a = TupleDescAttr(td, att - 1);

		/*
		 * a domain, a typmod or another type: SQL coerces, we do not.  The
		 * owner is idempotency.roleref since 0.6.0 (regrole before): an oid
		 * either way
		 */
		if ((a->atttypid != idem_store_col_types[i] &&
			 !(i == COL_OWNER && a->atttypid == roleref_type(nsp))) ||
			a->atttypmod != -1)
			fast = false;
		/* the probe reads these without a null check */
		if (!a->attnotnull && col_notnull[i])
			fast = false;
		idem_store.attnums[i] = att;
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

			if (att == idem_store.attnums[COL_OWNER])
				seen |= 1;
			else if (att == idem_store.attnums[COL_SCOPE])
				seen |= 2;
			else if (att == idem_store.attnums[COL_KEY])
				seen |= 4;
		}
		fast = fast && seen == 7;
		index_close(index, AccessShareLock);
	}
	relation_close(rel, NoLock);
	idem_store.fast = fast;
	idem_store.citus = citus;
	idem_store.relid = relid;
}

/*
 * Open the key table with lockmode, after any change to it that taking the
 * lock revealed (another session's ALTER TABLE or ALTER EXTENSION UPDATE
 * may have committed since idem_store_resolve() looked).
 */
Relation
idem_store_open(LOCKMODE lockmode)
{
	for (;;)
	{
		Oid			relid;
		Relation	rel;

		idem_store_resolve();
		relid = idem_store.relid;
		rel = table_open(relid, lockmode);
		if (idem_store.relid == relid)
			return rel;
		/* invalidated while we waited for the lock: look again */
		table_close(rel, lockmode);
	}
}

/* $1..$3 of every statement: the key's owner, scope and key */
void
idem_store_key_values(const KeyId *id, Datum *values)
{
	values[0] = ObjectIdGetDatum(id->owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id->scope, id->scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id->key, id->key_len));
}

/* 25006 unless this transaction may write */
void
idem_store_check_writable(const KeyId *id)
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

/* ---------------------------------------------------------------------
 * Interface (idempotency.h)
 * ---------------------------------------------------------------------
 */
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

	if (OidIsValid(idem_store.relid))
		return idem_store.citus;
	/* a table that cannot hold keys is reported as the read would */
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	idem_store_resolve();
	error_context_stack = errcb.previous;
	return idem_store.citus;
}

/*
 * Whether the key table has the recovery point columns (0.5.0 and later):
 * checkpoint() needs them.
 */
bool
idem_keystore_has_recovery(void)
{
	idem_store_resolve();
	return idem_store.recovery;
}

/* whether the key table has derive_seed (0.6.0; not during the update) */
bool
idem_keystore_has_seed(void)
{
	idem_store_resolve();
	return idem_store.seed;
}

/* from _PG_init: our relcache callback */
void
idem_keytable_init(void)
{
	idem_relcache_add(keystore_relcache);
}
