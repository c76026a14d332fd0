# test/citus/cluster.sh — a throwaway Citus cluster on one machine: a
# coordinator and two workers, each its own PostgreSQL (own data directory,
# port and unix socket), run as the postgres user from the private prefix
# that test/citus/build.sh made.  Source it (after test/cluster.sh), then:
#
#   citus_start [postgresql.conf lines...]   initdb and start three nodes,
#        preload 'citus, idempotency', add the workers, CREATE EXTENSION
#        citus and idempotency (Citus propagates the latter to the workers);
#        sets CITUS_DIR, PORT_C PORT_W1 PORT_W2 and HOST (the socket dir)
#   citus_stop                     stop every node (immediate) and remove them
#   citus_node_init NAME           initdb and start one more node (w3: a worker
#                                  added later, on the port after w2's)
#   citus_node_start|stop NAME     restart/stop helpers use NAME c, w1, w2 or w3
#
# The caller traps EXIT to citus_stop.  CITUS_BIN is the prefix's bin dir.
CITUS_DIR=""

citus_start() {
	local n port
	CITUS_DIR=$(mktemp -d /tmp/idempotency-citus.XXXXXX)
	chmod 755 "$CITUS_DIR"
	[ "$(id -u)" = 0 ] && chown postgres: "$CITUS_DIR"
	HOST=$CITUS_DIR
	port=$(tcp_port)
	PORT_C=$port PORT_W1=$((port + 1)) PORT_W2=$((port + 2))
	CITUS_CONF=("$@")
	for n in c w1 w2; do
		citus_node_init "$n" || return 1
	done
	export PGHOST=$CITUS_DIR PGUSER=postgres PGDATABASE=postgres
	psql -qX -v ON_ERROR_STOP=1 -p "$PORT_C" >"$CITUS_DIR/setup.log" 2>&1 <<SQL || { cat "$CITUS_DIR/setup.log" >&2; return 1; }
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('$CITUS_DIR', $PORT_C);
SQL
	for n in w1 w2; do
		psql -qX -v ON_ERROR_STOP=1 -p "$(citus_port $n)" -c "CREATE EXTENSION citus" \
			>>"$CITUS_DIR/setup.log" 2>&1 || { cat "$CITUS_DIR/setup.log" >&2; return 1; }
	done
	psql -qX -v ON_ERROR_STOP=1 -p "$PORT_C" >>"$CITUS_DIR/setup.log" 2>&1 <<SQL || { cat "$CITUS_DIR/setup.log" >&2; return 1; }
SELECT citus_add_node('$CITUS_DIR', $PORT_W1);
SELECT citus_add_node('$CITUS_DIR', $PORT_W2);
CREATE EXTENSION idempotency;
SQL
}

# citus_node_init NAME: initdb and start node NAME (c, w1, w2, or w3: a worker
# the caller adds later with citus_add_node) with the lines citus_start was given
citus_node_init() {
	local n=$1 line
	as_pg "$CITUS_BIN/initdb" -D "$CITUS_DIR/$n" -U postgres -A trust --no-sync \
		-E UTF8 --locale=C.UTF-8 >"$CITUS_DIR/initdb-$n.log" 2>&1 || {
		cat "$CITUS_DIR/initdb-$n.log" >&2
		return 1
	}
	{
		echo "port = $(citus_port "$n")"
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$CITUS_DIR'"
		echo "shared_preload_libraries = 'citus, idempotency'"
		echo "max_connections = 150"
		echo "max_prepared_transactions = 100"
		echo "fsync = off"
		echo "log_line_prefix = '%m [%p] %q%a '"
		echo "citus.node_conninfo = 'sslmode=disable'"
		echo "citus.local_hostname = '$CITUS_DIR'"
		echo "idempotency.purge_interval = 0"
		for line in "${CITUS_CONF[@]}"; do echo "$line"; done
	} >>"$CITUS_DIR/$n/postgresql.conf"
	citus_node_start "$n"
}

citus_port() {
	case $1 in c) echo "$PORT_C" ;; w1) echo "$PORT_W1" ;; w2) echo "$PORT_W2" ;; w3) echo "$((PORT_C + 3))" ;; esac
}

citus_node_start() {
	as_pg "$CITUS_BIN/pg_ctl" -D "$CITUS_DIR/$1" -l "$CITUS_DIR/$1.log" -w -t 60 start >/dev/null || {
		tail -n 30 "$CITUS_DIR/$1.log" >&2
		return 1
	}
}

citus_node_stop() {	# name [mode]
	as_pg "$CITUS_BIN/pg_ctl" -D "$CITUS_DIR/$1" -m "${2:-immediate}" -w stop >/dev/null 2>&1
}

citus_stop() {
	local n
	[ -n "$CITUS_DIR" ] || return 0
	for n in c w1 w2 w3; do
		[ -f "$CITUS_DIR/$n/postmaster.pid" ] && citus_node_stop "$n"
	done
	rm -rf "$CITUS_DIR"
	CITUS_DIR=""
}
