/*-------------------------------------------------------------------------
 *
 * outbox_notify.c
 *	  NOTIFY for the topics that ask for it (features floor): a topic
 *	  created or altered with notify => true (off by default since 0.6.0)
 *	  is announced to plain SQL clients that LISTEN when the transaction
 *	  that published to it commits.  Relays wait in wait_for() instead
 *	  (wakeup.c: shared memory, no lock).
 *
 * Design: publish() (and release(), redrive()) queue the channel
 * "idempotency.outbox.<topic>" in this backend, once per transaction and
 * topic, and a PRE_COMMIT transaction callback NOTIFYs each with an empty
 * payload (PRE_COMMIT runs before PostgreSQL's PreCommit_Notify()), so a
 * transaction announces each topic once, at commit.  NOTIFY is not
 * issued before commit because PostgreSQL refuses to PREPARE a transaction
 * that issued one: a prepared transaction notifies
 * nobody.  A rolled-back subtransaction takes its announcements with it.
 * The price of NOTIFY: PostgreSQL serialises the commits of all notifying
 * transactions (async.c takes a cluster-wide lock before the commit record
 * and holds it past the WAL flush), which is why it is off by default.
 *
 * Locking: none of its own (NOTIFY's, at commit).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/async.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idempotency.h"
#include "outbox.h"

#define CHANNEL_PREFIX "idempotency.outbox."

/*
 * Wake-ups wait here until commit (see the file comment):
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
static bool wake_callbacks = false;

/* at commit, NOTIFY each queued channel; at PREPARE, nobody */
static void
wake_xact_callback(XactEvent event, void *arg pg_attribute_unused())
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
wake_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
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
 * Wake the topic's relays at commit: NOTIFY "idempotency.outbox.<topic>"
 * with an empty payload, once per transaction and topic.
 */
void
idem_outbox_notify(const char *topic)
{
	char		channel[NAMEDATALEN];
	PendingWake *w;
	bool		found;
	int			level = GetCurrentTransactionNestLevel();

	StaticAssertStmt(sizeof(CHANNEL_PREFIX) + TOPIC_MAX_LEN <= NAMEDATALEN,
					 "a topic's channel fits a NOTIFY channel name");
	if (!wake_callbacks)
	{
		RegisterXactCallback(wake_xact_callback, NULL);
		RegisterSubXactCallback(wake_subxact_callback, NULL);
		wake_callbacks = true;
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
