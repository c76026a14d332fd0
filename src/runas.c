/*-------------------------------------------------------------------------
 *
 * runas.c
 *	  Ground floor: prepared SQL, run as the extension's owner or as the
 *	  caller.
 *
 * The tables belong to the extension's owner (pg_extension.extowner,
 * never the owner of schema idempotency, which another role could have
 * created first).  Plain roles only SELECT their own rows; the SECURITY
 * INVOKER functions switch to the owner for each statement, as core's
 * foreign-key checks do (SECURITY_LOCAL_USERID_CHANGE |
 * SECURITY_RESTRICTED_OPERATION), with the caller's role as a parameter
 * taken before the switch; an error is cleaned up by (sub)transaction
 * abort, which restores the user id.  The owner is read once and cached
 * until the key table's relcache invalidation (an extension's owner never
 * changes; DROP EXTENSION drops the table).  Statements are prepared once
 * per backend (generic plan, SPI_keepplan) into a caller-owned SPIPlanPtr,
 * every name schema-qualified and every value a parameter;
 * idem_run_as_owner_once() plans afresh, for Citus statements that have no
 * generic plan.  idem_insert_as_owner() inserts a row as the owner through
 * the executor's simple-relation insert, for a table of the shipped shape
 * (publish()'s fast path).  On Citus the reads through Citus's route run as the
 * caller (idem_run_as): see src/README.md, "Citus in detail".
 *
 * Callers are inside SPI_connect().  No locks of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static Oid	ext_owner = InvalidOid; /* pg_extension.extowner */
static Oid	ext_owner_relid = InvalidOid;	/* idempotency.idempotency_key */

static void
owner_syscache_callback(Datum arg pg_attribute_unused(), int cacheid pg_attribute_unused(),
						uint32 hashvalue pg_attribute_unused())
{
	ext_owner = InvalidOid;
}

static void
runas_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == ext_owner_relid)
		ext_owner = InvalidOid;
}

/* the owner of the extension's objects (cached: see the file comment) */
static Oid
extension_owner(void)
{
	Oid			extoid;
	Oid			nsp;
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	Oid			owner;

	if (OidIsValid(ext_owner))
		return ext_owner;
	idem_relcache_watch();
	extoid = get_extension_oid("idempotency", true);
	if (!OidIsValid(extoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension idempotency is not installed in this database"),
				 errhint("Run CREATE EXTENSION idempotency in this database.")));
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "could not find tuple for extension %u", extoid);
	owner = ((Form_pg_extension) GETSTRUCT(tup))->extowner;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	nsp = get_namespace_oid("idempotency", true);
	ext_owner_relid = OidIsValid(nsp) ? get_relname_relid("idempotency_key", nsp) : InvalidOid;
	ext_owner = owner;
	return ext_owner;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/* Prepare sql once per backend into *cache (kept, generic plan). */
static void
plan_prepare(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes)
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
 * Switch to the owner of the extension's objects for the statements that
 * follow (see the file comment); idem_as_caller() switches back.
 */
void
idem_as_owner(SavedUser *saved)
{
	Oid			owner = extension_owner();

	GetUserIdAndSecContext(&saved->userid, &saved->sec_context);
	SetUserIdAndSecContext(owner,
						   saved->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
}

void
idem_as_caller(const SavedUser *saved)
{
	SetUserIdAndSecContext(saved->userid, saved->sec_context);
}

/*
 * Run sql (prepared once into *cache) as the extension's owner with the
 * given parameters; raise if SPI does not answer expect_rc.  Returns the
 * number of rows processed; SPI_tuptable holds any rows returned.  snap,
 * when valid, is the snapshot to read with (SPI_execute_snapshot).
 */
uint64
idem_run_as_owner_snap(SPIPlanPtr *cache, const char *sql, int nargs,
					   Oid *argtypes, Datum *values, const char *nulls,
					   int expect_rc, Snapshot snap)
{
	SavedUser	saved;
	int			rc;

	idem_as_owner(&saved);
	plan_prepare(cache, sql, nargs, argtypes);
	if (snap != InvalidSnapshot)
		rc = SPI_execute_snapshot(*cache, values, nulls, snap, InvalidSnapshot,
								  false, false, 0);
	else
		rc = SPI_execute_plan(*cache, values, nulls, false, 0);
	if (rc != expect_rc)
		elog(ERROR, "idempotency statement failed: %s", SPI_result_code_string(rc));
	idem_as_caller(&saved);
	return SPI_processed;
}

uint64
idem_run_as_owner(SPIPlanPtr *cache, const char *sql, int nargs, Oid *argtypes,
				  Datum *values, const char *nulls, int expect_rc)
{
	return idem_run_as_owner_snap(cache, sql, nargs, argtypes, values, nulls,
								  expect_rc, InvalidSnapshot);
}

/*
 * idem_run_as_owner(), or with as_owner false the same statement as the
 * caller: on Citus, a statement through Citus's route (a transaction's
 * statements on a group of co-located shards go through one connection,
 * which is per role, and the caller's own work uses it too).  Only reads:
 * the caller may SELECT its own rows; the writes run on the row's shard
 * as the owner (keystore.c).
 */
uint64
idem_run_as(bool as_owner, SPIPlanPtr *cache, const char *sql, int nargs,
			Oid *argtypes, Datum *values, const char *nulls, int expect_rc)
{
	int			rc;

	if (as_owner)
		return idem_run_as_owner(cache, sql, nargs, argtypes, values, nulls,
								 expect_rc);
	plan_prepare(cache, sql, nargs, argtypes);
	rc = SPI_execute_plan(*cache, values, nulls, false, 0);
	if (rc != expect_rc)
		elog(ERROR, "idempotency statement failed: %s", SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * roleref_out(roleref) -> cstring: the role's name, as regrole prints it,
 * and "-" (nobody) for an oid that names no role.  regrole prints a
 * dropped role's oid as a bare number, which regrolein (and so roleref_in)
 * reads back on another node or cluster as whatever role has that oid
 * there: a shard move or a restore would hand a dropped role's keys to an
 * unrelated role.  "-" reads back as InvalidOid, whose rows no
 * role owns (the purge removes them once expired).
 */
PG_FUNCTION_INFO_V1(idempotency_roleref_out);

Datum
idempotency_roleref_out(PG_FUNCTION_ARGS)
{
	Oid			role = PG_GETARG_OID(0);

	if (!OidIsValid(role) || !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
		PG_RETURN_CSTRING(pstrdup("-"));
	return DirectFunctionCall1(regroleout, ObjectIdGetDatum(role));
}

/*
 * The same for a statement planned afresh with its parameter values (no
 * kept plan): for Citus, which cannot plan a generic plan of a statement
 * it must split into steps (lifecycle.c's purge of a distributed table).
 */
uint64
idem_run_as_owner_once(const char *sql, int nargs, Oid *argtypes,
					   Datum *values, const char *nulls, int expect_rc)
{
	SavedUser	saved;
	int			rc;

	idem_as_owner(&saved);
	rc = SPI_execute_with_args(sql, nargs, argtypes, values, nulls, false, 0);
	if (rc != expect_rc)
		elog(ERROR, "idempotency statement failed: %s", SPI_result_code_string(rc));
	idem_as_caller(&saved);
	return SPI_processed;
}

void
idem_runas_init(void)
{
	CacheRegisterSyscacheCallback(NAMESPACEOID, owner_syscache_callback, (Datum) 0);
	idem_relcache_add(runas_relcache);
}

/*
 * Insert one row (values/nulls in rel's column order) into rel as the
 * extension's owner, through the executor's simple-relation insert, as
 * logical replication's apply does: NOT NULL and CHECK constraints, every
 * index that is ready for inserts; index expressions and predicates run as
 * the owner, as the INSERT run as the owner ran them.  The caller holds rel
 * open and locked (RowExclusiveLock), and checked that it has no triggers,
 * rules or forced row security.
 */
void
idem_insert_as_owner(Relation rel, const Datum *values, const bool *nulls)
{
	EState	   *estate = CreateExecutorState();
	int			natts = RelationGetDescr(rel)->natts;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	SavedUser	saved;

	idem_as_owner(&saved);
	rri = IDEM_NEW_RESULT_REL(estate, rel);
	estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(rri, false);
	slot = ExecInitExtraTupleSlot(estate, RelationGetDescr(rel), &TTSOpsVirtual);
	ExecClearTuple(slot);
	memcpy(slot->tts_values, values, sizeof(Datum) * natts);
	memcpy(slot->tts_isnull, nulls, sizeof(bool) * natts);
	ExecStoreVirtualTuple(slot);
	IDEM_SIMPLE_INSERT(rri, estate, slot);
	idem_free_result_rel(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
	idem_as_caller(&saved);
}
