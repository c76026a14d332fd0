/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  The key guard (guard floor): idempotency.begin(), complete() and
 *	  fail(), what this transaction did with which key (the held keys) and
 *	  the commit check on them, and the request's fingerprint.
 *
 * Sections, in order: the held keys (backend-local, undone with
 * savepoints); the fingerprint (idempotency.fingerprint()); the guard
 * (idem_guard_begin(), idem_guard_finish(), the SQL functions).  The rows
 * and the key lock are the key store's (keystore.c).
 *
 * Locking: the key lock is held from begin() to the end of the
 * transaction (or of the subtransaction that took it, if that one rolls
 * back); a replay gives it back at once.  The held keys and the
 * fingerprint take no locks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/parallel.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "compat.h"
#include "guard.h"
#include "idempotency.h"
#include "keystore.h"
#include "stats.h"

/* =====================================================================
 * What this transaction did with which key, undone with savepoints, and
 * the commit check built on it.
 *
 * Design: every begin() that returns new or retry, and every complete()
 * or fail(), leaves a HeldKey record.  Records form a stack (newest on
 * top) in TopTransactionContext.  A record belongs to the subtransaction
 * that made it; a later change in the same subtransaction updates the
 * record in place, a change in a deeper subtransaction pushes a copy.
 * So rolling back a subtransaction is popping its records (they are all on
 * top of the stack), and committing one is handing its records to the
 * parent.  The newest record of a key is its current state.
 *
 * At PRE_COMMIT (and PRE_PREPARE) a key whose current state is still
 * HELD_BEGUN fails the commit: the transaction would otherwise store its
 * business writes without the key that guards them.
 *
 * Lookups walk the stack while it is short; past HELD_HASH_AT records a
 * hash table (64-bit key hash -> newest record with that hash) takes over,
 * so a batch that guards many keys in one transaction stays linear.
 *
 * Backend-local only: no shared memory, no locks.
 *
 * =====================================================================
 */
#define HELD_HASH_AT 32

typedef struct HeldHashEntry
{
	uint64		hash;			/* hash key */
	HeldKey    *newest;
} HeldHashEntry;

/* ---------------------------------------------------------------------
 * Local state (all of it lives in TopTransactionContext)
 * ---------------------------------------------------------------------
 */
static HeldKey *held_top = NULL;
static int	held_count = 0;
static HTAB *held_hash = NULL;

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */
static bool
keyid_equal(const KeyId *a, const KeyId *b)
{
	return a->hash == b->hash &&
		a->owner == b->owner &&
		a->key_len == b->key_len &&
		a->scope_len == b->scope_len &&
		memcmp(a->key, b->key, a->key_len) == 0 &&
		memcmp(a->scope, b->scope, a->scope_len) == 0;
}

/* newest record whose hash equals hash, or NULL */
static HeldKey *
newest_with_hash(uint64 hash)
{
	HeldKey    *h;

	if (held_hash)
	{
		HeldHashEntry *e = hash_search(held_hash, &hash, HASH_FIND, NULL);

		return e ? e->newest : NULL;
	}
	for (h = held_top; h; h = h->below)
		if (h->id.hash == hash)
			return h;
	return NULL;
}

static void
build_hash(void)
{
	HASHCTL		ctl;
	HeldKey    *h;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(HeldHashEntry);
	ctl.hcxt = TopTransactionContext;
	held_hash = hash_create("idempotency held keys", 256, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	/* walking newest first, the first record seen for a hash is the newest */
	for (h = held_top; h; h = h->below)
	{
		bool		found;
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_ENTER, &found);

		if (!found)
			e->newest = h;
	}
}

static void
pop_top(void)
{
	HeldKey    *h = held_top;

	held_top = h->below;
	held_count--;
	if (held_hash)
	{
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_FIND, NULL);

		Assert(e && e->newest == h);
		if (h->older)
			e->newest = h->older;
		else
			hash_search(held_hash, &h->id.hash, HASH_REMOVE, NULL);
	}
	pfree(h);
}

static void
reset_state(void)
{
	/* the memory goes with TopTransactionContext */
	held_top = NULL;
	held_count = 0;
	held_hash = NULL;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/* The current record of key id in this transaction, or NULL. */
HeldKey *
idem_held_lookup(const KeyId *id)
{
	HeldKey    *h;

	for (h = newest_with_hash(id->hash); h; h = h->older)
		if (keyid_equal(&h->id, id))
			return h;
	return NULL;
}

/*
 * Make proto (with its key strings) the current record of its key in the
 * current subtransaction and return the stored record.  When the key's
 * current record already belongs to this subtransaction it is overwritten,
 * since rolling this subtransaction back drops it anyway.
 */
static HeldKey *
held_push(const HeldKey *proto)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	HeldKey    *cur = idem_held_lookup(&proto->id);
	HeldKey    *h;
	char	   *p;

	if (cur && cur->subid == subid)
	{
		HeldKey    *below = cur->below,
				   *older = cur->older;
		KeyId		id = cur->id;

		memcpy(cur, proto, sizeof(HeldKey));
		cur->below = below;
		cur->older = older;
		cur->id = id;			/* keep our own copies of the strings */
		cur->subid = subid;
		return cur;
	}

	h = MemoryContextAlloc(TopTransactionContext,
						   sizeof(HeldKey) + proto->id.scope_len + proto->id.key_len + 2);
	memcpy(h, proto, sizeof(HeldKey));
	p = (char *) h + sizeof(HeldKey);
	memcpy(p, proto->id.scope, proto->id.scope_len);
	p[proto->id.scope_len] = '\0';
	h->id.scope = p;
	p += proto->id.scope_len + 1;
	memcpy(p, proto->id.key, proto->id.key_len);
	p[proto->id.key_len] = '\0';
	h->id.key = p;
	h->subid = subid;

	h->older = newest_with_hash(h->id.hash);
	h->below = held_top;
	held_top = h;
	held_count++;

	if (held_hash)
	{
		bool		found;
		HeldHashEntry *e = hash_search(held_hash, &h->id.hash, HASH_ENTER, &found);

		e->newest = h;
	}
	else if (held_count > HELD_HASH_AT)
		build_hash();
	return h;
}

/* ---------------------------------------------------------------------
 * Transaction callbacks
 * ---------------------------------------------------------------------
 */
static void
check_unfinished(bool prepare)
{
	HeldKey    *h;
	HeldKey    *first = NULL;
	int			n = 0;

	for (h = held_top; h; h = h->below)
	{
		if (h->state != HELD_BEGUN || idem_held_lookup(&h->id) != h)
			continue;
		n++;
		if (first == NULL)
			first = h;
	}
	if (first == NULL)
		return;

	ereport(ERROR,
			(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
			 errmsg("cannot %s: %s was begun but neither completed nor failed",
					prepare ? "prepare transaction" : "commit",
					idem_describe_key(&first->id)),
			 errdetail_plural("%d key begun in this transaction is unfinished, so the transaction was rolled back and nothing it wrote was stored.",
							  "%d keys begun in this transaction are unfinished, so the transaction was rolled back and nothing it wrote was stored.",
							  n, n),
			 errhint("Call idempotency.complete() or idempotency.fail() for every key that begin() returned as new or retry before COMMIT.")));
}

static void
held_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			check_unfinished(false);
			break;
		case XACT_EVENT_PRE_PREPARE:
			check_unfinished(true);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			reset_state();
			break;
		default:
			break;
	}
}

static void
held_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg pg_attribute_unused())
{
	HeldKey    *h;

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			while (held_top && held_top->subid == mySubid)
				pop_top();
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (h = held_top; h && h->subid == mySubid; h = h->below)
				h->subid = parentSubid;
			break;
		default:
			break;
	}
}

static void
heldkeys_init(void)
{
	RegisterXactCallback(held_xact_callback, NULL);
	RegisterSubXactCallback(held_subxact_callback, NULL);
}

/* =====================================================================
 * idempotency.fingerprint(jsonb): sha256 of a canonical encoding.
 *
 * Design: two jsonb values that are equal under jsonb's "=" must hash the
 * same.  jsonb already sorts object keys, drops duplicate keys and forgets
 * whitespace, so walking it with the jsonb iterator gives one order for
 * equal values.  The one thing it keeps that "=" ignores is the display
 * scale of numbers ({"a":1.0} = {"a":1}), so numbers are written through
 * numeric_normalize(), which drops insignificant zeroes.
 *
 * Every token is written as a one-byte tag and a 4-byte big-endian number
 * (element count of a container, byte length of a key, string or number,
 * followed by those bytes), so no two different token streams encode to the same bytes
 * (a key "a" followed by string "bc" differs from key "ab" and string "c").
 *
 * No locks, no shared state.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * hashing helpers
 * ---------------------------------------------------------------------
 */
typedef struct FpState
{
	IdemSha256	sha;
} FpState;

static void
fp_bytes(FpState *st, const void *data, size_t len)
{
	idem_sha256_update(&st->sha, data, len);
}

/* a tag and a 4-byte big-endian number (a length or an element count) */
static void
fp_head(FpState *st, char tag, uint32 n)
{
	uint8		head[5];

	head[0] = (uint8) tag;
	head[1] = (uint8) (n >> 24);
	head[2] = (uint8) (n >> 16);
	head[3] = (uint8) (n >> 8);
	head[4] = (uint8) n;
	fp_bytes(st, head, sizeof(head));
}

/* a tag, the length of data, and data */
static void
fp_token(FpState *st, char tag, const char *data, uint32 len)
{
	fp_head(st, tag, len);
	if (len > 0)
		fp_bytes(st, data, len);
}

static void
fp_scalar(FpState *st, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			fp_head(st, 'z', 0);
			break;
		case jbvBool:
			fp_head(st, v->val.boolean ? 't' : 'f', 0);
			break;
		case jbvString:
			fp_token(st, 's', v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			{
				char	   *s = numeric_normalize(v->val.numeric);

				fp_token(st, 'n', s, strlen(s));
				pfree(s);
				break;
			}
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
}

/* ---------------------------------------------------------------------
 * request_fingerprint: write the sha256 of jb's canonical encoding to out
 * ---------------------------------------------------------------------
 */
static void
request_fingerprint(Jsonb *jb, uint8 *out)
{
	FpState		st;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	idem_sha256_init(&st.sha);

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				fp_head(&st, v.val.array.rawScalar ? 'r' : '[',
						(uint32) v.val.array.nElems);
				break;
			case WJB_END_ARRAY:
				fp_head(&st, ']', 0);
				break;
			case WJB_BEGIN_OBJECT:
				fp_head(&st, '{', (uint32) v.val.object.nPairs);
				break;
			case WJB_END_OBJECT:
				fp_head(&st, '}', 0);
				break;
			case WJB_KEY:
				fp_token(&st, 'k', v.val.string.val, v.val.string.len);
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				fp_scalar(&st, &v);
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
		}
	}

	idem_sha256_final(&st.sha, out);
}

/* ---------------------------------------------------------------------
 * SQL-callable
 * ---------------------------------------------------------------------
 */

/* fingerprint(jsonb) -> bytea: sha256 of the canonical encoding */
PG_FUNCTION_INFO_V1(idempotency_fingerprint);

Datum
idempotency_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	bytea	   *result = (bytea *) palloc(VARHDRSZ + FINGERPRINT_LEN);

	SET_VARSIZE(result, VARHDRSZ + FINGERPRINT_LEN);
	request_fingerprint(jb, (uint8 *) VARDATA(result));
	PG_FREE_IF_COPY(jb, 0);
	PG_RETURN_BYTEA_P(result);
}

/* =====================================================================
 * idempotency.begin(), complete() and fail(): the key guard.
 *
 * The guard is idem_guard_begin() and idem_guard_finish(); the SQL
 * functions here and once() call them, with the key already built and
 * validated (keystore.c: idem_keyid(), IK003).  Single-transaction mode:
 * begin() fingerprints the request and opens the key in
 * the key store with one call (idem_keystore_open(): carried to its shard's
 * node on Citus, or the key lock taken if it is free and the row read; if
 * another transaction holds the lock, a live finished key is replayed
 * without waiting, else it waits at most lock_wait, IK002, and reads
 * again).  Then: replay (the lock given back), retry, or new; a different
 * fingerprint is IK001; new work in a read-only transaction or on a
 * standby is 25006.  Nothing is written at begin(): complete() and fail()
 * store the row for a key this transaction began (else IK004), and COMMIT
 * fails while a begun key is unfinished (the held keys, above).  So a first-time
 * request costs a lock, a probe and an insert; a replay a lock and a probe.
 * Nothing runs in parallel mode (a worker could escape the commit check).
 * Lease mode, and a key on Citus (claimed on its shard, or carried to the
 * shard's node): src/README.md, "Lease mode and Citus in the guard".
 *
 * Locking: the key lock is held from begin() to the end of the
 * transaction (or of the subtransaction that took it, if that one rolls
 * back).  A replay gives it back at once and never waits for it: a live
 * completed or permanently failed key changes only by expiring.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/*
 * The commit check (the held keys, above) runs in the leader; a parallel worker
 * could begin a key and escape it, so keys are never used in parallel
 * mode.
 */
static void
check_not_parallel(const KeyId *id)
{
	if (IsInParallelMode())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
				 errmsg("cannot use %s during a parallel operation", idem_describe_key(id)),
				 errhint("Call the idempotency functions from a function marked PARALLEL UNSAFE.")));
}

/*
 * ts as ISO 8601 in UTC, whole seconds rounded up ("2026-11-23T10:00:00Z"),
 * whatever DateStyle and TimeZone say, since a program may read IK002's
 * DETAIL.
 */
static char *
iso8601_utc(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (ts % USECS_PER_SEC != 0)
		ts += USECS_PER_SEC - ((ts % USECS_PER_SEC) + USECS_PER_SEC) % USECS_PER_SEC;
	if (timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		return pstrdup("infinity");
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year, tm.tm_mon,
					tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/*
 * The row descriptor of the calling function's named result type, built
 * once per call site and kept in fn_extra.  A call site lives one
 * execution of a prepared statement, so the type is taken from the call's
 * expression and its row from the type cache (kept current by the type's
 * invalidations), without pg_proc.  For begin() and once().
 */
TupleDesc
idem_result_desc(FunctionCallInfo fcinfo)
{
	TupleDesc	tupdesc = (TupleDesc) fcinfo->flinfo->fn_extra;

	if (tupdesc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		Oid			rettype = get_fn_expr_rettype(fcinfo->flinfo);
		TypeCacheEntry *tce = NULL;
		TupleDesc	td;

		if (OidIsValid(rettype) && rettype != RECORDOID)
			tce = lookup_type_cache(rettype, TYPECACHE_TUPDESC);
		if (tce != NULL && tce->tupDesc != NULL)
			td = tce->tupDesc;
		else if (get_call_result_type(fcinfo, NULL, &td) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "return type must be a row type");
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(td));
		fcinfo->flinfo->fn_extra = tupdesc;
		MemoryContextSwitchTo(old);
	}
	return tupdesc;
}

/*
 * begin()'s row.  As many columns as the installed type begin_result has:
 * 5 before 0.5.0, 7 since (recovery_point, recovery_state), NULL for any
 * further ones.
 */
static Datum
make_result(FunctionCallInfo fcinfo, const char *outcome, const char *status,
			const GuardBegin *res)
{
	TupleDesc	tupdesc = idem_result_desc(fcinfo);
	int			n = Max(tupdesc->natts, 7);
	Datum		values_buf[8];
	bool		nulls_buf[8];
	Datum	   *values = n <= 8 ? values_buf : palloc(sizeof(Datum) * n);
	bool	   *nulls = n <= 8 ? nulls_buf : palloc(sizeof(bool) * n);

	memset(nulls, true, sizeof(bool) * n);
	values[0] = CStringGetTextDatum(outcome);
	nulls[0] = false;
	values[1] = CStringGetTextDatum(status);
	nulls[1] = false;
	if (res->response)
	{
		values[2] = JsonbPGetDatum(res->response);
		nulls[2] = false;
	}
	values[3] = Int32GetDatum(res->attempts);
	nulls[3] = false;
	values[4] = TimestampTzGetDatum(res->created_at);
	nulls[4] = false;
	if (res->recovery_point)
	{
		values[5] = PointerGetDatum(res->recovery_point);
		nulls[5] = false;
	}
	if (res->recovery_state)
	{
		values[6] = JsonbPGetDatum(res->recovery_state);
		nulls[6] = false;
	}
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/* ---------------------------------------------------------------------
 * The guard's begin and finish (guard.h), and the SQL functions over them
 * ---------------------------------------------------------------------
 */

/*
 * The guard's begin, for SQL's begin() and for once(): open key id in the
 * key store and decide its outcome (see the section comment above); on new or
 * retry, this transaction holds the key until it completes or fails it.
 * request is the request to fingerprint (NULL: none); ttl the key's
 * lifetime (NULL: default_ttl); lease NULL outside lease mode.  On Citus
 * with the key's shard on another node the outcome is GUARD_ROUTED and
 * nothing was done: the caller carries the call there.  The response in
 * *out is allocated in the caller's memory context.
 */
void
idem_guard_begin(const KeyId *idp, Jsonb *request, const Interval *ttl,
				 const Interval *lease, GuardBegin *out)
{
	KeyId		id = *idp;
	HeldKey    *held;
	HeldKey		proto;
	KeyOpen		open;
	StoredKey  *stored = &open.stored;
	bool		has_hash = false;
	uint8		hash[FINGERPRINT_LEN];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	bool		lease_mode = lease != NULL;
	TimestampTz clock = 0;
	TimestampTz lease_end = 0;
	bool		row_there;
	bool		live;

	memset(out, 0, sizeof(GuardBegin));
	check_not_parallel(&id);
	if (lease_mode)
	{
		clock = GetCurrentTimestamp();
		lease_end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															TimestampTzGetDatum(clock),
															IntervalPGetDatum(lease)));
		if (lease_end <= clock)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("lease must be positive")));
	}

	held = idem_held_lookup(&id);
	if (held && (held->state == HELD_BEGUN || held->state == HELD_LEASED))
	{
		idem_stats_count(&id, IDEM_STAT_IK002);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
				 errmsg("%s is already in progress in this transaction", idem_describe_key(&id)),
				 errdetail("This transaction began it and has not completed or failed it yet."),
				 errhint("Call idempotency.complete() or idempotency.fail() before beginning it again.")));
	}

	if (request != NULL)
	{
		request_fingerprint(request, hash);
		has_hash = true;
	}

	/*
	 * One call: routed, or the key lock and the row (see
	 * idem_keystore_open(): a live finished key is replayed without waiting
	 * for another transaction's lock, and the lock given back).
	 */
	idem_keystore_open(&id, has_hash ? hash : NULL, ttl, now, &open,
					   CurrentMemoryContext);
	if (open.routed)
	{
		out->outcome = GUARD_ROUTED;
		return;
	}

	/*
	 * an expired row behaves as absent, but is still there to overwrite; so
	 * is the row a claim wrote
	 */
	row_there = stored->found || open.claimed;
	live = stored->found && stored->expires_at > now;

	if (live && has_hash && stored->has_hash &&
		memcmp(hash, stored->request_hash, FINGERPRINT_LEN) != 0)
	{
		idem_stats_count(&id, IDEM_STAT_IK001);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_REUSED),
				 errmsg("%s was already used with a different request", idem_describe_key(&id)),
				 errdetail("The key's stored request and this one differ; neither, nor anything computed from them, is shown."),
				 errhint("Use a new idempotency key for a new request (HTTP 422).")));
	}

	if (open.finished)
	{
		/* replay: nothing to write (the key store gave the lock back) */
		idem_stats_count(&id, IDEM_STAT_REPLAY);
		out->outcome = GUARD_REPLAY;
		out->status = stored->status;
		out->response = stored->response;
		out->attempts = stored->attempts;
		out->created_at = stored->created_at;
		out->recovery_point = stored->recovery_point;
		out->recovery_state = stored->recovery_state;
		return;
	}

	/* a live lease keeps everybody else out; a lapsed one is taken over */
	if (live && stored->status == 'i' && stored->locked_until != 0)
	{
		if (clock == 0)
			clock = GetCurrentTimestamp();
		if (stored->locked_until > clock)
		{
			idem_stats_count(&id, IDEM_STAT_IK002);
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
					 errmsg("%s is in progress under a lease", idem_describe_key(&id)),
					 errdetail("Attempt %d holds it until %s; retry after %d seconds.",
							   stored->attempts, iso8601_utc(stored->locked_until),
							   idem_seconds_until(stored->locked_until, clock)),
					 errhint("Retry after the lease ends (HTTP 409 with Retry-After); the first begin() after that takes the key over.")));
		}
	}

	/*
	 * new or retry: this transaction now owns the work, and must be able to
	 * store its outcome.  A live row that is not finished (a retryable
	 * failure, or an in_progress row left behind) is retried; anything else
	 * starts afresh.
	 */
	if (RecoveryInProgress() || XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot begin work under %s in a read-only transaction",
						idem_describe_key(&id)),
				 RecoveryInProgress() ?
				 errdetail("This server is a hot standby: it replays finished keys, but the outcome of new work could not be stored here.") :
				 errdetail("The outcome of the work could not be stored."),
				 errhint(RecoveryInProgress() ?
						 "Send requests that do work to the primary server." :
						 "Begin new keys in a read-write transaction.")));
	memset(&proto, 0, sizeof(proto));
	proto.id = id;
	proto.state = HELD_BEGUN;
	proto.expires_at = open.expires_at;
	proto.row_exists = row_there;
	proto.reset_point = row_there && !live;
	if (live)
	{
		proto.attempts = stored->attempts + 1;
		proto.created_at = stored->created_at;
	}
	else
	{
		proto.attempts = 1;
		proto.created_at = now;
	}
	if (has_hash)
	{
		proto.has_hash = true;
		memcpy(proto.request_hash, hash, FINGERPRINT_LEN);
	}
	else if (live && stored->has_hash)
	{
		proto.has_hash = true;
		memcpy(proto.request_hash, stored->request_hash, FINGERPRINT_LEN);
	}

	/*
	 * Lease mode: the in_progress row must be committed to keep others out
	 * after this transaction ends, so it is written now.
	 */
	if (lease_mode)
	{
		proto.state = HELD_LEASED;
		proto.locked_until = lease_end;
		if (proto.expires_at < lease_end)
			proto.expires_at = lease_end;
		idem_keystore_write(&proto, "in_progress", NULL, true, false);
		proto.row_exists = true;
		proto.reset_point = false;
	}
	held_push(&proto);

	idem_stats_count(&id, live ? IDEM_STAT_RETRY : IDEM_STAT_NEW);
	if (live && stored->status == 'i' && stored->locked_until != 0)
		idem_stats_count(&id, IDEM_STAT_TAKEOVER);
	out->outcome = live ? GUARD_RETRY : GUARD_NEW;
	out->status = 'i';
	out->response = live ? stored->response : NULL;
	out->attempts = proto.attempts;
	out->created_at = proto.created_at;
	/* a retry resumes from the last committed checkpoint */
	out->recovery_point = live ? stored->recovery_point : NULL;
	out->recovery_state = live ? stored->recovery_state : NULL;
}

/*
 * begin(key, request, scope, ttl, lease) -> (outcome, status, response,
 * attempts, created_at, recovery_point, recovery_state)
 */
PG_FUNCTION_INFO_V1(idempotency_begin);

Datum
idempotency_begin(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 0, 2, "idempotency key");
	GuardBegin	res;
	static const char *const outcomes[] = {"new", "retry", "replay"};
	static SPIPlanPtr route = NULL;

	idem_guard_begin(&id, PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1),
					 PG_ARGISNULL(3) ? NULL : PG_GETARG_INTERVAL_P(3),
					 PG_ARGISNULL(4) ? NULL : PG_GETARG_INTERVAL_P(4),
					 &res);
	/* Citus: the key's shard on another node: the call runs there */
	if (res.outcome == GUARD_ROUTED)
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);
	PG_RETURN_DATUM(make_result(fcinfo, outcomes[res.outcome],
								res.status == 'c' ? "completed" :
								res.status == 'f' ? "failed" : "in_progress",
								&res));
}

/*
 * The holder of a lease begun in an earlier transaction: attempt must be
 * the key's current attempt and the key still in progress.  Takes the key
 * lock, so a takeover cannot slip in between the check and the write.
 * Fills *h with the key's state.  Raises IK004.  For complete() and fail()
 * of an attempt, renew() (ops.c) and checkpoint() (recovery.c).
 */
void
idem_guard_lease_holder(const KeyId *id, int32 attempt, HeldKey *h)
{
	StoredKey	stored;
	bool		gone;

	/* on Citus, the row lock on the shard is what keeps a takeover out */
	idem_keystore_hold(id, &stored, CurrentMemoryContext);
	gone = !stored.found || stored.expires_at <= GetCurrentTransactionStartTimestamp();
	if (gone || stored.status != 'i' || stored.attempts != attempt)
	{
		const char *what = idem_describe_key(id);

		idem_stats_count(id, IDEM_STAT_IK004);
		if (!gone && stored.attempts > attempt) /* a zombie: taken over */
			idem_stats_count(id, IDEM_STAT_ZOMBIE);
		if (gone)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", what, attempt),
					 errdetail("No such key exists for this role, or it expired.")));
		if (stored.status != 'i' && stored.attempts == attempt)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", what, attempt),
					 errdetail("This attempt (%d) already %s the key; the stored outcome stands.",
							   attempt, stored.status == 'c' ? "completed" : "failed"),
					 errhint("A second complete() or fail() of the same attempt, e.g. after a lost acknowledgement, changes nothing.")));
		if (stored.status != 'i' && stored.attempts > attempt)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", what, attempt),
					 errdetail("Attempt %d took the key over after the lease of attempt %d ended, and %s it; this result is discarded.",
							   stored.attempts, attempt,
							   stored.status == 'c' ? "completed" : "failed"),
					 errhint("Make leases longer than the work takes.")));
		if (stored.status != 'i')
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", what, attempt),
					 errdetail("The key is already %s, at attempt %d.",
							   stored.status == 'c' ? "completed" : "failed", stored.attempts)));
		if (stored.attempts > attempt)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", what, attempt),
					 errdetail("Attempt %d took the key over after the lease of attempt %d ended; this result is discarded.",
							   stored.attempts, attempt),
					 errhint("Make leases longer than the work takes.")));
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s is not held by attempt %d", what, attempt),
				 errdetail("The key is at attempt %d.", stored.attempts)));
	}

	memset(h, 0, sizeof(HeldKey));
	h->id = *id;
	h->row_exists = true;
	h->attempts = stored.attempts;
	h->created_at = stored.created_at;
	h->expires_at = stored.expires_at;
	h->has_hash = stored.has_hash;
	memcpy(h->request_hash, stored.request_hash, FINGERPRINT_LEN);
}

/*
 * The guard's complete and fail, for SQL's complete()/fail() and for
 * once(): store payload as the outcome (newstate HELD_COMPLETED or
 * HELD_FAILED) of key id, which this transaction began or, with
 * has_attempt, whose lease attempt `attempt` holds.  Raises IK004.
 */
void
idem_guard_finish(const KeyId *idp, HeldState newstate, Jsonb *payload,
				  bool retryable, bool has_attempt, int32 attempt)
{
	KeyId		id = *idp;
	HeldKey    *held;
	HeldKey		next;
	const char *fn = newstate == HELD_COMPLETED ? "complete" : "fail";

	check_not_parallel(&id);
	held = idem_held_lookup(&id);
	if (held && (held->state == HELD_BEGUN || held->state == HELD_LEASED))
	{
		/* begun in this transaction */
		if (has_attempt && attempt != held->attempts)
		{
			idem_stats_count(&id, IDEM_STAT_IK004);
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by attempt %d", idem_describe_key(&id), attempt),
					 errdetail("This transaction began attempt %d.", held->attempts)));
		}
		next = *held;
	}
	else if (has_attempt)
		idem_guard_lease_holder(&id, attempt, &next);	/* begun earlier, with a
														 * lease */
	else
	{
		const char *what = idem_describe_key(&id);

		idem_stats_count(&id, IDEM_STAT_IK004);
		if (held)
			ereport(ERROR,
					(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
					 errmsg("%s is not held by this transaction", what),
					 errdetail("This transaction already %s it.",
							   held->state == HELD_COMPLETED ? "completed" : "failed")));
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s is not held by this transaction", what),
				 errdetail("%s() needs a begin() in the same transaction, by the same role, that returned new or retry.", fn),
				 errhint("A begin() in a savepoint that was rolled back no longer holds its key. For a key begun with a lease in another transaction, pass attempt => the attempts value that begin() returned.")));
	}

	next.locked_until = 0;
	idem_keystore_write(&next, newstate == HELD_COMPLETED ? "completed" : "failed",
						payload, newstate == HELD_COMPLETED, retryable);

	next.state = newstate;
	next.row_exists = true;
	held_push(&next);
	idem_stats_count(&id, newstate == HELD_COMPLETED ? IDEM_STAT_COMPLETE :
					 retryable ? IDEM_STAT_FAIL_RETRYABLE : IDEM_STAT_FAIL_FINAL);
}

/* complete(key, response, scope, attempt): store the result of a held key */
PG_FUNCTION_INFO_V1(idempotency_complete);

Datum
idempotency_complete(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 0, 2, "idempotency key");
	static SPIPlanPtr route = NULL;

	/* Citus: the key's shard on another node: the call runs there */
	if (idem_route_key(&id))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);
	/* a 0.1.0 SQL definition does not pass attempt (PG_NARGS) */
	idem_guard_finish(&id, HELD_COMPLETED,
					  PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1), false,
					  PG_NARGS() > 3 && !PG_ARGISNULL(3),
					  PG_NARGS() > 3 && !PG_ARGISNULL(3) ? PG_GETARG_INT32(3) : 0);
	PG_RETURN_VOID();
}

/* fail(key, error, scope, retryable, attempt): store the failure of a held key */
PG_FUNCTION_INFO_V1(idempotency_fail);

Datum
idempotency_fail(PG_FUNCTION_ARGS)
{
	KeyId		id;
	static SPIPlanPtr route = NULL;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("retryable must not be null")));
	id = idem_keyid(fcinfo, 0, 2, "idempotency key");
	/* Citus: the key's shard on another node: the call runs there */
	if (idem_route_key(&id))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);
	idem_guard_finish(&id, HELD_FAILED,
					  PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONB_P(1),
					  PG_GETARG_BOOL(3),
					  PG_NARGS() > 4 && !PG_ARGISNULL(4),
					  PG_NARGS() > 4 && !PG_ARGISNULL(4) ? PG_GETARG_INT32(4) : 0);
	PG_RETURN_VOID();
}

/* from _PG_init: the held keys' transaction callbacks */
void
idem_guard_init(void)
{
	heldkeys_init();
}
