/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  Reading and writing rows of idempotency.idempotency_key.
 *
 * Design: lookups probe the primary key directly (index_beginscan): no
 * parser, planner or executor on the path every request takes.  Writes are
 * two statements (INSERT, UPDATE), each prepared once per backend with SPI
 * and kept (generic plans, parameters for every value).  Every name in them
 * is schema-qualified and every operator is OPERATOR(pg_catalog.=), so no
 * search_path can redirect them.  keystore_write() connects to SPI only
 * when it runs SQL; keystore_run()'s callers are inside SPI_connect().
 *
 * The table belongs to the extension and plain roles may only SELECT their
 * own rows from it (row-level security).  The SQL functions are SECURITY
 * INVOKER, so they switch to the table's owner for the duration of each
 * statement, the way PostgreSQL's own foreign-key checks do
 * (SECURITY_LOCAL_USERID_CHANGE).  The owner column is always the caller's
 * role, taken before the switch, so a role only ever reaches its own rows.
 * An error inside the statement is cleaned up by (sub)transaction abort,
 * which restores the user id.
 *
 * Locking: writers hold the key lock (keylock.c), so no other
 * begin()/complete()/fail() writes the same key concurrently.  begin()'s
 * first lookup runs without it: it only acts on a live finished key, which
 * changes only by expiring.  The probe checks no privileges (it reads as
 * the table's owner would, for the caller's own role only).
 *
 * Isolation: under READ COMMITTED every statement sees the latest committed
 * state.  Under REPEATABLE READ and SERIALIZABLE the row may have changed
 * after the transaction's snapshot; the lookup then compares with the
 * latest committed version and raises a serialization failure (40001), so
 * the client retries and gets the stored answer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "executor/tuptable.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "idempotency.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static Oid	store_relid = InvalidOid;	/* idempotency.idempotency_key */
static Oid	store_owner = InvalidOid;	/* its owner */

/* attribute numbers of the columns the lookup reads, found by name */
typedef enum
{
	COL_STATUS, COL_REQUEST_HASH, COL_RESPONSE, COL_RETRYABLE, COL_ATTEMPTS,
	COL_CREATED_AT, COL_EXPIRES_AT, COL_LOCKED_UNTIL, NUM_LOOKUP_COLS
} LookupCol;

static const char *const lookup_col_names[NUM_LOOKUP_COLS] = {
	"status", "request_hash", "response", "retryable", "attempts",
	"created_at", "expires_at", "locked_until"
};
static AttrNumber lookup_attnums[NUM_LOOKUP_COLS];

/* attribute numbers of the columns keystore_write() writes, in $n order */
#define NUM_WRITE_COLS 12
static const char *const write_col_names[NUM_WRITE_COLS] = {
	"owner", "scope", "key", "status", "request_hash", "response", "retryable",
	"attempts", "created_at", "updated_at", "expires_at", "locked_until"
};
static AttrNumber write_attnums[NUM_WRITE_COLS];

static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_update = NULL;

#define KEY_WHERE \
	" WHERE k.owner OPERATOR(pg_catalog.=) $1" \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

static const char *const sql_insert =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

static const char *const sql_update =
"UPDATE idempotency.idempotency_key AS k"
"   SET status = $4, request_hash = $5, response = $6, retryable = $7,"
"       attempts = $8, created_at = $9, updated_at = $10, expires_at = $11,"
"       locked_until = $12" KEY_WHERE;

static Oid	write_argtypes[12] = {REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID,
	JSONBOID, BOOLOID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
TIMESTAMPTZOID};

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
static void
store_inval_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	if (relid == InvalidOid || relid == store_relid)
		store_relid = InvalidOid;
}

/* find the table and its owner (cached until the table changes) */
static void
store_resolve(void)
{
	Oid			nsp,
				rel = InvalidOid;
	HeapTuple	tup;

	if (OidIsValid(store_relid))
		return;
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp))
		rel = get_relname_relid("idempotency_key", nsp);
	if (!OidIsValid(rel))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key does not exist"),
				 errhint("Run CREATE EXTENSION idempotency in this database.")));
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", rel);
	store_owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	for (int i = 0; i < NUM_WRITE_COLS; i++)
	{
		write_attnums[i] = get_attnum(rel, write_col_names[i]);
		if (write_attnums[i] == InvalidAttrNumber)
			elog(ERROR, "column idempotency.idempotency_key.%s does not exist",
				 write_col_names[i]);
	}
	for (int i = 0; i < NUM_LOOKUP_COLS; i++)
	{
		lookup_attnums[i] = get_attnum(rel, lookup_col_names[i]);
		if (lookup_attnums[i] == InvalidAttrNumber)
			elog(ERROR, "column idempotency.idempotency_key.%s does not exist",
				 lookup_col_names[i]);
	}
	store_relid = rel;
}

/* Prepare sql once per backend into *cache (kept, generic plan). */
void
keystore_prepare(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan;

	if (*cache != NULL)
		return;
	plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	*cache = plan;
}

/*
 * Switch to the owner of the extension's tables for the statements that
 * follow (see the file comment); keystore_as_caller() switches back.
 */
void
keystore_as_owner(SavedUser *saved)
{
	store_resolve();
	GetUserIdAndSecContext(&saved->userid, &saved->sec_context);
	SetUserIdAndSecContext(store_owner,
						   saved->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
}

void
keystore_as_caller(const SavedUser *saved)
{
	SetUserIdAndSecContext(saved->userid, saved->sec_context);
}

void
keystore_key_values(const KeyId *id, Datum *values)
{
	values[0] = ObjectIdGetDatum(id->owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id->scope, id->scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id->key, id->key_len));
}

/*
 * Run sql (prepared once into *cache) as the tables' owner with the given
 * parameters; raise if SPI does not answer expect_rc.  Returns the number
 * of rows processed; SPI_tuptable holds any rows returned.
 */
uint64
keystore_run(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes,
			 Datum *values, const char *nulls, int expect_rc)
{
	SavedUser	saved;
	int			rc;

	keystore_as_owner(&saved);
	keystore_prepare(cache, sql, nargs, argtypes);
	rc = SPI_execute_plan(*cache, values, nulls, false, 0);
	if (rc != expect_rc)
		elog(ERROR, "idempotency statement failed: %s", SPI_result_code_string(rc));
	keystore_as_caller(&saved);
	return SPI_processed;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/*
 * Probe the primary key for key id under snapshot snap.  Returns whether a
 * row is visible; fills *out (response copied into outcxt) and *xmin.
 */
static bool
probe(const KeyId *id, Snapshot snap, StoredKey *out, MemoryContext outcxt,
	  TransactionId *xmin)
{
	Relation	heap = table_open(store_relid, AccessShareLock);
	Relation	index;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	bool		found;

	/*
	 * The primary key as the relcache knows it now that the table is locked:
	 * (key, scope, owner) since 0.3.0, (owner, scope, key) before; an ALTER
	 * EXTENSION UPDATE in another session rebuilds it under our feet.
	 */
	if (!heap->rd_indexvalid)
		list_free(RelationGetIndexList(heap));
	if (!OidIsValid(heap->rd_pkindex))
		elog(ERROR, "table idempotency.idempotency_key has no primary key");
	index = index_open(heap->rd_pkindex, AccessShareLock);
	if (index->rd_index->indnkeyatts != 3)
		elog(ERROR, "the primary key of idempotency.idempotency_key is not on owner, scope and key");
	slot = table_slot_create(heap, NULL);

	for (int i = 0; i < 3; i++)
	{
		AttrNumber	att = index->rd_index->indkey.values[i];
		const char *val;
		int			len;

		/* write_attnums[0..2] are owner, scope, key */
		if (att == write_attnums[0])
		{
			ScanKeyInit(&skey[i], i + 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(id->owner));
			continue;
		}
		if (att == write_attnums[1])
		{
			val = id->scope;
			len = id->scope_len;
		}
		else if (att == write_attnums[2])
		{
			val = id->key;
			len = id->key_len;
		}
		else
			elog(ERROR, "the primary key of idempotency.idempotency_key is not on owner, scope and key");
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, C_COLLATION_OID, F_TEXTEQ,
							   PointerGetDatum(cstring_to_text_with_len(val, len)));
	}
	scan = index_beginscan(heap, index, snap, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found && out != NULL)
	{
		bool		isnull;
		Datum		d;
		char	   *status;

#define COL(c) slot_getattr(slot, lookup_attnums[c], &isnull)
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
		out->expires_at = DatumGetTimestampTz(COL(COL_EXPIRES_AT));
		d = COL(COL_LOCKED_UNTIL);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
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
	table_close(heap, NoLock);
	return found;
}

/*
 * Read the stored row of key id (expired or not) into *out; the response
 * is copied into outcxt.
 *
 * A direct probe of the primary key, with the snapshot rules of an SPI
 * statement: the command counter is advanced (so this transaction's own
 * earlier writes are seen) and the transaction snapshot is taken (fresh
 * under READ COMMITTED).  Under REPEATABLE READ and SERIALIZABLE the latest
 * committed version is compared too (see the file comment).
 *
 * No privileges are checked: like the rest of this file, the probe acts as
 * the table's owner, for the caller's own role only.
 */
void
keystore_lookup(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	TransactionId xmin = InvalidTransactionId;

	store_resolve();
	memset(out, 0, sizeof(StoredKey));
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	(void) probe(id, GetActiveSnapshot(), out, outcxt, &xmin);
	PopActiveSnapshot();

	if (IsolationUsesXactSnapshot())
	{
		TransactionId latest_xmin = InvalidTransactionId;
		bool		latest = probe(id, GetLatestSnapshot(), NULL, outcxt, &latest_xmin);

		if (latest != out->found || (latest && latest_xmin != xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent use of %s",
							describe_key(id)),
					 errdetail("Another transaction stored a result for this key after this transaction took its snapshot."),
					 errhint("Retry the transaction; it will see the stored result.")));
	}
}

/*
 * Insert a key row without the executor, the way catalog rows are inserted:
 * heap_insert(), then index_insert() into each index (a unique index raises
 * 23505 as usual; heap_insert takes care of TOAST, WAL, logical decoding,
 * serializable conflicts and statistics).  values/nulls are in $n order.
 *
 * Only when the table is as the extension made it: columns exactly ours,
 * no triggers, no CHECK constraints, only plain immediate indexes.  Anything
 * else (a DBA's trigger or expression index, say) makes this return false
 * without doing anything, and the caller runs the SQL INSERT instead.
 */
#define MAX_DIRECT_INDEXES 8

static bool
direct_insert(Datum *values, const char *nulls)
{
	Relation	rel = table_open(store_relid, RowExclusiveLock);
	TupleDesc	td = RelationGetDescr(rel);
	Relation	indexes[MAX_DIRECT_INDEXES];
	IndexInfo  *infos[MAX_DIRECT_INDEXES];
	int			nindexes = 0;
	int			ncols = 0;
	bool		plain = rel->trigdesc == NULL &&
		(td->constr == NULL || td->constr->num_check == 0);
	List	   *indexoids;
	ListCell   *lc;
	Datum	   *row;
	bool	   *rownulls;
	HeapTuple	tup;
	int			i;

	for (i = 0; i < td->natts; i++)
		if (!TupleDescAttr(td, i)->attisdropped)
			ncols++;
	plain = plain && ncols == NUM_WRITE_COLS;

	indexoids = plain ? RelationGetIndexList(rel) : NIL;
	if (list_length(indexoids) > MAX_DIRECT_INDEXES)
		plain = false;
	foreach(lc, indexoids)
	{
		Relation	index;
		IndexInfo  *info;

		if (!plain)
			break;
		index = index_open(lfirst_oid(lc), RowExclusiveLock);
		info = BuildIndexInfo(index);
		indexes[nindexes] = index;
		infos[nindexes++] = info;
		if (info->ii_Expressions != NIL || info->ii_Predicate != NIL ||
			info->ii_ExclusionOps != NULL || !index->rd_index->indimmediate)
			plain = false;
	}
	if (!plain)
	{
		for (i = 0; i < nindexes; i++)
			index_close(indexes[i], NoLock);
		table_close(rel, NoLock);
		return false;
	}

	row = palloc0(sizeof(Datum) * td->natts);
	rownulls = palloc(sizeof(bool) * td->natts);
	memset(rownulls, true, sizeof(bool) * td->natts);
	for (i = 0; i < NUM_WRITE_COLS; i++)
	{
		row[write_attnums[i] - 1] = values[i];
		rownulls[write_attnums[i] - 1] = nulls != NULL && nulls[i] == 'n';
	}
	tup = heap_form_tuple(td, row, rownulls);
	heap_insert(rel, tup, GetCurrentCommandId(true), 0, NULL);

	for (i = 0; i < nindexes; i++)
	{
		Datum		ivalues[INDEX_MAX_KEYS];
		bool		inulls[INDEX_MAX_KEYS];
		int			k;

		for (k = 0; k < infos[i]->ii_NumIndexAttrs; k++)
		{
			AttrNumber	a = infos[i]->ii_IndexAttrNumbers[k];

			ivalues[k] = row[a - 1];
			inulls[k] = rownulls[a - 1];
		}
		index_insert(indexes[i], ivalues, inulls, &tup->t_self, rel,
					 indexes[i]->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
#if PG_VERSION_NUM >= 140000
					 false,
#endif
					 infos[i]);
		index_close(indexes[i], NoLock);
	}
	table_close(rel, NoLock);
	heap_freetuple(tup);
	return true;
}

/*
 * Store the outcome of held key h: an UPDATE when a row (perhaps expired)
 * was there at begin(), else an INSERT.  An UPDATE that finds nothing
 * (the expired row was purged meanwhile) falls back to the INSERT.
 */
void
keystore_write(const HeldKey *h, const char *status, Jsonb *response,
			   bool retryable_null, bool retryable)
{
	Datum		values[12];
	char		nulls[12];
	bytea	   *hash = NULL;
	bool		connected = false;
	bool		done = false;

	memset(nulls, ' ', sizeof(nulls));
	keystore_key_values(&h->id, values);
	values[3] = CStringGetTextDatum(status);
	if (h->has_hash)
	{
		hash = palloc(VARHDRSZ + FINGERPRINT_LEN);
		SET_VARSIZE(hash, VARHDRSZ + FINGERPRINT_LEN);
		memcpy(VARDATA(hash), h->request_hash, FINGERPRINT_LEN);
		values[4] = PointerGetDatum(hash);
	}
	else
		nulls[4] = 'n';
	if (response)
		values[5] = JsonbPGetDatum(response);
	else
		nulls[5] = 'n';
	values[6] = BoolGetDatum(retryable);
	if (retryable_null)
		nulls[6] = 'n';
	values[7] = Int32GetDatum(h->attempts);
	values[8] = TimestampTzGetDatum(h->created_at);
	values[9] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[10] = TimestampTzGetDatum(h->expires_at);
	values[11] = TimestampTzGetDatum(h->locked_until);
	if (h->locked_until == 0)
		nulls[11] = 'n';

	/* SQL (and so SPI) only for an UPDATE, or an INSERT direct_insert declines */
	if (h->row_exists)
	{
		SPI_connect();
		connected = true;
		done = keystore_run(&plan_update, sql_update, 12, write_argtypes,
							values, nulls, SPI_OK_UPDATE) > 0;
	}
	if (!done && !direct_insert(values, nulls))
	{
		if (!connected)
			SPI_connect();
		connected = true;
		keystore_run(&plan_insert, sql_insert, 12, write_argtypes,
					 values, nulls, SPI_OK_INSERT);
	}
	if (connected)
		SPI_finish();
}

void
KeystoreInit(void)
{
	CacheRegisterRelcacheCallback(store_inval_callback, (Datum) 0);
}
