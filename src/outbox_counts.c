/*-------------------------------------------------------------------------
 *
 * outbox_counts.c
 *	  The outbox's acked counts in shared memory: per topic, the messages
 *	  acked (and their retries) since the purge last wrote them into the
 *	  topic's row, as each snapshot sees them.
 *
 * Preloaded, ack() deletes a message's row (outbox_relay.c) and counts it
 * here; the purge (lifecycle.c) moves the counts into the topic's purged_*
 * columns, and outbox_stats adds them to what its snapshot sees of the
 * rows through idempotency._outbox_counts(topic_id).  Each topic's entry
 * holds a base, which every snapshot sees, and up to outbox_count_deltas deltas,
 * each tagged with the xid of the ack (+) or purge (-) that made it and
 * seen by a snapshot exactly when that xid's rows are; a delta every
 * snapshot sees as ended is folded into the base, or dropped if it
 * aborted.  A snapshot's horizon is the cluster's, so a transaction left
 * open in another database would keep every delta from folding; a
 * barrier folds them by this database's snapshots alone: it marks the
 * deltas whose transactions have ended and records the transactions of
 * this database that hold a snapshot then, and once each of those has
 * ended, every snapshot of the database sees the marked deltas as ended
 * (see barrier_start()).  The table has COUNT_TOPICS entries, a role at most
 * COUNT_SHARE of them; an ack that finds no place writes its count into
 * the topic's row in its own transaction (slower, never lost).  A crash
 * loses the counts not yet written.  Why purges never write a count twice:
 * src/README.md, "Acked counts".
 *
 * Locking: counts.lock (an LWLock, sharedhash.c) guards the hash table
 * and the barriers: shared to look up, exclusive to add, change or remove
 * an entry or a barrier.  Nothing waits while holding it (folding reads the
 * commit log, a barrier's start the process array, its end whether its
 * transactions' processes have moved on).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_claims.h"
#include "outbox_counts.h"

#define COUNTS_TRANCHE "idempotency outbox counts"
#define COUNT_TOPICS 4096		/* topics with counts not yet written */
#define COUNT_SHARE (COUNT_TOPICS / 8)	/* of them, one role's at most */
#define COUNT_CROWDED (count_deltas / 2)	/* deltas that start a barrier */
#define COUNT_BARRIERS 32		/* topics with a barrier at once */
#define COUNT_DB_BARRIERS (COUNT_BARRIERS / 4)	/* of them, one database's */
#define BARRIERS_NAME "idempotency outbox count barriers"

typedef struct CountKey
{
	Oid			db;
	Oid			gen;			/* the install: idem_outbox_install() */
	int32		topic_id;
} CountKey;

typedef struct CountDelta
{
	TransactionId xid;			/* the (sub)transaction that made it */
	uint32		mark;			/* the barrier that folds it; 0: none */
	int64		delivered;
	int64		retried;
} CountDelta;

typedef struct CountEntry
{
	CountKey	key;
	Oid			owner;			/* the topic's owner (COUNT_SHARE) */
	int64		delivered;		/* the base: every snapshot sees it */
	int64		retried;
	int			ndeltas;
	CountDelta	deltas[FLEXIBLE_ARRAY_MEMBER];	/* count_deltas of them */
} CountEntry;

/* GUC idempotency.outbox_count_deltas: transactions per topic not yet folded */
static int	count_deltas = 64;

/*
 * A barrier of one topic's entry: once each of its transactions has ended,
 * every snapshot of the entry's database sees the deltas marked with its
 * mark as ended.
 */
typedef struct CountBarrier
{
	CountKey	key;			/* key.db InvalidOid: a free place */
	uint32		mark;
	int			nvxids;
	VirtualTransactionId vxids[FLEXIBLE_ARRAY_MEMBER];
} CountBarrier;

typedef struct CountBarriers
{
	uint32		last_mark;
	char		places[FLEXIBLE_ARRAY_MEMBER];	/* COUNT_BARRIERS of
												 * barrier_size() */
} CountBarriers;

static CountBarriers *barriers = NULL;

static IdemSharedHash counts = {
	.name = COUNTS_TRANCHE,
	.hash_name = "idempotency outbox counts hash",
	.keysize = sizeof(CountKey),
	.entrysize = 0				/* count_entry_size(), once the GUC is read */
};
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static Size
count_entry_size(void)
{
	return MAXALIGN(offsetof(CountEntry, deltas) + sizeof(CountDelta) * count_deltas);
}

/* the transactions a barrier may wait for: every process that has a vxid */
static int
barrier_capacity(void)
{
	return MaxBackends + max_prepared_xacts + 1;
}

static Size
barrier_size(void)
{
	return MAXALIGN(offsetof(CountBarrier, vxids) +
					sizeof(VirtualTransactionId) * barrier_capacity());
}

static Size
barriers_size(void)
{
	return MAXALIGN(offsetof(CountBarriers, places)) + COUNT_BARRIERS * barrier_size();
}

static CountBarrier *
barrier_place(int i)
{
	return (CountBarrier *) ((char *) barriers + MAXALIGN(offsetof(CountBarriers, places)) +
							 i * barrier_size());
}

static void
counts_shmem_request(void)
{
	counts.entrysize = count_entry_size();
	idem_sharedhash_request(&counts, COUNT_TOPICS);
	RequestAddinShmemSpace(barriers_size());
}

static void
counts_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	counts.entrysize = count_entry_size();
	(void) idem_sharedhash_attach(&counts, COUNT_TOPICS);
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	barriers = ShmemInitStruct(BARRIERS_NAME, barriers_size(), &found);
	if (!found)
		memset(barriers, 0, barriers_size());
	LWLockRelease(AddinShmemInitLock);
}

/* from _PG_init, before the prefix is reserved: preloaded, the GUC and the shared memory */
void
idem_outbox_counts_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("idempotency.outbox_count_deltas",
							"Ack transactions per topic whose counts are kept apart until every snapshot sees them ended.",
							"Beyond them an ack writes its count into the topic's row; more concurrent relays of one topic need more.",
							&count_deltas,
							64, 4, 1024,
							PGC_POSTMASTER, 0,
							NULL, NULL, NULL);
	idem_request_shmem(counts_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = counts_shmem_startup;
}

/* ---------------------------------------------------------------------
 * Entries and their deltas (exclusive lock held)
 * ---------------------------------------------------------------------
 */
static inline CountKey
count_key(Oid gen, int32 topic_id)
{
	CountKey	k;

	memset(&k, 0, sizeof(k));
	k.db = MyDatabaseId;
	k.gen = gen;
	k.topic_id = topic_id;
	return k;
}

/*
 * Fold into the base the deltas every snapshot sees as ended (those of an
 * aborted transaction are dropped): by the cluster's horizon, or marked
 * with mark (not 0) by a barrier that has passed.  Needs a snapshot of this
 * transaction (RecentXmin) for the horizon.  Returns whether the entry is
 * empty now.
 */
static bool
count_fold(CountEntry *c, uint32 mark)
{
	int			i = 0;

	while (i < c->ndeltas)
	{
		CountDelta *d = &c->deltas[i];

		if (!(mark != 0 && d->mark == mark) &&
			!GlobalVisCheckRemovableXid(NULL, d->xid))
		{
			i++;
			continue;
		}
		if (TransactionIdDidCommit(d->xid))
		{
			c->delivered += d->delivered;
			c->retried += d->retried;
		}
		c->deltas[i] = c->deltas[--c->ndeltas];
	}
	return c->ndeltas == 0 && c->delivered == 0 && c->retried == 0;
}

/* how many entries role owner has */
static int
count_places_of(Oid owner)
{
	HASH_SEQ_STATUS seq;
	CountEntry *c;
	int			n = 0;

	hash_seq_init(&seq, counts.hash);
	while ((c = (CountEntry *) hash_seq_search(&seq)) != NULL)
		if (c->owner == owner)
			n++;
	return n;
}

/* fold every entry; drop the empty ones */
static void
count_sweep(void)
{
	HASH_SEQ_STATUS seq;
	CountEntry *c;

	hash_seq_init(&seq, counts.hash);
	while ((c = (CountEntry *) hash_seq_search(&seq)) != NULL)
		if (count_fold(c, 0))
			hash_search(counts.hash, &c->key, HASH_REMOVE, NULL);
}

/*
 * Add delivered and retried to topic_id's delta of transaction xid, making
 * the entry (of owner) and the delta if need be.  False: no place for
 * either (the table, owner's share or the entry's deltas are full).
 */
static bool
count_add(Oid gen, int32 topic_id, Oid owner, TransactionId xid,
		  int64 delivered, int64 retried, bool *crowded)
{
	CountKey	k = count_key(gen, topic_id);
	CountEntry *c;
	bool		found;
	int			i;

	c = (CountEntry *) hash_search(counts.hash, &k, HASH_FIND, NULL);
	if (c == NULL)
	{
		/*
		 * dynahash's HASH_ENTER_NULL fails only when the shared memory is
		 * used up, not at the table's size: the entries are counted here
		 */
		if (hash_get_num_entries(counts.hash) >= COUNT_TOPICS)
			count_sweep();
		if (hash_get_num_entries(counts.hash) >= COUNT_TOPICS ||
			count_places_of(owner) >= COUNT_SHARE)
			return false;
		c = (CountEntry *) hash_search(counts.hash, &k, HASH_ENTER_NULL, &found);
		if (c == NULL)
			return false;
		c->owner = owner;
		c->delivered = c->retried = 0;
		c->ndeltas = 0;
	}
	for (i = 0; i < c->ndeltas; i++)
		if (TransactionIdEquals(c->deltas[i].xid, xid))
			break;
	if (i == c->ndeltas && i == count_deltas)
	{
		(void) count_fold(c, 0);
		i = c->ndeltas;
	}
	if (i == count_deltas)
	{
		if (crowded)
			*crowded = true;
		return false;
	}
	if (i == c->ndeltas)
	{
		c->deltas[i].xid = xid;
		c->deltas[i].mark = 0;
		c->deltas[i].delivered = c->deltas[i].retried = 0;
		c->ndeltas++;
	}
	c->deltas[i].delivered += delivered;
	c->deltas[i].retried += retried;
	if (crowded && c->ndeltas >= COUNT_CROWDED)
	{
		(void) count_fold(c, 0);
		*crowded = c->ndeltas >= COUNT_CROWDED;
	}
	return true;
}

/* ---------------------------------------------------------------------
 * Barriers: folding by this database's snapshots (the file's head)
 * ---------------------------------------------------------------------
 */

/* the barrier of entry k, or NULL (lock held) */
static CountBarrier *
barrier_of(const CountKey *k)
{
	for (int i = 0; i < COUNT_BARRIERS; i++)
	{
		CountBarrier *b = barrier_place(i);

		if (OidIsValid(b->key.db) && memcmp(&b->key, k, sizeof(CountKey)) == 0)
			return b;
	}
	return NULL;
}

/*
 * Whether transaction v has ended: its process runs another transaction or
 * none (a prepared transaction holds no snapshot, so its process has moved
 * on too).  Read without the process's lock: a stale value only delays.
 */
static bool
vxid_ended(VirtualTransactionId v)
{
	PGPROC	   *proc = IDEM_VXID_PROC(v);
	VirtualTransactionId now;

	if (proc == NULL)
		return true;
	GET_VXID_FROM_PGPROC(now, *proc);
	return !VirtualTransactionIdEquals(now, v);
}

/*
 * Whether barrier b has passed: each transaction it recorded has ended (the
 * ended ones are dropped from it).  Exclusive lock held.
 */
static bool
barrier_passed(CountBarrier *b)
{
	int			j = 0;

	for (int i = 0; i < b->nvxids; i++)
		if (!vxid_ended(b->vxids[i]))
			b->vxids[j++] = b->vxids[i];
	b->nvxids = j;
	return j == 0;
}

/*
 * End barrier b: fold the deltas it marked, if it has passed, and free its
 * place.  Exclusive lock held.
 */
static void
barrier_end(CountBarrier *b, bool passed)
{
	CountEntry *c;

	if (passed)
	{
		c = (CountEntry *) hash_search(counts.hash, &b->key, HASH_FIND, NULL);
		if (c != NULL && count_fold(c, b->mark))
			hash_search(counts.hash, &b->key, HASH_REMOVE, NULL);
	}
	memset(&b->key, 0, sizeof(CountKey));
}

/*
 * Whether barrier b has nothing left to fold: its entry is gone, or holds no
 * delta it marked (the horizon folded them).
 */
static bool
barrier_idle(const CountBarrier *b)
{
	CountEntry *c = (CountEntry *) hash_search(counts.hash, &b->key, HASH_FIND, NULL);

	if (c == NULL)
		return true;
	for (int i = 0; i < c->ndeltas; i++)
		if (c->deltas[i].mark == b->mark)
			return false;
	return true;
}

/*
 * End every barrier that has passed or has nothing left to fold, whatever
 * its topic or database (a quiet or dropped topic's barrier is ended here,
 * not by an ack of its own).  Exclusive lock held.
 */
static void
barriers_settle(void)
{
	for (int i = 0; i < COUNT_BARRIERS; i++)
	{
		CountBarrier *b = barrier_place(i);

		if (!OidIsValid(b->key.db))
			continue;
		if (barrier_idle(b))
			barrier_end(b, false);
		else if (barrier_passed(b))
			barrier_end(b, true);
	}
}

/* a free place for a barrier of this database, or NULL (lock held) */
static CountBarrier *
barrier_free_place(void)
{
	CountBarrier *free_place = NULL;
	int			mine = 0;

	for (int i = 0; i < COUNT_BARRIERS; i++)
	{
		CountBarrier *b = barrier_place(i);

		if (!OidIsValid(b->key.db))
		{
			if (free_place == NULL)
				free_place = b;
		}
		else if (b->key.db == MyDatabaseId)
			mine++;
	}
	return mine < COUNT_DB_BARRIERS ? free_place : NULL;
}

/*
 * Start a barrier of entry c, if a place is free (exclusive lock held):
 * mark the deltas whose transactions snapshot snap sees as ended, then
 * record the transactions of this database that hold a snapshot, this one
 * included.  A snapshot that does not see a marked delta's transaction as
 * ended was taken before it ended, so before snap was: its process holds
 * it still (its xmin is set while it holds any snapshot) and its
 * transaction is recorded.  Vacuums, whose snapshots read no counts, are
 * not.  A database has at most COUNT_DB_BARRIERS places, so a long reader
 * in one database leaves places to the others.  Limit: a snapshot
 * imported (SET TRANSACTION SNAPSHOT) from a recorded transaction may
 * outlive it; it could read a marked delta folded.
 */
static void
barrier_start(CountEntry *c, Snapshot snap)
{
	CountBarrier *b = barrier_free_place();
	uint32		mark;
	bool		marked = false;
	VirtualTransactionId *vxids;
	int			n;
	int			i;

	if (b == NULL)
	{
		barriers_settle();
		b = barrier_free_place();
	}
	if (b == NULL)
		return;					/* no place: the horizon folds */
	mark = ++barriers->last_mark;
	if (mark == 0)
		mark = ++barriers->last_mark;
	for (i = 0; i < c->ndeltas; i++)
	{
		CountDelta *d = &c->deltas[i];

		if (!TransactionIdIsCurrentTransactionId(d->xid) &&
			!XidInMVCCSnapshot(d->xid, snap))
		{
			d->mark = mark;
			marked = true;
		}
	}
	if (!marked)
		return;
	vxids = GetCurrentVirtualXIDs(InvalidTransactionId, true, false,
								  PROC_IS_AUTOVACUUM | PROC_IN_VACUUM, &n);
	if (n < barrier_capacity())
	{
		memcpy(b->vxids, vxids, sizeof(VirtualTransactionId) * n);
		GET_VXID_FROM_PGPROC(b->vxids[n], *MyProc);
		b->nvxids = n + 1;
		b->mark = mark;
		b->key = c->key;
	}
	pfree(vxids);
}

/*
 * Entry k is crowded: if its barrier has passed, fold the deltas it marked
 * and free its place; then start the next barrier if the entry is still
 * crowded.
 */
static void
count_barrier_step(const CountKey *k)
{
	CountBarrier *b;
	CountEntry *c;

	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	b = barrier_of(k);
	if (b != NULL && barrier_passed(b))
	{
		barrier_end(b, true);
		b = NULL;
	}
	if (b == NULL && ActiveSnapshotSet())
	{
		c = (CountEntry *) hash_search(counts.hash, k, HASH_FIND, NULL);
		if (c != NULL && c->ndeltas >= COUNT_CROWDED)
			barrier_start(c, GetActiveSnapshot());
	}
	LWLockRelease(counts.lock);
}

/* ---------------------------------------------------------------------
 * For outbox_relay.c and lifecycle.c
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_count_row = NULL;

/*
 * ack() deleted delivered messages of topic_id (owned by owner; retried:
 * their attempts after the first; gen: the install, as
 * idem_outbox_claims_end() read it) in this (sub)transaction: count them in
 * its delta, or, with no place for it, in the topic's row.  Inside
 * SPI_connect().
 */
void
idem_outbox_count_acked(Oid gen, int32 topic_id, Oid owner, int64 delivered,
						int64 retried)
{
	TransactionId xid = GetCurrentTransactionId();	/* assigned: rows deleted */
	bool		done;
	bool		crowded = false;
	Oid			types[3] = {INT4OID, INT8OID, INT8OID};
	Datum		values[3];

	if (counts.hash == NULL || delivered == 0)
		return;
	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	done = count_add(gen, topic_id, owner, xid, delivered, retried, &crowded);
	LWLockRelease(counts.lock);
	if (crowded)
	{
		CountKey	k = count_key(gen, topic_id);

		count_barrier_step(&k);
		if (!done)
		{
			LWLockAcquire(counts.lock, LW_EXCLUSIVE);
			done = count_add(gen, topic_id, owner, xid, delivered, retried, NULL);
			LWLockRelease(counts.lock);
		}
	}
	if (done)
		return;
	/* no place: into the row, as the purge writes them */
	values[0] = Int32GetDatum(topic_id);
	values[1] = Int64GetDatum(delivered);
	values[2] = Int64GetDatum(retried);
	idem_run_as_owner(&plan_count_row,
					  "UPDATE idempotency.outbox_topic AS p"
					  "   SET purged_delivered = p.purged_delivered OPERATOR(pg_catalog.+) $2,"
					  "       purged_retries = p.purged_retries OPERATOR(pg_catalog.+) $3"
					  " WHERE p.id OPERATOR(pg_catalog.=) $1",
					  3, types, values, NULL, SPI_OK_UPDATE);
}

/*
 * The counts of this database's topics the purge may write into their rows
 * (of owner's topics; InvalidOid: every role's), up to max of them into the
 * arrays; returns how many.  What is taken is each entry's base less what
 * purges still open took: taking it adds a delta (-counts) of this
 * transaction, which the snapshots that see its write of the row see too.
 * The purge gives back at once those it did not write
 * (idem_outbox_counts_put_back).  Entries of an earlier install of the
 * extension in this database are dropped.
 */
int
idem_outbox_counts_take(Oid owner, int32 *topic_ids, int64 *delivered,
						int64 *retried, int max)
{
	HASH_SEQ_STATUS seq;
	CountEntry *c;
	int			n = 0;
	Oid			gen;
	TransactionId xid = InvalidTransactionId;

	if (counts.hash == NULL || RecoveryInProgress())
		return 0;
	gen = idem_outbox_install();
	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	barriers_settle();
	hash_seq_init(&seq, counts.hash);
	while ((c = (CountEntry *) hash_seq_search(&seq)) != NULL)
	{
		int64		d;
		int64		r;
		int			i;

		if (c->key.db != MyDatabaseId)
			continue;
		if (c->key.gen != gen)
		{
			/* an install dropped since (DROP EXTENSION): its topics are gone */
			if (OidIsValid(gen))
				hash_search(counts.hash, &c->key, HASH_REMOVE, NULL);
			continue;
		}
		if (OidIsValid(owner) && c->owner != owner)
			continue;
		if (count_fold(c, 0))
		{
			hash_search(counts.hash, &c->key, HASH_REMOVE, NULL);
			continue;
		}
		if (n >= max)
			continue;			/* folded all the same */
		/* the base less what purges not rolled back took */
		d = c->delivered;
		r = c->retried;
		for (i = 0; i < c->ndeltas; i++)
		{
			CountDelta *cd = &c->deltas[i];

			/* in progress (prepared too) or committed: not aborted */
			if ((cd->delivered < 0 || cd->retried < 0) &&
				!TransactionIdDidAbort(cd->xid))
			{
				d += cd->delivered;
				r += cd->retried;
			}
		}
		if (d <= 0 && r <= 0)
			continue;
		if (!TransactionIdIsValid(xid))
			xid = GetCurrentTransactionId();
		if (!count_add(gen, c->key.topic_id, c->owner, xid, -d, -r, NULL))
			continue;			/* no delta free: the next purge */
		topic_ids[n] = c->key.topic_id;
		delivered[n] = d;
		retried[n] = r;
		n++;
	}
	LWLockRelease(counts.lock);
	return n;
}

/* counts idem_outbox_counts_take() took that the purge did not write: back now */
void
idem_outbox_counts_put_back(int32 topic_id, int64 delivered, int64 retried)
{
	if (counts.hash == NULL)
		return;
	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	/* the taking delta exists: this only adds to it */
	(void) count_add(idem_outbox_install(), topic_id, InvalidOid,
					 GetCurrentTransactionId(), delivered, retried, NULL);
	LWLockRelease(counts.lock);
}

/* ---------------------------------------------------------------------
 * The SQL-callable reader
 * ---------------------------------------------------------------------
 */

/*
 * topic_id's acked counts not yet written by the purge, as snapshot snap
 * sees them (0 and 0: none): the base and the deltas of the transactions
 * whose rows it sees.  The entry is copied under the lock; the commit log
 * is read after.
 */
static void
counts_read(int32 topic_id, Snapshot snap, int64 *delivered, int64 *retried)
{
	CountKey	k;
	CountEntry *c;
	CountEntry *copy;
	bool		found = false;
	int			i;

	*delivered = *retried = 0;
	if (counts.hash == NULL)
		return;
	k = count_key(idem_outbox_install(), topic_id);
	copy = palloc(count_entry_size());
	LWLockAcquire(counts.lock, LW_SHARED);
	c = (CountEntry *) hash_search(counts.hash, &k, HASH_FIND, NULL);
	if (c != NULL)
	{
		memcpy(copy, c, offsetof(CountEntry, deltas) + sizeof(CountDelta) * c->ndeltas);
		found = true;
	}
	LWLockRelease(counts.lock);
	if (!found)
	{
		pfree(copy);
		return;
	}
	*delivered = copy->delivered;
	*retried = copy->retried;
	for (i = 0; i < copy->ndeltas; i++)
	{
		CountDelta *d = &copy->deltas[i];

		if (TransactionIdIsCurrentTransactionId(d->xid) ||
			(!XidInMVCCSnapshot(d->xid, snap) && TransactionIdDidCommit(d->xid)))
		{
			*delivered += d->delivered;
			*retried += d->retried;
		}
	}
	pfree(copy);
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
	if (counts.hash != NULL && idem_outbox_topic_visible(topic_id))
		counts_read(topic_id, ActiveSnapshotSet() ? GetActiveSnapshot() :
					GetTransactionSnapshot(), &delivered, &retried);
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
	idem_sharedhash_forget(&counts, db, gen);
	if (barriers == NULL)
		return;
	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	for (int i = 0; i < COUNT_BARRIERS; i++)
	{
		CountBarrier *b = barrier_place(i);

		if (OidIsValid(b->key.db) && (!OidIsValid(db) || b->key.db == db) &&
			(!OidIsValid(gen) || b->key.gen == gen))
			memset(&b->key, 0, sizeof(CountKey));
	}
	LWLockRelease(counts.lock);
}

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_outbox_counts_databases(Oid *dbs, int max)
{
	int			n = idem_sharedhash_databases(&counts, dbs, max);

	if (barriers == NULL)
		return n;
	LWLockAcquire(counts.lock, LW_SHARED);
	for (int i = 0; i < COUNT_BARRIERS && n < max; i++)
	{
		Oid			db = barrier_place(i)->key.db;
		bool		listed = !OidIsValid(db);

		for (int j = 0; j < n && !listed; j++)
			listed = dbs[j] == db;
		if (!listed)
			dbs[n++] = db;
	}
	LWLockRelease(counts.lock);
	return n;
}
