/*-------------------------------------------------------------------------
 *
 * keylock.c
 *	  The lock that lets one transaction at a time work on a key.
 *
 * Design: a heavyweight lock in ExclusiveLock mode on an advisory lock tag
 * (database, 64-bit hash of owner+scope+key, field4 = KEYLOCK_FIELD4).  The
 * field4 value keeps it apart from pg_advisory_lock()'s keys (which use 1
 * and 2), and it shows in pg_locks as locktype 'advisory', objsubid 18756.
 * It is a transaction-level lock: released at commit or abort, and when a
 * subtransaction that took it rolls back.  A replay may release it early.
 *
 * The first attempt never waits (keylock_try).  When the key is busy we
 * wait (keylock_wait) at most
 * idempotency.lock_wait by running the ordinary lock wait with the
 * backend's LockTimeout set to that value for the duration of the wait;
 * the resulting lock timeout is turned into IK002.  Deadlocks between keys
 * are found by the ordinary deadlock detector.
 *
 * Two different keys share a lock only if their 64-bit hashes collide;
 * the cost of that is a needless wait, never a wrong answer.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "miscadmin.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
int			idem_lock_wait_ms = 5000;

#define KEYLOCK_FIELD4 0x4944	/* 18756 */

static void
set_tag(LOCKTAG *tag, const KeyId *id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId,
						 (uint32) (id->hash >> 32), (uint32) id->hash,
						 KEYLOCK_FIELD4);
}

/* process id of a holder of tag other than us, 0 if none is known */
static int
holder_pid(const LOCKTAG *tag)
{
	VirtualTransactionId *vxids = GetLockConflicts(tag, ExclusiveLock, NULL);

	for (; VirtualTransactionIdIsValid(*vxids); vxids++)
	{
		PGPROC	   *proc;

		proc = IDEM_VXID_PROC(*vxids);
		if (proc != NULL && proc->pid != 0)
			return proc->pid;
	}
	return 0;
}

/*
 * IK002 for a key another transaction holds.  The client's DETAIL names no
 * process: behind a connection pooler a backend pid means nothing to the
 * client (One round trip: the pid goes to the server log only).
 */
static void
report_in_progress(const KeyId *id, const LOCKTAG *tag)
{
	int			pid = holder_pid(tag);

	idem_stats_count(id, IDEM_STAT_IK002);
	ereport(ERROR,
			(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
			 errmsg("%s is in progress in another transaction", idem_describe_key(id)),
			 errdetail("Another transaction holds it; this request waited %d ms (idempotency.lock_wait).",
					   idem_lock_wait_ms),
			 pid != 0 ?
			 errdetail_log("The transaction of process %d holds it; this request waited %d ms (idempotency.lock_wait).",
						   pid, idem_lock_wait_ms) : 0,
			 errhint("Retry after the first request has finished (HTTP 409 with Retry-After).")));
}

/*
 * Try to take the lock of key id for this transaction without waiting:
 * KEYLOCK_TAKEN (this call took it), KEYLOCK_HELD (this transaction held it
 * already) or KEYLOCK_BUSY (another transaction holds it).
 */
KeyLockResult
idem_keylock_try(const KeyId *id)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	set_tag(&tag, id);
	res = LockAcquire(&tag, ExclusiveLock, false, true);
	if (res == LOCKACQUIRE_NOT_AVAIL)
		return KEYLOCK_BUSY;
	return res == LOCKACQUIRE_OK ? KEYLOCK_TAKEN : KEYLOCK_HELD;
}

/*
 * Wait for the lock of key id, at most idempotency.lock_wait, and take it.
 * Raises IK002 on timeout (at once when lock_wait is 0).
 */
void
idem_keylock_wait(const KeyId *id)
{
	LOCKTAG		tag;
	volatile bool timed_out = false;
	int			save_timeout;
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz start;

	set_tag(&tag, id);
	if (idem_lock_wait_ms <= 0)
	{
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			return;
		report_in_progress(id, &tag);
	}

	start = GetCurrentTimestamp();	/* for idempotency.stats, log_waits */
	save_timeout = LockTimeout;
	LockTimeout = idem_lock_wait_ms;
	PG_TRY();
	{
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		LockTimeout = save_timeout;
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		{
			FreeErrorData(edata);
			PG_RE_THROW();
		}
		FlushErrorState();
		FreeErrorData(edata);
		timed_out = true;
	}
	PG_END_TRY();
	LockTimeout = save_timeout;
	idem_stats_wait(id, start, !timed_out, idem_lock_wait_ms);

	if (timed_out)
		report_in_progress(id, &tag);
}

/*
 * Take the lock of key id, waiting at most idempotency.lock_wait (IK002).
 * Returns true when this call took the lock, false when this transaction
 * held it already.
 */
bool
idem_keylock_acquire(const KeyId *id)
{
	KeyLockResult res = idem_keylock_try(id);

	if (res == KEYLOCK_BUSY)
	{
		idem_keylock_wait(id);
		return true;
	}
	return res == KEYLOCK_TAKEN;
}

/* Give back a lock that keylock_acquire() took (a replay needs it no longer). */
void
idem_keylock_release(const KeyId *id)
{
	LOCKTAG		tag;

	set_tag(&tag, id);
	LockRelease(&tag, ExclusiveLock, false);
}

/* ---------------------------------------------------------------------
 * One round trip (once.c)
 * ---------------------------------------------------------------------
 */

/*
 * Does another transaction hold the lock of key id now?  Looks at the lock
 * table without taking or queueing for the lock (for lookup()).
 */
bool
idem_keylock_busy(const KeyId *id)
{
	LOCKTAG		tag;

	set_tag(&tag, id);
	/* a prepared transaction counts too (its holder has no process) */
	return VirtualTransactionIdIsValid(*GetLockConflicts(&tag, ExclusiveLock, NULL));
}

/* from _PG_init: our GUC */
void
idem_keylock_init(void)
{
	DefineCustomIntVariable("idempotency.lock_wait",
							"How long begin() waits for a key another transaction holds.",
							"After this time begin() raises IK002; 0 raises it at once.",
							&idem_lock_wait_ms,
							5000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}
