/*-------------------------------------------------------------------------
 *
 * target.c
 *	  The write helpers' shared layer: the target table and its columns,
 *	  the id argument, SQL built from catalog facts, and the plan cache.
 *	  machine.c, versioned.c and insert_once.c build on it; it calls
 *	  nothing of theirs.
 *
 * Statements are built from catalog facts only (the regclass, column names
 * checked with get_attnum and quoted, types and operators from the
 * catalog, schema-qualified); every value is a parameter, and JSON values
 * are cast to column types by PostgreSQL (jsonb_populate_record() on a row
 * of NULLs: idem_null_row()).  The id argument is converted to the id
 * column's type once, and only if the conversion is exact.  Plans are kept
 * per backend keyed by (table, signature), as PostgreSQL's ri_triggers.c
 * keeps foreign keys' plans, at most IDEM_HELPER_PLANS_MAX pairs, used only
 * while valid.
 * Why each, and how a plan is freed under a nested helper call:
 * src/README.md, "The write helpers' statements and plans".
 *
 * Locking: idem_target_arg() takes RowExclusiveLock on the target (the
 * lock the helper's UPDATE or INSERT takes anyway) before it reads the
 * catalog or the plan cache, whatever the caller's privileges, as the
 * parser does (parserOpenTable): regclassin took no lock, and no ALTER
 * TABLE may come between a plan's validity check and its execution
 * (test/specs/target_lock.spec).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/ilist.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "parser/parse_coerce.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rls.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "idempotency.h"
#include "target.h"

/* ---------------------------------------------------------------------
 * Local state: the plan cache
 * ---------------------------------------------------------------------
 */
typedef struct PlanKey
{
	Oid			relid;
	uint64		sighash;		/* hash of the signature string */
} PlanKey;

typedef struct PlanEntry
{
	PlanKey		key;
	char	   *sig;			/* full signature, TopMemoryContext */
	IdemPlans	plans;
	dlist_node	lru;			/* most recently used first */
} PlanEntry;

static HTAB *plan_cache = NULL;
static dlist_head plan_lru = DLIST_STATIC_INIT(plan_lru);
static int	plan_count = 0;

/* plans dropped while a helper call was under way; freed at depth 0 */
static List *plan_graveyard = NIL;

/* helper calls under way in this backend (nested through triggers) */
static int	helper_depth = 0;

/* ---------------------------------------------------------------------
 * Targets, columns, arguments
 * ---------------------------------------------------------------------
 */

/*
 * The target table of argument argno (regclass): a table or partitioned
 * table, locked (see the file comment).
 */
IdemTarget
idem_target_arg(FunctionCallInfo fcinfo, int argno)
{
	IdemTarget	t;
	Oid			relid;
	char		kind;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("target must not be null")));
	relid = PG_GETARG_OID(argno);
	kind = get_rel_relkind(relid);
	if (kind == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", get_rel_name(relid))));
	LockRelationOid(relid, RowExclusiveLock);
	/* dropped while we waited? */
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	t.relid = relid;
	t.relname = get_rel_name(relid);
	t.qualname = quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
											t.relname);
	return t;
}

/* column name of t; 42703 if there is none (or it is a system column) */
IdemColumn
idem_column(const IdemTarget *t, const char *name)
{
	IdemColumn	c;
	Oid			collation;

	c.name = name;
	c.attnum = get_attnum(t->relid, name);
	if (c.attnum == InvalidAttrNumber || c.attnum < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist", name, t->relname)));
	get_atttypetypmodcoll(t->relid, c.attnum, &c.type, &c.typmod, &collation);
	c.quoted = quote_identifier(name);
	return c;
}

/* a name argument that must not be NULL */
const char *
idem_name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	return pstrdup(NameStr(*PG_GETARG_NAME(argno)));
}

/* the keys of a jsonb object, checked as columns of t; sorted (jsonb order) */
List *
idem_object_columns(const IdemTarget *t, Jsonb *jb, const char *what)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	List	   *cols = NIL;

	if (!JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object of column names and values", what)));
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		if (tok == WJB_KEY)
		{
			IdemColumn *c = palloc(sizeof(IdemColumn));

			*c = idem_column(t, pnstrdup(v.val.string.val, v.val.string.len));
			cols = lappend(cols, c);
		}
	return cols;
}

/*
 * value (of type from) as type to, by PostgreSQL's explicit cast without a
 * length coercion; *ok is false when there is no cast.
 */
static Datum
convert_datum(Datum value, Oid from, Oid to, bool *ok)
{
	Oid			funcid;
	CoercionPathType path;

	*ok = true;
	if (from == to)
		return value;
	path = find_coercion_pathway(to, from, COERCION_EXPLICIT, &funcid);
	switch (path)
	{
		case COERCION_PATH_RELABELTYPE:
			return value;
		case COERCION_PATH_FUNC:
			if (get_func_nargs(funcid) == 1)
				return OidFunctionCall1(funcid, value);
			return OidFunctionCall3(funcid, value, Int32GetDatum(-1), BoolGetDatum(true));
		case COERCION_PATH_COERCEVIAIO:
			{
				Oid			out,
							in,
							ioparam;
				bool		varlena;

				getTypeOutputInfo(from, &out, &varlena);
				getTypeInputInfo(to, &in, &ioparam);
				return OidInputFunctionCall(in, OidOutputFunctionCall(out, value),
											ioparam, -1);
			}
		default:
			*ok = false;
			return (Datum) 0;
	}
}

/*
 * The id argument argno as a value of the id column's type (see the file
 * comment): 22004 when NULL, 42846 when there is no cast, 22P02 when the
 * cast is not exact.
 */
Datum
idem_id_value(FunctionCallInfo fcinfo, int argno, const IdemColumn *idc)
{
	Oid			argtype = get_fn_expr_argtype(fcinfo->flinfo, argno);
	Datum		value;
	Datum		converted;
	Datum		back;
	bool		ok;
	char		category;
	bool		preferred;
	TypeCacheEntry *tc;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	if (!OidIsValid(argtype))
		elog(ERROR, "could not determine the type of the id argument");
	value = PG_GETARG_DATUM(argno);
	if (argtype == idc->type)
		return value;

	converted = convert_datum(value, argtype, idc->type, &ok);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_CANNOT_COERCE),
				 errmsg("cannot use an id of type %s for column \"%s\" of type %s",
						format_type_be(argtype), idc->name, format_type_be(idc->type))));

	/* a string is read by the column type's own input rules: exact */
	get_type_category_preferred(getBaseType(argtype), &category, &preferred);
	if (category == TYPCATEGORY_STRING || category == TYPCATEGORY_UNKNOWN)
		return converted;

	back = convert_datum(converted, idc->type, argtype, &ok);
	tc = lookup_type_cache(argtype, TYPECACHE_EQ_OPR_FINFO);
	if (ok && OidIsValid(tc->eq_opr_finfo.fn_oid) &&
		!DatumGetBool(FunctionCall2Coll(&tc->eq_opr_finfo, get_typcollation(argtype),
										value, back)))
	{
		Oid			out;
		bool		varlena;

		getTypeOutputInfo(idc->type, &out, &varlena);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TEXT_REPRESENTATION),
				 errmsg("id %s does not convert exactly to type %s of column \"%s\"",
						idem_id_text(fcinfo, argno), format_type_be(idc->type), idc->name),
				 errdetail("As %s it would be %s, another value.",
						   format_type_be(idc->type), OidOutputFunctionCall(out, converted))));
	}
	return converted;
}

/* the id argument (anyelement) as text, for messages */
char *
idem_id_text(FunctionCallInfo fcinfo, int argno)
{
	Oid			type = get_fn_expr_argtype(fcinfo->flinfo, argno);
	Oid			out;
	bool		varlena;

	if (PG_ARGISNULL(argno))
		return "NULL";
	getTypeOutputInfo(type, &out, &varlena);
	return OidOutputFunctionCall(out, PG_GETARG_DATUM(argno));
}

bool
idem_is_integer_type(Oid type)
{
	return type == INT2OID || type == INT4OID || type == INT8OID;
}

int64
idem_integer_datum(Datum d, Oid type)
{
	switch (type)
	{
		case INT2OID:
			return DatumGetInt16(d);
		case INT4OID:
			return DatumGetInt32(d);
		default:
			return DatumGetInt64(d);
	}
}

/* ---------------------------------------------------------------------
 * SQL fragments
 * ---------------------------------------------------------------------
 */

/* a type, schema-qualified, with its typmod when typmod >= 0 */
char *
idem_type_sql(Oid type, int32 typmod)
{
	if (typmod < 0)
		return format_type_extended(type, -1, FORMAT_TYPE_FORCE_QUALIFY);
	return format_type_extended(type, typmod,
								FORMAT_TYPE_FORCE_QUALIFY | FORMAT_TYPE_TYPEMOD_GIVEN);
}

/* "OPERATOR(schema.op)": the default btree = (TYPECACHE_EQ_OPR) or < of type */
char *
idem_operator_sql(Oid type, int which)
{
	TypeCacheEntry *tc = lookup_type_cache(type, which);
	Oid			opr = which == TYPECACHE_EQ_OPR ? tc->eq_opr : tc->lt_opr;
	HeapTuple	tup;
	Form_pg_operator op;
	char	   *sql;

	if (!OidIsValid(opr))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("type %s has no %s operator", format_type_be(type),
						which == TYPECACHE_EQ_OPR ? "equality" : "ordering")));
	tup = SearchSysCache1(OPEROID, ObjectIdGetDatum(opr));
	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for operator %u", opr);
	op = (Form_pg_operator) GETSTRUCT(tup);
	sql = psprintf("OPERATOR(%s.%s)",
				   quote_identifier(get_namespace_name(op->oprnamespace)),
				   NameStr(op->oprname));
	ReleaseSysCache(tup);
	return sql;
}

/*
 * "pg_catalog.jsonb_populate_record(base, json) AS r": the row of the
 * target with the values of the JSON object; base is a parameter holding
 * idem_null_row().
 */
char *
idem_record_sql(const char *base, const char *json)
{
	return psprintf("pg_catalog.jsonb_populate_record(%s, %s) AS r", base, json);
}

/*
 * A row of t's row type whose fields are all NULL, and that type.  As the
 * base record of jsonb_populate_record() it makes the function convert
 * only the keys the JSON object has: a column the call does not name is
 * not read as NULL through its domain (a NOT NULL domain would refuse it).
 * A parameter, not a cast of ROW(NULL, ...), which would check them, and
 * not a column definition list, which would register a new anonymous
 * record type, kept for the life of the backend, per set of columns.
 */
Datum
idem_null_row(const IdemTarget *t, Oid *rowtype)
{
	TupleDesc	desc;
	Datum	   *values;
	bool	   *nulls;
	HeapTuple	tup;

	*rowtype = get_rel_type_id(t->relid);
	desc = lookup_rowtype_tupdesc(*rowtype, -1);
	values = palloc0(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	memset(nulls, true, desc->natts * sizeof(bool));
	tup = heap_form_tuple(desc, values, nulls);
	ReleaseTupleDesc(desc);
	return HeapTupleGetDatum(tup);
}

/* ---------------------------------------------------------------------
 * Plans
 * ---------------------------------------------------------------------
 */

/*
 * Run body as a helper call: counted in helper_depth, so that no plan is
 * freed while a call further up may be executing it.
 */
Datum
idem_helper_call(PGFunction body, FunctionCallInfo fcinfo)
{
	volatile Datum result = (Datum) 0;

	helper_depth++;
	PG_TRY();
	{
		result = body(fcinfo);
	}
	PG_FINALLY();
	{
		helper_depth--;
	}
	PG_END_TRY();
	return result;
}

/*
 * free plan now, or at the next outermost call (src/README.md, "The write
 * helpers' statements and plans")
 */
static void
drop_plan(SPIPlanPtr plan)
{
	if (plan == NULL)
		return;
	if (helper_depth <= 1)
		SPI_freeplan(plan);
	else
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		plan_graveyard = lappend(plan_graveyard, plan);
		MemoryContextSwitchTo(old);
	}
}

static void
drop_entry(PlanEntry *e)
{
	drop_plan(e->plans.work);
	drop_plan(e->plans.probe);
	pfree(e->sig);
	dlist_delete(&e->lru);
	plan_count--;
	hash_search(plan_cache, &e->key, HASH_REMOVE, NULL);
}

/* the hash key (HASH_BLOBS: padding bytes too must be set) */
static void
plan_key(Oid relid, const char *sig, PlanKey *key)
{
	memset(key, 0, sizeof(*key));
	key->relid = relid;
	key->sighash = hash_bytes_extended((const unsigned char *) sig, strlen(sig), 0);
}

/*
 * The kept plans for sig on relid, if both are there and valid (copied to
 * *out); otherwise false, and the caller prepares them (idem_target_prepare) and
 * hands them to idem_plans_store().
 */
bool
idem_plans_fetch(Oid relid, const char *sig, IdemPlans *out)
{
	PlanKey		key;
	PlanEntry  *e;

	if (plan_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(PlanKey);
		ctl.entrysize = sizeof(PlanEntry);
		plan_cache = hash_create("idempotency helper plans", IDEM_HELPER_PLANS_MAX,
								 &ctl, HASH_ELEM | HASH_BLOBS);
	}
	if (helper_depth <= 1 && plan_graveyard != NIL)
	{
		ListCell   *lc;

		foreach(lc, plan_graveyard)
			SPI_freeplan(lfirst(lc));
		list_free(plan_graveyard);
		plan_graveyard = NIL;
	}

	plan_key(relid, sig, &key);
	e = hash_search(plan_cache, &key, HASH_FIND, NULL);
	if (e == NULL)
		return false;
	if (strcmp(e->sig, sig) == 0 &&
		SPI_plan_is_valid(e->plans.work) && SPI_plan_is_valid(e->plans.probe))
	{
		dlist_move_head(&plan_lru, &e->lru);
		*out = e->plans;
		return true;
	}
	/* stale (ALTER TABLE) or another signature with the same hash */
	drop_entry(e);
	return false;
}

/*
 * SPI_prepare, generic plan; kept only by idem_plans_store().  Where Citus
 * is installed, the plan cache chooses: Citus cannot make a generic plan
 * of the helpers' statements on a distributed table (an INSERT ... SELECT,
 * a sub-SELECT in SET, a join with a reference table), and prices one it
 * cannot make so that custom plans are used.
 */
SPIPlanPtr
idem_target_prepare(const char *sql, int nargs, Oid *argtypes)
{
	int			options = OidIsValid(get_relname_relid("pg_dist_partition",
													   PG_CATALOG_NAMESPACE)) ?
		0 : CURSOR_OPT_GENERIC_PLAN;
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, options);

	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	return plan;
}

/*
 * Keep plans (from idem_target_prepare(); SPI_keepplan() moves them out of the
 * SPI call's memory) under (relid, sig).  Evicts the least recently used
 * pair when the cache is full.
 */
void
idem_plans_store(Oid relid, const char *sig, IdemPlans *plans)
{
	PlanKey		key;
	PlanEntry  *e;
	bool		found;

	plan_key(relid, sig, &key);
	if (SPI_keepplan(plans->work) != 0 || SPI_keepplan(plans->probe) != 0)
		elog(ERROR, "SPI_keepplan failed");

	e = hash_search(plan_cache, &key, HASH_FIND, NULL);
	if (e != NULL)
		drop_entry(e);			/* a nested call stored it meanwhile */
	while (plan_count >= IDEM_HELPER_PLANS_MAX)
		drop_entry(dlist_container(PlanEntry, lru, dlist_tail_node(&plan_lru)));

	e = hash_search(plan_cache, &key, HASH_ENTER, &found);
	e->sig = MemoryContextStrdup(TopMemoryContext, sig);
	e->plans = *plans;
	dlist_push_head(&plan_lru, &e->lru);
	plan_count++;
}

/*
 * Run probe (the row with the given id) after the write found nothing to
 * change: the row is there (SPI_tuptable holds it) or the id names no row
 * (P0002).  what names the helper in internal errors.
 */
void
idem_probe_row(SPIPlanPtr probe, Datum *values, FunctionCallInfo fcinfo,
			   const IdemTarget *t, const IdemColumn *idc, const char *what)
{
	int			rc = SPI_execute_plan(probe, values, NULL, false, 0);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "%s probe failed: %s", what, SPI_result_code_string(rc));
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("no row with %s = %s in table \"%s\"",
						idc->name, idem_id_text(fcinfo, 1), t->relname)));
}

/*
 * The UPDATE changed nothing although the probe shows a row it should have
 * changed (a transition the machine allows, the expected version): the
 * row is hidden from UPDATE.  Row security whose UPDATE policy excludes
 * the row while a SELECT policy shows it: 42501.  Otherwise a BEFORE UPDATE
 * trigger that returned NULL, or a rule: 09000.  Never IK005/IK006, which
 * would name a state or version that does allow the write.
 */
void
idem_update_hidden(FunctionCallInfo fcinfo, const IdemTarget *t,
				   const IdemColumn *idc, const char *what)
{
	if (check_enable_rls(t->relid, InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s cannot update row %s = %s in table \"%s\": row-level security hides it from UPDATE",
						what, idc->name, idem_id_text(fcinfo, 1), t->relname),
				 errdetail("Role %s may read the row, but no UPDATE policy of the table lets it change it; nothing was written.",
						   GetUserNameFromId(GetUserId(), false)),
				 errhint("Grant the role an UPDATE policy that covers the row, or call the helper as a role that has one.")));
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("%s cannot update row %s = %s in table \"%s\": a trigger or rule skipped the UPDATE",
					what, idc->name, idem_id_text(fcinfo, 1), t->relname),
			 errdetail("The row allows the change, but the UPDATE changed no row; nothing was written.")));
}
