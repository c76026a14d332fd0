# idempotency — PGXS build.  `make test` runs every suite against a throwaway
# cluster (test/run); `make demo` plays the double-click payment (demo/run).

PG_CONFIG ?= pg_config

MODULE_big = idempotency
OBJS = \
	src/idempotency.o \
	src/cache.o \
	src/runas.o \
	src/sharedhash.o \
	src/stats.o \
	src/keycitus.o \
	src/keystore.o \
	src/guard.o \
	src/lifecycle.o \
	src/ops.o \
	src/worker.o \
	src/target.o \
	src/machine.o \
	src/versioned.o \
	src/insert_once.o \
	src/once.o \
	src/lookup.o \
	src/http.o \
	src/recovery.o \
	src/wakeup.o \
	src/outbox_claims.o \
	src/outbox_counts.o \
	src/outbox_topics.o \
	src/outbox_publish.o \
	src/outbox_relay.o \
	src/outbox_vacuum.o \
	src/owners.o

EXTENSION = idempotency
# (names relative to the source directory, also in a VPATH build)
DATA = $(notdir $(wildcard $(if $(VPATH),$(VPATH)/)idempotency--*.sql))

# pg_regress suites (sql/, expected/); run in this order against one database.
REGRESS = setup guard errors fingerprint savepoint security wal lease lifecycle helpers helpers_hardening helpers_plans hardening partitioned upgrade stats once lookup http transition retry_after schema purge insert_path once_evict recovery citus outbox outbox_publish outbox_window wakeup wakeup_slots identity helpers_rls key_health outbox_dropped_owner
REGRESS_OPTS = --inputdir=. --load-extension=idempotency
# isolation specs (test/specs, expected output in test/expected)
ISOLATION = same_key lock_wait lease lifecycle helpers upgrade lock_namespace cic forget_begin forget_new renew_takeover once secret_rotation secret_snapshot purge_partitioned purge_topic target_lock recovery outbox wakeup outbox_drop outbox_redrive outbox_revoke outbox_counts outbox_takeover outbox_snapshot outbox_serializable outbox_barrier
ISOLATION_OPTS = --inputdir=test --outputdir=test/output --load-extension=idempotency
# TAP scripts (PostgreSQL::Test::Cluster, own clusters): PGXS prove_installcheck;
# PROVE_TESTS=test/t/003_purge_worker.pl runs one (also from the environment:
# ONLY=tap PROVE_TESTS=test/t/005_stats.pl make test), PROVE_FLAGS=-v shows each test
TAP_TESTS = 1
PROVE_TESTS ?= test/t/*.pl

# One test at a time (docs/development.md, "One test at a time"):
# `make installcheck REGRESS=guard` runs that regress file alone on a running
# server, `make installcheck ISOLATION=same_key` that spec, and
# `make installcheck PROVE_TESTS=test/t/005_stats.pl` that TAP script (own
# clusters); a kind not named on the command line is skipped then.
ifneq ($(and $(filter command line,$(origin REGRESS)),$(REGRESS)),)
ifneq ($(origin ISOLATION),command line)
ISOLATION =
endif
ifneq ($(origin TAP_TESTS),command line)
TAP_TESTS =
endif
endif
ifneq ($(and $(filter command line,$(origin ISOLATION)),$(ISOLATION)),)
ifneq ($(origin REGRESS),command line)
REGRESS =
endif
ifneq ($(origin TAP_TESTS),command line)
TAP_TESTS =
endif
endif
ifneq ($(and $(filter command line,$(origin PROVE_TESTS)),$(PROVE_TESTS)),)
ifneq ($(origin REGRESS),command line)
REGRESS =
endif
ifneq ($(origin ISOLATION),command line)
ISOLATION =
endif
endif

# warnings, not errors: a newer compiler must not stop `make install`;
# CI builds with COPT=-Werror (.ci/run)
PG_CFLAGS = -Wall -Wextra
# server headers as system headers: -Wextra then judges our code, not theirs
PG_CPPFLAGS = -I$(srcdir)/src -isystem $(shell $(PG_CONFIG) --includedir-server)

EXTRA_CLEAN = results regression.diffs regression.out test/output tmp_check

PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
else
# A fresh machine may lack the server headers and PGXS; `make test` and
# `make demo` install them (test/cluster.sh: ensure_packages) before building.
all install installcheck:
	@echo "PGXS not found: install postgresql-server-dev-15, or run make test / make demo" >&2; exit 1
endif

# a VPATH build (Debian's pg_buildext builds in build-MAJOR/) needs src/
# for the objects
ifdef VPATH
$(shell mkdir -p src)
endif

$(OBJS): src/idempotency.h src/compat.h
src/guard.o src/idempotency.o src/keystore.o src/lifecycle.o src/ops.o src/owners.o src/recovery.o src/stats.o: src/stats.h
src/target.o src/machine.o src/versioned.o src/insert_once.o: src/target.h
src/guard.o src/once.o src/ops.o src/recovery.o src/idempotency.o: src/guard.h
src/lifecycle.o src/worker.o src/idempotency.o: src/lifecycle.h
src/keystore.o src/guard.o src/idempotency.o src/ops.o src/recovery.o src/lookup.o src/once.o src/lifecycle.o src/machine.o src/insert_once.o src/outbox_topics.o src/outbox_publish.o: src/keystore.h
src/keycitus.o src/keystore.o src/guard.o src/idempotency.o src/ops.o src/recovery.o src/lookup.o src/once.o src/lifecycle.o src/machine.o src/insert_once.o src/outbox_publish.o: src/keycitus.h
src/outbox_topics.o src/outbox_publish.o src/outbox_relay.o src/wakeup.o: src/outbox_topics.h
src/outbox_claims.o src/outbox_relay.o src/outbox_counts.o src/owners.o src/idempotency.o: src/outbox_claims.h
src/outbox_counts.o src/outbox_relay.o src/lifecycle.o src/owners.o src/idempotency.o: src/outbox_counts.h
src/outbox_vacuum.o src/outbox_relay.o src/worker.o src/owners.o src/idempotency.o: src/outbox_vacuum.h
src/wakeup.o src/outbox_publish.o src/outbox_relay.o src/idempotency.o: src/wakeup.h

.PHONY: test test-all demo
# make test: this machine's PostgreSQL (pg_config).  make test PG=17 (or 18,
# 15): the same suite inside a throwaway layer over the cached Debian chroot
# of that major (test/chroot.sh; built once, as root).  make test-all: 15, 17
# and 18, one line per major and the summed closing line (test/matrix).
PG ?=
test:
ifeq ($(PG),)
	bash test/run
else
	bash test/chroot.sh scratch $(PG) . make --no-print-directory COPT='$(COPT)' test
endif

test-all:
	bash test/matrix

demo:
	bash demo/run

.PHONY: bench
bench:
	bash bench/run

# src/ in PostgreSQL's layout (pgindent's pg_bsd_indent and switches;
# test/indent/indent): the typedefs list from this server's headers first,
# then every src/*.c and src/*.h rewritten in place.  make test's indent
# suite fails on any difference.
.PHONY: indent
indent:
	PG_CONFIG='$(PG_CONFIG)' perl test/indent/indent --typedefs-update
	PG_CONFIG='$(PG_CONFIG)' perl test/indent/indent

# as root, in cached chroots (test/pg15src.sh): the assertion build, pg_upgrade
.PHONY: test-cassert test-upgrade
test-cassert:
	bash test/cassert/run

test-upgrade:
	bash test/upgrade/run

# PGXN release zip (META.json): git archive of HEAD (.gitattributes leaves
# out clients/, debian/, bench/, .ci/), as pg_partman and pgmq make theirs;
# with the portable edition's generated install script added at
# portable/build/ (what a managed service's user runs with psql -f or hands
# to pgtle.install_extension), generated from the checkout's sources
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/idempotency.control)
.PHONY: dist
dist:
	$(MAKE) -C portable
	git archive --format zip -o $(EXTENSION)-$(EXTVERSION).zip \
		--prefix=$(EXTENSION)-$(EXTVERSION)/portable/build/ --add-file=portable/build/$(EXTENSION)--$(EXTVERSION).sql \
		--prefix=$(EXTENSION)-$(EXTVERSION)/ HEAD

# the portable edition (portable/README.md): its install script generated
# from this one, and the C edition's tests run against it on a copy of the
# host's server without the C library (portable/server.sh; the suite
# `portable` of make test)
.PHONY: portable portable-check
portable:
	$(MAKE) -C portable PG_CONFIG=$(PG_CONFIG)

portable-check:
	$(MAKE) -C portable check PG_CONFIG=$$(PG_CONFIG=$(PG_CONFIG) bash portable/server.sh)
