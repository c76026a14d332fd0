/*-------------------------------------------------------------------------
 *
 * outbox_vacuum.c
 *	  The outbox's table vacuumed as soon as enough messages were acked:
 *	  acked counts per database in shared memory (GUC
 *	  outbox_vacuum_after), and the VACUUM the background worker runs.
 *
 * With claims in shared memory ack() deletes the message, so every
 * delivered message is a dead row version until a vacuum, and autovacuum
 * comes once per autovacuum_naptime.  Preloaded, shared memory holds
 * VACUUM_DATABASES slots, one per database whose acks were counted.  An
 * ack adds its deleted messages to a total of its transaction
 * (idem_outbox_vacuum_count()); at XACT_EVENT_COMMIT the total is added to
 * the slot (one atomic add), and the commit that takes it to
 * outbox_vacuum_after sets the launcher's latch.  The launcher (worker.c)
 * starts one vacuum worker at a time, for the database with the most acks;
 * the worker (idem_outbox_vacuum_run()) runs a lazy VACUUM (SKIP_LOCKED,
 * TRUNCATE false, PARALLEL 0) of outbox_message.  The slots, the options
 * and what a failure does: src/README.md, "The outbox's vacuum".
 *
 * Locking: vac->mutex, a spinlock, guards taking and freeing a slot, the
 * slots' started/done/failed and the launcher's latch; the counts are
 * atomics.  Nothing waits while holding it.  The VACUUM takes SHARE UPDATE
 * EXCLUSIVE on the table, which no publish, claim, ack or purge conflicts
 * with.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/relation.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "commands/vacuum.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "nodes/value.h"
#include "parser/parse_node.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox_vacuum.h"

#define VACUUM_DATABASES 256	/* databases counted at once */
#define VACUUM_BACKOFF_S 10		/* after a failed vacuum, doubled per */
#define VACUUM_BACKOFF_MAX_S 600	/* failure in a row up to this */
#define VACUUM_WORKER_NAME "idempotency outbox vacuum worker"

typedef struct VacuumSlot
{
	pg_atomic_uint32 db;		/* 0: free */
	pg_atomic_uint64 acked;		/* since the launcher last started a vacuum */
	uint32		started;		/* the launcher's last vacuum */
	uint32		done;			/* the last one a worker finished */
	bool		failed;			/* and whether its VACUUM failed */
	int			failures;		/* in a row (the launcher's) */
	TimestampTz not_before;		/* the launcher's */
	TransactionId horizon;		/* at the last vacuum done (the worker's) */
} VacuumSlot;

typedef struct VacuumShared
{
	slock_t		mutex;
	Latch	   *launcher;		/* set when a count reaches the setting */
	bool		full;			/* a database found no free slot */
	VacuumSlot	slots[VACUUM_DATABASES];
} VacuumShared;

/* ---------------------------------------------------------------------
 * GUC and local state
 * ---------------------------------------------------------------------
 */
int			idem_outbox_vacuum_after = 10000;

static VacuumShared *vac = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static int	my_slot = -1;		/* this backend's database's, cached */
static int64 acked_here = 0;	/* by this transaction's acks */
static bool callback_registered = false;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
static void
vacuum_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(VacuumShared)));
}

static void
vacuum_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	vac = ShmemInitStruct("idempotency outbox vacuum", sizeof(VacuumShared), &found);
	if (!found)
	{
		SpinLockInit(&vac->mutex);
		vac->launcher = NULL;
		vac->full = false;
		for (i = 0; i < VACUUM_DATABASES; i++)
		{
			VacuumSlot *s = &vac->slots[i];

			pg_atomic_init_u32(&s->db, 0);
			pg_atomic_init_u64(&s->acked, 0);
			s->started = s->done = 0;
			s->failed = false;
			s->failures = 0;
			s->not_before = 0;
			s->horizon = InvalidTransactionId;
		}
	}
	LWLockRelease(AddinShmemInitLock);
}

/* from _PG_init, before the prefix is reserved: the GUC; preloaded, the shared memory */
void
idem_outbox_vacuum_init(void)
{
	DefineCustomIntVariable("idempotency.outbox_vacuum_after",
							"Acked outbox messages of a database after which the background worker vacuums its outbox table.",
							"0 leaves it to autovacuum; needs the library in shared_preload_libraries.",
							&idem_outbox_vacuum_after,
							10000, 0, INT_MAX,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	idem_request_shmem(vacuum_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = vacuum_shmem_startup;
}

/*
 * The slot of database db, -1 if it has none; with make, a free one is
 * taken for it (-1 and vac->full set when every slot is taken).
 */
static int
slot_of(Oid db, bool make)
{
	int			i;
	int			free_slot = -1;

	for (i = 0; i < VACUUM_DATABASES; i++)
		if (pg_atomic_read_u32(&vac->slots[i].db) == db)
			return i;
	if (!make)
		return -1;
	SpinLockAcquire(&vac->mutex);
	for (i = 0; i < VACUUM_DATABASES; i++)
	{
		uint32		d = pg_atomic_read_u32(&vac->slots[i].db);

		if (d == db)
			break;
		if (d == 0 && free_slot < 0)
			free_slot = i;
	}
	if (i == VACUUM_DATABASES)
	{
		if (free_slot >= 0)
		{
			VacuumSlot *s = &vac->slots[free_slot];

			pg_atomic_write_u64(&s->acked, 0);
			s->started = s->done = 0;
			s->failed = false;
			s->failures = 0;
			s->not_before = 0;
			s->horizon = InvalidTransactionId;
			pg_atomic_write_u32(&s->db, db);
			i = free_slot;
		}
		else
		{
			vac->full = true;
			i = -1;
		}
	}
	SpinLockRelease(&vac->mutex);
	return i;
}

static void
wake_launcher(void)
{
	Latch	   *latch;

	SpinLockAcquire(&vac->mutex);
	latch = vac->launcher;
	SpinLockRelease(&vac->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* ---------------------------------------------------------------------
 * Counting acks (ack() in outbox_relay.c)
 * ---------------------------------------------------------------------
 */

/* n messages acked by a transaction that committed */
static void
count_committed(int64 n)
{
	VacuumSlot *s;
	uint64		old;
	int			after = idem_outbox_vacuum_after;

	if (my_slot < 0 || pg_atomic_read_u32(&vac->slots[my_slot].db) != MyDatabaseId)
	{
		my_slot = slot_of(MyDatabaseId, true);
		if (my_slot < 0)
		{
			wake_launcher();	/* to free the slots of dropped databases */
			return;				/* not counted: autovacuum's turn */
		}
	}
	s = &vac->slots[my_slot];
	old = pg_atomic_fetch_add_u64(&s->acked, (uint64) n);
	if (after > 0 && old < (uint64) after && old + (uint64) n >= (uint64) after)
		wake_launcher();
}

static void
vacuum_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	if (acked_here == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			count_committed(acked_here);
			acked_here = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			acked_here = 0;
			break;
		default:
			break;
	}
}

/*
 * ack() deleted n messages: counted for the vacuum when the transaction
 * commits (a subtransaction rolled back meanwhile still counts: the count
 * only decides when to vacuum)
 */
void
idem_outbox_vacuum_count(int64 n)
{
	if (vac == NULL || n <= 0)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(vacuum_xact_callback, NULL);
		callback_registered = true;
	}
	acked_here += n;
}

/* ---------------------------------------------------------------------
 * For the launcher (worker.c)
 * ---------------------------------------------------------------------
 */
static void
launcher_detach(int code pg_attribute_unused(), Datum arg pg_attribute_unused())
{
	SpinLockAcquire(&vac->mutex);
	vac->launcher = NULL;
	SpinLockRelease(&vac->mutex);
}

/* the launcher's latch is set when a database's count reaches the setting */
void
idem_outbox_vacuum_attach(void)
{
	if (vac == NULL)
		return;
	SpinLockAcquire(&vac->mutex);
	vac->launcher = MyLatch;
	SpinLockRelease(&vac->mutex);
	on_shmem_exit(launcher_detach, (Datum) 0);
}

/*
 * The slot whose database's outbox is to be vacuumed now: of those at or
 * over the setting and not backing off, the one with the most acks; -1 if
 * none (or the setting is 0).  *db gets its database, *wait_ms how long
 * until a slot backing off may go (-1: none is).
 */
int
idem_outbox_vacuum_due(TimestampTz now, Oid *db, long *wait_ms)
{
	int			best = -1;
	uint64		best_n = 0;
	TimestampTz soonest = 0;
	int			after = idem_outbox_vacuum_after;
	int			i;

	*wait_ms = -1;
	*db = InvalidOid;
	if (vac == NULL || after <= 0)
		return -1;
	for (i = 0; i < VACUUM_DATABASES; i++)
	{
		VacuumSlot *s = &vac->slots[i];
		Oid			d = pg_atomic_read_u32(&s->db);
		uint64		n;

		if (d == InvalidOid)
			continue;
		n = pg_atomic_read_u64(&s->acked);
		if (n < (uint64) after)
			continue;
		if (s->not_before > now)
		{
			if (soonest == 0 || s->not_before < soonest)
				soonest = s->not_before;
			continue;
		}
		if (best < 0 || n > best_n)
		{
			best = i;
			best_n = n;
			*db = d;
		}
	}
	if (soonest != 0)
		*wait_ms = (long) ((soonest - now + 999) / 1000);
	return best;
}

/* the number the next vacuum of slot i will have (for its worker) */
uint32
idem_outbox_vacuum_next(int i)
{
	return vac->slots[i].started + 1;
}

/*
 * The launcher started the worker of slot i (run number seq): the count
 * goes down by what it is now (the acks of the vacuum's turn)
 */
void
idem_outbox_vacuum_begin(int i, uint32 seq)
{
	VacuumSlot *s = &vac->slots[i];

	pg_atomic_fetch_sub_u64(&s->acked, pg_atomic_read_u64(&s->acked));
	SpinLockAcquire(&vac->mutex);
	s->started = seq;
	SpinLockRelease(&vac->mutex);
}

/* the count of slot i spent without a vacuum (a database not to vacuum) */
void
idem_outbox_vacuum_skip(int i)
{
	VacuumSlot *s = &vac->slots[i];

	pg_atomic_fetch_sub_u64(&s->acked, pg_atomic_read_u64(&s->acked));
}

/*
 * The worker of slot i has stopped: a failed VACUUM, or a worker that
 * ended without a word, backs the database off; a vacuum done clears that.
 * Returns whether it was done.
 */
bool
idem_outbox_vacuum_end(int i, TimestampTz now)
{
	VacuumSlot *s = &vac->slots[i];
	bool		ok;

	SpinLockAcquire(&vac->mutex);
	ok = s->done == s->started && !s->failed;
	SpinLockRelease(&vac->mutex);
	if (ok)
	{
		s->failures = 0;
		s->not_before = 0;
	}
	else
	{
		int64		backoff = VACUUM_BACKOFF_S;
		int			k;

		s->failures++;
		for (k = 1; k < s->failures && backoff < VACUUM_BACKOFF_MAX_S; k++)
			backoff *= 2;
		backoff = Min(backoff, VACUUM_BACKOFF_MAX_S);
		s->not_before = now + backoff * USECS_PER_SEC;
	}
	return ok;
}

/* did a database find every slot taken since the last call? */
bool
idem_outbox_vacuum_full(void)
{
	bool		full;

	if (vac == NULL)
		return false;
	SpinLockAcquire(&vac->mutex);
	full = vac->full;
	vac->full = false;
	SpinLockRelease(&vac->mutex);
	return full;
}

/* free the slot of database db, dropped (owners.c) */
void
idem_outbox_vacuum_forget(Oid db)
{
	int			i;

	if (vac == NULL)
		return;
	SpinLockAcquire(&vac->mutex);
	for (i = 0; i < VACUUM_DATABASES; i++)
		if (pg_atomic_read_u32(&vac->slots[i].db) == db)
			pg_atomic_write_u32(&vac->slots[i].db, 0);
	SpinLockRelease(&vac->mutex);
}

/* free the slots of databases not among the n of dbs (those that exist) */
void
idem_outbox_vacuum_forget_others(const Oid *dbs, int n)
{
	int			i;
	int			j;

	SpinLockAcquire(&vac->mutex);
	for (i = 0; i < VACUUM_DATABASES; i++)
	{
		Oid			d = pg_atomic_read_u32(&vac->slots[i].db);

		if (d == InvalidOid)
			continue;
		for (j = 0; j < n; j++)
			if (dbs[j] == d)
				break;
		if (j == n)
			pg_atomic_write_u32(&vac->slots[i].db, 0);
	}
	SpinLockRelease(&vac->mutex);
}

/* ---------------------------------------------------------------------
 * For the worker (worker.c), connected to the database of slot i
 * ---------------------------------------------------------------------
 */

/*
 * The worker's word for the launcher: run seq of slot i done, failed or
 * not; a vacuum done keeps the horizon it began with (InvalidTransactionId:
 * none was run)
 */
static void
report(int i, uint32 seq, bool failed, TransactionId horizon)
{
	VacuumSlot *s;

	if (vac == NULL || i < 0 || i >= VACUUM_DATABASES)
		return;
	s = &vac->slots[i];
	SpinLockAcquire(&vac->mutex);
	if (pg_atomic_read_u32(&s->db) == MyDatabaseId)
	{
		s->done = seq;
		s->failed = failed;
		if (!failed && TransactionIdIsValid(horizon))
			s->horizon = horizon;
	}
	SpinLockRelease(&vac->mutex);
}

/* VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) of relid, as a top-level statement */
static void
vacuum_table(Oid relid)
{
	VacuumStmt *stmt = makeNode(VacuumStmt);

	stmt->options = list_make3(makeDefElem("skip_locked", (Node *) makeBoolean(true), -1),
							   makeDefElem("truncate", (Node *) makeBoolean(false), -1),
							   makeDefElem("parallel", (Node *) makeInteger(0), -1));
	stmt->rels = list_make1(makeVacuumRelation(NULL, relid, NIL));
	stmt->is_vacuumcmd = true;
	ExecVacuum(make_parsestate(NULL), stmt, true);
}

/*
 * This database's idempotency.outbox_message (InvalidOid: no extension);
 * *dbname its name.  Only the extension's own table: after its schema was
 * renamed, a table of that name is another role's (test/t/017).
 */
static Oid
outbox_table(char **dbname, TransactionId *horizon)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid			relid = InvalidOid;
	Oid			ext;
	char	   *name;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	ext = get_extension_oid("idempotency", true);
	if (OidIsValid(ext))
	{
		Oid			nsp = get_namespace_oid("idempotency", true);

		if (OidIsValid(nsp))
			relid = get_relname_relid("outbox_message", nsp);
		if (OidIsValid(relid) && getExtensionOfObject(RelationRelationId, relid) != ext)
			relid = InvalidOid;
	}
	/* the oldest deletion not removable yet (a lock taken: not waited for) */
	*horizon = InvalidTransactionId;
	if (OidIsValid(relid) && ConditionalLockRelationOid(relid, AccessShareLock))
	{
		Relation	rel = try_relation_open(relid, NoLock);

		if (rel != NULL)
		{
			*horizon = GetOldestNonRemovableTransactionId(rel);
			relation_close(rel, NoLock);
		}
	}
	name = get_database_name(MyDatabaseId);
	*dbname = MemoryContextStrdup(TopMemoryContext, name ? name : "?");
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	return relid;
}

/*
 * VACUUM of relid as a top-level statement; an error is caught and its
 * message returned (NULL: vacuumed).  The worker exits after it.
 */
static char *
vacuum_caught(Oid relid)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *volatile message = NULL;

	/* ExecVacuum keeps what must outlive its transactions under PortalContext */
	PortalContext = AllocSetContextCreate(TopMemoryContext, "idempotency outbox vacuum",
										  ALLOCSET_DEFAULT_SIZES);
	PG_TRY();
	{
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		pgstat_report_activity(STATE_RUNNING,
							   "VACUUM (SKIP_LOCKED, TRUNCATE false, PARALLEL 0) idempotency.outbox_message");
		vacuum_table(relid);
		CommitTransactionCommand();
		pgstat_report_activity(STATE_IDLE, NULL);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		RESUME_INTERRUPTS();
		message = edata->message ? edata->message : "?";
	}
	PG_END_TRY();
	return message;
}

/*
 * Vacuum this database's idempotency.outbox_message, for run seq of slot
 * i; a database without the extension is left at once.  An error is
 * caught, logged (LOG the first time in a row, DEBUG1 after) and reported
 * to the launcher, which backs off; the worker then exits.
 */
void
idem_outbox_vacuum_run(int i, uint32 seq)
{
	char	   *dbname;
	TransactionId horizon;
	Oid			relid = outbox_table(&dbname, &horizon);
	bool		first_failure;
	char	   *failure;

	if (!OidIsValid(relid))
	{
		elog(DEBUG1, VACUUM_WORKER_NAME " found no extension idempotency in database \"%s\"",
			 dbname);
		report(i, seq, false, InvalidTransactionId);
		return;
	}

	/*
	 * The horizon where the last vacuum left it (a long transaction, a
	 * prepared one, a replication slot): every deletion since is newer, so a
	 * VACUUM could remove nothing and would only read the table again
	 * (test/t/017).  The count is spent; the acks after the horizon moves
	 * start the next vacuum.
	 */
	if (TransactionIdIsValid(horizon) && vac != NULL && i >= 0 && i < VACUUM_DATABASES &&
		TransactionIdEquals(vac->slots[i].horizon, horizon))
	{
		elog(DEBUG1, VACUUM_WORKER_NAME " skipped the vacuum of idempotency.outbox_message in database \"%s\": its removal horizon (%u) has not moved since the last vacuum",
			 dbname, horizon);
		report(i, seq, false, InvalidTransactionId);
		return;
	}
	first_failure = vac == NULL || i < 0 || i >= VACUUM_DATABASES ||
		vac->slots[i].failures == 0;
	failure = vacuum_caught(relid);
	report(i, seq, failure != NULL, horizon);
	if (failure != NULL)
		ereport(first_failure ? LOG : DEBUG1,
				(errmsg(VACUUM_WORKER_NAME ": the vacuum of idempotency.outbox_message in database \"%s\" failed: %s",
						dbname, failure),
				 errdetail("The launcher tries again after %d s at the earliest, longer after each failure in a row; autovacuum still vacuums the table.",
						   VACUUM_BACKOFF_S)));
	else
		elog(DEBUG1, VACUUM_WORKER_NAME " ran VACUUM of idempotency.outbox_message in database \"%s\" (skipped if another vacuum of it was in progress)",
			 dbname);
}
