/*-------------------------------------------------------------------------
 *
 * versioned.c
 *	  Optimistic locking: update_versioned().
 *
 * Design: one UPDATE, run as the caller (SECURITY INVOKER), sets the
 * columns named in `changes` (cast by jsonb_populate_record() on a row of
 * NULLs, so a column the call does not name keeps its value untouched)
 * and adds 1 to the version column, for the row with the id (a parameter
 * of the id column's own type, converted exactly by target.c) whose version
 * is still expected_version; RETURNING gives the new version.  Only when it
 * changed nothing does a probe read the row: stale (IK006, with the current
 * version) or no such row (P0002).  A NULL expected_version is refused
 * (22004) only after the probe found the row: a caller that read the version
 * of a missing row learns that the row is missing.
 *
 * Locking: the UPDATE's row lock, and PostgreSQL's recheck of the WHERE
 * clause after waiting for a concurrent writer, make two updates from the
 * same version come out as exactly one new version and one IK006.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/typcache.h"

#include "idempotency.h"
#include "target.h"

static Datum
versioned_body(FunctionCallInfo fcinfo)
{
	IdemTarget	t = idem_target_arg(fcinfo, 0);
	IdemColumn	ver = idem_column(&t, idem_name_arg(fcinfo, 4, "version_column"));
	IdemColumn	idc = idem_column(&t, idem_name_arg(fcinfo, 5, "id_column"));
	Jsonb	   *changes;
	List	   *cols;
	ListCell   *lc;
	StringInfoData sig;
	IdemPlans	plans;
	Oid			argtypes[4];
	Datum		values[4];
	int			rc;
	bool		isnull;
	int64		result;

	if (ver.attnum == idc.attnum)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("version column and id column must differ, both are \"%s\"", ver.name),
				 errdetail("update_versioned() would rewrite the column that identifies the row.")));
	values[0] = idem_id_value(fcinfo, 1, &idc);
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("changes must not be null")));
	changes = PG_GETARG_JSONB_P(3);
	if (!idem_is_integer_type(ver.type))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("version column \"%s\" must be an integer column, not %s",
						ver.name, format_type_be(ver.type))));
	cols = idem_object_columns(&t, changes, "changes");
	if (cols == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("changes must name at least one column")));

	initStringInfo(&sig);
	appendStringInfo(&sig, "versioned %d %d %u", ver.attnum, idc.attnum, idc.type);
	foreach(lc, cols)
	{
		IdemColumn *c = lfirst(lc);

		if (c->attnum == ver.attnum || c->attnum == idc.attnum)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("changes may not set column \"%s\"", c->name),
					 errdetail("update_versioned() sets the version column itself, and the id column identifies the row.")));
		appendStringInfo(&sig, " %d", c->attnum);
	}

	argtypes[0] = idc.type;
	argtypes[1] = INT8OID;
	argtypes[2] = JSONBOID;
	values[3] = idem_null_row(&t, &argtypes[3]);
	SPI_connect();
	if (!idem_plans_fetch(t.relid, sig.data, &plans))
	{
		StringInfoData targets,
					sources;
		char	   *where = psprintf("t.%s %s $1", idc.quoted,
									 idem_operator_sql(idc.type, TYPECACHE_EQ_OPR));

		initStringInfo(&targets);
		initStringInfo(&sources);
		foreach(lc, cols)
		{
			IdemColumn *c = lfirst(lc);

			appendStringInfo(&targets, "%s, ", c->quoted);
			appendStringInfo(&sources, "r.%s, ", c->quoted);
		}
		plans.work = idem_target_prepare(psprintf("UPDATE %s AS t SET (%s%s) = (SELECT %st.%s OPERATOR(pg_catalog.+) 1"
												  "  FROM %s)"
												  " WHERE %s AND t.%s OPERATOR(pg_catalog.=) $2"
												  " RETURNING t.%s",
												  t.qualname, targets.data, ver.quoted, sources.data,
												  ver.quoted, idem_record_sql("$4", "$3"),
												  where, ver.quoted, ver.quoted),
										 4, argtypes);
		plans.probe = idem_target_prepare(psprintf("SELECT t.%s FROM %s AS t WHERE %s",
												   ver.quoted, t.qualname, where),
										  1, argtypes);
		idem_plans_store(t.relid, sig.data, &plans);
	}

	/*
	 * A NULL version is what a caller gets by reading the version of a row
	 * that does not exist: the missing row (P0002) is the error it needs
	 * first, so the probe runs before the NULL is refused.
	 */
	if (PG_ARGISNULL(2))
	{
		idem_probe_row(plans.probe, values, fcinfo, &t, &idc, "versioned");
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("expected_version must not be null")));
	}
	values[1] = Int64GetDatum(PG_GETARG_INT64(2));
	values[2] = JsonbPGetDatum(changes);
	rc = SPI_execute_plan(plans.work, values, NULL, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "versioned update failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		result = idem_integer_datum(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
												  1, &isnull), ver.type);
		SPI_finish();
		PG_RETURN_INT64(result);
	}

	idem_probe_row(plans.probe, values, fcinfo, &t, &idc, "versioned");
	/* the expected version there, and no row changed: hidden from UPDATE */
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull && idem_integer_datum(d, ver.type) == PG_GETARG_INT64(2))
			idem_update_hidden(fcinfo, &t, &idc, "update_versioned()");
	}
	{
		char	   *current = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		ereport(ERROR,
				(errcode(ERRCODE_STALE_VERSION),
				 errmsg("stale version of row %s = %s in table \"%s\": expected %lld, current %s",
						idc.name, idem_id_text(fcinfo, 1), t.relname,
						(long long) PG_GETARG_INT64(2), current ? current : "NULL"),
				 errdetail("Another write changed the row since version %lld; its %s is now %s.",
						   (long long) PG_GETARG_INT64(2), ver.name, current ? current : "NULL"),
				 errhint("Read the row again and retry with its current version (HTTP 409).")));
	}
	PG_RETURN_NULL();			/* not reached */
}

/* update_versioned(target, id, expected_version, changes, version_column, id_column) -> new version */
PG_FUNCTION_INFO_V1(idempotency_update_versioned);

Datum
idempotency_update_versioned(PG_FUNCTION_ARGS)
{
	return idem_helper_call(versioned_body, fcinfo);
}
