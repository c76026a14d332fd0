/*-------------------------------------------------------------------------
 *
 * ops.c
 *	  Operating on one key: idempotency.forget() and idempotency.renew().
 *
 * forget(key, scope): delete one of the caller's own keys, e.g. a key that
 * failed for good (retryable => false) and that support wants cleared, so
 * that the next begin() is new.  A key in flight is refused with IK002:
 * one this transaction began and has not finished, one whose key lock
 * another transaction holds (tried without waiting: forget() never queues
 * behind a request), or one under a live lease.  An absent or expired key,
 * and another role's key (keys are per role), is false.  The key lock
 * taken here is kept to the end of the transaction, so a begin() of the
 * same key waits for the forget() to commit or roll back and then sees the
 * outcome.  Every deletion is logged at LOG with role and key.
 *
 * renew(key, lease, attempt, scope): extend the lease of attempt `attempt`
 * of one of the caller's keys to now + lease, under the checks complete()
 * makes for a lease (guard.c: idem_guard_lease_holder(), which takes the
 * key lock; IK004 if the key was taken over, finished, or never leased).
 * expires_at is moved to at least the new lease end.  Returns the new
 * locked_until.
 *
 * forget() takes its key and deletes the row through the key store, one
 * call each (keystore.c: idem_keystore_take(), idem_keystore_delete()); on
 * Citus the row is locked and deleted on the key's shard, so a begin()
 * through any node waits for it.
 *
 * Both write through the ordinary paths (the key store's DELETE and UPDATE
 * as the extension's owner), so read-only transactions and hot standbys
 * refuse them (25006).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "guard.h"
#include "idempotency.h"
#include "keystore.h"
#include "stats.h"

/* 25006 unless this transaction may write (before any lock is taken) */
static void
check_writable(const KeyId *id, const char *fn)
{
	if (RecoveryInProgress() || XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot %s %s in a read-only transaction", fn, idem_describe_key(id)),
				 RecoveryInProgress() ?
				 errhint("Send it to the primary server.") : 0));
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/* forget(key, scope) -> true if one of the caller's keys was deleted */
PG_FUNCTION_INFO_V1(idempotency_forget);

Datum
idempotency_forget(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 0, 1, "idempotency key");
	HeldKey    *held;
	StoredKey	stored;
	KeyLockResult lock;
	const char *role;
	static SPIPlanPtr route = NULL;

	check_writable(&id, "forget");
	/* Citus: the key's shard on another node: the call runs there */
	if (idem_route_key(&id))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);
	held = idem_held_lookup(&id);
	if (held && (held->state == HELD_BEGUN || held->state == HELD_LEASED))
	{
		idem_stats_count(&id, IDEM_STAT_IK002);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
				 errmsg("cannot forget %s: it is in progress in this transaction",
						idem_describe_key(&id)),
				 errdetail("This transaction began it and has not completed or failed it yet.")));
	}

	lock = idem_keystore_take(&id, &stored, CurrentMemoryContext);
	if (lock == KEYLOCK_BUSY)
	{
		idem_stats_count(&id, IDEM_STAT_IK002);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
				 errmsg("cannot forget %s: it is in progress in another transaction",
						idem_describe_key(&id)),
				 errdetail("Another transaction holds the key; forget() does not wait for it."),
				 errhint("Try again when that request has finished.")));
	}
	/* absent, expired (the purge takes it), or another role's */
	if (!stored.found || stored.expires_at <= GetCurrentTransactionStartTimestamp())
		PG_RETURN_BOOL(false);
	if (stored.status == 'i' && stored.locked_until > GetCurrentTimestamp())
	{
		idem_stats_count(&id, IDEM_STAT_IK002);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
				 errmsg("cannot forget %s: it is in progress under a lease",
						idem_describe_key(&id)),
				 errdetail("Attempt %d holds it until %s.", stored.attempts,
						   timestamptz_to_str(stored.locked_until)),
				 errhint("Let the worker finish it, or forget it after the lease ends.")));
	}

	/* false: purged meanwhile, as it expired; 09000 if a trigger skipped it */
	if (!idem_keystore_delete(&id))
		PG_RETURN_BOOL(false);
	role = GetUserNameFromId(id.owner, true);
	idem_stats_count(&id, IDEM_STAT_FORGET);
	ereport(LOG,
			(errmsg("role \"%s\" forgot %s (status %s, attempt %d)",
					role ? role : "?", idem_describe_key(&id),
					stored.status == 'c' ? "completed" :
					stored.status == 'f' ? "failed" : "in_progress",
					stored.attempts),
			 errhidestmt(true)));
	PG_RETURN_BOOL(true);
}

/* renew(key, lease, attempt, scope) -> the new end of the caller's lease */
PG_FUNCTION_INFO_V1(idempotency_renew);

Datum
idempotency_renew(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 0, 3, "idempotency key");
	TimestampTz clock = GetCurrentTimestamp();
	TimestampTz lease_end;
	HeldKey		h;
	static SPIPlanPtr route = NULL;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null")));
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be null"),
				 errhint("Pass the attempts value that begin() returned.")));
	lease_end = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														TimestampTzGetDatum(clock),
														PG_GETARG_DATUM(1)));
	if (lease_end <= clock)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive")));
	check_writable(&id, "renew");
	/* Citus: the key's shard on another node: the call runs there */
	if (idem_route_key(&id))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);

	idem_guard_lease_holder(&id, PG_GETARG_INT32(2), &h);	/* IK004 */
	h.state = HELD_LEASED;
	h.locked_until = lease_end;
	if (h.expires_at < lease_end)
		h.expires_at = lease_end;
	idem_keystore_write(&h, "in_progress", NULL, true, false);
	idem_stats_count(&id, IDEM_STAT_RENEW);
	PG_RETURN_TIMESTAMPTZ(lease_end);
}
