/*-------------------------------------------------------------------------
 *
 * helpers.c
 *	  Write helpers: create_machine() and transition(), update_versioned(),
 *	  insert_once().
 *
 * Design: each helper builds its statements from catalog facts only:
 * the target relation (regclass, checked and schema-qualified), its column
 * names (checked with get_attnum, quoted with quote_identifier), their types
 * (format_type_extended with FORMAT_TYPE_FORCE_QUALIFY) and the equality
 * operator of the id column's type from the type cache, written as
 * OPERATOR(schema.op).  Every value goes in as a parameter.  JSON values are
 * cast to column types by PostgreSQL itself, through
 * jsonb_populate_record(NULL::table, $n).
 *
 * The statements run as the caller (SECURITY INVOKER): privileges and
 * row-level security of the target table apply as to any other statement.
 * Only create_machine() writes an extension table, as its owner.
 *
 * The common case is one statement: a conditional UPDATE or an INSERT ...
 * ON CONFLICT DO NOTHING that does the work when it may.  Only when it
 * wrote nothing does a second statement find out why (already there,
 * invalid transition, stale version, no such row, the existing row).  The
 * row lock taken by the UPDATE/INSERT and PostgreSQL's recheck of the
 * WHERE clause after waiting for a concurrent writer make concurrent
 * identical calls come out as exactly one applied/inserted.
 *
 * Plan cache: statements are prepared once per backend and kept, in a hash
 * keyed by (helper, table, columns, types).  A relcache invalidation of the
 * table marks its entries stale (they are freed and prepared again at the
 * next call, never inside the callback, which may run while a plan is
 * executing), so ALTER TABLE between calls is always seen.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/relation.h"
#include "catalog/pg_class.h"
#include "common/hashfn.h"
#include "catalog/pg_index.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "idempotency.h"

#define ERRCODE_INVALID_STATE_TRANSITION	MAKE_SQLSTATE('I','K','0','0','5')
#define ERRCODE_STALE_VERSION				MAKE_SQLSTATE('I','K','0','0','6')

/* ---------------------------------------------------------------------
 * Plan cache
 * ---------------------------------------------------------------------
 */
typedef struct HelperPlanKey
{
	Oid			relid;
	uint64		sighash;		/* hash of the signature string */
} HelperPlanKey;

typedef struct HelperPlan
{
	HelperPlanKey key;
	char	   *sig;			/* full signature, TopMemoryContext */
	bool		valid;
	SPIPlanPtr	work;			/* the statement that does the work */
	SPIPlanPtr	probe;			/* the one that finds out why it did not */
} HelperPlan;

static HTAB *helper_plans = NULL;

/*
 * Helper calls under way in this backend (a trigger on a target table may
 * call a helper again).  A stale plan is freed only when none is, since an
 * outer call may still be executing it.
 */
static int	helper_depth = 0;

static void
helper_inval_callback(Datum arg pg_attribute_unused(), Oid relid)
{
	HASH_SEQ_STATUS status;
	HelperPlan *p;

	if (helper_plans == NULL)
		return;
	hash_seq_init(&status, helper_plans);
	while ((p = hash_seq_search(&status)) != NULL)
		if (relid == InvalidOid || p->key.relid == relid)
			p->valid = false;
}

/*
 * The cache entry for signature sig on relid; *fresh is true when its
 * plans must be (re)prepared.
 */
static HelperPlan *
plan_entry(Oid relid, const char *sig, bool *fresh)
{
	HelperPlanKey key;
	HelperPlan *p;
	bool		found;

	if (helper_plans == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(HelperPlanKey);
		ctl.entrysize = sizeof(HelperPlan);
		helper_plans = hash_create("idempotency helper plans", 64, &ctl,
								   HASH_ELEM | HASH_BLOBS);
		CacheRegisterRelcacheCallback(helper_inval_callback, (Datum) 0);
	}
	memset(&key, 0, sizeof(key));
	key.relid = relid;
	key.sighash = hash_bytes_extended((const unsigned char *) sig, strlen(sig), 0);
	p = hash_search(helper_plans, &key, HASH_ENTER, &found);
	if (found && p->valid && strcmp(p->sig, sig) == 0)
	{
		*fresh = false;
		return p;
	}
	if (found)
	{
		if (helper_depth == 0)
		{
			if (p->work)
				SPI_freeplan(p->work);
			if (p->probe)
				SPI_freeplan(p->probe);
		}
		pfree(p->sig);
	}
	p->sig = MemoryContextStrdup(TopMemoryContext, sig);
	p->work = p->probe = NULL;
	p->valid = false;			/* until both plans are in */
	*fresh = true;
	return p;
}

/* SPI_execute_plan, counted in helper_depth */
static int
run_plan(SPIPlanPtr plan, Datum *values, const char *nulls)
{
	int			rc;

	helper_depth++;
	PG_TRY();
	{
		rc = SPI_execute_plan(plan, values, nulls, false, 0);
	}
	PG_FINALLY();
	{
		helper_depth--;
	}
	PG_END_TRY();
	return rc;
}


/* ---------------------------------------------------------------------
 * Catalog helpers
 * ---------------------------------------------------------------------
 */
typedef struct Target
{
	Oid			relid;
	char	   *qualname;		/* "schema"."table", quoted */
	char	   *relname;		/* for messages */
} Target;

static Target
target_of(Oid relid)
{
	Target		t;
	char		kind = get_rel_relkind(relid);

	if (kind == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	if (kind != RELKIND_RELATION && kind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", get_rel_name(relid))));
	t.relid = relid;
	t.relname = get_rel_name(relid);
	t.qualname = quote_qualified_identifier(get_namespace_name(get_rel_namespace(relid)),
											t.relname);
	return t;
}

typedef struct Column
{
	const char *name;
	const char *quoted;
	AttrNumber	attnum;
	Oid			type;
} Column;

static Column
column_of(const Target *t, const char *name)
{
	Column		c;

	c.name = name;
	c.attnum = get_attnum(t->relid, name);
	if (c.attnum == InvalidAttrNumber || c.attnum < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist", name, t->relname)));
	c.type = get_atttype(t->relid, c.attnum);
	c.quoted = quote_identifier(name);
	return c;
}

static const char *
name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	return pstrdup(NameStr(*PG_GETARG_NAME(argno)));
}

static char *
type_sql(Oid type)
{
	return format_type_extended(type, -1, FORMAT_TYPE_FORCE_QUALIFY);
}

/* "OPERATOR(schema.op)" for the default btree operator of strategy of type */
static char *
operator_sql(Oid type, int which)
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

/* the id argument (anyelement) as text, for messages */
static char *
id_text(FunctionCallInfo fcinfo, int argno)
{
	Oid			type = get_fn_expr_argtype(fcinfo->flinfo, argno);
	Oid			out;
	bool		varlena;

	if (PG_ARGISNULL(argno))
		return "NULL";
	getTypeOutputInfo(type, &out, &varlena);
	return OidOutputFunctionCall(out, PG_GETARG_DATUM(argno));
}

/*
 * Run the probe of p (the row with the given id), after the write found
 * nothing to change: the row is there (SPI_tuptable holds it) or the id
 * names no row (P0002).  what names the helper in internal errors.
 */
static void
probe_row(HelperPlan *p, Datum *values, FunctionCallInfo fcinfo,
		  const Target *t, const Column *idc, const char *what)
{
	int			rc = run_plan(p->probe, values, NULL);

	if (rc != SPI_OK_SELECT)
		elog(ERROR, "%s probe failed: %s", what, SPI_result_code_string(rc));
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("no row with %s = %s in table \"%s\"",
						idc->name, id_text(fcinfo, 1), t->relname)));
}

/* the type of the id argument (anyelement); NULL ids are refused */
static Oid
id_arg_type(FunctionCallInfo fcinfo, int argno)
{
	Oid			type = get_fn_expr_argtype(fcinfo->flinfo, argno);

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	if (!OidIsValid(type))
		elog(ERROR, "could not determine the type of the id argument");
	return type;
}

static bool
is_integer_type(Oid type)
{
	return type == INT2OID || type == INT4OID || type == INT8OID;
}

static int64
integer_datum(Datum d, Oid type)
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
 * State machines
 * ---------------------------------------------------------------------
 */
static void
bad_machine(const char *machine, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid transitions for state machine \"%s\"", machine),
			 errdetail("%s", detail),
			 errhint("Write transitions as an object from each state to an array of the states it may move to, e.g. {\"pending\": [\"paid\", \"cancelled\"], \"paid\": [\"shipped\"]}.")));
}

/* Check the shape of a transitions object (see bad_machine). */
static void
check_transitions(const char *machine, Jsonb *jb)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	int			nstates = 0;
	List	   *seen = NIL;
	char	   *from = NULL;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_COUNT(jb) == 0)
		bad_machine(machine, "The transitions must be a non-empty JSON object.");

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_OBJECT:
				if (depth++ != 0)
					bad_machine(machine, psprintf("The transitions of state \"%s\" must be an array, not an object.", from));
				break;
			case WJB_END_OBJECT:
				depth--;
				break;
			case WJB_KEY:
				from = pnstrdup(v.val.string.val, v.val.string.len);
				if (v.val.string.len == 0)
					bad_machine(machine, "A state name is empty.");
				nstates++;
				break;
			case WJB_VALUE:
				bad_machine(machine, psprintf("The transitions of state \"%s\" must be an array of state names.", from));
				break;
			case WJB_BEGIN_ARRAY:
				if (depth++ != 1)
					bad_machine(machine, psprintf("The transitions of state \"%s\" must be an array of state names, not nested arrays.", from));
				list_free_deep(seen);
				seen = NIL;
				break;
			case WJB_END_ARRAY:
				depth--;
				break;
			case WJB_ELEM:
				{
					char	   *to;
					ListCell   *lc;

					if (v.type != jbvString || v.val.string.len == 0)
						bad_machine(machine, psprintf("State \"%s\" lists a target that is not a non-empty string.", from));
					to = pnstrdup(v.val.string.val, v.val.string.len);
					foreach(lc, seen)
						if (strcmp(lfirst(lc), to) == 0)
							bad_machine(machine, psprintf("State \"%s\" lists \"%s\" twice.", from, to));
					seen = lappend(seen, to);
					break;
				}
			default:
				break;
		}
	}
	(void) nstates;
}

static SPIPlanPtr plan_machine_upsert = NULL;
static SPIPlanPtr plan_machine_get = NULL;

/* create_machine(machine, transitions): define or redefine a state machine */
PG_FUNCTION_INFO_V1(idempotency_create_machine);

Datum
idempotency_create_machine(PG_FUNCTION_ARGS)
{
	char	   *machine;
	Jsonb	   *transitions;
	Oid			argtypes[4] = {TEXTOID, JSONBOID, REGROLEOID, BOOLOID};
	Datum		values[4];
	uint64		n;

	if (PG_ARGISNULL(0) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(0)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("state machine name must not be null or empty")));
	machine = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (PG_ARGISNULL(1))
		bad_machine(machine, "The transitions are NULL.");
	transitions = PG_GETARG_JSONB_P(1);
	check_transitions(machine, transitions);

	values[0] = CStringGetTextDatum(machine);
	values[1] = JsonbPGetDatum(transitions);
	values[2] = ObjectIdGetDatum(GetUserId());
	values[3] = BoolGetDatum(superuser());

	SPI_connect();
	n = idem_run_as_owner(&plan_machine_upsert,
					 "INSERT INTO idempotency.state_machine AS m (machine, transitions, owner, updated_at)"
					 " VALUES ($1, $2, $3, pg_catalog.now())"
					 " ON CONFLICT (machine) DO UPDATE"
					 "   SET transitions = EXCLUDED.transitions, updated_at = EXCLUDED.updated_at"
					 " WHERE m.owner OPERATOR(pg_catalog.=) $3 OR $4",
					 4, argtypes, values, NULL, SPI_OK_INSERT);
	SPI_finish();
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("state machine \"%s\" belongs to another role", machine),
				 errdetail("Only the role that defined a state machine, or a superuser, may redefine it.")));
	PG_RETURN_VOID();
}

/* the transitions of machine, or NULL when there is no such machine */
static Jsonb *
machine_transitions(const char *machine)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;

	values[0] = CStringGetTextDatum(machine);
	if (idem_run_as_owner(&plan_machine_get,
					 "SELECT m.transitions FROM idempotency.state_machine AS m"
					 " WHERE m.machine OPERATOR(pg_catalog.=) $1",
					 1, argtypes, values, NULL, SPI_OK_SELECT) == 0)
		return NULL;
	return DatumGetJsonbPCopy(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The states of a machine from which to_state may be reached, as
 * "\"a\", \"b\"" for messages; *allowed tells whether current is one of them.
 */
static char *
predecessors(Jsonb *transitions, const char *to_state, const char *current,
			 bool *allowed)
{
	StringInfoData buf;
	JsonbIterator *it = JsonbIteratorInit(&transitions->root);
	JsonbValue	v;
	JsonbIteratorToken tok;
	char	   *from = NULL;

	*allowed = false;
	initStringInfo(&buf);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
			from = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_ELEM && v.type == jbvString &&
				 strlen(to_state) == (size_t) v.val.string.len &&
				 memcmp(v.val.string.val, to_state, v.val.string.len) == 0)
		{
			appendStringInfo(&buf, "%s\"%s\"", buf.len ? ", " : "", from);
			if (current != NULL && strcmp(current, from) == 0)
				*allowed = true;
		}
	}
	return buf.data;
}

/* transition(target, id, to_state, machine, state_column, id_column) -> applied | already */
PG_FUNCTION_INFO_V1(idempotency_transition);

Datum
idempotency_transition(PG_FUNCTION_ARGS)
{
	Target		t = target_of(PG_GETARG_OID(0));
	Oid			id_type = id_arg_type(fcinfo, 1);
	const char *state_name = name_arg(fcinfo, 4, "state_column");
	const char *id_name = name_arg(fcinfo, 5, "id_column");
	Column		state = column_of(&t, state_name);
	Column		idc = column_of(&t, id_name);
	char	   *to_state;
	char	   *machine = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	bool		forward = machine == NULL;
	char	   *sig;
	HelperPlan *p;
	bool		fresh;
	Oid			argtypes[3] = {id_type, TEXTOID, TEXTOID};
	Datum		values[3];
	int			tries;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("to_state must not be null")));
	to_state = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (forward && !is_integer_type(state.type))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a state machine is required for state column \"%s\" of type %s",
						state.name, format_type_be(state.type)),
				 errhint("Without a machine, transition() only moves integer states forward.")));

	sig = psprintf("transition %d %d %u %u %u", (int) forward, state.attnum,
				   state.type, idc.attnum, id_type);
	p = plan_entry(t.relid, sig, &fresh);

	SPI_connect();
	if (fresh)
	{
		char	   *where = psprintf("t.%s %s $1::%s", idc.quoted,
									 operator_sql(idc.type, TYPECACHE_EQ_OPR),
									 type_sql(idc.type));
		char	   *work;

		if (forward)
			work = psprintf("UPDATE %s AS t SET %s = $2::%s WHERE %s AND t.%s %s $2::%s",
							t.qualname, state.quoted, type_sql(state.type), where,
							state.quoted, operator_sql(state.type, TYPECACHE_LT_OPR),
							type_sql(state.type));
		else
			work = psprintf("UPDATE %s AS t SET %s = $2::%s WHERE %s"
							" AND t.%s::pg_catalog.text OPERATOR(pg_catalog.<>) $2"
							" AND t.%s::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY("
							"   SELECT e.key FROM idempotency.state_machine AS m,"
							"          pg_catalog.jsonb_each(m.transitions) AS e"
							"    WHERE m.machine OPERATOR(pg_catalog.=) $3"
							"      AND e.value OPERATOR(pg_catalog.?) $2))",
							t.qualname, state.quoted, type_sql(state.type), where,
							state.quoted, state.quoted);
		idem_prepare(&p->work, work, 3, argtypes);
		idem_prepare(&p->probe, psprintf("SELECT t.%s::pg_catalog.text FROM %s AS t WHERE %s",
										 state.quoted, t.qualname, where),
								1, argtypes);
		p->valid = true;
	}

	values[0] = PG_GETARG_DATUM(1);
	values[1] = CStringGetTextDatum(to_state);
	values[2] = machine ? CStringGetTextDatum(machine) : (Datum) 0;

	/*
	 * A probe may see a state that changed after the UPDATE looked: if the
	 * move is allowed from what it sees, try again (a few times at most).
	 */
	for (tries = 0;; tries++)
	{
		int			rc;
		char	   *current;
		Jsonb	   *transitions = NULL;
		char	   *from;
		bool		allowed;

		rc = run_plan(p->work, values, machine ? NULL : "  n");
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "transition update failed: %s", SPI_result_code_string(rc));
		if (SPI_processed > 0)
		{
			SPI_finish();
			PG_RETURN_TEXT_P(cstring_to_text("applied"));
		}

		probe_row(p, values, fcinfo, &t, &idc, "transition");
		current = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (current != NULL && strcmp(current, to_state) == 0)
		{
			SPI_finish();
			PG_RETURN_TEXT_P(cstring_to_text("already"));
		}

		if (forward)
		{
			if (tries < 3 && current != NULL &&
				integer_datum(DirectFunctionCall1(int8in, CStringGetDatum(current)), INT8OID) <
				integer_datum(DirectFunctionCall1(int8in, CStringGetDatum(to_state)), INT8OID))
				continue;
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_STATE_TRANSITION),
					 errmsg("invalid state transition of row %s = %s in table \"%s\" from %s to %s",
							idc.name, id_text(fcinfo, 1), t.relname,
							current ? current : "NULL", to_state),
					 errdetail("Without a state machine, states only move forward; the current state is %s.",
							   current ? current : "NULL")));
		}

		transitions = machine_transitions(machine);
		if (transitions == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("state machine \"%s\" does not exist", machine),
					 errhint("Define it with idempotency.create_machine().")));
		from = predecessors(transitions, to_state, current, &allowed);
		if (tries < 3 && allowed)
			continue;			/* the state moved under us: try again */
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_STATE_TRANSITION),
				 errmsg("invalid state transition of row %s = %s in table \"%s\" from \"%s\" to \"%s\"",
						idc.name, id_text(fcinfo, 1), t.relname,
						current ? current : "NULL", to_state),
				 from[0] ?
				 errdetail("The current state is \"%s\"; state machine \"%s\" allows \"%s\" only from %s.",
						   current ? current : "NULL", machine, to_state, from) :
				 errdetail("The current state is \"%s\"; state machine \"%s\" never moves to \"%s\".",
						   current ? current : "NULL", machine, to_state)));
	}
}

/* ---------------------------------------------------------------------
 * Versioned update
 * ---------------------------------------------------------------------
 */

/* the keys of a jsonb object, checked as columns of t; sorted (jsonb order) */
static List *
object_columns(const Target *t, Jsonb *jb, const char *what)
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
			Column	   *c = palloc(sizeof(Column));

			*c = column_of(t, pnstrdup(v.val.string.val, v.val.string.len));
			cols = lappend(cols, c);
		}
	return cols;
}

/* update_versioned(target, id, expected_version, changes, version_column, id_column) -> new version */
PG_FUNCTION_INFO_V1(idempotency_update_versioned);

Datum
idempotency_update_versioned(PG_FUNCTION_ARGS)
{
	Target		t = target_of(PG_GETARG_OID(0));
	Oid			id_type = id_arg_type(fcinfo, 1);
	Column		ver = column_of(&t, name_arg(fcinfo, 4, "version_column"));
	Column		idc = column_of(&t, name_arg(fcinfo, 5, "id_column"));
	Jsonb	   *changes;
	List	   *cols;
	ListCell   *lc;
	StringInfoData sig;
	HelperPlan *p;
	bool		fresh;
	Oid			argtypes[3] = {id_type, INT8OID, JSONBOID};
	Datum		values[3];
	int			rc;
	bool		isnull;
	int64		result;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("expected_version must not be null")));
	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("changes must not be null")));
	changes = PG_GETARG_JSONB_P(3);
	if (!is_integer_type(ver.type))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("version column \"%s\" must be an integer column, not %s",
						ver.name, format_type_be(ver.type))));
	cols = object_columns(&t, changes, "changes");
	if (cols == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("changes must name at least one column")));

	initStringInfo(&sig);
	appendStringInfo(&sig, "versioned %d %d %u", ver.attnum, idc.attnum, id_type);
	foreach(lc, cols)
	{
		Column	   *c = lfirst(lc);

		if (c->attnum == ver.attnum || c->attnum == idc.attnum)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("changes may not set column \"%s\"", c->name),
					 errdetail("update_versioned() sets the version column itself, and the id column identifies the row.")));
		appendStringInfo(&sig, " %d", c->attnum);
	}
	p = plan_entry(t.relid, sig.data, &fresh);

	SPI_connect();
	if (fresh)
	{
		StringInfoData targets,
					sources;
		char	   *where = psprintf("t.%s %s $1::%s", idc.quoted,
									 operator_sql(idc.type, TYPECACHE_EQ_OPR),
									 type_sql(idc.type));

		initStringInfo(&targets);
		initStringInfo(&sources);
		foreach(lc, cols)
		{
			Column	   *c = lfirst(lc);

			appendStringInfo(&targets, "%s, ", c->quoted);
			appendStringInfo(&sources, "r.%s, ", c->quoted);
		}
		idem_prepare(&p->work, psprintf("UPDATE %s AS t SET (%s%s) = (SELECT %st.%s OPERATOR(pg_catalog.+) 1"
										"  FROM pg_catalog.jsonb_populate_record(NULL::%s, $3) AS r)"
										" WHERE %s AND t.%s OPERATOR(pg_catalog.=) $2"
										" RETURNING t.%s",
										t.qualname, targets.data, ver.quoted, sources.data,
										ver.quoted, t.qualname, where, ver.quoted, ver.quoted),
							   3, argtypes);
		idem_prepare(&p->probe, psprintf("SELECT t.%s FROM %s AS t WHERE %s",
										 ver.quoted, t.qualname, where),
								1, argtypes);
		p->valid = true;
	}

	values[0] = PG_GETARG_DATUM(1);
	values[1] = Int64GetDatum(PG_GETARG_INT64(2));
	values[2] = JsonbPGetDatum(changes);
	rc = run_plan(p->work, values, NULL);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "versioned update failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
	{
		result = integer_datum(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
											 1, &isnull), ver.type);
		SPI_finish();
		PG_RETURN_INT64(result);
	}

	probe_row(p, values, fcinfo, &t, &idc, "versioned");
	{
		char	   *current = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		ereport(ERROR,
				(errcode(ERRCODE_STALE_VERSION),
				 errmsg("stale version of row %s = %s in table \"%s\": expected %lld, current %s",
						idc.name, id_text(fcinfo, 1), t.relname,
						(long long) PG_GETARG_INT64(2), current ? current : "NULL"),
				 errdetail("Another write changed the row since version %lld; its %s is now %s.",
						   (long long) PG_GETARG_INT64(2), ver.name, current ? current : "NULL"),
				 errhint("Read the row again and retry with its current version (HTTP 409).")));
	}
	PG_RETURN_NULL();			/* not reached */
}

/* ---------------------------------------------------------------------
 * Dedup insert
 * ---------------------------------------------------------------------
 */

/* the primary key columns of t, in index order */
static List *
primary_key_columns(const Target *t)
{
	Relation	rel = relation_open(t->relid, AccessShareLock);
	Oid			pk = RelationGetPrimaryKeyIndex(rel);
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
		Column	   *c = palloc(sizeof(Column));

		*c = column_of(t, get_attname(t->relid, idx->indkey.values[i], false));
		cols = lappend(cols, c);
	}
	ReleaseSysCache(tup);
	return cols;
}

/* insert_once(target, row, conflict_columns) -> (inserted, row) */
PG_FUNCTION_INFO_V1(idempotency_insert_once);

Datum
idempotency_insert_once(PG_FUNCTION_ARGS)
{
	Target		t = target_of(PG_GETARG_OID(0));
	Jsonb	   *row;
	List	   *cols;
	List	   *keys = NIL;
	ListCell   *lc;
	StringInfoData sig;
	HelperPlan *p;
	bool		fresh;
	Oid			argtypes[1] = {JSONBOID};
	Datum		values[1];
	TupleDesc	tupdesc;
	Datum		result[2];
	bool		nulls[2] = {false, false};
	MemoryContext caller_cxt = CurrentMemoryContext;
	int			tries;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("row must not be null")));
	row = PG_GETARG_JSONB_P(1);
	cols = object_columns(&t, row, "row");
	if (cols == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("row must name at least one column")));

	if (PG_ARGISNULL(2))
		keys = primary_key_columns(&t);
	else
	{
		ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(2);
		Datum	   *elems;
		bool	   *elnulls;
		int			n,
					i;

		deconstruct_array(arr, NAMEOID, NAMEDATALEN, false, TYPALIGN_CHAR,
						  &elems, &elnulls, &n);
		if (n == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("conflict_columns must not be empty")));
		for (i = 0; i < n; i++)
		{
			Column	   *c = palloc(sizeof(Column));

			if (elnulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("conflict_columns must not contain NULL")));
			*c = column_of(&t, pstrdup(NameStr(*DatumGetName(elems[i]))));
			keys = lappend(keys, c);
		}
	}

	initStringInfo(&sig);
	appendStringInfoString(&sig, "insert_once");
	foreach(lc, cols)
		appendStringInfo(&sig, " %d", ((Column *) lfirst(lc))->attnum);
	appendStringInfoString(&sig, " on");
	foreach(lc, keys)
		appendStringInfo(&sig, " %d", ((Column *) lfirst(lc))->attnum);
	p = plan_entry(t.relid, sig.data, &fresh);

	SPI_connect();
	if (fresh)
	{
		StringInfoData targets,
					sources,
					conflict,
					match;

		initStringInfo(&targets);
		initStringInfo(&sources);
		initStringInfo(&conflict);
		initStringInfo(&match);
		foreach(lc, cols)
		{
			Column	   *c = lfirst(lc);

			appendStringInfo(&targets, "%s%s", targets.len ? ", " : "", c->quoted);
			appendStringInfo(&sources, "%sr.%s", sources.len ? ", " : "", c->quoted);
		}
		foreach(lc, keys)
		{
			Column	   *c = lfirst(lc);

			appendStringInfo(&conflict, "%s%s", conflict.len ? ", " : "", c->quoted);
			appendStringInfo(&match, "%st.%s %s r.%s", match.len ? " AND " : "",
							 c->quoted, operator_sql(c->type, TYPECACHE_EQ_OPR), c->quoted);
		}
		idem_prepare(&p->work, psprintf("INSERT INTO %s AS t (%s)"
										" SELECT %s FROM pg_catalog.jsonb_populate_record(NULL::%s, $1) AS r"
										" ON CONFLICT (%s) DO NOTHING"
										" RETURNING pg_catalog.to_jsonb(t.*)",
										t.qualname, targets.data, sources.data, t.qualname,
										conflict.data),
							   1, argtypes);
		idem_prepare(&p->probe, psprintf("SELECT pg_catalog.to_jsonb(t.*) FROM %s AS t,"
										 " pg_catalog.jsonb_populate_record(NULL::%s, $1) AS r"
										 " WHERE %s",
										 t.qualname, t.qualname, match.data),
								1, argtypes);
		p->valid = true;
	}

	values[0] = JsonbPGetDatum(row);

	/*
	 * Insert, or read the row that holds the key.  If that row is deleted
	 * between the two, insert again (a few times at most).
	 */
	for (tries = 0;; tries++)
	{
		int			rc = run_plan(p->work, values, NULL);
		bool		isnull;

		if (rc != SPI_OK_INSERT_RETURNING)
			elog(ERROR, "insert_once insert failed: %s", SPI_result_code_string(rc));
		result[0] = BoolGetDatum(SPI_processed > 0);
		if (SPI_processed == 0)
		{
			rc = run_plan(p->probe, values, NULL);
			if (rc != SPI_OK_SELECT)
				elog(ERROR, "insert_once probe failed: %s", SPI_result_code_string(rc));
			if (SPI_processed == 0)
			{
				if (tries < 3)
					continue;
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not insert into or read the row of \"%s\" with that key",
								t.relname),
						 errdetail("The conflicting row kept disappearing."),
						 errhint("Retry the transaction.")));
			}
		}
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
