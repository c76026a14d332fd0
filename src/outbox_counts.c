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
 * holds a base, which every snapshot sees, and up to COUNT_DELTAS deltas,
 * each tagged with the xid of the ack (+) or purge (-) that made it and
 * seen by a snapshot exactly when that xid's rows are; a delta every
 * snapshot sees as ended is folded into the base, or dropped if it
 * aborted.  The table has COUNT_TOPICS entries, a role at most
 * COUNT_SHARE of them; an ack that finds no place writes its count into
 * the topic's row in its own transaction (slower, never lost).  A crash
 * loses the counts not yet written.  Why purges never write a count twice:
 * src/README.md, "Acked counts".
 *
 * Locking: counts.lock (an LWLock, sharedhash.c) guards the hash table:
 * shared to look up, exclusive to add, change or remove an entry.  Nothing
 * waits while holding it (folding reads the commit log).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
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
#define COUNT_DELTAS 16			/* transactions per topic not yet folded */

typedef struct CountKey
{
	Oid			db;
	Oid			gen;			/* the install: idem_outbox_install() */
	int32		topic_id;
} CountKey;

typedef struct CountDelta
{
	TransactionId xid;			/* the (sub)transaction that made it */
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
	CountDelta	deltas[COUNT_DELTAS];
} CountEntry;

static IdemSharedHash counts = {
	.name = COUNTS_TRANCHE,
	.hash_name = "idempotency outbox counts hash",
	.keysize = sizeof(CountKey),
	.entrysize = sizeof(CountEntry)
};
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static void
counts_shmem_request(void)
{
	idem_sharedhash_request(&counts, COUNT_TOPICS);
}

static void
counts_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	(void) idem_sharedhash_attach(&counts, COUNT_TOPICS);
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
 * aborted transaction are dropped).  Needs a snapshot of this transaction
 * (RecentXmin) for the horizon.  Returns whether the entry is empty now.
 */
static bool
count_fold(CountEntry *c)
{
	int			i = 0;

	while (i < c->ndeltas)
	{
		CountDelta *d = &c->deltas[i];

		if (!GlobalVisCheckRemovableXid(NULL, d->xid))
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
		if (count_fold(c))
			hash_search(counts.hash, &c->key, HASH_REMOVE, NULL);
}

/*
 * Add delivered and retried to topic_id's delta of transaction xid, making
 * the entry (of owner) and the delta if need be.  False: no place for
 * either (the table, owner's share or the entry's deltas are full).
 */
static bool
count_add(Oid gen, int32 topic_id, Oid owner, TransactionId xid,
		  int64 delivered, int64 retried)
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
	if (i == c->ndeltas && i == COUNT_DELTAS)
	{
		(void) count_fold(c);
		i = c->ndeltas;
	}
	if (i == COUNT_DELTAS)
		return false;
	if (i == c->ndeltas)
	{
		c->deltas[i].xid = xid;
		c->deltas[i].delivered = c->deltas[i].retried = 0;
		c->ndeltas++;
	}
	c->deltas[i].delivered += delivered;
	c->deltas[i].retried += retried;
	return true;
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
	Oid			types[3] = {INT4OID, INT8OID, INT8OID};
	Datum		values[3];

	if (counts.hash == NULL || delivered == 0)
		return;
	LWLockAcquire(counts.lock, LW_EXCLUSIVE);
	done = count_add(gen, topic_id, owner, xid, delivered, retried);
	LWLockRelease(counts.lock);
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
		if (count_fold(c))
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
		if (!count_add(gen, c->key.topic_id, c->owner, xid, -d, -r))
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
					 GetCurrentTransactionId(), delivered, retried);
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
	CountEntry	copy;
	bool		found = false;
	int			i;

	*delivered = *retried = 0;
	if (counts.hash == NULL)
		return;
	k = count_key(idem_outbox_install(), topic_id);
	LWLockAcquire(counts.lock, LW_SHARED);
	c = (CountEntry *) hash_search(counts.hash, &k, HASH_FIND, NULL);
	if (c != NULL)
	{
		copy = *c;
		found = true;
	}
	LWLockRelease(counts.lock);
	if (!found)
		return;
	*delivered = copy.delivered;
	*retried = copy.retried;
	for (i = 0; i < copy.ndeltas; i++)
	{
		CountDelta *d = &copy.deltas[i];

		if (TransactionIdIsCurrentTransactionId(d->xid) ||
			(!XidInMVCCSnapshot(d->xid, snap) && TransactionIdDidCommit(d->xid)))
		{
			*delivered += d->delivered;
			*retried += d->retried;
		}
	}
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
}

/* the databases that have entries here, up to max of them into dbs; how many */
int
idem_outbox_counts_databases(Oid *dbs, int max)
{
	return idem_sharedhash_databases(&counts, dbs, max);
}
