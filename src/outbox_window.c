/*-------------------------------------------------------------------------
 *
 * outbox_window.c
 *	  claim() with claims in shared memory (features floor): the window of
 *	  ready messages scanned in C, and what a claim does with each message
 *	  it has locked.
 *
 * The claim statement's window (outbox_relay.c, CLAIM_WINDOW) done as an
 * index scan of outbox_message_ready_idx in (available_at, id) order, with
 * the statement's rules: a message with a live claim in shared memory is
 * skipped before its row is read; a keyed message is a candidate only when
 * it heads its key (a probe of outbox_message_key_idx); candidates are
 * locked FOR UPDATE SKIP LOCKED until `want` are claimed, each entered in
 * shared memory by claim_take() (which the SQL claims beyond the window
 * share).  Taken only for the shipped shape of the table and its two
 * indexes; anything else uses the statement.  Why (the statement was two
 * thirds of a claim + ack) and each rule: src/README.md, "claim()'s window
 * in C".
 *
 * Locking: RowShareLock on outbox_message (held to the transaction's end,
 * as SELECT FOR UPDATE), AccessShareLock on its two indexes; row locks
 * (exclusive, as FOR UPDATE) on the messages claimed; the claims' lock
 * inside outbox_claims.c, never held here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/itup.h"
#include "access/relation.h"
#include "access/relscan.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox.h"

/* ---------------------------------------------------------------------
 * What a claim does with a message it locked
 * ---------------------------------------------------------------------
 */
#define TAKE_CLAIMED 0
#define TAKE_DEAD 1				/* a lapsed claim at max_attempts */
#define TAKE_BUSY 2				/* another claim holds it */
#define TAKE_FULL 3				/* no room in shared memory */

/* lapsed claims taken over: their attempts go into the rows */
typedef struct Lapsed
{
	int			n;
	int			ndead;
	Datum	   *ids;
	Datum	   *attempts;
	Datum	   *dead;
} Lapsed;

static void
lapsed_init(Lapsed *l, int size)
{
	l->n = l->ndead = 0;
	l->ids = palloc(size * sizeof(Datum));
	l->attempts = palloc(size * sizeof(Datum));
	l->dead = palloc(size * sizeof(Datum));
}

/*
 * Message id (its row locked by this transaction; row_attempts its
 * attempts, durable: the row carries a claim of its own, which lapsed) for
 * the claim in values ($3 token, $4 until, $5 now, $6 max_attempts, $1
 * topic): enter it in shared memory.  *attempt: the claim's attempt.
 */
static int
claim_take(int64 id, int32 row_attempts, bool durable, Datum *values,
		   Lapsed *l, int32 *attempt)
{
	int32		topic_id = DatumGetInt32(values[0]);
	pg_uuid_t  *token = DatumGetUUIDP(values[2]);
	TimestampTz until = DatumGetTimestampTz(values[3]);
	TimestampTz now = DatumGetTimestampTz(values[4]);
	int32		max_attempts = DatumGetInt32(values[5]);
	int32		lapsed;
	int			r;

	if (durable && row_attempts >= max_attempts)
	{
		/* a durable claim lapsed at max_attempts: dead */
		r = CLAIM_LAPSED;
		lapsed = row_attempts;
	}
	else
	{
		r = idem_outbox_claim_enter(id, topic_id, token, until, now,
									row_attempts, max_attempts, &lapsed);
		if (r == CLAIM_NEW && durable)
		{
			r = CLAIM_LAPSED;	/* its attempt is in the row already */
			lapsed = row_attempts;
		}
	}
	if (r == CLAIM_BUSY)
		return TAKE_BUSY;
	if (r == CLAIM_FULL)
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("idempotency.outbox_claims (%d) messages are claimed: claim() hands out fewer",
						idem_outbox_claims_max),
				 errhint("Raise idempotency.outbox_claims (a restart is needed) or claim smaller batches.")));
		return TAKE_FULL;
	}
	if (r == CLAIM_LAPSED)
	{
		l->ids[l->n] = Int64GetDatum(id);
		l->attempts[l->n] = Int32GetDatum(lapsed);
		l->dead[l->n] = BoolGetDatum(lapsed >= max_attempts);
		l->n++;
		if (lapsed >= max_attempts)
		{
			l->ndead++;
			return TAKE_DEAD;
		}
	}
	*attempt = r == CLAIM_LAPSED ? lapsed + 1 : row_attempts + 1;
	return TAKE_CLAIMED;
}

/*
 * A claim that took over lapsed claims writes their attempts into the rows
 * (so a crash loses at most the attempt in flight), and makes those at
 * max_attempts dead.
 */
static SPIPlanPtr plan_claim_lapsed = NULL;

static void
lapsed_write(Lapsed *l)
{
	Oid			ltypes[3] = {INT8ARRAYOID, INT4ARRAYOID, BOOLARRAYOID};
	Datum		lvalues[3];

	if (l->n == 0)
		return;
	lvalues[0] = PointerGetDatum(construct_array(l->ids, l->n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	lvalues[1] = PointerGetDatum(construct_array(l->attempts, l->n, INT4OID, 4, true, TYPALIGN_INT));
	lvalues[2] = PointerGetDatum(construct_array(l->dead, l->n, BOOLOID, 1, true, TYPALIGN_CHAR));
	idem_run_as_owner(&plan_claim_lapsed,
					  "UPDATE idempotency.outbox_message AS m"
					  "   SET attempts = l.attempts, claim = NULL,"
					  "       state = CASE WHEN l.dead THEN 'dead' ELSE 'pending' END,"
					  "       last_error = '{\"error\": \"visibility timeout: the claim lapsed without ack or nack\"}'::pg_catalog.jsonb"
					  "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
					  "       AS l(id, attempts, dead)"
					  " WHERE m.id OPERATOR(pg_catalog.=) l.id"
					  "   AND m.state OPERATOR(pg_catalog.=) 'pending'",
					  3, ltypes, lvalues, NULL, SPI_OK_UPDATE);
}

/*
 * Run a claim statement of outbox_relay.c (it locks the candidates and
 * returns the outbox_claim columns, then whether the row carries a durable
 * claim) for up to remaining messages: each locked row is entered in
 * shared memory (claim_take()), and the statement runs again as long as
 * some of those it took went dead and fewer than remaining were claimed
 * (each run turns at least one message dead, so this ends).  Returns how
 * many were claimed.  Inside SPI_connect().
 */
int32
idem_outbox_claim_run_shared(SPIPlanPtr *plan, const char *sql, Oid *argtypes,
							 Datum *values, int32 remaining, ReturnSetInfo *rsinfo)
{
	int32		claimed = 0;

	for (;;)
	{
		uint64		n;
		uint64		i;
		Lapsed		l;
		bool		full = false;

		values[1] = Int32GetDatum(remaining - claimed);
		n = idem_run_as_owner(plan, sql, 8, argtypes, values, NULL, SPI_OK_SELECT);
		if (n == 0)
			return claimed;
		lapsed_init(&l, (int) n);
		for (i = 0; i < n && !full; i++)
		{
			Datum		cols[11];
			bool		nulls[11];
			int32		attempt;

			heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, cols, nulls);
			switch (claim_take(DatumGetInt64(cols[0]), DatumGetInt32(cols[6]),
							   DatumGetBool(cols[10]), values, &l, &attempt))
			{
				case TAKE_CLAIMED:
					cols[6] = Int32GetDatum(attempt);
					tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
					claimed++;
					break;
				case TAKE_FULL:
					full = true;
					break;
				default:
					break;
			}
		}
		lapsed_write(&l);
		if (l.ndead == 0 || claimed >= remaining || full)
			return claimed;
	}
}

/* ---------------------------------------------------------------------
 * The window, scanned in C
 * ---------------------------------------------------------------------
 */

/* the columns the scan reads, and the two indexes */
enum
{
	M_ID, M_TOPIC, M_MESSAGE_ID, M_KEY, M_PAYLOAD, M_HEADERS, M_STATE,
	M_ATTEMPTS, M_AVAILABLE, M_CLAIM, M_PUBLISHED, M_NCOLS
};

static const struct
{
	const char *name;
	Oid			type;
}			msg_cols[M_NCOLS] = {
	{"id", INT8OID}, {"topic_id", INT4OID}, {"message_id", UUIDOID},
	{"message_key", TEXTOID}, {"payload", JSONBOID}, {"headers", JSONBOID},
	{"state", TEXTOID}, {"attempts", INT4OID}, {"available_at", TIMESTAMPTZOID},
	{"claim", UUIDOID}, {"published_at", TIMESTAMPTZOID}
};

typedef struct Window
{
	Relation	heap;
	Relation	ready;			/* (topic_id, available_at, id) WHERE pending */
	Relation	keys;			/* (topic_id, message_key, id) WHERE pending
								 * AND message_key IS NOT NULL */
	AttrNumber	att[M_NCOLS];
	IndexScanDesc keyscan;		/* the key-head probe: begun on first use in a
								 * pass, ended with it */
	TupleTableSlot *keyslot;
} Window;

/* a btree index over exactly the columns a, b, c of the heap, valid and partial */
static bool
index_shape(Relation index, AttrNumber a, AttrNumber b, AttrNumber c)
{
	Form_pg_index ix = index->rd_index;

	return index->rd_rel->relam == BTREE_AM_OID && ix->indisvalid &&
		ix->indnkeyatts == 3 && ix->indnatts == 3 &&
		ix->indkey.values[0] == a && ix->indkey.values[1] == b &&
		ix->indkey.values[2] == c &&
		!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) &&
		RelationGetIndexExpressions(index) == NIL;
}

static Relation
open_index(Oid nsp, const char *name, Relation heap)
{
	Oid			relid = get_relname_relid(name, nsp);
	Relation	index;

	if (!OidIsValid(relid))
		return NULL;
	index = index_open(relid, AccessShareLock);
	if (index->rd_index->indrelid != RelationGetRelid(heap))
	{
		index_close(index, AccessShareLock);
		return NULL;
	}
	return index;
}

/*
 * Open outbox_message and its two indexes; false (nothing held open) when
 * the table is not of the shipped shape.
 */
static bool
window_open(Window *w)
{
	Oid			nsp = get_namespace_oid("idempotency", false);
	Oid			relid;
	TupleDesc	desc;

	memset(w, 0, sizeof(*w));
	relid = RangeVarGetRelid(makeRangeVar("idempotency", "outbox_message", -1),
							 RowShareLock, false);
	w->heap = table_open(relid, NoLock);
	desc = RelationGetDescr(w->heap);
	for (int c = 0; c < M_NCOLS; c++)
	{
		w->att[c] = InvalidAttrNumber;
		for (int i = 0; i < desc->natts; i++)
		{
			Form_pg_attribute a = TupleDescAttr(desc, i);

			if (!a->attisdropped && strcmp(NameStr(a->attname), msg_cols[c].name) == 0 &&
				a->atttypid == msg_cols[c].type)
				w->att[c] = a->attnum;
		}
		if (w->att[c] == InvalidAttrNumber)
			goto no;
	}
	if (w->heap->rd_rel->relkind != RELKIND_RELATION)
		goto no;
	w->ready = open_index(nsp, "outbox_message_ready_idx", w->heap);
	w->keys = open_index(nsp, "outbox_message_key_idx", w->heap);
	if (w->ready != NULL && w->keys != NULL &&
		index_shape(w->ready, w->att[M_TOPIC], w->att[M_AVAILABLE], w->att[M_ID]) &&
		index_shape(w->keys, w->att[M_TOPIC], w->att[M_KEY], w->att[M_ID]))
		return true;
no:
	if (w->ready != NULL)
		index_close(w->ready, AccessShareLock);
	if (w->keys != NULL)
		index_close(w->keys, AccessShareLock);
	table_close(w->heap, NoLock);	/* the lock stays, as a statement's would */
	return false;
}

static void
window_close(Window *w)
{
	index_close(w->ready, NoLock);
	index_close(w->keys, NoLock);
	table_close(w->heap, NoLock);
}

/* does the message id of key head its key (no pending message of the key before it)? */
static bool
key_head(Window *w, Snapshot snap, int32 topic_id, Datum key, int64 id)
{
	ScanKeyData skey[3];
	bool		before = false;

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(topic_id));
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   w->keys->rd_indcollation[1], F_TEXTEQ, key);
	ScanKeyInit(&skey[2], 3, BTLessStrategyNumber, F_INT8LT, Int64GetDatum(id));
	if (w->keyscan == NULL)
	{
		w->keyscan = IDEM_INDEX_BEGINSCAN(w->heap, w->keys, snap, 3, 0);
		w->keyslot = table_slot_create(w->heap, NULL);
	}
	index_rescan(w->keyscan, skey, 3, NULL, 0);
	while (index_getnext_slot(w->keyscan, ForwardScanDirection, w->keyslot))
	{
		bool		isnull;
		text	   *state = DatumGetTextPP(slot_getattr(w->keyslot, w->att[M_STATE], &isnull));

		if (VARSIZE_ANY_EXHDR(state) == 7 && memcmp(VARDATA_ANY(state), "pending", 7) == 0)
		{
			before = true;
			break;
		}
	}
	return !before;
}

static bool
is_pending(TupleTableSlot *slot, Window *w)
{
	bool		isnull;
	text	   *state = DatumGetTextPP(slot_getattr(slot, w->att[M_STATE], &isnull));

	return !isnull && VARSIZE_ANY_EXHDR(state) == 7 &&
		memcmp(VARDATA_ANY(state), "pending", 7) == 0;
}

/* a message claimed: its row (copied) and the claim's attempt */
typedef struct Got
{
	int64		id;
	int32		attempt;
	HeapTuple	tup;
} Got;

static int
got_cmp(const void *a, const void *b)
{
	int64		x = ((const Got *) a)->id;
	int64		y = ((const Got *) b)->id;

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * One pass over the window with a fresh snapshot (as each run of the
 * statement had): claims up to want messages into got[]; *ngot how many.
 * *full: window unclaimed ready messages are left after the claims.
 * Returns false when shared memory was full (claim no more).
 */
static bool
window_pass(Window *w, Datum *values, int32 window, int32 want, Got *got,
			int *ngot, Lapsed *l, bool *full)
{
	int32		topic_id = DatumGetInt32(values[0]);
	TimestampTz now = DatumGetTimestampTz(values[4]);
	Snapshot	snap;
	CommandId	cid;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	TupleTableSlot *lslot;
	int32		seen = 0;		/* ready, visible, not claimed by another */
	int32		taken = 0;		/* of them, locked by this pass */
	bool		room = true;

	*ngot = 0;
	*full = false;
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	snap = GetActiveSnapshot();
	cid = GetCurrentCommandId(true);

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(topic_id));
	ScanKeyInit(&skey[1], 2, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	slot = table_slot_create(w->heap, NULL);
	lslot = table_slot_create(w->heap, NULL);
	scan = IDEM_INDEX_BEGINSCAN(w->heap, w->ready, snap, 2, 0);
	scan->xs_want_itup = true;	/* the id, from the index entry */
	index_rescan(scan, skey, 2, NULL, 0);
	while (*ngot < want && index_getnext_tid(scan, ForwardScanDirection) != NULL)
	{
		IdemOutboxClaim c;
		bool		isnull;
		int64		id;
		Datum		key;
		ItemPointerData tid;
		TM_FailureData tmfd;
		TM_Result	res;
		int32		attempt;
		int			lockflags = TUPLE_LOCK_FLAG_LOCK_UPDATE_IN_PROGRESS;

		CHECK_FOR_INTERRUPTS();

		/*
		 * Claimed: not in the window.  Asked before the heap is read (the
		 * entry's id is the row's: an id changes only by redrive, of a dead
		 * row, which is in no entry of this index), so that relays skip each
		 * other's claims at the cost of the index entry alone.
		 */
		id = DatumGetInt64(index_getattr(scan->xs_itup, 3, scan->xs_itupdesc, &isnull));
		if (idem_outbox_claim_read(id, &c) && c.until > now)
			continue;
		if (!index_fetch_heap(scan, slot) || !is_pending(slot, w))
			continue;
		seen++;
		if (seen > window)
		{
			/* past the window: only counting what is left, for *full */
			if (seen - taken > window)
			{
				*full = true;
				break;
			}
			continue;
		}
		key = slot_getattr(slot, w->att[M_KEY], &isnull);
		if (!isnull && !key_head(w, snap, topic_id, key, id))
			continue;

		/* FOR UPDATE SKIP LOCKED */
		if (!IsolationUsesXactSnapshot())
			lockflags |= TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
		tid = slot->tts_tid;
		res = table_tuple_lock(w->heap, &tid, snap, lslot, cid, LockTupleExclusive,
							   LockWaitSkip, lockflags, &tmfd);
		switch (res)
		{
			case TM_Ok:
				break;
			case TM_WouldBlock:
			case TM_SelfModified:
				continue;
			case TM_Updated:
			case TM_Deleted:
				if (IsolationUsesXactSnapshot())
					ereport(ERROR,
							(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
							 errmsg("could not serialize access due to concurrent update")));
				if (res == TM_Deleted)
					continue;
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
				break;
			default:
				elog(ERROR, "unexpected table_tuple_lock status: %u", res);
		}
		taken++;

		/*
		 * A newer version was locked: the statement's quals again, and its id
		 * (redrive() gives a dead message a new one: not this candidate)
		 */
		if (tmfd.traversed &&
			(DatumGetInt64(slot_getattr(lslot, w->att[M_ID], &isnull)) != id ||
			 DatumGetInt32(slot_getattr(lslot, w->att[M_TOPIC], &isnull)) != topic_id ||
			 !is_pending(lslot, w) ||
			 DatumGetTimestampTz(slot_getattr(lslot, w->att[M_AVAILABLE], &isnull)) > now ||
			 (idem_outbox_claim_read(id, &c) && c.until > now)))
			continue;
		switch (claim_take(id, DatumGetInt32(slot_getattr(lslot, w->att[M_ATTEMPTS], &isnull)),
						   !slot_attisnull(lslot, w->att[M_CLAIM]), values, l, &attempt))
		{
			case TAKE_CLAIMED:
				got[*ngot].id = id;
				got[*ngot].attempt = attempt;
				got[*ngot].tup = ExecCopySlotHeapTuple(lslot);
				(*ngot)++;
				break;
			case TAKE_FULL:
				room = false;
				break;
			default:
				break;
		}
		if (!room)
			break;
	}
	index_endscan(scan);
	if (w->keyscan != NULL)
	{
		index_endscan(w->keyscan);	/* it read with this pass's snapshot */
		ExecDropSingleTupleTableSlot(w->keyslot);
		w->keyscan = NULL;
	}
	ExecDropSingleTupleTableSlot(slot);
	ExecDropSingleTupleTableSlot(lslot);
	PopActiveSnapshot();
	if (*ngot >= want || !room)
		*full = false;
	return room;
}

/*
 * Claim up to want messages of the window (values as the claim statements
 * take them: $1 topic id, $3 token, $4 until, $5 now, $6 max_attempts, $7
 * topic name, $8 the window's size) into rsinfo, in id order.  Returns how
 * many, or -1 when the table is not of the shipped shape (then nothing was
 * done: run the statement).  *full: the window was full (claim beyond it).
 * Inside SPI_connect() (the lapsed claims' UPDATE).
 */
int32
idem_outbox_claim_scan(Datum *values, int32 want, ReturnSetInfo *rsinfo, bool *full)
{
	int32		window = DatumGetInt32(values[7]);
	int32		claimed = 0;
	Window		w;
	MemoryContext cxt;
	MemoryContext old;

	*full = false;
	/* what a statement with FOR UPDATE says in a read-only transaction */
	PreventCommandIfReadOnly("SELECT FOR UPDATE");
	if (!window_open(&w))
		return -1;
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idempotency claim window",
								ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		Got		   *got;
		int			ngot;
		Lapsed		l;
		bool		room;

		MemoryContextReset(cxt);
		old = MemoryContextSwitchTo(cxt);
		got = palloc((want - claimed) * sizeof(Got));
		lapsed_init(&l, window);	/* only the window's rows are locked */
		room = window_pass(&w, values, window, want - claimed, got, &ngot, &l, full);
		MemoryContextSwitchTo(old);
		qsort(got, ngot, sizeof(Got), got_cmp);
		for (int i = 0; i < ngot; i++)
		{
			TupleDesc	desc = RelationGetDescr(w.heap);
			Datum		cols[10];
			bool		nulls[10];

#define COL(n, c) (cols[n] = heap_getattr(got[i].tup, w.att[c], desc, &nulls[n]))
			COL(0, M_ID);
			COL(1, M_MESSAGE_ID);
			cols[2] = values[6];
			nulls[2] = false;
			COL(3, M_KEY);
			COL(4, M_PAYLOAD);
			COL(5, M_HEADERS);
			cols[6] = Int32GetDatum(got[i].attempt);
			nulls[6] = false;
			COL(7, M_PUBLISHED);
			cols[8] = values[2];
			cols[9] = values[3];
			nulls[8] = nulls[9] = false;
#undef COL
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
		}
		claimed += ngot;
		lapsed_write(&l);
		if (l.ndead == 0 || claimed >= want || !room)
			break;
	}
	MemoryContextDelete(cxt);
	window_close(&w);
	return claimed;
}
