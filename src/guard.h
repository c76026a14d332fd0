/*-------------------------------------------------------------------------
 *
 * guard.h
 *	  The guard (guard.c, guard floor): begin, complete and fail of one key
 *	  in the caller's transaction, and the keys this transaction holds.
 *	  For the SQL functions over it (once.c, ops.c, recovery.c) and the
 *	  library's load (idempotency.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef GUARD_H
#define GUARD_H

#include "keystore.h"

typedef enum GuardOutcome
{
	GUARD_NEW,					/* first time: do the work */
	GUARD_RETRY,				/* an earlier attempt failed retryably or
								 * lapsed */
	GUARD_REPLAY,				/* finished: return the stored response */
	GUARD_ROUTED				/* Citus: the key's shard is on another node;
								 * the caller carries the call there */
} GuardOutcome;

typedef struct GuardBegin
{
	GuardOutcome outcome;
	char		status;			/* 'i'n_progress, 'c'ompleted, 'f'ailed */
	Jsonb	   *response;		/* stored response (replay, retry), or NULL */
	int32		attempts;
	TimestampTz created_at;
	text	   *recovery_point; /* last checkpoint (retry, replay), or NULL */
	Jsonb	   *recovery_state;
} GuardBegin;

extern void idem_guard_init(void);
extern HeldKey *idem_held_lookup(const KeyId *id);
extern TupleDesc idem_result_desc(FunctionCallInfo fcinfo);
extern void idem_guard_begin(const KeyId *id, Jsonb *request,
							 const Interval *ttl, const Interval *lease,
							 GuardBegin *out);
extern void idem_guard_finish(const KeyId *id, HeldState newstate,
							  Jsonb *payload, bool retryable,
							  bool has_attempt, int32 attempt);
extern void idem_guard_lease_holder(const KeyId *id, int32 attempt,
									HeldKey *h);

#endif							/* GUARD_H */
