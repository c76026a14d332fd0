/*-------------------------------------------------------------------------
 *
 * lookup.c
 *	  idempotency.lookup(): what a program needs to decide when to retry.
 *
 * lookup(key, scope) reads the caller's own key row the way the guard
 * does (keystore.c), without taking the key lock, without the guard's
 * serialization check and without writing; works on a hot standby.  A key
 * that another transaction is working on in single-transaction mode has
 * no row yet: it is reported from the lock table (keystore.c:
 * idem_keylock_busy()).  The recovery point and state are the last ones a
 * committed checkpoint() recorded (recovery.c); a 0.4.0 lookup_result
 * (before ALTER EXTENSION UPDATE) has no columns for them.
 *
 * Locking: none taken.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/*
 * lookup(key, scope) -> at most one row (status, attempts, created_at,
 * updated_at, expires_at, locked_until, retry_after, recovery_point,
 * recovery_state) of the caller's key
 */
PG_FUNCTION_INFO_V1(idempotency_lookup);

Datum
idempotency_lookup(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	KeyId		id;
	StoredKey	stored;
	Datum		out[9];
	bool		onulls[9] = {
		false, false, false, false, false, false, false, true, true
	};
	bool		have_row = false;
	bool		finished = false;
	TimestampTz now = GetCurrentTimestamp();

	idem_init_materialized_srf(fcinfo);
	/* lookup_result has 7 columns before 0.5.0, 9 since (recovery point) */
	if (rsinfo->setDesc->natts != 7 && rsinfo->setDesc->natts != 9)
		elog(ERROR, "idempotency.lookup_result has %d columns", rsinfo->setDesc->natts);
	id = idem_keyid(fcinfo, 0, 1, "idempotency key");

	/* the guard's own read (keystore.c), for the caller's role only */
	idem_keystore_peek(&id, &stored, CurrentMemoryContext);
	if (stored.found && stored.expires_at > GetCurrentTransactionStartTimestamp())
	{
		have_row = true;
		out[0] = CStringGetTextDatum(stored.status == 'c' ? "completed" :
									 stored.status == 'f' ? "failed" : "in_progress");
		out[1] = Int32GetDatum(stored.attempts);
		out[2] = TimestampTzGetDatum(stored.created_at);
		out[3] = TimestampTzGetDatum(stored.updated_at);
		out[4] = TimestampTzGetDatum(stored.expires_at);
		out[5] = TimestampTzGetDatum(stored.locked_until);
		onulls[5] = stored.locked_until == 0;
		if (stored.status == 'c' || (stored.status == 'f' && !stored.retryable))
		{
			finished = true;
			onulls[6] = true;
		}
		else if (stored.status == 'i' && stored.locked_until != 0)
			out[6] = Int32GetDatum(idem_seconds_until(stored.locked_until, now));
		else
			out[6] = Int32GetDatum(0);
		if (stored.recovery_point)
		{
			out[7] = PointerGetDatum(stored.recovery_point);
			onulls[7] = false;
		}
		if (stored.recovery_state)
		{
			out[8] = JsonbPGetDatum(stored.recovery_state);
			onulls[8] = false;
		}
	}

	/*
	 * Not finished: is another transaction working on it now?  In single-
	 * transaction mode that is the only trace of it (no row until commit).
	 */
	if (!finished && idem_keylock_busy(&id))
	{
		if (!have_row)
			for (int i = 1; i < 6; i++)
				onulls[i] = true;
		have_row = true;
		out[0] = CStringGetTextDatum("in_progress");
		out[6] = Int32GetDatum(Max(1, onulls[5] ? 1 :
								   idem_seconds_until(DatumGetTimestampTz(out[5]), now)));
		onulls[6] = false;
	}

	if (have_row)
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, onulls);
	return (Datum) 0;
}
