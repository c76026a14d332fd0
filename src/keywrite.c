/*-------------------------------------------------------------------------
 *
 * keywrite.c
 *	  Writing a key's row of idempotency.idempotency_key (stores floor): the
 *	  outcome of a held key, a checkpoint's recovery point, a Citus claim.
 *
 * Design: a new row goes through the executor on the fast path
 * (keyfast.c), else a prepared INSERT; an update (a retry, the end of a
 * lease, a checkpoint) is always a prepared UPDATE; on Citus every write
 * is one of keycitus.c's statements (an upsert, a claim, a checkpoint by
 * the owner's name).  Every statement is schema-qualified, every operator
 * OPERATOR(pg_catalog.=), every value a parameter; it runs as the
 * extension's owner (runas.c) for the caller's own role only (on Citus as
 * the caller).  Every write refuses a read-only transaction and a hot
 * standby (25006).  Errors raised underneath name the key and the table
 * (an error context).
 *
 * Locking: writers hold the key lock (keylock.c), so no other
 * begin()/complete()/fail() writes the same key concurrently; on Citus the
 * row lock on the shard (a claim or idem_keystore_lock()).  RowExclusiveLock
 * on the table for an insert.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/rel.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_insert_seed = NULL;
static SPIPlanPtr plan_update = NULL;
static SPIPlanPtr plan_update_rp = NULL;
static SPIPlanPtr plan_update_seed = NULL;
static SPIPlanPtr plan_checkpoint = NULL;
static SPIPlanPtr plan_update_freeze = NULL;
static SPIPlanPtr plan_checkpoint_freeze = NULL;

static const char *const sql_insert =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/* since 0.6.0: with the new row's derive_seed (no DEFAULT: see keytable.c) */
static const char *const sql_insert_seed =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until, derive_seed)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

#define UPDATE_BASE \
"UPDATE idempotency.idempotency_key AS k" \
"   SET status = $4, request_hash = $5, response = $6, retryable = $7," \
"       attempts = $8, created_at = $9, updated_at = $10, expires_at = $11," \
"       locked_until = $12"

/* a retry or the end of the work: the recovery point stays */
static const char *const sql_update = UPDATE_BASE KEY_WHERE;

/*
 * Since 0.6.0 a write in the same life also freezes the seed of a row that
 * has none (restored from a dump of 0.5.0, which derives from its role's
 * name now): version 0, the row's created_at, the tag of the secret it
 * derives with (the oldest restored from 0.5.0) and the role's name, as the
 * update freezes the rows it finds, so that a rename from then on changes
 * nothing.  Evaluated only for such a row (COALESCE).
 */
#define FREEZE_SEED \
", derive_seed = COALESCE(k.derive_seed," \
"    pg_catalog.decode('00', 'hex')" \
"    OPERATOR(pg_catalog.||) pg_catalog.timestamptz_send(k.created_at)" \
"    OPERATOR(pg_catalog.||) (SELECT pg_catalog.substr(pg_catalog.sha256(s.secret), 1, 8)" \
"                               FROM idempotency.derive_secret AS s WHERE s.restored_050" \
"                              ORDER BY s.created_at, s.secret LIMIT 1)" \
"    OPERATOR(pg_catalog.||) pg_catalog.convert_to(" \
"        (SELECT r.rolname::pg_catalog.text FROM pg_catalog.pg_roles AS r" \
"          WHERE r.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid)," \
"        pg_catalog.getdatabaseencoding()))"
static const char *const sql_update_freeze = UPDATE_BASE FREEZE_SEED KEY_WHERE;

/* new work over an expired row: its recovery point goes too */
static const char *const sql_update_rp =
UPDATE_BASE ", recovery_point = NULL, recovery_state = NULL" KEY_WHERE;

/*
 * since 0.6.0, new work over an expired row: a new seed too (a row restored
 * from a dump of 0.5.0 has none, and 0.5.0's derivation would give the new
 * life the old life's downstream keys)
 */
static const char *const sql_update_seed =
UPDATE_BASE ", recovery_point = NULL, recovery_state = NULL, derive_seed = $13" KEY_WHERE;

/* checkpoint(): the recovery point of a held lease */
static const char *const sql_checkpoint =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6" KEY_WHERE;
static const char *const sql_checkpoint_freeze =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6" FREEZE_SEED KEY_WHERE;

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */
/* the row of held key h, in $n order */
static void
row_values(const HeldKey *h, const char *status, Jsonb *response,
		   bool retryable_null, bool retryable, Datum *values, char *nulls)
{
	bytea	   *hash;

	memset(nulls, ' ', NUM_COLS);
	idem_store_key_values(&h->id, values);
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

	/*
	 * $13: the seed of a new row or a new life, where the table has one (an
	 * UPDATE that finds no row falls back to the INSERT)
	 */
	idem_store_resolve();
	if (idem_store.seed)
		values[SEED_ARG] = PointerGetDatum(idem_store_new_seed());
	else
		nulls[SEED_ARG] = 'n';
}

/*
 * Store the outcome of held key h: an UPDATE when a row (perhaps expired)
 * was there at begin(), else an INSERT.  An UPDATE that finds nothing
 * (the expired row was purged meanwhile) falls back to the INSERT.
 */
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

	idem_store_check_writable(&h->id);
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, status, response, retryable_null, retryable, values, nulls);

	idem_store_resolve();
	if (idem_store.citus)
	{
		ShardPlans *sp = idem_store_shard(&h->id);

		/* the row this transaction claimed or locked, or a new one */
		SPI_connect();
		connected = true;
		done = idem_store_citus_run(sp, h->reset_point && idem_store.recovery ?
									SS_UPSERT_RP : SS_UPSERT, NUM_SEED_ARGS,
									idem_store_write_types, values, nulls,
									SPI_OK_INSERT) > 0;
	}
	else if (h->row_exists)
	{
		SPI_connect();
		connected = true;
		if (h->reset_point && idem_store.seed)
			done = idem_run_as_owner(&plan_update_seed, sql_update_seed, NUM_SEED_ARGS,
									 idem_store_write_types, values, nulls, SPI_OK_UPDATE) > 0;
		else if (h->reset_point && idem_store.recovery)
			done = idem_run_as_owner(&plan_update_rp, sql_update_rp, NUM_BASE_COLS,
									 idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0;
		else
			done = idem_store.seed ?
				idem_run_as_owner(&plan_update_freeze, sql_update_freeze, NUM_BASE_COLS,
								  idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0 :
				idem_run_as_owner(&plan_update, sql_update, NUM_BASE_COLS,
								  idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0;
	}
	if (!done)
	{
		Relation	rel = idem_store_open(RowExclusiveLock);

		if (idem_store.fast)
		{
			SavedUser	saved;

			/*
			 * as the SQL path would: a DBA's CHECK or index functions run as
			 * the owner
			 */
			idem_as_owner(&saved);
			idem_store_insert(rel, values, nulls);
			idem_as_caller(&saved);
		}
		table_close(rel, NoLock);
		if (!idem_store.fast)
		{
			if (!connected)
				SPI_connect();
			connected = true;
			if ((idem_store.seed ?
				 idem_run_as_owner(&plan_insert_seed, sql_insert_seed, NUM_SEED_ARGS,
								   idem_store_write_types, values, nulls, SPI_OK_INSERT) :
				 idem_run_as_owner(&plan_insert, sql_insert, NUM_BASE_COLS,
								   idem_store_col_types, values, nulls,
								   SPI_OK_INSERT)) != 1)
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
 * checkpoint(): set the recovery point and state of key id, whose lease
 * the caller holds (the key lock too: guard.c's lease holder check; on
 * Citus the row lock on the shard).  In the caller's transaction, as the extension's
 * owner (on Citus as the caller, like every Citus statement).  Returns the
 * rows updated (1, or 0 if the row is gone, which the locks rule out).
 */
uint64
idem_keystore_checkpoint(const KeyId *id, text *point, Jsonb *state)
{
	Oid			argtypes[6] = {
		REGROLEOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID
	};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	uint64		n;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "storing the recovery point of"};

	idem_store_check_writable(id);
	if (!idem_keystore_has_recovery())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key has no recovery point columns"),
				 errdetail("The library is version 0.5.0 or later; the extension's SQL objects are older."),
				 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	idem_store_key_values(id, values);
	values[3] = PointerGetDatum(point);
	if (state)
		values[4] = JsonbPGetDatum(state);
	else
		nulls[4] = 'n';
	values[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	idem_store_resolve();
	sp = idem_store.citus ? idem_store_shard(id) : NULL;
	SPI_connect();
	if (idem_store.citus)
	{
		/* the owner by name (idempotency.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		values[0] = idem_owner_ref(id->owner);
		n = idem_store_citus_run(sp, SS_CHECKPOINT, 6, argtypes, values, nulls,
								 SPI_OK_UPDATE);
	}
	else
		n = idem_store.seed ?
			idem_run_as_owner(&plan_checkpoint_freeze, sql_checkpoint_freeze, 6, argtypes,
							  values, nulls, SPI_OK_UPDATE) :
			idem_run_as_owner(&plan_checkpoint, sql_checkpoint, 6, argtypes,
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

	idem_store_check_writable(&h->id);
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, "in_progress", NULL, true, false, values, nulls);
	idem_store_resolve();
	sp = idem_store_shard(&h->id);
	SPI_connect();
	inserted = idem_store_citus_run(sp, SS_CLAIM, NUM_SEED_ARGS,
									idem_store_write_types, values, nulls,
									SPI_OK_INSERT) > 0;
	SPI_finish();
	error_context_stack = errcb.previous;
	return inserted;
}

/*
 * Citus: forget() (ops.c): delete key id's row, which the caller has locked
 * (idem_keystore_lock()), on its shard (on this node: the call was carried
 * here, keyroute.c), as the extension's owner.  Returns true when a row was
 * deleted.
 */
bool
idem_keystore_delete_citus(const KeyId *id)
{
	Oid			argtypes[3] = {REGROLEOID, TEXTOID, TEXTOID};
	Datum		values[3];
	bool		deleted;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "forgetting"};

	idem_store_check_writable(id);
	errcb.callback = idem_store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	idem_store_key_values(id, values);
	/* the owner by name (idempotency.h: IDEM_OWNER_EQ_CITUS) */
	values[0] = idem_owner_ref(id->owner);
	idem_store_resolve();
	sp = idem_store_shard(id);
	SPI_connect();
	deleted = idem_store_citus_run(sp, SS_DELETE, 3, argtypes, values, NULL,
								   SPI_OK_DELETE) > 0;
	SPI_finish();
	error_context_stack = errcb.previous;
	return deleted;
}
