/*-------------------------------------------------------------------------
 *
 * outbox_counts.c
 *	  The outbox's acked counts in shared memory: per topic, the messages
 *	  acked (and their retries) since the purge last wrote them into the
 *	  topic's row.
 *
 * With the library preloaded, ack() deletes the message's row at once
 * (outbox_relay.c) and counts it here when its transaction commits; the
 * purge (lifecycle.c) moves the counts into the topic's purged_* columns.
 * What the counts give the SQL statements:
 *
 *	idempotency._outbox_counts(topic_id)	acked and retried since the purge
 *											last wrote them into the topic's row
 *
 * The table has COUNT_TOPICS places for the cluster; a count that finds it
 * full is lost.  A crash or restart empties it.
 *
 * Locking: counts->lock (an LWLock) guards the hash table: shared to look
 * up, exclusive to add, change or remove an entry.  Nothing waits while
 * holding it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idempotency.h"

#define COUNTS_TRANCHE "idempotency outbox counts"
#define COUNT_TOPICS 4096		/* topics with unflushed counts */

typedef struct CountKey
{
	Oid			db;
	Oid			gen;			/* the install: idem_outbox_install() */
	int32		topic_id;
} CountKey;

typedef struct CountEntry
{
	CountKey	key;
	int64		delivered;
	int64		retried;
} CountEntry;

typedef struct CountsShared
{
	LWLock	   *lock;
} CountsShared;

/* what this transaction does to the table at its end */
typedef enum CountPendingKind
{
	PENDING_COUNT,				/* counts added at commit */
	PENDING_RESTORE				/* counts the purge took out: put back if
								 * it aborts (a taken count is in no entry
								 * until then, so no two purges write it) */
} CountPendingKind;

typedef struct CountPending
{
	CountPendingKind kind;
	Oid			gen;			/* the install, read when added */
	int32		topic_id;
	int64		delivered;
	int64		retried;
	int			level;			/* the (sub)transaction's nesting level */
} CountPending;

static CountsShared *counts = NULL;
static HTAB *count_hash = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static List *pending = NIL;		/* of CountPending, in TopTransactionContext */
static bool callback_registered = false;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static void
counts_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(CountsShared)) +
						   hash_estimate_size(COUNT_TOPICS, sizeof(CountEntry)));
	RequestNamedLWLockTranche(COUNTS_TRANCHE, 1);
}

static void
counts_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	counts = ShmemInitStruct("idempotency outbox counts", sizeof(CountsShared), &found);
	if (!found)
		counts->lock = &(GetNamedLWLockTranche(COUNTS_TRANCHE))->lock;
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(CountKey);
	info.entrysize = sizeof(CountEntry);
	count_hash = ShmemInitHash("idempotency outbox counts hash",
							   COUNT_TOPICS, COUNT_TOPICS,
							   &info, HASH_ELEM | HASH_BLOBS);
	LWLockRelease(AddinShmemInitLock);
}

/* from _PG_init: preloaded, the shared memory */
void
idem_outbox_counts_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	idem_request_shmem(counts_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = counts_shmem_startup;
}

/* ---------------------------------------------------------------------
 * At the transaction's end
 * ---------------------------------------------------------------------
 */

/* add to topic_id's counts (exclusive lock held) */
static void
count_add(Oid gen, int32 topic_id, int64 delivered, int64 retried)
{
	CountKey	k;
	CountEntry *c;
	bool		found;

	memset(&k, 0, sizeof(k));
	k.db = MyDatabaseId;
	k.gen = gen;
	k.topic_id = topic_id;
	c = (CountEntry *) hash_search(count_hash, &k, HASH_FIND, NULL);
	found = c != NULL;
	if (c == NULL && hash_get_num_entries(count_hash) < COUNT_TOPICS)
		c = (CountEntry *) hash_search(count_hash, &k, HASH_ENTER_NULL, &found);
	if (c == NULL)
		return;					/* full: the counts are lost (documented) */
	if (!found)
		c->delivered = c->retried = 0;
	c->delivered += delivered;
	c->retried += retried;
	if (c->delivered == 0 && c->retried == 0)
		hash_search(count_hash, &k, HASH_REMOVE, NULL);
}

static void
counts_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	ListCell   *lc;
	bool		commit;

	if (pending == NIL)
		return;
	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT &&
		event != XACT_EVENT_PREPARE && event != XACT_EVENT_PARALLEL_COMMIT &&
		event != XACT_EVENT_PARALLEL_ABORT)
		return;
	/* prepared: its counts are lost, what it took too (documented) */
	if (event != XACT_EVENT_PREPARE && count_hash != NULL)
	{
		commit = event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT;
		LWLockAcquire(counts->lock, LW_EXCLUSIVE);
		foreach(lc, pending)
		{
			CountPending *p = (CountPending *) lfirst(lc);

			if ((p->kind == PENDING_COUNT) == commit)
				count_add(p->gen, p->topic_id, p->delivered, p->retried);
		}
		LWLockRelease(counts->lock);
	}
	pending = NIL;				/* its memory goes with TopTransactionContext */
}

/*
 * A subtransaction's pending counts go with its abort (what its purge took
 * is put back at once); on commit they pass to its parent.
 */
static void
counts_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
						SubTransactionId parentSubid pg_attribute_unused(),
						void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	List	   *kept = NIL;
	ListCell   *lc;
	MemoryContext old;

	if (pending == NIL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	if (event == SUBXACT_EVENT_ABORT_SUB && count_hash != NULL)
		LWLockAcquire(counts->lock, LW_EXCLUSIVE);
	foreach(lc, pending)
	{
		CountPending *p = (CountPending *) lfirst(lc);

		if (p->level >= level)
		{
			if (event == SUBXACT_EVENT_COMMIT_SUB)
				p->level = level - 1;
			else
			{
				if (p->kind == PENDING_RESTORE && count_hash != NULL)
					count_add(p->gen, p->topic_id, p->delivered, p->retried);
				continue;
			}
		}
		kept = lappend(kept, p);
	}
	if (event == SUBXACT_EVENT_ABORT_SUB && count_hash != NULL)
		LWLockRelease(counts->lock);
	MemoryContextSwitchTo(old);
	pending = kept;
}

static void
pending_add(CountPendingKind kind, Oid gen, int32 topic_id, int64 delivered, int64 retried)
{
	MemoryContext old;
	CountPending *p;

	if (!callback_registered)
	{
		RegisterXactCallback(counts_xact_callback, NULL);
		RegisterSubXactCallback(counts_subxact_callback, NULL);
		callback_registered = true;
	}
	old = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc0(sizeof(CountPending));
	p->kind = kind;
	p->gen = gen;
	p->topic_id = topic_id;
	p->delivered = delivered;
	p->retried = retried;
	p->level = GetCurrentTransactionNestLevel();
	pending = lappend(pending, p);
	MemoryContextSwitchTo(old);
}

/* ---------------------------------------------------------------------
 * For outbox_relay.c and lifecycle.c
 * ---------------------------------------------------------------------
 */

/* delivered messages of topic_id (and their retries): counted at commit */
void
idem_outbox_count_at_commit(int32 topic_id, int64 delivered, int64 retried)
{
	if (count_hash != NULL)
		pending_add(PENDING_COUNT, idem_outbox_install(), topic_id, delivered, retried);
}

/*
 * This database's unflushed counts, for the purge to write into the topics'
 * rows: up to max of them into the arrays; returns how many.  They are taken
 * out of the table here, under its lock, so that a second purge running
 * beside this one (purge() beside the worker) cannot write them too, and put
 * back if this transaction (or its subtransaction) aborts; the purge puts
 * back at once those of topics it skipped (idem_outbox_counts_put_back).  A
 * prepared transaction takes them with it: COMMIT PREPARED writes them,
 * ROLLBACK PREPARED loses them (documented).  Those of an earlier install of
 * the extension in this database are dropped.
 */
int
idem_outbox_counts_list(int32 *topic_ids, int64 *delivered, int64 *retried, int max)
{
	HASH_SEQ_STATUS seq;
	CountEntry *c;
	int			n = 0;
	int			i;
	Oid			gen;

	if (count_hash == NULL)
		return 0;
	gen = idem_outbox_install();
	LWLockAcquire(counts->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, count_hash);
	while ((c = (CountEntry *) hash_seq_search(&seq)) != NULL)
	{
		if (c->key.db != MyDatabaseId)
			continue;
		if (c->key.gen != gen)
		{
			/* an install dropped since (DROP EXTENSION): its topics are gone */
			if (OidIsValid(gen))
				hash_search(count_hash, &c->key, HASH_REMOVE, NULL);
			continue;
		}
		if (n >= max)
		{
			hash_seq_term(&seq);
			break;
		}
		topic_ids[n] = c->key.topic_id;
		delivered[n] = c->delivered;
		retried[n] = c->retried;
		n++;
		/* dynahash allows removing the entry the scan just returned */
		hash_search(count_hash, &c->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(counts->lock);
	for (i = 0; i < n; i++)
		pending_add(PENDING_RESTORE, gen, topic_ids[i], delivered[i], retried[i]);
	return n;
}

/* counts idem_outbox_counts_list() took that the purge did not write: back now */
void
idem_outbox_counts_put_back(int32 topic_id, int64 delivered, int64 retried)
{
	Oid			gen;

	if (count_hash == NULL)
		return;
	gen = idem_outbox_install();
	LWLockAcquire(counts->lock, LW_EXCLUSIVE);
	count_add(gen, topic_id, delivered, retried);
	LWLockRelease(counts->lock);
	/* an abort puts back what the take registered: this cancels it */
	pending_add(PENDING_RESTORE, gen, topic_id, -delivered, -retried);
}

/* ---------------------------------------------------------------------
 * The SQL-callable reader
 * ---------------------------------------------------------------------
 */

/* topic_id's acked counts not yet written by the purge (0 and 0: none) */
static void
counts_read(int32 topic_id, int64 *delivered, int64 *retried)
{
	CountKey	k;
	CountEntry *c;

	*delivered = *retried = 0;
	if (count_hash == NULL)
		return;
	memset(&k, 0, sizeof(k));
	k.db = MyDatabaseId;
	k.gen = idem_outbox_install();
	k.topic_id = topic_id;
	LWLockAcquire(counts->lock, LW_SHARED);
	c = (CountEntry *) hash_search(count_hash, &k, HASH_FIND, NULL);
	if (c != NULL)
	{
		*delivered = c->delivered;
		*retried = c->retried;
	}
	LWLockRelease(counts->lock);
}

/*
 * _outbox_counts(topic_id) -> (delivered, retried): acked since the purge
 * last wrote the counts into the topic's row, for the view outbox_stats;
 * zeros for a topic the caller may not see (idem_outbox_topic_visible).
 */
PG_FUNCTION_INFO_V1(idempotency_outbox_counts);

Datum
idempotency_outbox_counts(PG_FUNCTION_ARGS)
{
	int32		topic_id = PG_GETARG_INT32(0);
	TupleDesc	desc;
	int64		delivered = 0;
	int64		retried = 0;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "_outbox_counts must return a row");
	if (count_hash != NULL && idem_outbox_topic_visible(topic_id))
		counts_read(topic_id, &delivered, &retried);
	values[0] = Int64GetDatum(delivered);
	values[1] = Int64GetDatum(retried);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/*
 * Free the counts of database db and install gen (InvalidOid: of every
 * install): owners.c, when a database or an install is gone.
 */
void
idem_outbox_counts_forget(Oid db, Oid gen)
{
	HASH_SEQ_STATUS seq;
	CountEntry *c;

	if (count_hash == NULL)
		return;
	LWLockAcquire(counts->lock, LW_EXCLUSIVE);
	hash_seq_init(&seq, count_hash);
	while ((c = (CountEntry *) hash_seq_search(&seq)) != NULL)
	{
		if (c->key.db != db)
			continue;
		if (OidIsValid(gen) && c->key.gen != gen)
			continue;
		hash_search(count_hash, &c->key, HASH_REMOVE, NULL);
	}
	LWLockRelease(counts->lock);
}

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_outbox_counts_databases(Oid *dbs, int max)
{
	HASH_SEQ_STATUS seq;
	CountEntry *e;
	int			n = 0;
	int			i;

	if (count_hash == NULL)
		return 0;
	LWLockAcquire(counts->lock, LW_SHARED);
	hash_seq_init(&seq, count_hash);
	while ((e = (CountEntry *) hash_seq_search(&seq)) != NULL)
	{
		for (i = 0; i < n; i++)
			if (dbs[i] == e->key.db)
				break;
		if (i < n)
			continue;
		if (n == max)
		{
			hash_seq_term(&seq);
			break;
		}
		dbs[n++] = e->key.db;
	}
	LWLockRelease(counts->lock);
	return n;
}
