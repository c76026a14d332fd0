/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  Reading and writing rows of idempotency.idempotency_key.
 *
 * Design: three statements, each prepared once per backend with SPI and
 * kept (generic plans, parameters for every value).  Every name in them is
 * schema-qualified and every operator is OPERATOR(pg_catalog.=), so no
 * search_path can redirect them.  Callers are inside SPI_connect().
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
 * Locking: the caller holds the key lock (keylock.c), so no other
 * begin()/complete()/fail() works on the same key concurrently.
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

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
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

static SPIPlanPtr plan_lookup = NULL;
static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_update = NULL;

#define KEY_WHERE \
	" WHERE k.owner OPERATOR(pg_catalog.=) $1" \
	"   AND k.scope OPERATOR(pg_catalog.=) $2" \
	"   AND k.key OPERATOR(pg_catalog.=) $3"

static const char *const sql_lookup =
"SELECT k.status, k.request_hash, k.response, k.retryable, k.attempts,"
"       k.created_at, k.expires_at, k.xmin, k.locked_until"
"  FROM idempotency.idempotency_key AS k" KEY_WHERE;

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

static Oid	key_argtypes[3] = {REGROLEOID, TEXTOID, TEXTOID};
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
 * Read the stored row of key id (expired or not) into *out; the response
 * is copied into outcxt so it survives SPI_finish().
 */
void
keystore_lookup(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	Datum		values[3];
	SavedUser	saved;
	TransactionId xmin = InvalidTransactionId;
	int			rc;

	memset(out, 0, sizeof(StoredKey));
	keystore_key_values(id, values);

	keystore_as_owner(&saved);
	keystore_prepare(&plan_lookup, sql_lookup, 3, key_argtypes);
	rc = SPI_execute_plan(plan_lookup, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "idempotency key lookup failed: %s", SPI_result_code_string(rc));

	if (SPI_processed > 0)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d;
		char	   *status;

		out->found = true;
		status = TextDatumGetCString(SPI_getbinval(tup, td, 1, &isnull));
		out->status = status[0];	/* i(n_progress), c(ompleted), f(ailed) */
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
		out->attempts = DatumGetInt32(SPI_getbinval(tup, td, 5, &isnull));
		out->created_at = DatumGetTimestampTz(SPI_getbinval(tup, td, 6, &isnull));
		out->expires_at = DatumGetTimestampTz(SPI_getbinval(tup, td, 7, &isnull));
		xmin = DatumGetTransactionId(SPI_getbinval(tup, td, 8, &isnull));
		d = SPI_getbinval(tup, td, 9, &isnull);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
	}

	if (IsolationUsesXactSnapshot())
	{
		bool		same;

		rc = SPI_execute_snapshot(plan_lookup, values, NULL, GetLatestSnapshot(),
								  InvalidSnapshot, true, false, 1);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "idempotency key lookup failed: %s", SPI_result_code_string(rc));
		if (SPI_processed == 0)
			same = !out->found;
		else
		{
			bool		isnull;

			same = out->found &&
				DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 8,
													&isnull)) == xmin;
		}
		if (!same)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent use of %s",
							describe_key(id)),
					 errdetail("Another transaction stored a result for this key after this transaction took its snapshot."),
					 errhint("Retry the transaction; it will see the stored result.")));
	}
	keystore_as_caller(&saved);
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
	SavedUser	saved;
	bytea	   *hash = NULL;
	int			rc;

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

	keystore_as_owner(&saved);
	if (h->row_exists)
	{
		keystore_prepare(&plan_update, sql_update, 12, write_argtypes);
		rc = SPI_execute_plan(plan_update, values, nulls, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "idempotency key update failed: %s", SPI_result_code_string(rc));
	}
	if (!h->row_exists || SPI_processed == 0)
	{
		keystore_prepare(&plan_insert, sql_insert, 12, write_argtypes);
		rc = SPI_execute_plan(plan_insert, values, nulls, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "idempotency key insert failed: %s", SPI_result_code_string(rc));
	}
	keystore_as_caller(&saved);
}

void
KeystoreInit(void)
{
	CacheRegisterRelcacheCallback(store_inval_callback, (Datum) 0);
}
