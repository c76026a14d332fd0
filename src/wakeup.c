/*-------------------------------------------------------------------------
 *
 * wakeup.c
 *	  The outbox's wake-ups, both ways in one room: a publisher's
 *	  idem_wake_at_commit() (publish() in outbox_publish.c; nack(),
 *	  release(), redrive() in outbox_relay.c) wakes the topic's relays when
 *	  its transaction commits, through shared memory for wait_for(), and by
 *	  NOTIFY for a topic created or altered with notify => true.
 *
 * Two ways, because two kinds of users need them.  Shared memory (the
 * library preloaded): relays (the Node and Python clients' among them)
 * sleep in idempotency.wait_for() until a transaction that published to one
 * of its topics has committed, or until its timeout; no lock on the
 * publisher's path.  Without preloading wait_for() raises 55000 (poll
 * claim()).  NOTIFY (off by default): plain SQL clients that LISTEN
 * "idempotency.outbox.<topic>", among them relays written for the portable
 * edition, whose only wake-up is LISTEN/NOTIFY (or polling): the same LISTEN
 * works against either edition.  Its price is that PostgreSQL serialises
 * the commits of all notifying transactions (its async.c takes a cluster-wide
 * lock before the commit record and holds it past the WAL flush), which is
 * why a topic asks for it.
 *
 * Shared memory holds WAKE_ENTRIES entries, one per (database, topic id)
 * someone has waited on, plus one overflow entry: a count, a number of
 * waiters and pins, and a ConditionVariable.  The publisher's topic is
 * listed for its transaction; at XACT_EVENT_COMMIT, once the commit is
 * visible, each listed topic's count goes up and its sleepers are woken.
 * wait_for() compares the counts with the cursor it is given and sleeps
 * until one differs.  The entries, the cursor, why no wake-up is lost and
 * what a role can learn: src/README.md, "Wake-ups (wakeup.c)".  NOTIFY
 * channels are queued once per transaction and topic, and a PRE_COMMIT
 * callback NOTIFYs
 * each with an empty payload (before PostgreSQL's PreCommit_Notify()): not
 * earlier, since PostgreSQL refuses to PREPARE a transaction that issued a
 * NOTIFY.  A prepared transaction wakes nobody either way; a rolled-back
 * subtransaction takes its wake-ups with it.
 *
 * Locking: none on the publisher's path (an atomic add; a broadcast only
 * while a relay sleeps; NOTIFY's own lock at commit); a waiter takes
 * wake->lock, a spinlock, to find, make and pin its entries, and the cv's
 * spinlock inside the ConditionVariable calls.  The sleep ends on a cancel,
 * statement_timeout, a shutdown or the postmaster's death.  wait_for(),
 * like pg_sleep(), holds back vacuum's horizon while it waits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_topics.h"
#include "wakeup.h"

#define WAKE_ENTRIES 4096		/* a power of two */
#define WAKE_PROBES 64			/* places an entry may take from its hash */
#define WAKE_MAX_TOPICS 100		/* topics of one wait_for() */

typedef struct WakeEntry
{
	pg_atomic_uint64 key;		/* (dbid << 32) | topic id; 0: free */
	pg_atomic_uint64 count;		/* commits that published to the topic */
	pg_atomic_uint32 waiters;	/* wait_for() calls asleep on cv */
	pg_atomic_uint32 pins;		/* wait_for() calls using the entry */
	ConditionVariable cv;
} WakeEntry;

typedef struct WakeShared
{
	uint64		epoch;			/* when the shared memory was made */
	uint64		seed;			/* of the places' hash, random */
	slock_t		lock;			/* taking and giving up entries */
	/* wait_for() of topics with different entries sleeps on multi_cv */
	pg_atomic_uint32 multi_waiters;
	ConditionVariable multi_cv;
	WakeEntry	overflow;
	WakeEntry	entries[WAKE_ENTRIES];
} WakeShared;

/* a topic this transaction published to, at the lowest level it did */
typedef struct Touched
{
	int32		topic_id;
	int			level;
} Touched;

static WakeShared *wake = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* this transaction's topics, in TopTransactionContext; NULL: none */
static Touched *touched = NULL;
static int	ntouched = 0;
static int	touched_size = 0;
static bool callbacks_registered = false;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static void
wake_entry_init(WakeEntry *e)
{
	pg_atomic_init_u64(&e->key, 0);
	pg_atomic_init_u64(&e->count, 0);
	pg_atomic_init_u32(&e->waiters, 0);
	pg_atomic_init_u32(&e->pins, 0);
	ConditionVariableInit(&e->cv);
}

static void
wake_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(WakeShared)));
}

static void
wake_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	wake = ShmemInitStruct("idempotency wake-ups", sizeof(WakeShared), &found);
	if (!found)
	{
		wake->epoch = (uint64) GetCurrentTimestamp();
		if (!pg_strong_random(&wake->seed, sizeof(wake->seed)))
			wake->seed = wake->epoch;
		SpinLockInit(&wake->lock);
		pg_atomic_init_u32(&wake->multi_waiters, 0);
		ConditionVariableInit(&wake->multi_cv);
		wake_entry_init(&wake->overflow);
		for (i = 0; i < WAKE_ENTRIES; i++)
			wake_entry_init(&wake->entries[i]);
	}
	LWLockRelease(AddinShmemInitLock);
}

void
idem_wakeup_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	idem_request_shmem(wake_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = wake_shmem_startup;
}

static inline uint64
wake_key(Oid dbid, int32 topic_id)
{
	return ((uint64) dbid << 32) | (uint32) topic_id;
}

/* an entry's first count: of key and the server start, 0 to 2^62 - 1 */
static inline uint64
wake_start(uint64 key)
{
	return hash_bytes_uint32_extended((uint32) key,
									  hash_bytes_uint32_extended((uint32) (key >> 32),
																 wake->epoch)) >> 2;
}

/* the first place of key's probe sequence: a hash seeded at random */
static inline uint32
wake_hash(uint64 key)
{
	return (uint32) hash_bytes_uint32_extended((uint32) key, wake->seed ^ (key >> 32));
}

/*
 * A publisher's look-up: the entry of key, NULL if a place of its probe
 * sequence before it is free (nobody waits on the topic: places are taken
 * in order and never freed, only given to another key), else the overflow
 * entry.  No lock: an entry given to another key meanwhile gets a spurious
 * count, harmless (see wake_pin()).
 */
static WakeEntry *
wake_find(uint64 key)
{
	uint32		h = wake_hash(key);
	int			i;

	for (i = 0; i < WAKE_PROBES; i++)
	{
		WakeEntry  *e = &wake->entries[(h + i) & (WAKE_ENTRIES - 1)];
		uint64		k = pg_atomic_read_u64(&e->key);

		if (k == key)
			return e;
		if (k == 0)
			return NULL;
	}
	return &wake->overflow;
}

/*
 * A waiter's: the entry of key, pinned (not given to another key until
 * wake_unpin()).  Not there: made in the first free place of its probe
 * sequence, else in the first place nobody pins (taken back from its
 * topic, whose next waiter makes it another entry), else the overflow entry,
 * which only a sequence of 64 places all pinned by waits in progress gets
 * (the places are a random hash of the key: an attacker must pin about the
 * whole table, 4096 topics in waits at once, 41 sessions).
 *
 * A new entry's count starts at a value of the key and of this server start
 * (kept by adding, so that no commit counted since the key was set is lost),
 * so that a cursor read from another entry (another topic id, as a topic
 * dropped and created again under its name has; an entry taken back and
 * made again; a cursor from before a restart) differs from it: that relay
 * wakes once, at once, where a commit it has not claimed would otherwise be
 * missed until its timeout.  A publisher that found the entry before it
 * changed key counts on the new key: a spurious wake-up.  The old key lost
 * nothing: nobody waited on it, its commit was visible before the place
 * changed hands, so before its next waiter's baseline (and a cursor of it
 * differs from the new entry's count).
 */
static WakeEntry *
wake_pin(uint64 key)
{
	uint32		h = wake_hash(key);
	WakeEntry  *e = NULL;
	WakeEntry  *unpinned = NULL;
	int			i;

	SpinLockAcquire(&wake->lock);
	for (i = 0; i < WAKE_PROBES; i++)
	{
		WakeEntry  *p = &wake->entries[(h + i) & (WAKE_ENTRIES - 1)];
		uint64		k = pg_atomic_read_u64(&p->key);

		if (k == key)
		{
			e = p;
			break;
		}
		if (k == 0)
		{
			unpinned = p;		/* free: the first place for a new key */
			break;
		}
		if (unpinned == NULL && pg_atomic_read_u32(&p->pins) == 0)
			unpinned = p;
	}
	if (e == NULL && unpinned != NULL)
	{
		e = unpinned;
		pg_atomic_write_u64(&e->key, key);
		pg_atomic_fetch_add_u64(&e->count, wake_start(key));	/* a full barrier */
	}
	if (e != NULL)
		pg_atomic_fetch_add_u32(&e->pins, 1);
	SpinLockRelease(&wake->lock);
	return e != NULL ? e : &wake->overflow;
}

static void
wake_unpin(WakeEntry *e)
{
	if (e != &wake->overflow)
		pg_atomic_fetch_sub_u32(&e->pins, 1);
}

/* ---------------------------------------------------------------------
 * Publishers: the transaction's topics, counted at commit
 * ---------------------------------------------------------------------
 */
static void
wake_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	WakeEntry  *seen[8];
	int			nseen = 0;
	bool		any = false;
	int			i;

	if (touched == NULL)
		return;
	if (event == XACT_EVENT_COMMIT && wake != NULL)
	{
		/* the commit is visible: order that before every read below */
		pg_memory_barrier();
		for (i = 0; i < ntouched; i++)
		{
			WakeEntry  *e = wake_find(wake_key(MyDatabaseId, touched[i].topic_id));
			int			j;

			if (e == NULL)
				continue;		/* nobody ever waited on it */
			/* overflowed topics share one entry: count it once */
			for (j = 0; j < nseen && seen[j] != e; j++)
				;
			if (j < nseen)
				continue;
			if (nseen < (int) lengthof(seen))
				seen[nseen++] = e;
			pg_atomic_fetch_add_u64(&e->count, 1);	/* a full barrier */
			if (pg_atomic_read_u32(&e->waiters) > 0)
				ConditionVariableBroadcast(&e->cv);
			any = true;
		}
		if (any && pg_atomic_read_u32(&wake->multi_waiters) > 0)
			ConditionVariableBroadcast(&wake->multi_cv);
	}
	/* committed, aborted or prepared (nobody is woken): the list is done */
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PREPARE || event == XACT_EVENT_PARALLEL_COMMIT ||
		event == XACT_EVENT_PARALLEL_ABORT)
	{
		touched = NULL;
		ntouched = 0;
		touched_size = 0;
	}
}

/* a subtransaction's topics go with its abort, to its parent on commit */
static void
wake_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
					  SubTransactionId parentSubid pg_attribute_unused(),
					  void *arg pg_attribute_unused())
{
	int			level = GetCurrentTransactionNestLevel();
	int			i;
	int			kept = 0;

	if (touched == NULL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	for (i = 0; i < ntouched; i++)
	{
		if (touched[i].level >= level)
		{
			if (event == SUBXACT_EVENT_ABORT_SUB)
				continue;
			touched[i].level = level - 1;
		}
		touched[kept++] = touched[i];
	}
	ntouched = kept;
}

/* list topic_id for this transaction's commit (preloaded) */
static void
wake_list(int32 topic_id)
{
	int			level;
	int			i;

	level = GetCurrentTransactionNestLevel();
	for (i = 0; i < ntouched; i++)
		if (touched[i].topic_id == topic_id)
		{
			if (touched[i].level > level)
				touched[i].level = level;
			return;
		}
	if (!callbacks_registered)
	{
		RegisterXactCallback(wake_xact_callback, NULL);
		RegisterSubXactCallback(wake_subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (touched == NULL)
	{
		touched_size = 4;
		touched = MemoryContextAlloc(TopTransactionContext,
									 touched_size * sizeof(Touched));
	}
	else if (ntouched == touched_size)
	{
		touched_size *= 2;
		touched = repalloc(touched, touched_size * sizeof(Touched));
	}
	touched[ntouched].topic_id = topic_id;
	touched[ntouched].level = level;
	ntouched++;
}

/* ---------------------------------------------------------------------
 * NOTIFY, for the topics that ask for it
 * ---------------------------------------------------------------------
 */
#define CHANNEL_PREFIX "idempotency.outbox."

/*
 * NOTIFYs wait here until commit (see the file comment):
 * one entry per channel, with the lowest (sub)transaction level that
 * queued it; in TopTransactionContext, forgotten at the end of the
 * transaction.
 */
typedef struct PendingWake
{
	char		channel[NAMEDATALEN];
	int			level;
} PendingWake;

static HTAB *pending_wakes = NULL;
static bool notify_callbacks = false;

/* at commit, NOTIFY each queued channel; at PREPARE, nobody */
static void
notify_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	PendingWake *w;
	HTAB	   *wakes = pending_wakes;

	if (wakes == NULL)
		return;
	pending_wakes = NULL;
	/* PRE_COMMIT runs before PreCommit_Notify(), which sends them */
	if (event == XACT_EVENT_PRE_COMMIT)
	{
		hash_seq_init(&seq, wakes);
		while ((w = hash_seq_search(&seq)) != NULL)
			Async_Notify(w->channel, "");
	}
	/* any other event ends the transaction or prepares it: drop them */
}

/* a subtransaction's wake-ups go with its abort, to its parent on commit */
static void
notify_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
						SubTransactionId parentSubid pg_attribute_unused(),
						void *arg pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	PendingWake *w;
	int			level = GetCurrentTransactionNestLevel();

	if (pending_wakes == NULL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	hash_seq_init(&seq, pending_wakes);
	while ((w = hash_seq_search(&seq)) != NULL)
	{
		if (w->level < level)
			continue;
		if (event == SUBXACT_EVENT_COMMIT_SUB)
			w->level = level - 1;
		else
			(void) hash_search(pending_wakes, w->channel, HASH_REMOVE, NULL);
	}
}

/*
 * Queue NOTIFY "idempotency.outbox.<topic>" (an empty payload) for this
 * transaction's commit, once per transaction and topic.
 */
static void
notify_at_commit(const char *topic)
{
	char		channel[NAMEDATALEN];
	PendingWake *w;
	bool		found;
	int			level = GetCurrentTransactionNestLevel();

	StaticAssertStmt(sizeof(CHANNEL_PREFIX) + TOPIC_MAX_LEN <= NAMEDATALEN,
					 "a topic's channel fits a NOTIFY channel name");
	if (!notify_callbacks)
	{
		RegisterXactCallback(notify_xact_callback, NULL);
		RegisterSubXactCallback(notify_subxact_callback, NULL);
		notify_callbacks = true;
	}
	if (pending_wakes == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(PendingWake);
		ctl.hcxt = TopTransactionContext;
		pending_wakes = hash_create("idempotency outbox wake-ups", 8, &ctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	memset(channel, 0, sizeof(channel));
	snprintf(channel, sizeof(channel), "%s%s", CHANNEL_PREFIX, topic);
	w = hash_search(pending_wakes, channel, HASH_ENTER, &found);
	if (!found || w->level > level)
		w->level = level;
}

/* ---------------------------------------------------------------------
 * For the publishers
 * ---------------------------------------------------------------------
 */

/*
 * Wake the relays of topic topic_id (named topic) when this transaction
 * commits: through shared memory (preloaded), and by NOTIFY when the topic
 * asks for it (notify).
 */
void
idem_wake_at_commit(int32 topic_id, const char *topic, bool notify)
{
	if (wake != NULL)
		wake_list(topic_id);
	if (notify)
		notify_at_commit(topic);
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_topics = NULL;

/*
 * The ids of the topics named, each of which the caller must be allowed to
 * consume: 42704 for a topic that does not exist, 42501 for one the caller
 * may not consume (as claim() says; a topic whose owner was dropped is
 * one that does not exist).
 */
static void
topic_ids(Datum *names, int n, int32 *ids)
{
	Oid			argtypes[2] = {TEXTARRAYOID, REGROLEOID};
	Datum		values[2];
	Oid			me = GetUserId();
	uint64		rows;
	uint64		r;
	int			i;

	values[0] = PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
	values[1] = ObjectIdGetDatum(me);
	SPI_connect();
	rows = idem_run_as_owner(&plan_topics,
							 "SELECT t.name, t.id,"
							 "       t.owner OPERATOR(pg_catalog.=) $2"
							 "       OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g"
							 "                   WHERE g.topic_id OPERATOR(pg_catalog.=) t.id"
							 "                     AND g.grantee OPERATOR(pg_catalog.=) $2"
							 "                     AND g.can_consume)"
							 "  FROM idempotency.outbox_topic AS t"
							 " WHERE t.name OPERATOR(pg_catalog.=) ANY ($1)"
							 "   AND EXISTS (SELECT FROM pg_catalog.pg_roles AS r"
							 "                WHERE r.oid OPERATOR(pg_catalog.=) t.owner::pg_catalog.oid)",
							 2, argtypes, values, NULL, SPI_OK_SELECT);
	for (i = 0; i < n; i++)
	{
		char	   *name = TextDatumGetCString(names[i]);
		bool		found = false;

		for (r = 0; r < rows && !found; r++)
		{
			HeapTuple	tup = SPI_tuptable->vals[r];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			char	   *got = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));

			if (strcmp(got, name) != 0)
				continue;
			found = true;
			if (!DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull)))
				ereport(ERROR,
						(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						 errmsg("permission denied for topic \"%s\"", name),
						 errdetail("Role %s may not consume from this topic.",
								   GetUserNameFromId(me, false)),
						 errhint("The topic's owner can allow it with idempotency.grant_topic().")));
			ids[i] = DatumGetInt32(SPI_getbinval(tup, desc, 2, &isnull));
		}
		if (!found)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("topic \"%s\" does not exist", name),
					 errhint("Create it with idempotency.create_topic().")));
	}
	SPI_finish();
}

/* a wait_for() in progress: its pinned entries, its waiters count */
typedef struct WakeWait
{
	WakeEntry **entries;
	int			npinned;
	pg_atomic_uint32 *waiters;	/* NULL until counted */
} WakeWait;

/*
 * A wait_for() ends, normally, by an error or by the backend's exit (FATAL:
 * pg_terminate_backend(), a shutdown): it no longer waits nor pins.  (A
 * terminated wait left waiters above 0 for good, and every later commit of
 * the topic, of any topic for a multi-topic wait, broadcast on its cv.)
 */
static void
wake_wait_gone(int code pg_attribute_unused(), Datum arg)
{
	WakeWait   *w = (WakeWait *) DatumGetPointer(arg);

	ConditionVariableCancelSleep();
	if (w->waiters != NULL)
		pg_atomic_fetch_sub_u32(w->waiters, 1);
	w->waiters = NULL;
	while (w->npinned > 0)
		wake_unpin(w->entries[--w->npinned]);
}

/* the counts of entries e[0..n-1]; true if one differs from since */
static bool
wake_read(WakeEntry **e, int n, const int64 *since, int64 *now)
{
	bool		changed = false;
	int			i;

	for (i = 0; i < n; i++)
	{
		now[i] = (int64) pg_atomic_read_u64(&e[i]->count);
		if (now[i] != since[i])
			changed = true;
	}
	return changed;
}

/*
 * wait_for(topics text[], timeout interval, since int8[])
 *   -> (woken text[], cursor int8[])
 *
 * See src/README.md, "Wake-ups".  The topics are checked
 * (22004, 22023, 42704, 42501) and their entries found or made; then,
 * unless a count already differs from since, the call sleeps until one
 * does or timeout passes.
 */
PG_FUNCTION_INFO_V1(idempotency_wait_for);

Datum
idempotency_wait_for(PG_FUNCTION_ARGS)
{
	static uint32 wait_event = 0;
	ArrayType  *topics_arr;
	Datum	   *names;
	bool	   *name_nulls;
	int			n;
	int32	   *ids;
	WakeEntry **entries;
	int64	   *since;
	int64	   *now;
	Datum	   *out;
	Datum	   *woken;
	int			nwoken = 0;
	Interval   *timeout;
	TimestampTz deadline;
	ConditionVariable *cv;
	pg_atomic_uint32 *waiters;
	volatile bool single = true;
	WakeWait   *ww;
	TupleDesc	desc;
	Datum		result[2];
	bool		result_nulls[2] = {false, false};
	int			i;

	idem_outbox_not_null(fcinfo, 0, "topics");
	idem_outbox_not_null(fcinfo, 1, "timeout");
	topics_arr = PG_GETARG_ARRAYTYPE_P(0);
	deconstruct_array(topics_arr, TEXTOID, -1, false, TYPALIGN_INT,
					  &names, &name_nulls, &n);
	if (ARR_NDIM(topics_arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topics must be a one-dimensional array")));
	if (n < 1 || n > WAKE_MAX_TOPICS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topics must name 1 to %d topics", WAKE_MAX_TOPICS)));
	for (i = 0; i < n; i++)
		if (name_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("topics must not contain nulls")));
	timeout = PG_GETARG_INTERVAL_P(1);
	{
		Interval	zero;

		memset(&zero, 0, sizeof(zero));
		if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(timeout),
											  IntervalPGetDatum(&zero))) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("timeout must be zero or positive")));
	}
	since = palloc(n * sizeof(int64));
	if (!PG_ARGISNULL(2))
	{
		ArrayType  *s = PG_GETARG_ARRAYTYPE_P(2);
		Datum	   *sv;
		bool	   *sn;
		int			ns;

		deconstruct_array(s, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &sv, &sn, &ns);
		if (ns != n || ARR_NDIM(s) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("since must have one element per topic"),
					 errdetail("since has %d elements and topics %d.", ns, n),
					 errhint("Pass the cursor an earlier call with the same topics returned.")));
		for (i = 0; i < n; i++)
		{
			if (sn[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("since must not contain nulls")));
			since[i] = DatumGetInt64(sv[i]);
		}
	}

	/* the topics: each checked before anything is said about it */
	ids = palloc(n * sizeof(int32));
	topic_ids(names, n, ids);
	if (wake == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempotency.wait_for() needs the idempotency library in shared_preload_libraries"),
				 errdetail("Relays are woken through shared memory, which only a preloaded library has."),
				 errhint("Add idempotency to shared_preload_libraries and restart the server, or poll idempotency.claim() at an interval instead.")));

	if (wait_event == 0)
		wait_event = idem_wait_event("IdempotencyWaitFor");
	deadline = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													   TimestampTzGetDatum(GetCurrentTimestamp()),
													   IntervalPGetDatum(timeout)));
	now = palloc0(n * sizeof(int64));
	entries = palloc(n * sizeof(WakeEntry *));
	ww = palloc0(sizeof(WakeWait));
	ww->entries = entries;

	/* pins and waiters given back on an error and a FATAL exit alike */
	PG_ENSURE_ERROR_CLEANUP(wake_wait_gone, PointerGetDatum(ww));
	{
		for (i = 0; i < n; i++)
		{
			entries[i] = wake_pin(wake_key(MyDatabaseId, ids[i]));
			ww->npinned = i + 1;
			if (entries[i] != entries[0])
				single = false;
		}
		if (single)
		{
			cv = &entries[0]->cv;
			waiters = &entries[0]->waiters;
		}
		else
		{
			cv = &wake->multi_cv;
			waiters = &wake->multi_waiters;
		}
		pg_atomic_fetch_add_u32(waiters, 1);	/* a full barrier */
		ww->waiters = waiters;
		ConditionVariablePrepareToSleep(cv);
		if (PG_ARGISNULL(2))
			(void) wake_read(entries, n, now, since);	/* the baseline */
		for (;;)
		{
			long		ms;

			if (wake_read(entries, n, since, now))
				break;
			ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
			if (ms <= 0)
				break;
			(void) ConditionVariableTimedSleep(cv, ms, wait_event);
		}
		ConditionVariableCancelSleep();
	}
	PG_END_ENSURE_ERROR_CLEANUP(wake_wait_gone, PointerGetDatum(ww));
	wake_wait_gone(0, PointerGetDatum(ww));

	/* the topics woken and the cursor */
	woken = palloc(n * sizeof(Datum));
	out = palloc(n * sizeof(Datum));
	for (i = 0; i < n; i++)
	{
		out[i] = Int64GetDatum(now[i]);
		if (now[i] != since[i])
			woken[nwoken++] = names[i];
	}
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "wait_for() must return a record");
	desc = BlessTupleDesc(desc);
	result[0] = PointerGetDatum(construct_array(woken, nwoken, TEXTOID, -1, false, TYPALIGN_INT));
	result[1] = PointerGetDatum(construct_array(out, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, result, result_nulls)));
}
