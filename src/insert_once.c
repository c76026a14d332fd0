/*-------------------------------------------------------------------------
 *
 * insert_once.c
 *	  The dedup insert: insert_once().
 *
 * Design: one INSERT ... ON CONFLICT (key columns) DO NOTHING RETURNING the
 * new row, run as the caller (SECURITY INVOKER), inserts exactly the
 * columns named in `row` (cast by jsonb_populate_record() on a row of
 * NULLs; the others get their defaults, and are not checked against their
 * domains before that).  When it inserted nothing, a probe reads the row that holds
 * the key: its key columns equal the values of `row`, or, for a key column
 * that `row` leaves out, the column's default expression (deparsed into the
 * probe, so the probe looks for the value the INSERT used).  The deparsed
 * default names functions and operators as the current search_path sees
 * them (qualified only where they would otherwise resolve elsewhere), so
 * such a pair of plans is kept per search_path and role, as once() keeps
 * its plans; another search_path gets its own spelling.
 *
 * When the probe finds nothing:
 *	  - a BEFORE INSERT row trigger on the table skipped the row or changed
 *		its key: 09000 at once (running the trigger again could repeat its
 *		side effects);
 *	  - a left-out key column has a volatile or generated default, whose
 *		value the probe cannot know: 23505 at once;
 *	  - row security (enabled for the caller) hides the conflicting row
 *		from the probe: 42501 once a second insert conflicted too;
 *	  - otherwise the conflicting row was deleted between the two
 *		statements: insert again, three times at most, then 40001.
 * A client that retries on 40001 therefore never retries forever.
 *
 * Locking: ON CONFLICT waits for a concurrent inserter of the same key;
 * exactly one call inserts, the others return its row (or insert, if it
 * rolled back).  Under REPEATABLE READ a conflict with a row the snapshot
 * cannot see is PostgreSQL's 40001.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "catalog/namespace.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/rls.h"
#include "utils/ruleutils.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"
#include "target.h"

/* the primary key columns of t, in index order */
static List *
primary_key_columns(const IdemTarget *t)
{
	Relation	rel = relation_open(t->relid, AccessShareLock);
	Oid			pk = IDEM_PRIMARY_KEY_INDEX(rel);
	List	   *cols = NIL;
	HeapTuple	tup;
	Form_pg_index idx;
	int			i;

	relation_close(rel, AccessShareLock);
	if (!OidIsValid(pk))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_COLUMN_REFERENCE),
				 errmsg("table \"%s\" has no primary key", t->relname),
				 errhint("Pass conflict_columns naming the columns of a unique index.")));
	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(pk));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for index %u", pk);
	idx = (Form_pg_index) GETSTRUCT(tup);
	for (i = 0; i < idx->indnkeyatts; i++)
	{
		IdemColumn *c = palloc(sizeof(IdemColumn));

		*c = idem_column(t, get_attname(t->relid, idx->indkey.values[i], false));
		cols = lappend(cols, c);
	}
	ReleaseSysCache(tup);
	return cols;
}

/* the conflict_columns argument, or the primary key when it is NULL */
static List *
key_columns(FunctionCallInfo fcinfo, const IdemTarget *t)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *elnulls;
	int			n;
	List	   *keys = NIL;

	if (PG_ARGISNULL(2))
		return primary_key_columns(t);
	arr = PG_GETARG_ARRAYTYPE_P(2);
	deconstruct_array(arr, NAMEOID, NAMEDATALEN, false, TYPALIGN_CHAR,
					  &elems, &elnulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("conflict_columns must not be empty")));
	for (int i = 0; i < n; i++)
	{
		IdemColumn *c = palloc(sizeof(IdemColumn));

		if (elnulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("conflict_columns must not contain NULL")));
		*c = idem_column(t, pstrdup(NameStr(*DatumGetName(elems[i]))));
		keys = lappend(keys, c);
	}
	return keys;
}

static bool
named_in(List *cols, const IdemColumn *c)
{
	ListCell   *lc;

	foreach(lc, cols)
	{
		if (((IdemColumn *) lfirst(lc))->attnum == c->attnum)
			return true;
	}
	return false;
}

/*
 * The value the INSERT gives key column c that row leaves out, as SQL (its
 * default expression, or NULL); NULL (no SQL) when the probe cannot know it
 * (volatile or generated).
 */
static char *
default_sql(Relation rel, const IdemColumn *c)
{
	Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel), c->attnum - 1);
	Node	   *expr;

	if (att->attgenerated)
		return NULL;
	expr = build_column_default(rel, c->attnum);
	if (expr == NULL)
		return psprintf("NULL::%s", idem_type_sql(c->type, -1));
	if (contain_volatile_functions(expr))
		return NULL;
	return psprintf("(%s)", deparse_expression(expr, NIL, false, false));
}

static Datum
insert_once_body(FunctionCallInfo fcinfo)
{
	IdemTarget	t = idem_target_arg(fcinfo, 0);
	Jsonb	   *row;
	List	   *cols;
	List	   *keys;
	ListCell   *lc;
	StringInfoData sig;
	IdemPlans	plans;
	Oid			argtypes[2];
	Datum		values[2];
	TupleDesc	tupdesc;
	Datum		result[2];
	bool		nulls[2] = {false, false};
	MemoryContext caller_cxt = CurrentMemoryContext;
	const char *unknowable = NULL;	/* a left-out key the probe cannot know */
	int			tries;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("row must not be null")));
	row = PG_GETARG_JSONB_P(1);
	cols = idem_object_columns(&t, row, "row");
	if (cols == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("row must name at least one column")));
	keys = key_columns(fcinfo, &t);

	initStringInfo(&sig);
	appendStringInfoString(&sig, "insert_once");
	foreach(lc, cols)
		appendStringInfo(&sig, " %d", ((IdemColumn *) lfirst(lc))->attnum);
	appendStringInfoString(&sig, " on");
	foreach(lc, keys)
		appendStringInfo(&sig, " %d", ((IdemColumn *) lfirst(lc))->attnum);
	/* a default in the probe is spelled for this search_path and role */
	foreach(lc, keys)
	{
		if (!named_in(cols, lfirst(lc)))
		{
			appendStringInfo(&sig, " as %u %s", GetUserId(), namespace_search_path);
			break;
		}
	}

	argtypes[0] = JSONBOID;
	values[1] = idem_null_row(&t, &argtypes[1]);
	SPI_connect();
	if (!idem_plans_fetch(t.relid, sig.data, &plans))
	{
		StringInfoData targets,
					sources,
					conflict,
					match;
		Relation	rel = relation_open(t.relid, NoLock);

		initStringInfo(&targets);
		initStringInfo(&sources);
		initStringInfo(&conflict);
		initStringInfo(&match);
		foreach(lc, cols)
		{
			IdemColumn *c = lfirst(lc);

			appendStringInfo(&targets, "%s%s", targets.len ? ", " : "", c->quoted);
			appendStringInfo(&sources, "%sr.%s", sources.len ? ", " : "", c->quoted);
		}
		foreach(lc, keys)
		{
			IdemColumn *c = lfirst(lc);
			char	   *value = named_in(cols, c) ? psprintf("r.%s", c->quoted) : default_sql(rel, c);

			appendStringInfo(&conflict, "%s%s", conflict.len ? ", " : "", c->quoted);
			appendStringInfo(&match, "%st.%s %s %s", match.len ? " AND " : "",
							 c->quoted, idem_operator_sql(c->type, TYPECACHE_EQ_OPR),
							 value ? value : "NULL");
		}
		relation_close(rel, NoLock);
		if (idem_citus_table(t.relid))
		{
			/*
			 * Citus runs an INSERT ... SELECT through the coordinator and
			 * then miscounts the rows a DO NOTHING skipped; an INSERT of one
			 * VALUES row is routed to its shard.  Its RETURNING may not call
			 * to_jsonb() (not IMMUTABLE): a CTE around it does (so the
			 * statement is a SELECT).
			 */
			StringInfoData fields;

			initStringInfo(&fields);
			foreach(lc, cols)
			{
				IdemColumn *c = lfirst(lc);

				appendStringInfo(&fields, "%s(pg_catalog.jsonb_populate_record($2, $1)).%s",
								 fields.len ? ", " : "", c->quoted);
			}
			plans.work = idem_target_prepare(psprintf("WITH i AS ("
													  "INSERT INTO %s AS t (%s)"
													  " VALUES (%s)"
													  " ON CONFLICT (%s) DO NOTHING"
													  " RETURNING t.*)"
													  " SELECT pg_catalog.to_jsonb(i.*) FROM i",
													  t.qualname, targets.data, fields.data,
													  conflict.data),
											 2, argtypes);
		}
		else
			plans.work = idem_target_prepare(psprintf("INSERT INTO %s AS t (%s)"
													  " SELECT %s FROM %s"
													  " ON CONFLICT (%s) DO NOTHING"
													  " RETURNING pg_catalog.to_jsonb(t.*)",
													  t.qualname, targets.data, sources.data,
													  idem_record_sql("$2", "$1"), conflict.data),
											 2, argtypes);
		plans.probe = idem_target_prepare(psprintf("SELECT pg_catalog.to_jsonb(t.*) FROM %s AS t, %s"
												   " WHERE %s",
												   t.qualname, idem_record_sql("$2", "$1"), match.data),
										  2, argtypes);
		idem_plans_store(t.relid, sig.data, &plans);
	}

	values[0] = JsonbPGetDatum(row);

	/*
	 * Insert, or read the row that holds the key.  If that row is deleted
	 * between the two, insert again (a few times at most).
	 */
	for (tries = 0;; tries++)
	{
		int			rc = SPI_execute_plan(plans.work, values, NULL, false, 0);
		bool		isnull;

		if (rc != SPI_OK_INSERT_RETURNING && rc != SPI_OK_SELECT)
			elog(ERROR, "insert_once insert failed: %s", SPI_result_code_string(rc));
		result[0] = BoolGetDatum(SPI_processed > 0);
		if (SPI_processed == 0)
		{
			Relation	rel;
			bool		skipping;

			rc = SPI_execute_plan(plans.probe, values, NULL, false, 0);
			if (rc != SPI_OK_SELECT)
				elog(ERROR, "insert_once probe failed: %s", SPI_result_code_string(rc));
			if (SPI_processed > 0)
				goto found;

			rel = relation_open(t.relid, NoLock);
			skipping = rel->trigdesc != NULL && rel->trigdesc->trig_insert_before_row;
			foreach(lc, keys)
			{
				IdemColumn *c = lfirst(lc);

				if (!named_in(cols, c) && default_sql(rel, c) == NULL)
					unknowable = c->name;
			}
			relation_close(rel, NoLock);
			if (skipping)
				ereport(ERROR,
						(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
						 errmsg("insert_once() on table \"%s\" neither inserted the row nor found one with its key",
								t.relname),
						 errdetail("A BEFORE INSERT trigger on the table skipped the row or changed its key.")));
			if (unknowable != NULL)
				ereport(ERROR,
						(errcode(ERRCODE_UNIQUE_VIOLATION),
						 errmsg("insert_once() on table \"%s\" neither inserted the row nor found one with its key",
								t.relname),
						 errdetail("Key column \"%s\" is not in row, and its default is volatile or generated, so the row that holds the key cannot be looked up.",
								   unknowable),
						 errhint("Name every conflict column in row.")));

			/*
			 * Hidden, not deleted: after one more try, a row that still holds
			 * the key but stays unseen is one row security hides from the
			 * caller; retrying would never find it.
			 */
			if (tries >= 1 && check_enable_rls(t.relid, InvalidOid, true) == RLS_ENABLED)
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("insert_once() on table \"%s\" found the key held by a row that row-level security hides",
								t.relname),
						 errdetail("No SELECT policy of the table lets role %s read the row that holds the key; nothing was written.",
								   GetUserNameFromId(GetUserId(), false)),
						 errhint("Grant the role a SELECT policy that covers the row, or use another key.")));
			if (tries < 3)
				continue;
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not insert into or read the row of \"%s\" with that key",
							t.relname),
					 errdetail("The conflicting row kept disappearing."),
					 errhint("Retry the transaction.")));
		}
found:
		{
			MemoryContext old = MemoryContextSwitchTo(caller_cxt);

			result[1] = PointerGetDatum(DatumGetJsonbPCopy(SPI_getbinval(SPI_tuptable->vals[0],
																		 SPI_tuptable->tupdesc,
																		 1, &isnull)));
			MemoryContextSwitchTo(old);
		}
		break;
	}
	SPI_finish();

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, result, nulls)));
}

/* insert_once(target, row, conflict_columns) -> (inserted, row) */
PG_FUNCTION_INFO_V1(idempotency_insert_once);

Datum
idempotency_insert_once(PG_FUNCTION_ARGS)
{
	return idem_helper_call(insert_once_body, fcinfo);
}
