/*-------------------------------------------------------------------------
 *
 * machine.c
 *	  State machines: create_machine() and transition().
 *
 * Design: a machine is a row of idempotency.state_machine: an object from
 * each state to the array of states it may move to.  create_machine()
 * checks its shape in one pass (a hash set per state finds a target listed
 * twice; the loop checks for interrupts, so statement_timeout and
 * pg_cancel_backend() stop a huge definition) and upserts it as the
 * extension's owner (idem_run_as_owner, runas.c), for the role that defined it only.
 *
 * transition() is one conditional UPDATE, run as the caller (SECURITY
 * INVOKER): the row with the id (a parameter of the id column's own type,
 * converted exactly by target.c) moves to to_state if the machine lists its
 * current state as a predecessor, or, without a machine, if to_state is
 * greater (integer states only).  Only when it changed nothing does a probe
 * find out why, and it reads the row and the machine in the same statement
 * (a join, the transitions detoasted only when a move is refused):
 * already there (applied by an earlier call), no such row (P0002), no such
 * machine (42704), a broken machine row (55000) or a move the machine does
 * not allow (IK005).  to_state is read by the state column type's input
 * function before anything runs, so a label the type does not have is the
 * type's own error; state columns of other types than strings, enums and
 * integers are refused (42804).  "Already there" is the state type's own
 * equality (an integer column at 5 is already at '05'), never a comparison
 * of texts; integer and enum states are spelled as the type spells them
 * before they are matched with a machine's (text) states.
 *
 * Locking: the UPDATE's row lock, and PostgreSQL's recheck of the WHERE
 * clause after waiting for a concurrent writer of the row, make concurrent
 * identical calls come out as exactly one applied and the others already.
 * A probe may see a state that changed after the UPDATE looked; if the move
 * is allowed from what it sees, the UPDATE runs again (three times at most).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/typcache.h"

#include "idempotency.h"
#include "keystore.h"
#include "target.h"

/* Longest machine name in bytes: the primary key indexes it */
#define MAX_MACHINE_BYTES 1024

/* Characters of a rejected machine name shown in messages */
#define MACHINE_NAME_CLIP 40

static SPIPlanPtr plan_machine_upsert = NULL;

/*
 * On Citus (a reference table) the owner is compared with the inserted
 * one, which each node reads by name: role oids differ between nodes
 * (keycitus.h: IDEM_OWNER_EQ_CITUS)
 */
static SPIPlanPtr plan_machine_upsert_citus = NULL;

#define UPSERT_SQL(owner_eq, param) \
	"INSERT INTO idempotency.state_machine AS m (machine, transitions, owner, updated_at)" \
	" VALUES ($1, $2, $3, pg_catalog.now())" \
	" ON CONFLICT (machine) DO UPDATE" \
	"   SET transitions = EXCLUDED.transitions, updated_at = EXCLUDED.updated_at" \
	" WHERE " owner_eq("m.owner", param) " OR $4"

/* ---------------------------------------------------------------------
 * Checking a definition
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

/* one target of one state, pointing into the jsonb */
typedef struct TargetKey
{
	int			state;			/* ordinal of the state in the object */
	int			len;
	const char *name;
} TargetKey;

static uint32
target_hash(const void *key, Size keysize pg_attribute_unused())
{
	const TargetKey *k = key;

	return hash_combine(hash_bytes((const unsigned char *) k->name, k->len),
						(uint32) k->state);
}

static int
target_match(const void *key1, const void *key2, Size keysize pg_attribute_unused())
{
	const TargetKey *a = key1;
	const TargetKey *b = key2;

	if (a->state != b->state || a->len != b->len)
		return 1;
	return memcmp(a->name, b->name, a->len);
}

/* Check the shape of a transitions object (see bad_machine), in one pass. */
static void
check_transitions(const char *machine, Jsonb *jb)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	int			state = 0;
	char	   *from = NULL;
	HTAB	   *seen;
	HASHCTL		ctl;

	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_COUNT(jb) == 0)
		bad_machine(machine, "The transitions must be a non-empty JSON object.");

	ctl.keysize = sizeof(TargetKey);
	ctl.entrysize = sizeof(TargetKey);
	ctl.hash = target_hash;
	ctl.match = target_match;
	ctl.hcxt = CurrentMemoryContext;
	seen = hash_create("idempotency machine targets", 256, &ctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		CHECK_FOR_INTERRUPTS();
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
				state++;
				break;
			case WJB_VALUE:
				bad_machine(machine, psprintf("The transitions of state \"%s\" must be an array of state names.", from));
				break;
			case WJB_BEGIN_ARRAY:
				if (depth++ != 1)
					bad_machine(machine, psprintf("The transitions of state \"%s\" must be an array of state names, not nested arrays.", from));
				break;
			case WJB_END_ARRAY:
				depth--;
				break;
			case WJB_ELEM:
				{
					TargetKey	key;
					bool		found;

					if (v.type != jbvString || v.val.string.len == 0)
						bad_machine(machine, psprintf("State \"%s\" lists a target that is not a non-empty string.", from));
					key.state = state;
					key.len = v.val.string.len;
					key.name = v.val.string.val;
					hash_search(seen, &key, HASH_ENTER, &found);
					if (found)
						bad_machine(machine, psprintf("State \"%s\" lists \"%s\" twice.", from,
													  pnstrdup(key.name, key.len)));
					break;
				}
			default:
				break;
		}
	}
	hash_destroy(seen);
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

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
	if (strlen(machine) > MAX_MACHINE_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("state machine name \"%s...\" is too long",
						pnstrdup(machine, pg_mbcliplen(machine, strlen(machine), MACHINE_NAME_CLIP))),
				 errdetail("The name is %zu bytes; the limit is %d.", strlen(machine), MAX_MACHINE_BYTES)));
	if (PG_ARGISNULL(1))
		bad_machine(machine, "The transitions are NULL.");
	transitions = PG_GETARG_JSONB_P(1);
	check_transitions(machine, transitions);

	values[0] = CStringGetTextDatum(machine);
	values[1] = JsonbPGetDatum(transitions);
	values[2] = ObjectIdGetDatum(GetUserId());
	values[3] = BoolGetDatum(superuser());

	SPI_connect();
	if (idem_table_distributed(IDEM_TABLE_MACHINE)) /* the owner as inserted */
		n = idem_run_as_owner(&plan_machine_upsert_citus,
							  UPSERT_SQL(IDEM_OWNER_EQ, "EXCLUDED.owner"),
							  4, argtypes, values, NULL, SPI_OK_INSERT);
	else
		n = idem_run_as_owner(&plan_machine_upsert, UPSERT_SQL(IDEM_OWNER_EQ, "$3"),
							  4, argtypes, values, NULL, SPI_OK_INSERT);
	SPI_finish();
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("state machine \"%s\" belongs to another role", machine),
				 errdetail("Only the role that defined a state machine, or a superuser, may redefine it.")));
	PG_RETURN_VOID();
}

/*
 * The transitions of machine from the probe's third column; 55000 for a
 * row a DBA broke (NULL, or not an object).
 */
static Jsonb *
probe_transitions(const char *machine, bool isnull, Datum d)
{
	Jsonb	   *jb = isnull ? NULL : DatumGetJsonbP(d);

	if (jb == NULL || !JB_ROOT_IS_OBJECT(jb))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("state machine \"%s\" in table idempotency.state_machine is broken", machine),
				 errdetail("Its transitions are %s, not a JSON object.",
						   jb == NULL ? "NULL" :
						   JB_ROOT_IS_ARRAY(jb) && !JB_ROOT_IS_SCALAR(jb) ? "a JSON array" : "a JSON scalar"),
				 errhint("Define it again with idempotency.create_machine().")));
	return jb;
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
		CHECK_FOR_INTERRUPTS();
		if (tok == WJB_KEY)
			from = pnstrdup(v.val.string.val, v.val.string.len);
		else if (tok == WJB_ELEM && from != NULL && v.type == jbvString &&
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

/* Refuse state columns transition() cannot compare as text (42804). */
static void
check_state_type(const IdemTarget *t, const IdemColumn *state)
{
	Oid			base = getBaseType(state->type);
	char		category;
	bool		preferred;

	get_type_category_preferred(base, &category, &preferred);
	if (category != TYPCATEGORY_STRING && category != TYPCATEGORY_ENUM &&
		!idem_is_integer_type(base))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("state column \"%s\" of table \"%s\" has type %s, which transition() does not support",
						state->name, t->relname, format_type_be(state->type)),
				 errdetail("A state column must be of a string type, an enum type or an integer type.")));
}

/* the probe's column col: the row is in to_state by the type's equality */
static bool
probe_already(int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, &isnull);

	return !isnull && DatumGetBool(d);
}

static Datum
transition_body(FunctionCallInfo fcinfo)
{
	IdemTarget	t = idem_target_arg(fcinfo, 0);
	const char *state_name = idem_name_arg(fcinfo, 4, "state_column");
	const char *id_name = idem_name_arg(fcinfo, 5, "id_column");
	IdemColumn	state = idem_column(&t, state_name);
	IdemColumn	idc = idem_column(&t, id_name);
	char	   *to_state;
	char	   *machine = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	bool		forward = machine == NULL;
	char	   *sig;
	IdemPlans	plans;
	Oid			argtypes[3];
	Datum		values[3];
	Datum		id;
	int			tries;

	if (state.attnum == idc.attnum)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("state column and id column must differ, both are \"%s\"", state.name),
				 errdetail("transition() would rewrite the column that identifies the row.")));
	id = idem_id_value(fcinfo, 1, &idc);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("to_state must not be null")));
	to_state = text_to_cstring(PG_GETARG_TEXT_PP(2));
	check_state_type(&t, &state);
	if (forward && !idem_is_integer_type(state.type))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a state machine is required for state column \"%s\" of type %s",
						state.name, format_type_be(state.type)),
				 errhint("Without a machine, transition() only moves integer states forward.")));

	/*
	 * A value the column cannot hold is the type's own error (22P02 ...). An
	 * integer or enum to_state is spelled as the type spells it ('05' is 5),
	 * so a machine's states, which are text, match it; strings stay as given
	 * (char(n) would pad them).
	 */
	{
		Oid			in,
					ioparam,
					out;
		bool		varlena;
		Datum		v;

		getTypeInputInfo(state.type, &in, &ioparam);
		v = OidInputFunctionCall(in, to_state, ioparam, state.typmod);
		if (idem_is_integer_type(getBaseType(state.type)) ||
			type_is_enum(getBaseType(state.type)))
		{
			getTypeOutputInfo(state.type, &out, &varlena);
			to_state = OidOutputFunctionCall(out, v);
		}
	}

	argtypes[0] = idc.type;
	argtypes[1] = TEXTOID;
	argtypes[2] = TEXTOID;
	sig = psprintf("transition %d %d %u %d %u", (int) forward, state.attnum,
				   state.type, idc.attnum, idc.type);

	SPI_connect();
	if (!idem_plans_fetch(t.relid, sig, &plans))
	{
		char	   *where = psprintf("t.%s %s $1", idc.quoted,
									 idem_operator_sql(idc.type, TYPECACHE_EQ_OPR));
		char	   *state_type = idem_type_sql(state.type, -1);

		/* already there: by the state type's equality, never as text */
		char	   *same = psprintf("t.%s %s $2::%s", state.quoted,
									idem_operator_sql(state.type, TYPECACHE_EQ_OPR),
									state_type);

		if (forward)
		{
			plans.work = idem_target_prepare(psprintf("UPDATE %s AS t SET %s = $2::%s WHERE %s AND t.%s %s $2::%s",
													  t.qualname, state.quoted, state_type, where,
													  state.quoted,
													  idem_operator_sql(state.type, TYPECACHE_LT_OPR),
													  state_type),
											 3, argtypes);
			plans.probe = idem_target_prepare(psprintf("SELECT t.%s::pg_catalog.text, %s FROM %s AS t WHERE %s",
													   state.quoted, same, t.qualname, where),
											  2, argtypes);
		}
		else
		{
			plans.work = idem_target_prepare(psprintf("UPDATE %s AS t SET %s = $2::%s WHERE %s"
													  " AND NOT (%s)"
													  " AND t.%s::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY("
													  "   SELECT e.key FROM idempotency.state_machine AS m,"
													  "          pg_catalog.jsonb_each(CASE WHEN pg_catalog.jsonb_typeof(m.transitions)"
													  "            OPERATOR(pg_catalog.=) 'object' THEN m.transitions END) AS e"
													  "    WHERE m.machine OPERATOR(pg_catalog.=) $3"
													  "      AND e.value OPERATOR(pg_catalog.?) $2))",
													  t.qualname, state.quoted, state_type, where,
													  same, state.quoted),
											 3, argtypes);
			/* the row's state and, in the same snapshot, the machine */
			plans.probe = idem_target_prepare(psprintf("SELECT t.%s::pg_catalog.text, m.machine IS NOT NULL, m.transitions, %s"
													   " FROM %s AS t LEFT JOIN idempotency.state_machine AS m"
													   "   ON m.machine OPERATOR(pg_catalog.=) $3"
													   " WHERE %s",
													   state.quoted, same, t.qualname, where),
											  3, argtypes);
		}
		idem_plans_store(t.relid, sig, &plans);
	}

	values[0] = id;
	values[1] = CStringGetTextDatum(to_state);
	values[2] = machine ? CStringGetTextDatum(machine) : (Datum) 0;

	for (tries = 0;; tries++)
	{
		int			rc;
		char	   *current;
		Jsonb	   *transitions;
		char	   *from;
		bool		allowed;
		bool		isnull;
		Datum		d;

		rc = SPI_execute_plan(plans.work, values, machine ? NULL : "  n", false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "transition update failed: %s", SPI_result_code_string(rc));
		if (SPI_processed > 0)
		{
			SPI_finish();
			PG_RETURN_TEXT_P(cstring_to_text("applied"));
		}

		idem_probe_row(plans.probe, values, fcinfo, &t, &idc, "transition");
		current = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		if (forward)
		{
			if (probe_already(2))
			{
				SPI_finish();
				PG_RETURN_TEXT_P(cstring_to_text("already"));
			}
			if (tries < 3 && current != NULL &&
				DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(current))) <
				DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(to_state))))
				continue;
			if (current != NULL &&
				DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(current))) <
				DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(to_state))))
				idem_update_hidden(fcinfo, &t, &idc, "transition()");
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_STATE_TRANSITION),
					 errmsg("invalid state transition of row %s = %s in table \"%s\" from %s to %s",
							idc.name, idem_id_text(fcinfo, 1), t.relname,
							current ? current : "NULL", to_state),
					 errdetail("Without a state machine, states only move forward; the current state is %s.",
							   current ? current : "NULL")));
		}

		if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("state machine \"%s\" does not exist", machine),
					 errhint("Define it with idempotency.create_machine().")));
		if (probe_already(4))
		{
			SPI_finish();
			PG_RETURN_TEXT_P(cstring_to_text("already"));
		}
		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull);
		transitions = probe_transitions(machine, isnull, d);
		from = predecessors(transitions, to_state, current, &allowed);
		if (tries < 3 && allowed)
			continue;			/* the state moved under us: try again */
		if (allowed)
			idem_update_hidden(fcinfo, &t, &idc, "transition()");
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_STATE_TRANSITION),
				 errmsg("invalid state transition of row %s = %s in table \"%s\" from \"%s\" to \"%s\"",
						idc.name, idem_id_text(fcinfo, 1), t.relname,
						current ? current : "NULL", to_state),
				 from[0] ?
				 errdetail("The current state is \"%s\"; state machine \"%s\" allows \"%s\" only from %s.",
						   current ? current : "NULL", machine, to_state, from) :
				 errdetail("The current state is \"%s\"; state machine \"%s\" never moves to \"%s\".",
						   current ? current : "NULL", machine, to_state)));
	}
}

/* transition(target, id, to_state, machine, state_column, id_column) -> applied | already */
PG_FUNCTION_INFO_V1(idempotency_transition);

Datum
idempotency_transition(PG_FUNCTION_ARGS)
{
	return idem_helper_call(transition_body, fcinfo);
}
