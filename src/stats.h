/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  idempotency.stats: what is counted, and the count of one event.
 *
 * The counters live in shared memory only when the library is preloaded;
 * otherwise idem_stats_count() tests one flag and returns.  stats.c keeps
 * them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

#include "idempotency.h"

/* what the counters count (the columns of idempotency.stats) */
typedef enum IdemStat
{
	IDEM_STAT_NEW,				/* begin() outcomes */
	IDEM_STAT_RETRY,
	IDEM_STAT_REPLAY,
	IDEM_STAT_COMPLETE,			/* complete() stored a response */
	IDEM_STAT_FAIL_RETRYABLE,	/* fail(retryable => true) */
	IDEM_STAT_FAIL_FINAL,		/* fail(retryable => false) */
	IDEM_STAT_IK001,			/* errors raised */
	IDEM_STAT_IK002,
	IDEM_STAT_IK004,
	IDEM_STAT_WAITS,			/* waits for a key lock (idem_stats_wait) */
	IDEM_STAT_TAKEOVER,			/* begin() took over a lapsed lease */
	IDEM_STAT_ZOMBIE,			/* a taken-over attempt was refused */
	IDEM_STAT_PURGED,			/* rows purge() or the worker deleted */
	IDEM_STAT_FORGET,			/* keys forget() deleted */
	IDEM_STAT_RENEW,			/* leases renew() extended */
	IDEM_STAT_NCOUNTERS
} IdemStat;

extern void idem_stats_init(void);
extern void idem_stats_forget(Oid db, Oid role);
extern int	idem_stats_databases(Oid *dbs, int max);
extern void idem_stats_add(Oid owner, const char *scope, int scope_len,
						   IdemStat what, int64 n);
extern void idem_stats_wait(const KeyId *id, double ms);

/* count one event of key id; nothing unless preloaded */
extern void idem_stats_count(const KeyId *id, IdemStat what);

#endif							/* IDEM_STATS_H */
