/*-------------------------------------------------------------------------
 *
 * keyread.c
 *	  Reading a key's row of idempotency.idempotency_key (stores floor):
 *	  lookup, peek, lock, and the seed derive_key() needs.
 *
 * Design: the fast path probes the primary key (keyfast.c); otherwise a
 * prepared SELECT (the SQL path, here) casts every column to the type the
 * guard reads, or on Citus the same through keycitus.c.  Every statement is
 * schema-qualified, every operator OPERATOR(pg_catalog.=), every value a
 * parameter; it runs as the extension's owner (runas.c) for the caller's
 * own role only (on Citus as the caller).  Errors raised underneath name
 * the key and the table (an error context).
 *
 * Isolation: under READ COMMITTED every lookup sees the latest committed
 * state.  Under REPEATABLE READ and SERIALIZABLE the row may have changed
 * after the transaction's snapshot; the lookup then compares with the
 * latest committed version and raises a serialization failure (40001), so
 * the client retries and gets the stored answer.  On Citus the row lives on
 * the shard's node, where idem_keystore_lock()'s locking read raises it.
 *
 * Locking: AccessShareLock on the table.  begin()'s first lookup runs
 * without the key lock: it only acts on a live finished key, which changes
 * only by expiring.  On Citus idem_keystore_lock() locks the row (SELECT
 * ... FOR UPDATE).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_select = NULL;
static SPIPlanPtr plan_select_rp = NULL;

static const char *const sql_select = SELECT_BASE FROM_KEYS KEY_WHERE;
static const char *const sql_select_rp = SELECT_BASE SELECT_RP FROM_KEYS KEY_WHERE;

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

	idem_store_key_values(id, values);
	if (idem_store.citus)
	{
		/* the owner by name (idempotency.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		values[0] = idem_owner_ref(id->owner);
		sp = idem_store_shard(id);
	}
	SPI_connect();
	if (idem_store.citus || lock)
	{
		CitusStmt	k = lock ? (idem_store.recovery ? SS_LOCK_RP : SS_LOCK) :
			(idem_store.recovery ? SS_SELECT_RP : SS_SELECT);

		n = idem_store_citus_run(sp, k, 3, argtypes, values, NULL, SPI_OK_SELECT);
	}
	else if (idem_store.recovery)
		n = idem_run_as_owner_snap(&plan_select_rp, sql_select_rp, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	else
		n = idem_run_as_owner_snap(&plan_select, sql_select, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	if (n > 1)
		idem_store_bad_table(psprintf("It holds " UINT64_FORMAT " rows for one key: its primary key on (key, scope, owner) is missing.", n));
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
			idem_store_bad_table("A row has a null status.");
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
			idem_store_bad_table("A row has a null expires_at.");
		out->expires_at = DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 8, &isnull);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (idem_store.recovery)
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
 * No privileges are checked: like every statement of the key store, the
 * lookup acts
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

	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	heap = idem_store_open(AccessShareLock);
	memset(out, 0, sizeof(StoredKey));
	if (idem_store.fast)
	{
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		UpdateActiveSnapshotCommandId();
		(void) idem_store_probe(heap, id, GetActiveSnapshot(), out, outcxt, &xmin);
		PopActiveSnapshot();
	}
	else
		(void) sql_probe(id, InvalidSnapshot, out, outcxt, &xmin, lock);

	/*
	 * On Citus the row lives on the shard's node, where a locking read raises
	 * the serialization failure itself; a local snapshot says nothing about
	 * it.
	 */
	if (check_latest && IsolationUsesXactSnapshot() && !idem_store.citus)
	{
		TransactionId latest_xmin = InvalidTransactionId;
		bool		latest;

		if (idem_store.fast)
			latest = idem_store_probe(heap, id, GetLatestSnapshot(), NULL, outcxt, &latest_xmin);
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
 * derive_key(): the seed and creation time of key id's live row (the
 * caller's own: run as the extension's owner for that owner only; on Citus
 * through Citus's route, by the owner's name).  Returns false when no live
 * row is visible: never stored (a single-transaction key before its
 * complete()), rolled back, expired, or another role's.  The seed is
 * copied into the caller's memory context; *seed is NULL for a row with
 * none (restored from a dump of 0.5.0), and for every row of a table from
 * before 0.6.0 (during the update; *created_at is 0 then): recovery.c
 * derives those as 0.5.0 did.
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

	idem_store_resolve();
	*seed = NULL;
	*created_at = 0;
	if (!idem_store.seed)
		return true;			/* a 0.5.0 table: any key, as 0.5.0 did */
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	idem_store_key_values(id, values);
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	SPI_connect();
	if (idem_store.citus)
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
		}
		*created_at = DatumGetTimestampTz(SPI_getbinval(tup, td, 2, &isnull));
		found = true;
	}
	SPI_finish();
	error_context_stack = errcb.previous;
	return found;
}
