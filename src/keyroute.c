/*-------------------------------------------------------------------------
 *
 * keyroute.c
 *	  Citus: carry a call to the node of its key's shard, and run a
 *	  statement on a shard of this node as the extension's owner.
 *
 * On Citus no role but the extension's owner writes the key, token and
 * seen-message tables either: rows are written where their shard lives, as
 * the owner (keycitus.c for keys, idem_shard_exec() here for tokens and
 * seen messages).  A call whose shard is on another node is carried there
 * whole: the SQL function calls itself on that node, with the same
 * arguments and the caller's settings, in the caller's distributed
 * transaction, through a router query with a modifying CTE on an
 * always-empty co-located table (key_route, token_route), so Citus
 * includes that node in its two-phase commit.  A routed call does what the
 * same call on the shard's node does, no more.  The query and why each of
 * its parts: src/README.md, "Citus in detail".
 *
 * Locking: a carried call's UPDATE takes RowExclusiveLock on the route
 * table's shard and matches no row.  PUBLIC may UPDATE that one column and
 * nothing else (a column grant, which LOCK TABLE does not accept), so no
 * role can lock a route table and hold up the others' carried calls.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/regproc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* the route tables, by IdemRoute */
static const char *const route_sql[IDEM_NROUTES] = {
	"WITH r AS (UPDATE idempotency.key_route AS r SET k = r.k"
	" WHERE r.k OPERATOR(pg_catalog.=) $1 RETURNING r.k)",
	"WITH r AS (UPDATE idempotency.token_route AS r SET t = r.t"
	" WHERE r.t OPERATOR(pg_catalog.=) $1 RETURNING r.t)"
};
static const Oid route_type[IDEM_NROUTES] = {TEXTOID, UUIDOID};

/*
 * The caller's settings that a call acts on, carried with it: the carried
 * call runs in the session Citus keeps on the shard's node, whose settings
 * are the server's, not the ones the caller SET in its own session (before,
 * a role's SET idempotency.default_ttl = 3600 gave its keys and message ids
 * the server's day when carried, and its lock_wait was not honoured).  The
 * route query sets them there for the rest of the transaction (set_config
 * is_local), before the function runs: in the subquery c, whose volatile
 * target list the planner neither pulls up nor prunes, from columns of s,
 * so that Citus does not evaluate them on the node that plans the query.
 */
static const struct
{
	const char *name;
	const int  *value;
}			carried[] = {
	{"idempotency.default_ttl", &idem_default_ttl_s},
	{"idempotency.lock_wait", &idem_lock_wait_ms},
	{"idempotency.max_key_length", &idem_max_key_length},
};
#define NCARRIED ((int) lengthof(carried))

/*
 * Citus: is the shard of the key table row of id on another node?  (Then
 * the call must be carried there: idem_route_call.)  When it is here, its
 * metadata lock is taken (shard.c).
 */
bool
idem_route_key(const KeyId *id)
{
	Oid			shard_relid;

	if (!idem_keystore_distributed(id))
		return false;
	return idem_local_shard(idem_store.relid, id, &shard_relid) == 0;
}

/* the same for table t, whose distribution value is value (text form) */
bool
idem_route_table(IdemTable t, const char *value, int len)
{
	KeyId		v;
	Oid			shard_relid;

	if (!idem_table_distributed(t))
		return false;
	memset(&v, 0, sizeof(v));
	v.key = value;
	v.key_len = len;
	v.scope = "";
	return idem_local_shard(idem_table_relid(t), &v, &shard_relid) == 0;
}

/*
 * Is this backend running a task a Citus node sent it (a carried call
 * among them)?  Citus names its connections "citus_internal gpid=..."
 * (CITUS_APPLICATION_NAME_PREFIX).  Only a hint: a client may call itself
 * that too.
 */
bool
idem_route_arrived(void)
{
	const char *name = GetConfigOption("application_name", true, false);

	return name != NULL && strncmp(name, "citus_internal gpid=", 20) == 0;
}

/*
 * Call function fn (its qualified name) with nargs arguments of types
 * argtypes on the node of the shard group of value (of type
 * route_type[via]): see src/README.md, "Citus in detail".  *cache keeps
 * the plan (one per call site).  Returns its result, of type rettype, in
 * the caller's memory context; *isnull when it is null.
 */
Datum
idem_route_exec(IdemRoute via, Datum value, const char *fn, int nargs,
				const Oid *argtypes, const Datum *args, const bool *argnulls,
				Oid rettype, SPIPlanPtr *cache, bool *isnull)
{
	int			nparams = nargs + 1 + NCARRIED;
	Oid		   *types = palloc(sizeof(Oid) * nparams);
	Datum	   *values = palloc(sizeof(Datum) * nparams);
	char	   *nulls = palloc(nparams + 1);
	Datum		result;
	int16		typlen;
	bool		typbyval;
	MemoryContext caller_cxt = CurrentMemoryContext;

	types[0] = route_type[via];
	values[0] = value;
	nulls[0] = ' ';
	for (int i = 0; i < nargs; i++)
	{
		types[i + 1] = argtypes[i];
		values[i + 1] = argnulls[i] ? (Datum) 0 : args[i];
		nulls[i + 1] = argnulls[i] ? 'n' : ' ';
	}
	/* the caller's settings, each as text (the GUC's base unit) */
	for (int i = 0; i < NCARRIED; i++)
	{
		types[nargs + 1 + i] = TEXTOID;
		values[nargs + 1 + i] = CStringGetTextDatum(psprintf("%d", *carried[i].value));
		nulls[nargs + 1 + i] = ' ';
	}
	nulls[nparams] = '\0';

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (*cache == NULL)
	{
		StringInfoData sql;
		SPIPlanPtr	plan;

		/* the arguments positional, through the subquery's columns */
		initStringInfo(&sql);
		appendStringInfo(&sql, "%s SELECT %s(", route_sql[via], fn);
		for (int i = 0; i < nargs; i++)
			appendStringInfo(&sql, "%sc.a%d", i ? ", " : "", i + 1);
		appendStringInfoString(&sql, ") FROM (SELECT ");
		for (int i = 0; i < nargs; i++)
			appendStringInfo(&sql, "%s$%d AS a%d", i ? ", " : "", i + 2, i + 1);
		for (int i = 0; i < NCARRIED; i++)
			appendStringInfo(&sql, "%spg_catalog.set_config('%s', s.g%d, true) AS g%d",
							 (i || nargs) ? ", " : "", carried[i].name, i, i);
		appendStringInfoString(&sql, " FROM (SELECT pg_catalog.count(*)");
		for (int i = 0; i < NCARRIED; i++)
			appendStringInfo(&sql, ", $%d AS g%d", nargs + 2 + i, i);
		appendStringInfoString(&sql, " FROM r) AS s) AS c");

		/*
		 * A custom plan for each call: Citus cannot plan the modifying CTE of
		 * a generic plan (its parameters unknown), and prunes a custom one to
		 * the route's shard group.
		 */
		plan = SPI_prepare_cursor(sql.data, nparams, types, CURSOR_OPT_CUSTOM_PLAN);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*cache = plan;
		pfree(sql.data);
	}
	if (SPI_execute_plan(*cache, values, nulls, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "idempotency: the routed call of %s returned " UINT64_FORMAT " rows",
			 fn, (uint64) SPI_processed);
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
	get_typlenbyval(rettype, &typlen, &typbyval);
	if (!*isnull)
	{
		MemoryContext spi_cxt = MemoryContextSwitchTo(caller_cxt);

		result = datumCopy(result, typbyval, typlen);
		MemoryContextSwitchTo(spi_cxt);
	}
	SPI_finish();
	return *isnull ? (Datum) 0 : result;
}

/*
 * Call the SQL function of fcinfo again, with the same arguments, on the
 * node of the shard group of value: idem_route_exec().  Returns the
 * function's result there.
 */
Datum
idem_route_call(FunctionCallInfo fcinfo, IdemRoute via, Datum value,
				SPIPlanPtr *cache)
{
	Oid			fn = fcinfo->flinfo->fn_oid;
	int			nargs = PG_NARGS();
	Datum	   *args = palloc(sizeof(Datum) * Max(nargs, 1));
	bool	   *argnulls = palloc(sizeof(bool) * Max(nargs, 1));
	Oid		   *declared;
	int			ndeclared;
	Oid			rettype;
	char	   *name;
	char	   *paren;
	Datum		result;
	bool		isnull;

	rettype = get_func_signature(fn, &declared, &ndeclared);
	if (ndeclared != nargs)
		elog(ERROR, "idempotency: cannot route function %u: %d arguments, %d declared",
			 fn, nargs, ndeclared);
	for (int i = 0; i < nargs; i++)
	{
		argnulls[i] = PG_ARGISNULL(i);
		args[i] = argnulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	/* the function by its qualified name (without its argument types) */
	name = format_procedure_qualified(fn);
	paren = strchr(name, '(');
	if (paren)
		*paren = '\0';
	result = idem_route_exec(via, value, name, nargs, declared, args, argnulls,
							 rettype, cache, &isnull);
	if (isnull)
		PG_RETURN_NULL();
	return result;
}

/*
 * Citus: run sql, a statement on table t of the extension (named in it as
 * shell, e.g. "idempotency.token"), on the shard of value when that shard
 * is on this node, as the extension's owner (inside SPI).  Returns false,
 * running nothing, when the shard is not here; else true with *processed
 * the rows processed.  Planned afresh each time (the text names the shard).
 */
bool
idem_shard_exec(IdemTable t, const char *value, int len, const char *shell,
				const char *sql, int nargs, Oid *argtypes, Datum *values,
				const char *nulls, int expect_rc, uint64 *processed)
{
	KeyId		v;
	Oid			shard_relid;
	const char *at = strstr(sql, shell);
	char	   *nsp;
	char	   *rel;
	StringInfoData buf;

	memset(&v, 0, sizeof(v));
	v.key = value;
	v.key_len = len;
	v.scope = "";
	if (idem_local_shard(idem_table_relid(t), &v, &shard_relid) == 0)
		return false;
	nsp = get_namespace_name(get_rel_namespace(shard_relid));
	rel = get_rel_name(shard_relid);
	if (at == NULL || nsp == NULL || rel == NULL)
		elog(ERROR, "idempotency: a shard of %s is gone", shell);
	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, sql, at - sql);
	appendStringInfoString(&buf, quote_qualified_identifier(nsp, rel));
	appendStringInfoString(&buf, at + strlen(shell));
	*processed = idem_run_as_owner_once(buf.data, nargs, argtypes, values,
										nulls, expect_rc);
	pfree(buf.data);
	return true;
}
