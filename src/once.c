/*-------------------------------------------------------------------------
 *
 * once.c
 *	  One round trip: idempotency.once().
 *
 * once(key, request, sql, VARIADIC args) is begin() -> the work ->
 * complete() in one statement, so a client sends a guarded request as one
 * statement in autocommit: the key is validated (IK003) and the work's
 * plan found (one SELECT/INSERT/UPDATE/DELETE/MERGE, else refused before
 * anything happens); idem_guard_begin() (guard.c) decides; a replay returns
 * the stored response and runs nothing; new work runs with SPI as the
 * caller (SECURITY INVOKER: the caller's privileges, row-level security
 * and search_path), its rows become the response, and idem_guard_finish()
 * stores it.  An error in the work aborts the statement: nothing is
 * stored and the key stays free.
 *
 * The response: a single json or jsonb column's value as it is, else the
 * row as a jsonb object; several rows an array, no row null.  String
 * arguments (text, varchar, unknown: what drivers send untyped) get the
 * types the statement decides, as untyped bind parameters do; hence the
 * two forms, VARIADIC text[] and VARIADIC "any".  Plans are kept per
 * (statement, argument types, search_path, role), at most
 * ONCE_PLAN_CACHE_SIZE, the least recently used freed first; the details:
 * src/README.md, "once()".
 *
 * Locking: the key lock, as begin() takes it: held from the guard's begin
 * to the end of the transaction, given back at once by a replay; none here
 * for a call carried to another Citus node.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/ilist.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/analyze.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "guard.h"
#include "idempotency.h"
#include "keystore.h"

#define ONCE_PLAN_CACHE_SIZE 64

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */

/* One kept plan of the work, per (statement, types, search_path, role) */
typedef struct OncePlan
{
	uint64		hash;			/* hash key: plan_hash() */
	dlist_node	lru;			/* in plan_lru, most recently used first */
	MemoryContext cxt;			/* the rest lives here (a child of plan_cxt),
								 * with the input functions' fn_extra state */
	char	   *sql;
	char	   *search_path;	/* the search_path and role it was analysed */
	Oid			userid;			/* under: they decide untyped arguments' types */
	int			nargs;
	Oid		   *argtypes;		/* as given */
	Oid		   *paramtypes;		/* as the statement decided them */
	bool	   *untyped;		/* string argument converted to paramtypes[i] */
	FmgrInfo   *infuncs;		/* input functions of untyped arguments */
	Oid		   *ioparams;
	SPIPlanPtr	plan;
	int			busy;			/* executions under way (a work statement may
								 * call once() again): never freed then */
} OncePlan;

static HTAB *plan_cache = NULL;
static dlist_head plan_lru = DLIST_STATIC_INIT(plan_lru);
static int	plan_count = 0;
static MemoryContext plan_cxt = NULL;

/* to_jsonb(record), called with a FuncExpr that tells it the argument type */
static FmgrInfo to_jsonb_finfo;
static bool to_jsonb_ready = false;

static const char *const outcome_names[] = {"new", "retry", "replay"};

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/* a string argument: its type is decided by the statement */
static bool
is_string_type(Oid type)
{
	return type == TEXTOID || type == VARCHAROID || type == UNKNOWNOID;
}

static uint64
plan_hash(const char *sql, int nargs, const Oid *argtypes)
{
	uint64		h = hash_bytes_extended((const unsigned char *) sql, strlen(sql),
										(uint64) nargs);

	/* the types the statement decides depend on search_path and the role */
	h = hash_bytes_extended((const unsigned char *) namespace_search_path,
							strlen(namespace_search_path), h ^ GetUserId());
	if (nargs > 0)
		h = hash_bytes_extended((const unsigned char *) argtypes,
								nargs * sizeof(Oid), h);
	return h;
}

static void
plan_free(OncePlan *p)
{
	bool		found;

	dlist_delete(&p->lru);
	if (p->plan)
		SPI_freeplan(p->plan);
	/* with whatever the input functions kept (a domain's ExprContext ...) */
	MemoryContextDelete(p->cxt);
	plan_count--;
	hash_search(plan_cache, &p->hash, HASH_REMOVE, &found);
}

/* errors in the work's text point into that text, as SPI's do */
static void
work_error_callback(void *arg)
{
	int			pos = geterrposition();

	if (pos > 0)
	{
		errposition(0);
		internalerrposition(pos);
		internalerrquery((const char *) arg);
	}
	else
		errcontext("statement of idempotency.once(): \"%s\"", (const char *) arg);
}

/*
 * Refuse anything but one SELECT, INSERT, UPDATE, DELETE or MERGE (42601
 * for several statements, 0A000 for another kind), and decide the types
 * of the string arguments: *paramtypes gets nargs types.
 */
static void
analyse_work(const char *sql, int nargs, const Oid *argtypes, Oid *paramtypes)
{
	List	   *raw;
	RawStmt    *rs;
	Oid		   *types;
	int			ntypes = nargs;
	Query	   *query;
	NodeTag		tag;
	ErrorContextCallback errcb;

	errcb.callback = work_error_callback;
	errcb.arg = (void *) sql;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	raw = pg_parse_query(sql);

	if (list_length(raw) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("idempotency.once() runs exactly one SQL statement"),
				 errdetail("The statement text holds %d statements.", list_length(raw)),
				 errhint("Put several writes into one statement with a WITH clause, or call a function.")));
	rs = linitial_node(RawStmt, raw);
	tag = nodeTag(rs->stmt);
	if (tag != T_SelectStmt && tag != T_InsertStmt && tag != T_UpdateStmt &&
		tag != T_DeleteStmt && !IDEM_IS_MERGE_TAG(tag))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idempotency.once() cannot run %s", CreateCommandName(rs->stmt)),
				 errdetail("The work must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement."),
				 errhint("Call a function or procedure from a SELECT for other work.")));

	types = palloc0(sizeof(Oid) * Max(nargs, 1));
	for (int i = 0; i < nargs; i++)
		types[i] = is_string_type(argtypes[i]) ? InvalidOid : argtypes[i];
	query = IDEM_PARSE_ANALYZE_VARPARAMS(rs, sql, &types, &ntypes);
	if (query->utilityStmt != NULL || query->commandType == CMD_UTILITY)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idempotency.once() cannot run %s",
						CreateCommandName(query->utilityStmt ? query->utilityStmt : rs->stmt)),
				 errdetail("The work must be one SELECT, INSERT, UPDATE, DELETE or MERGE statement.")));
	if (ntypes > nargs)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_PARAMETER),
				 errmsg("the statement of idempotency.once() uses $%d, but %d argument%s given",
						ntypes, nargs, nargs == 1 ? " was" : "s were")));
	for (int i = 0; i < nargs; i++)
		paramtypes[i] = (types[i] == InvalidOid || types[i] == UNKNOWNOID) ?
			TEXTOID : types[i];
	error_context_stack = errcb.previous;
}

/*
 * The kept plan of sql with these argument types: from the cache, or
 * analysed and prepared now (connecting to SPI for it).
 */
static OncePlan *
plan_for(const char *sql, int nargs, const Oid *argtypes)
{
	uint64		hash = plan_hash(sql, nargs, argtypes);
	OncePlan   *p;
	bool		found;
	Oid		   *paramtypes;
	Oid		   *infuncs;
	Oid		   *ioparams;
	SPIPlanPtr	plan;
	MemoryContext old;

	if (plan_cache == NULL)
	{
		HASHCTL		ctl;

		plan_cxt = AllocSetContextCreate(CacheMemoryContext,
										 "idempotency once() plans",
										 ALLOCSET_SMALL_SIZES);
		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(OncePlan);
		ctl.hcxt = plan_cxt;
		plan_cache = hash_create("idempotency once() plans", ONCE_PLAN_CACHE_SIZE,
								 &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}

	p = hash_search(plan_cache, &hash, HASH_FIND, NULL);
	if (p != NULL)
	{
		bool		same = p->nargs == nargs && strcmp(p->sql, sql) == 0 &&
			p->userid == GetUserId() &&
			strcmp(p->search_path, namespace_search_path) == 0 &&
			(nargs == 0 || memcmp(p->argtypes, argtypes, sizeof(Oid) * nargs) == 0);

		/*
		 * A plan in use by an outer once() is used as it is (SPI revalidates
		 * it); one with another text under the same hash is not cached.
		 */
		if (same && (p->busy > 0 || SPI_plan_is_valid(p->plan)))
		{
			dlist_move_head(&plan_lru, &p->lru);
			return p;
		}
		if (p->busy > 0)		/* two texts, one 64-bit hash, one running */
			elog(ERROR, "idempotency.once() plan cache collision");
		plan_free(p);			/* stale, or another text with the same hash */
	}

	/*
	 * Decide the types, look up their input functions and prepare; errors
	 * here leave the cache as it was.
	 */
	paramtypes = palloc(sizeof(Oid) * Max(nargs, 1));
	infuncs = palloc0(sizeof(Oid) * Max(nargs, 1));
	ioparams = palloc0(sizeof(Oid) * Max(nargs, 1));
	analyse_work(sql, nargs, argtypes, paramtypes);
	for (int i = 0; i < nargs; i++)
		if (is_string_type(argtypes[i]))
			getTypeInputInfo(paramtypes[i], &infuncs[i], &ioparams[i]);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	plan = SPI_prepare(sql, nargs, paramtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	SPI_finish();

	/* evict the least recently used plan not in use, when full */
	if (plan_count >= ONCE_PLAN_CACHE_SIZE)
	{
		dlist_iter	it;

		dlist_reverse_foreach(it, &plan_lru)
		{
			OncePlan   *old_p = dlist_container(OncePlan, lru, it.cur);

			if (old_p->busy == 0)
			{
				plan_free(old_p);
				break;
			}
		}
	}

	p = hash_search(plan_cache, &hash, HASH_ENTER, &found);
	p->cxt = AllocSetContextCreate(plan_cxt, "idempotency once() plan",
								   ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(p->cxt);
	p->hash = hash;
	p->sql = pstrdup(sql);
	p->search_path = pstrdup(namespace_search_path);
	p->userid = GetUserId();
	p->nargs = nargs;
	p->plan = plan;
	p->busy = 0;
	if (nargs > 0)
	{
		p->argtypes = palloc(sizeof(Oid) * nargs);
		memcpy(p->argtypes, argtypes, sizeof(Oid) * nargs);
		p->paramtypes = palloc(sizeof(Oid) * nargs);
		memcpy(p->paramtypes, paramtypes, sizeof(Oid) * nargs);
		p->untyped = palloc0(sizeof(bool) * nargs);
		p->infuncs = palloc0(sizeof(FmgrInfo) * nargs);
		p->ioparams = palloc0(sizeof(Oid) * nargs);
		for (int i = 0; i < nargs; i++)
		{
			if (!is_string_type(argtypes[i]))
				continue;
			p->untyped[i] = true;
			p->ioparams[i] = ioparams[i];
			fmgr_info_cxt(infuncs[i], &p->infuncs[i], p->cxt);
		}
	}
	MemoryContextSwitchTo(old);
	dlist_push_head(&plan_lru, &p->lru);
	plan_count++;
	pfree(paramtypes);
	pfree(infuncs);
	pfree(ioparams);
	return p;
}

/* the jsonb value of row `row` of SPI's result (see the file comment) */
static Jsonb *
row_value(SPITupleTable *tt, uint64 row)
{
	TupleDesc	td = tt->tupdesc;
	HeapTuple	tup = tt->vals[row];
	int			only = -1;
	int			live = 0;

	for (int i = 0; i < td->natts; i++)
		if (!TupleDescAttr(td, i)->attisdropped)
		{
			only = i;
			live++;
		}
	if (live == 1)
	{
		Oid			type = TupleDescAttr(td, only)->atttypid;
		bool		isnull;
		Datum		d;

		if (type == JSONBOID || type == JSONOID)
		{
			d = heap_getattr(tup, only + 1, td, &isnull);
			if (isnull)
				return NULL;
			if (type == JSONBOID)
				return DatumGetJsonbPCopy(d);
			return DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
													  CStringGetDatum(TextDatumGetCString(d))));
		}
	}

	if (!to_jsonb_ready)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		fmgr_info(F_TO_JSONB, &to_jsonb_finfo);
		to_jsonb_finfo.fn_expr = (Node *)
			makeFuncExpr(F_TO_JSONB, JSONBOID,
						 list_make1(makeNullConst(RECORDOID, -1, InvalidOid)),
						 InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
		MemoryContextSwitchTo(old);
		to_jsonb_ready = true;
	}
	return DatumGetJsonbP(FunctionCall1(&to_jsonb_finfo,
										heap_copy_tuple_as_datum(tup, td)));
}

/* the response of the work's result (see the file comment), or NULL */
static Jsonb *
result_response(SPITupleTable *tt, uint64 nrows)
{
	JsonbParseState *state = NULL;
	JsonbValue *res = NULL;

	if (tt == NULL || nrows == 0)
		return NULL;
	BlessTupleDesc(tt->tupdesc);
	if (nrows == 1)
		return row_value(tt, 0);

	pushJsonbValue(&state, WJB_BEGIN_ARRAY, NULL);
	for (uint64 r = 0; r < nrows; r++)
	{
		Jsonb	   *v = row_value(tt, r);
		JsonbValue	jv;

		if (v == NULL)
		{
			jv.type = jbvNull;
			pushJsonbValue(&state, WJB_ELEM, &jv);
			continue;
		}
		jv.type = jbvBinary;
		jv.val.binary.data = &v->root;
		jv.val.binary.len = VARSIZE(v) - VARHDRSZ;
		pushJsonbValue(&state, WJB_ELEM, &jv);
	}
	res = pushJsonbValue(&state, WJB_END_ARRAY, NULL);
	return JsonbValueToJsonb(res);
}

/*
 * Citus, the key's shard on another node (keystore.c): the guard's two
 * steps run there, as the SQL functions begin(key, request) and
 * complete(key, response), each carried to that node in the caller's
 * transaction; the work runs here, between them.
 */
static void
route_begin(FunctionCallInfo fcinfo, GuardBegin *g)
{
	static SPIPlanPtr route = NULL;
	Oid			types[2] = {TEXTOID, JSONBOID};
	Datum		args[2] = {PG_GETARG_DATUM(0), PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1)};
	bool		nulls[2] = {false, PG_ARGISNULL(1)};
	bool		isnull;
	HeapTupleHeader row;
	Datum		d;
	char	   *outcome;

	d = idem_route_exec(IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), "idempotency.begin",
						2, types, args, nulls,
						RECORDOID, &route, &isnull);
	if (isnull)
		elog(ERROR, "idempotency.begin() returned null");
	row = DatumGetHeapTupleHeader(d);
	d = GetAttributeByNum(row, 1, &isnull);
	outcome = isnull ? "" : TextDatumGetCString(d);
	memset(g, 0, sizeof(GuardBegin));
	g->outcome = strcmp(outcome, "replay") == 0 ? GUARD_REPLAY :
		strcmp(outcome, "retry") == 0 ? GUARD_RETRY : GUARD_NEW;
	d = GetAttributeByNum(row, 3, &isnull);
	g->response = isnull ? NULL : DatumGetJsonbP(d);
}

static void
route_complete(FunctionCallInfo fcinfo, Jsonb *response)
{
	static SPIPlanPtr route = NULL;
	Oid			types[2] = {TEXTOID, JSONBOID};
	Datum		args[2] = {PG_GETARG_DATUM(0), response ? JsonbPGetDatum(response) : (Datum) 0};
	bool		nulls[2] = {false, response == NULL};
	bool		isnull;

	(void) idem_route_exec(IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), "idempotency.complete",
						   2, types, args, nulls, VOIDOID, &route, &isnull);
}

/*
 * The common part of both once() forms: arguments 0..2 are key, request
 * and sql; the work's nargs arguments are in values/nulls/types.
 */
static Datum
once_run(FunctionCallInfo fcinfo, int nargs, Datum *values, bool *nulls,
		 Oid *types)
{
	KeyId		id;
	char	   *sql;
	GuardBegin	g;
	Datum		result[2];
	bool		rnulls[2] = {false, false};
	Jsonb	   *response;
	MemoryContext caller_cxt = CurrentMemoryContext;
	OncePlan   *volatile running;
	volatile bool routed = false;

	/* the key, in the default scope '' (IK003) */
	id = idem_make_keyid(PG_ARGISNULL(0) ? NULL : PG_GETARG_TEXT_PP(0),
						 cstring_to_text(""), "idempotency key");
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("the statement of idempotency.once() must not be null")));
	sql = text_to_cstring(PG_GETARG_TEXT_PP(2));

	/* the work is checked and prepared before anything else happens */
	running = plan_for(sql, nargs, types);

	/*
	 * From here on the plan is in use: a nested once() (from a domain's CHECK
	 * in an argument's input function, or from the work itself) must not
	 * evict or free it.
	 */
	running->busy++;
	PG_TRY();
	{
		idem_guard_begin(&id, PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1),
						 NULL, NULL, &g);
		/* Citus: the key's shard on another node: begin() runs there */
		routed = g.outcome == GUARD_ROUTED;
		if (routed)
			route_begin(fcinfo, &g);

		if (g.outcome == GUARD_REPLAY)
			response = g.response;
		else
		{
			Datum	   *pvalues = palloc(sizeof(Datum) * Max(nargs, 1));
			char	   *pnulls = palloc(Max(nargs, 1));
			int			rc;

			for (int i = 0; i < nargs; i++)
			{
				pnulls[i] = nulls[i] ? 'n' : ' ';
				if (nulls[i])
					pvalues[i] = (Datum) 0;
				else if (running->untyped[i])
				{
					char	   *s = types[i] == UNKNOWNOID ? DatumGetCString(values[i]) :
						TextDatumGetCString(values[i]);

					pvalues[i] = InputFunctionCall(&running->infuncs[i], s, running->ioparams[i], -1);
				}
				else
					pvalues[i] = values[i];
			}
			if (SPI_connect() != SPI_OK_CONNECT)
				elog(ERROR, "SPI_connect failed");
			rc = SPI_execute_plan(running->plan, pvalues, pnulls, false, 0);
			if (rc < 0)
				elog(ERROR, "the statement of idempotency.once() failed: %s",
					 SPI_result_code_string(rc));
			{
				MemoryContext spi_cxt = MemoryContextSwitchTo(caller_cxt);

				response = result_response(SPI_tuptable, SPI_processed);
				MemoryContextSwitchTo(spi_cxt);
			}
			SPI_finish();
		}
	}
	PG_FINALLY();
	{
		running->busy--;
	}
	PG_END_TRY();

	if (g.outcome != GUARD_REPLAY && routed)
		route_complete(fcinfo, response);
	else if (g.outcome != GUARD_REPLAY)
		idem_guard_finish(&id, HELD_COMPLETED, response, false, false, 0);

	result[0] = CStringGetTextDatum(outcome_names[g.outcome]);
	if (response)
		result[1] = JsonbPGetDatum(response);
	else
		rnulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(idem_result_desc(fcinfo),
													  result, rnulls)));
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/* once(key, request, sql, VARIADIC args text[]) -> (outcome, response) */
PG_FUNCTION_INFO_V1(idempotency_once_text);

Datum
idempotency_once_text(PG_FUNCTION_ARGS)
{
	int			nargs = 0;
	Datum	   *values = NULL;
	bool	   *nulls = NULL;
	Oid		   *types;

	if (!PG_ARGISNULL(3))
	{
		ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(3);

		if (ARR_NDIM(arr) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("the arguments of idempotency.once() must be a one-dimensional array")));
		deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
						  &values, &nulls, &nargs);
	}
	types = palloc(sizeof(Oid) * Max(nargs, 1));
	for (int i = 0; i < nargs; i++)
		types[i] = TEXTOID;
	return once_run(fcinfo, nargs, values, nulls, types);
}

/* once(key, request, sql, VARIADIC args "any") -> (outcome, response) */
PG_FUNCTION_INFO_V1(idempotency_once_any);

Datum
idempotency_once_any(PG_FUNCTION_ARGS)
{
	int			nargs;
	Datum	   *values;
	bool	   *nulls;
	Oid		   *types;

	if (get_fn_expr_variadic(fcinfo->flinfo))
	{
		/* once(..., VARIADIC array): the elements are the arguments */
		Oid			elemtype;
		int16		typlen;
		bool		typbyval;
		char		typalign;

		nargs = 0;
		values = NULL;
		nulls = NULL;
		if (PG_ARGISNULL(3))
			elemtype = TEXTOID;
		else
		{
			ArrayType  *arr = PG_GETARG_ARRAYTYPE_P(3);

			elemtype = ARR_ELEMTYPE(arr);
			if (ARR_NDIM(arr) > 1)
				ereport(ERROR,
						(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
						 errmsg("the arguments of idempotency.once() must be a one-dimensional array")));
			get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
			deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
							  &values, &nulls, &nargs);
		}
		types = palloc(sizeof(Oid) * Max(nargs, 1));
		for (int i = 0; i < nargs; i++)
			types[i] = elemtype;
	}
	else
	{
		nargs = PG_NARGS() - 3;
		values = palloc(sizeof(Datum) * Max(nargs, 1));
		nulls = palloc(sizeof(bool) * Max(nargs, 1));
		types = palloc(sizeof(Oid) * Max(nargs, 1));
		for (int i = 0; i < nargs; i++)
		{
			types[i] = get_fn_expr_argtype(fcinfo->flinfo, i + 3);
			if (!OidIsValid(types[i]))
				elog(ERROR, "could not determine the type of argument %d", i + 4);
			values[i] = PG_GETARG_DATUM(i + 3);
			nulls[i] = PG_ARGISNULL(i + 3);
		}
	}
	return once_run(fcinfo, nargs, values, nulls, types);
}
