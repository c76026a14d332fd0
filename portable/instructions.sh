#!/usr/bin/env bash
# portable/instructions.sh — instructions per request, C edition against the
# portable edition, counted by callgrind in a single-user backend (as
# bench/instructions.sh does for the C edition): deterministic, so the two
# can be compared on a machine too loaded for tps.
#
#   C_PG_CONFIG=... PORTABLE_PG_CONFIG=... bash portable/instructions.sh [requests=300]
#
# C_PG_CONFIG: a PostgreSQL with the C library installed; PORTABLE_PG_CONFIG:
# one without it.  PORTABLE_SRC: the portable sources (portable/src), e.g.
# another branch's, to compare; INSTR_ROLE: a role the sessions act as (SET
# SESSION AUTHORIZATION, as if logged in as it: NOLOGIN, no superuser,
# INSERT on the payment table), so that row security and the caller's
# checks are counted as an application meets them (default: none, the
# superuser).  KINDS: the kinds to count (all).  INSTR_KEEP=DIR keeps the
# callgrind files (callgrind_annotate them).
# Kinds, one transaction or statement each, prepared once:
#   bare     BEGIN; INSERT a payment; COMMIT
#   guarded  BEGIN; begin() of a new key; the INSERT; complete(); COMMIT
#   select   SELECT of a finished key's row from the key table
#   replay   begin() of a finished key (autocommit)
#   once     once() of a new key: INSERT ... RETURNING id, arguments as text
#   oncerep  once() of a finished key (the work does not run)
#   hand     bench/portable.sh's hand-written PL/pgSQL pattern for one round
#            trip (its own key table: INSERT ... ON CONFLICT DO NOTHING,
#            SELECT ... FOR UPDATE, compare, the INSERT, UPDATE), a new key
#   floor    the least any PL/pgSQL once() of a new key does: an invoker
#            function that makes the key row through a SECURITY DEFINER
#            function (INSERT ... ON CONFLICT DO NOTHING RETURNING; an
#            application role may not write the key table), runs the
#            caller's statement as the caller (EXECUTE of a statement
#            prepared once per session, its arguments as literals, as the
#            portable once() does) and stores the result through another
#            (UPDATE); no fingerprint, no caller checks, no commit check,
#            no settings: a lower bound for the portable once(), not a
#            product
#   rfloor   the least any PL/pgSQL replay does: one SECURITY DEFINER
#            function with a pinned search_path (an application role may
#            not read other roles' keys), the caller taken from the
#            session user, one indexed SELECT of the finished key's row, the
#            row returned; no checks of key, ttl, lease, request or state
set -u
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
N=${1:-300}
PSRC=${PORTABLE_SRC:-$here/src}
ROLE=${INSTR_ROLE:-}
KINDS=${KINDS:-bare guarded select replay once oncerep hand floor rfloor}
OWNER=${ROLE:-postgres}
version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$top/idempotency.control")
. "$top/test/cluster.sh"
WORK=$(mktemp -d /tmp/portable-instr.XXXXXX)
chmod 777 "$WORK"
trap 'cluster_stop; rm -rf "$WORK"' EXIT

PREPARES="PREPARE ins(text) AS INSERT INTO payment (key, amount) VALUES (\$1, 10);
PREPARE beg(text) AS SELECT outcome FROM idempotency.begin(\$1);
PREPARE fin(text) AS SELECT idempotency.complete(\$1, '{\"ok\": true}');
PREPARE sel(text) AS SELECT status, response FROM idempotency.idempotency_key WHERE owner = '$OWNER'::regrole AND scope = '' AND key = \$1;
PREPARE rep(text) AS SELECT outcome, response FROM idempotency.begin(\$1);
PREPARE once1(text) AS SELECT outcome, response FROM idempotency.once(\$1, NULL, 'INSERT INTO payment (key, amount) VALUES (\$1, \$2) RETURNING id', \$1, '10'::text);
PREPARE hand1(text) AS SELECT pl_once(\$1, NULL, 10);
PREPARE work(text, text) AS INSERT INTO payment (key, amount) VALUES (\$1, \$2::int) RETURNING id;
PREPARE floor1(text) AS SELECT floor_once(\$1, 'work', \$1, '10');
PREPARE rfloor1(text) AS SELECT outcome, response FROM rfloor_begin(\$1);"

gen() {	# kind
	[ -n "$ROLE" ] && echo "SET SESSION AUTHORIZATION $ROLE;"
	echo "$PREPARES"
	[ "$1" = empty ] && return
	for i in $(seq 1 "$N"); do
		case $1 in
		bare) echo "BEGIN; EXECUTE ins('b$i'); COMMIT;" ;;
		guarded) echo "BEGIN; EXECUTE beg('g$i'); EXECUTE ins('g$i'); EXECUTE fin('g$i'); COMMIT;" ;;
		select) echo "EXECUTE sel('replay-$((i % 1000 + 1))');" ;;
		replay) echo "EXECUTE rep('replay-$((i % 1000 + 1))');" ;;
		once) echo "EXECUTE once1('o$i');" ;;
		oncerep) echo "EXECUTE once1('replay-$((i % 1000 + 1))');" ;;
		hand) echo "EXECUTE hand1('h$i');" ;;
		floor) echo "EXECUTE floor1('f$i');" ;;
		rfloor) echo "EXECUTE rfloor1('replay-$((i % 1000 + 1))');" ;;
		esac
	done
}
count() {	# edition kind -> instructions of the whole session
	local f="$WORK/$1.$2.sql" out="$WORK/cg.$1.$2"
	gen "$2" >"$f"
	chmod 644 "$f"
	as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
		"$PG_BINDIR/postgres" --single -D "$CLUSTER_DIR/data" postgres <"$f" >/dev/null 2>&1
	[ -n "${INSTR_KEEP:-}" ] && cp "$out" "$INSTR_KEEP/"
	awk '/^summary:|^totals:/ { print $2; exit }' "$out"
}

for edition in C portable; do
	if [ "$edition" = C ]; then
		PG_BINDIR=$("${C_PG_CONFIG:?a pg_config with the C library}" --bindir)
	else
		PG_BINDIR=$("${PORTABLE_PG_CONFIG:?a pg_config without it}" --bindir)
	fi
	cluster_start >/dev/null || exit 2
	if [ "$edition" = C ]; then
		psql -qX -c 'CREATE EXTENSION idempotency' || exit 2
	else
		perl "$here/build.pl" "$top/idempotency--$version.sql" "$PSRC" >"$WORK/portable.sql" 2>/dev/null &&
			psql -qX -v ON_ERROR_STOP=1 -1 -f "$WORK/portable.sql" >/dev/null || exit 2
	fi
	{
		echo "CREATE TABLE payment (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL);"
		cat "$top/bench/scripts/handwritten.sql" "$top/bench/scripts/rfloor.sql"
		cat <<'SQL'
CREATE TABLE fl_key (key text PRIMARY KEY, status text NOT NULL, response jsonb);
CREATE FUNCTION fl_begin(k text) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE x text;
BEGIN
  INSERT INTO public.fl_key (key, status) VALUES (k, 'in_progress') ON CONFLICT DO NOTHING RETURNING key INTO x;
  RETURN x IS NOT NULL;
END $$;
CREATE FUNCTION fl_complete(k text, r jsonb) RETURNS void LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  UPDATE public.fl_key SET status = 'completed', response = r WHERE key = k;
END $$;
CREATE FUNCTION floor_once(k text, stmt text, VARIADIC args text[]) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE r jsonb;
BEGIN
  IF NOT fl_begin(k) THEN
    RETURN NULL;
  END IF;
  EXECUTE format('EXECUTE %I(%L, %L)', stmt, args[1], args[2]) INTO r;
  PERFORM fl_complete(k, r);
  RETURN r;
END $$;
SQL
		[ -n "$ROLE" ] && echo "CREATE ROLE $ROLE NOLOGIN; GRANT INSERT, SELECT ON payment TO $ROLE;
GRANT USAGE ON SEQUENCE payment_id_seq TO $ROLE;
GRANT EXECUTE ON FUNCTION pl_once(text, jsonb, int) TO $ROLE; GRANT ALL ON pl_key TO $ROLE;
SET SESSION AUTHORIZATION $ROLE;"
		cat <<'SQL'
DO $$
BEGIN
  FOR i IN 1..1000 LOOP
    PERFORM idempotency.once('replay-' || i, NULL, 'INSERT INTO payment (key, amount) VALUES ($1, $2) RETURNING id', 'replay-' || i, '10');
  END LOOP;
END $$;
SQL
	} | psql -qX -v ON_ERROR_STOP=1 >/dev/null || exit 2
	as_pg "$PG_BINDIR/pg_ctl" -D "$CLUSTER_DIR/data" -w stop >/dev/null
	empty=$(count "$edition" empty)
	for k in $KINDS; do
		echo "$edition $k $(( ( $(count "$edition" "$k") - empty ) / N ))"
	done
	cluster_stop
done
echo "($N requests each, postgres --single under callgrind)"
