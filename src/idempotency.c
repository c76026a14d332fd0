/*-------------------------------------------------------------------------
 *
 * idempotency.c
 *	  Module load and configuration of the idempotency extension.
 *
 * _PG_init only calls one idem_xxx_init() per file that needs one: each
 * defines its own GUCs (as pgvector's hnsw.c and ivfflat.c do) and registers
 * what it needs (transaction callbacks, cache invalidation callbacks,
 * shared memory).  The module works loaded on demand (CREATE EXTENSION,
 * first call) or preloaded; only preloaded does worker.c register the purge
 * background worker.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "compat.h"
#include "guard.h"
#include "idempotency.h"
#include "keystore.h"
#include "lifecycle.h"
#include "outbox_claims.h"
#include "outbox_counts.h"
#include "outbox_topics.h"
#include "outbox_vacuum.h"
#include "stats.h"
#include "wakeup.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/*
 * Each file defines its own GUCs in its init, in this order (before the
 * prefix is reserved, so that a setting of ours given before the library
 * was loaded is kept), and registers its callbacks.
 */
void
_PG_init(void)
{
	idem_runas_init();
	idem_keystore_init();		/* lock_wait, log_waits, default_ttl,
								 * max_key_length */
	idem_worker_init();			/* purge_*, database; the worker, preloaded */
	idem_stats_init();			/* stats_max (preloaded) */
	idem_outbox_claims_init();	/* outbox_claims, shared memory (preloaded) */
	idem_outbox_counts_init();	/* outbox_count_deltas, shared memory
								 * (preloaded) */
	idem_outbox_vacuum_init();	/* outbox_vacuum_after, shared memory
								 * (preloaded) */

	IDEM_RESERVE_GUC_PREFIX("idempotency");

	idem_guard_init();			/* the held keys' transaction callbacks */
	idem_outbox_topics_init();	/* its relcache callback */
	idem_wakeup_init();			/* shared memory (preloaded) */
	idem_owners_init();			/* object_access_hook (preloaded) */
}
