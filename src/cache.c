/*-------------------------------------------------------------------------
 *
 * cache.c
 *	  Ground floor, lowest file: the library's one relcache invalidation
 *	  callback, shared by every file that caches something about a
 *	  relation.
 *
 * Design: a file whose cache a relcache invalidation must clear adds its
 * callback from its idem_xxx_init() (idem_relcache_add()), and calls
 * idem_relcache_watch() before it fills that cache.  The server's callback
 * is registered by the first watch in a process, not at load time: the
 * server has ten slots per process, and with shared_preload_libraries a
 * callback registered in _PG_init would take one in every process the
 * postmaster starts, walsenders included, where Citus and pgoutput need
 * theirs (a logical shard move failed with "out of relcache_callback_list
 * slots").  From then on every invalidation reaches every added callback,
 * in the order they were added.
 *
 * Kept here, below every file that caches, so that no file calls up into
 * the module's load (idempotency.c) to be told of a change.
 *
 * No locks of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/inval.h"

#include "idempotency.h"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
#define MAX_RELCACHE_CALLBACKS 8

static IdemRelcacheCallback callbacks[MAX_RELCACHE_CALLBACKS];
static int	ncallbacks = 0;
static bool relcache_watched = false;

static void
relcache_inval(Datum arg pg_attribute_unused(), Oid relid)
{
	for (int i = 0; i < ncallbacks; i++)
		callbacks[i] (relid);
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/* From an idem_xxx_init(): call fn(relid) on every relcache invalidation. */
void
idem_relcache_add(IdemRelcacheCallback fn)
{
	if (ncallbacks >= MAX_RELCACHE_CALLBACKS)
		elog(ERROR, "too many idempotency relcache callbacks");
	callbacks[ncallbacks++] = fn;
}

/* call before filling a cache that a relcache invalidation must clear */
void
idem_relcache_watch(void)
{
	if (relcache_watched)
		return;
	CacheRegisterRelcacheCallback(relcache_inval, (Datum) 0);
	relcache_watched = true;
}
