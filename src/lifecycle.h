/*-------------------------------------------------------------------------
 *
 * lifecycle.h
 *	  The lifecycle (lifecycle.c, features floor; worker.c, top floor): the
 *	  purge of expired rows and the background workers that run it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef LIFECYCLE_H
#define LIFECYCLE_H

#include "idempotency.h"

/* lifecycle.c */
#define PURGE_NTABLES 4			/* keys, tokens, seen messages, outbox
								 * messages */
extern int64 idem_purge_expired(Oid owner, int batch_size, TimestampTz now,
								int64 *counts);

/* worker.c */
extern void idem_worker_init(void);

#endif							/* LIFECYCLE_H */
