#!/usr/bin/env bash
# Starts, breaks and removes idem's local production topology: a private
# 3-node RabbitMQ cluster (quorum queues, streams, the consistent-hash
# exchange) and a PostgreSQL primary with a streaming standby. Everything runs
# on spare ports, with its own node names, Erlang cookie, epmd and data dirs
# under one state dir, beside the services of scripts/services.sh and never
# touching them. On a Debian machine, as root, missing packages are installed.
#
#   up [--sync|--async]   start what does not answer, join the nodes, repair the
#                         PostgreSQL pair; print the URLs as export lines
#   env                   print the URLs only
#   status                every process and role; exits 1 unless all is up
#   down                  stop and remove everything it created
#   kill NODE             kill -9 a RabbitMQ node (idem2, idem2@localhost or 2)
#   freeze NODE           kill -STOP a RabbitMQ node: a gray failure (the kernel
#                         still accepts its TCP connections, nothing answers)
#   thaw NODE             kill -CONT a frozen node (up thaws every node too)
#   start NODE            start a node again and wait until it runs
#   stop NODE             stop a node cleanly
#   ctl NODE ARGS...      rabbitmqctl -n NODE ARGS, with the cluster's environment
#   queues NODE ARGS...   rabbitmq-queues likewise
#   pg-stop-primary       stop the PostgreSQL primary at once (pg_ctl -m immediate)
#   pg-promote            promote the standby
#   pg-failover           both
#   pg-rejoin             bring a stopped node back as a fresh standby of the
#                         primary (what `up` does for PostgreSQL)
#   pg-recreate           a new, empty pair
#   pg-mode sync|async    synchronous replication (remote_apply) or not
#   help                  this text
#
#   IDEM_CLUSTER_DIR         state dir, default /tmp/idem-cluster
#   IDEM_CLUSTER_AMQP_PORT   AMQP port of idem1, default 5681 (idem2 +1, idem3 +2)
#   IDEM_CLUSTER_STREAM_PORT stream port of idem1, default 5561
#   IDEM_CLUSTER_DIST_PORT   Erlang distribution port of idem1, default 25681;
#                            CLI tools take DIST+10020 to DIST+10050
#   IDEM_CLUSTER_EPMD_PORT   the cluster's own epmd, default 4370
#   IDEM_CLUSTER_PARTITION_HANDLING
#                            RabbitMQ's cluster_partition_handling: autoheal
#                            (the default), pause_minority or ignore; read
#                            when a node starts (docs/operations.md, Partitions)
#   IDEM_CLUSTER_PG_PORT     PostgreSQL node pg1, default 5442 (pg2 +1)
#   IDEM_CLUSTER_PG_SYNC     1 or 0: as `up --sync` or `up --async`; without
#                            either, a new pair is asynchronous and an existing
#                            one keeps its mode
#   IDEM_CLUSTER_WAIT        seconds to wait for any one thing, default 120
set -euo pipefail

DIR=${IDEM_CLUSTER_DIR:-/tmp/idem-cluster}
AMQP_PORT=${IDEM_CLUSTER_AMQP_PORT:-5681}
STREAM_PORT=${IDEM_CLUSTER_STREAM_PORT:-5561}
DIST_PORT=${IDEM_CLUSTER_DIST_PORT:-25681}
EPMD_PORT=${IDEM_CLUSTER_EPMD_PORT:-4370}
PARTITION_HANDLING=${IDEM_CLUSTER_PARTITION_HANDLING:-autoheal}
PG_PORT=${IDEM_CLUSTER_PG_PORT:-5442}
WAIT_SECONDS=${IDEM_CLUSTER_WAIT:-120}
NODES=3
HOST=127.0.0.1

log() { echo "cluster: $*" >&2; }
die() { log "$*"; exit 1; }

case $DIR in
/*[!/]*) ;;
*) die "IDEM_CLUSTER_DIR must be an absolute path below / (is '$DIR')" ;;
esac
case $DIR in *[[:space:]]*) die "IDEM_CLUSTER_DIR must not contain spaces" ;; esac
case $PARTITION_HANDLING in
autoheal | pause_minority | ignore) ;;
*) die "IDEM_CLUSTER_PARTITION_HANDLING must be autoheal, pause_minority or ignore (is '$PARTITION_HANDLING')" ;;
esac
MARKER=$DIR/.idem-cluster # only a dir holding it is ever removed

# Whatever RabbitMQ settings the caller has are not the cluster's.
for v in $(compgen -e | grep '^RABBITMQ_' || true); do unset "$v"; done

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

gone() { # PID PORT: the process (if any) exited and nothing listens on PORT
	{ [ -z "$1" ] || ! kill -0 "$1" 2>/dev/null; } && ! port_open "$2"
}

# shellcheck source=apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

# wait_until WHAT COMMAND... retries COMMAND every half second for at most
# WAIT_SECONDS.
wait_until() {
	local what=$1 deadline=$((SECONDS + WAIT_SECONDS))
	shift
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || die "$what: not within ${WAIT_SECONDS}s"
		sleep 0.5
	done
}

# owned PID tells whether PID is a live process this state dir started: its
# command line or environment names the state dir.
owned() {
	[ -n "$1" ] && [ -r "/proc/$1/cmdline" ] || return 1
	grep -qzF "$DIR/" "/proc/$1/cmdline" 2>/dev/null || marked "$1"
}

# marked PID tells whether PID runs with the environment mark that everything
# this script starts carries (CLI tools, epmd, the nodes' helpers).
marked() { grep -qzxF "IDEM_CLUSTER_OWNER=$DIR" "/proc/$1/environ" 2>/dev/null; }

# ---------------------------------------------------------------- RabbitMQ

rabbit_bin() {
	if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
		echo /usr/lib/rabbitmq/bin # Debian: /usr/sbin/rabbitmq-* switch to the rabbitmq user
	elif command -v rabbitmq-server >/dev/null; then
		dirname "$(readlink -f "$(command -v rabbitmq-server)")"
	fi
}

node_name() { echo "idem$1@localhost"; }
node_dir() { echo "$DIR/rabbit/idem$1"; }

# node_index NODE prints 1..3 for "2", "idem2" or "idem2@localhost".
node_index() {
	local i=${1%@localhost}
	i=${i#idem}
	case $i in [1-9]) [ "$i" -le $NODES ] && echo "$i" && return ;; esac
	die "unknown node '$1' (idem1..idem$NODES)"
}

# rabbit_env I exports what a node and the CLI tools talking to it need, so
# that nothing is read from /etc/rabbitmq or the default node's cookie.
rabbit_env() {
	local n
	n=$(node_dir "$1")
	export IDEM_CLUSTER_OWNER=$DIR HOME=$DIR/rabbit/home \
		RABBITMQ_CONF_ENV_FILE=$DIR/rabbit/rabbitmq-env.conf \
		ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=$HOST \
		RABBITMQ_NODENAME=$(node_name "$1") RABBITMQ_NODE_IP_ADDRESS=$HOST \
		RABBITMQ_NODE_PORT=$((AMQP_PORT + $1 - 1)) RABBITMQ_DIST_PORT=$((DIST_PORT + $1 - 1)) \
		RABBITMQ_CONFIG_FILE=$n/rabbitmq.conf RABBITMQ_ADVANCED_CONFIG_FILE=$n/advanced.config \
		RABBITMQ_CONFIG_FILES=$n/conf.d RABBITMQ_MNESIA_BASE=$n/mnesia RABBITMQ_LOG_BASE=$n/log \
		RABBITMQ_PID_FILE=$n/pid RABBITMQ_ENABLED_PLUGINS_FILE=$DIR/rabbit/enabled_plugins \
		RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}" \
		RABBITMQ_CTL_ERL_ARGS="-start_epmd false" \
		RABBITMQ_CTL_DIST_PORT_MIN=$((DIST_PORT + 10020)) RABBITMQ_CTL_DIST_PORT_MAX=$((DIST_PORT + 10050))
}

# cli TOOL I ARGS... runs a RabbitMQ CLI tool (rabbitmqctl, rabbitmq-queues)
# against node I, bounded by WAIT_SECONDS.
cli() {
	local tool=$1 i=$2
	shift 2
	(rabbit_env "$i" && cd "$DIR" && exec timeout "$WAIT_SECONDS" "$RABBIT_BIN/$tool" -n "$(node_name "$i")" "$@" 9>&-)
}

ctl() { cli rabbitmqctl "$@"; }

node_pid() { # the node's beam process, when it runs
	local pid
	pid=$(cat "$(node_dir "$1")/pid" 2>/dev/null) || return 1
	owned "$pid" && echo "$pid"
}

node_starting() { # the wrapper started by rabbit_start is still alive
	local pid
	pid=$(cat "$(node_dir "$1")/wrapper" 2>/dev/null) || return 1
	# Until it execs, the wrapper is a subshell of this script that carries
	# neither the state dir nor the mark: its parent tells.
	owned "$pid" || [ "$(awk '{print $4}' "/proc/$pid/stat" 2>/dev/null)" = "$$" ]
}

rabbit_files() {
	mkdir -p "$DIR/rabbit/home"
	local cookie=$DIR/rabbit/home/.erlang.cookie
	if [ ! -s "$cookie" ]; then
		tr -dc A-Z </dev/urandom | head -c 32 >"$cookie" || true
		chmod 400 "$cookie"
	fi
	: >"$DIR/rabbit/rabbitmq-env.conf"
	echo '[rabbitmq_stream,rabbitmq_consistent_hash_exchange].' >"$DIR/rabbit/enabled_plugins"
	local i n
	for i in $(seq $NODES); do
		n=$(node_dir "$i")
		mkdir -p "$n/conf.d" "$n/log" "$n/mnesia"
		cat >"$n/rabbitmq.conf" <<-CONF
			listeners.tcp.1 = $HOST:$((AMQP_PORT + i - 1))
			stream.listeners.tcp.1 = $HOST:$((STREAM_PORT + i - 1))
			stream.advertised_host = localhost
			stream.advertised_port = $((STREAM_PORT + i - 1))
			log.console = false
			log.file.level = info
			cluster_partition_handling = $PARTITION_HANDLING
			net_ticktime = 10
		CONF
		# A blank node joins the first one as it boots (no CLI round trips);
		# a node that has data rejoins the cluster it knows.
		[ "$i" = 1 ] || cat >>"$n/rabbitmq.conf" <<-CONF
			cluster_formation.peer_discovery_backend = classic_config
			cluster_formation.classic_config.nodes.1 = $(node_name 1)
		CONF
	done
}

epmd_up() {
	local pid
	pid=$(cat "$DIR/rabbit/epmd.pid" 2>/dev/null) && owned "$pid" && port_open "$EPMD_PORT" && return
	port_open "$EPMD_PORT" && die "port $EPMD_PORT (IDEM_CLUSTER_EPMD_PORT) is taken by a process this script did not start"
	log "starting epmd on port $EPMD_PORT"
	(
		export IDEM_CLUSTER_OWNER=$DIR
		cd "$DIR"
		exec setsid epmd -port "$EPMD_PORT" -address "$HOST" >"$DIR/rabbit/epmd.log" 2>&1 </dev/null 9>&-
	) &
	echo $! >"$DIR/rabbit/epmd.pid"
	wait_until "epmd on port $EPMD_PORT" port_open "$EPMD_PORT"
}

rabbit_start() {
	local i=$1 port=$((AMQP_PORT + $1 - 1)) p
	if node_pid "$i" >/dev/null || node_starting "$i"; then return; fi
	for p in "$port" $((STREAM_PORT + i - 1)) $((DIST_PORT + i - 1)); do
		port_open "$p" && die "port $p, meant for $(node_name "$i"), is taken by a process this script did not start"
	done
	log "starting $(node_name "$i") (AMQP $port)"
	local n
	n=$(node_dir "$i")
	rm -f "$n/pid"
	(rabbit_env "$i" && cd "$n" && exec setsid "$RABBIT_BIN/rabbitmq-server" >"$n/stdout.log" 2>&1 </dev/null 9>&-) &
	echo $! >"$n/wrapper"
}

node_answers() { node_pid "$1" >/dev/null && port_open $((AMQP_PORT + $1 - 1)); }

# rabbit_wait I waits until node I accepts AMQP and stream connections (the
# last listeners a booting node opens), and fails at once if it died on the way.
rabbit_wait() {
	local i=$1 deadline=$((SECONDS + WAIT_SECONDS))
	until node_answers "$i" && port_open $((STREAM_PORT + $1 - 1)); do
		if ! node_starting "$i" && ! node_pid "$i" >/dev/null; then
			tail -n 20 "$(node_dir "$i")/log/$(node_name "$i").log" "$(node_dir "$i")/stdout.log" >&2 2>/dev/null || true
			die "$(node_name "$i") exited while starting (logs in $(node_dir "$i")/log)"
		fi
		[ $SECONDS -lt $deadline ] || die "$(node_name "$i") did not start within ${WAIT_SECONDS}s (logs in $(node_dir "$i")/log)"
		sleep 0.5
	done
}

running_nodes() { # as node I sees them: idem1@localhost,idem2@localhost,...
	ctl "$1" -q eval 'lists:sort(rabbit_nodes:all_running()).' | tr -d '[] \n'
}

partitions() { # the nodes node I has a partition on record with, comma separated
	ctl "$1" -q eval 'lists:sort(rabbit_node_monitor:partitions()).' | tr -d '[] \n'
}

# rabbit_join I joins node I to the first node with rabbitmqctl, for a node
# that booted on its own (its data was from another cluster).
rabbit_join() {
	local i=$1 out=$DIR/rabbit/join.log
	log "joining $(node_name "$i") to $(node_name 1)"
	{ ctl "$i" -q stop_app && ctl "$i" -q reset && ctl "$i" -q join_cluster "$(node_name 1)" &&
		ctl "$i" -q start_app; } >"$out" 2>&1 || { cat "$out" >&2; die "$(node_name "$i") could not join $(node_name 1)"; }
}

rabbit_up() {
	rabbit_files
	epmd_up
	local i all seen
	for i in $(seq $NODES); do rabbit_thaw "$i"; done
	rabbit_start 1
	rabbit_wait 1
	for i in $(seq 2 $NODES); do rabbit_start "$i"; done
	for i in $(seq 2 $NODES); do rabbit_wait "$i"; done
	all=$(for i in $(seq $NODES); do node_name "$i"; done | sort | paste -sd,)
	seen=$(running_nodes 1)
	if [ "$seen" != "$all" ]; then
		for i in $(seq 2 $NODES); do
			case ,$seen, in *,$(node_name "$i"),*) ;; *) rabbit_join "$i" ;; esac
		done
		wait_until "all $NODES nodes running in one cluster" test "$(running_nodes 1)" = "$all"
	fi
	log "RabbitMQ cluster ready: $all"
}

rabbit_kill() {
	local i=$1 pid
	pid=$(node_pid "$i") || die "$(node_name "$i") is not running"
	log "kill -9 $(node_name "$i") (pid $pid)"
	kill -9 "$pid"
	rabbit_exited "$i" "$pid"
}

# rabbit_freeze I stops node I's process (SIGSTOP) without closing anything:
# its sockets stay open and its listener's backlog takes new connections, so
# a client sees a node that has gone silent, as behind a frozen VM or a
# blackholed host. A freeze longer than the net tick (10 s) leaves a
# partition when the node thaws, which autoheal ends by restarting the
# nodes of the side that lost (status reports partitions meanwhile).
rabbit_freeze() {
	local i=$1 pid
	pid=$(node_pid "$i") || die "$(node_name "$i") is not running"
	log "kill -STOP $(node_name "$i") (pid $pid)"
	kill -STOP "$pid"
}

rabbit_thaw() {
	local i=$1 pid
	pid=$(node_pid "$i") || return 0
	if [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = T ]; then
		log "kill -CONT $(node_name "$i") (pid $pid)"
		kill -CONT "$pid"
	fi
}

rabbit_stop() {
	local i=$1 pid
	pid=$(node_pid "$i") || { log "$(node_name "$i") is not running"; return; }
	log "stopping $(node_name "$i")"
	ctl "$i" -q stop >/dev/null
	rabbit_exited "$i" "$pid"
}

# rabbit_exited I PID waits until node I's process PID and the wrapper that
# started it are gone, so that the node can be started again at once.
rabbit_exited() {
	local i=$1 wrapper
	wrapper=$(cat "$(node_dir "$i")/wrapper" 2>/dev/null) && owned "$wrapper" || wrapper=
	wait_until "$(node_name "$i") to exit" gone "$2" $((AMQP_PORT + i - 1))
	wait_until "the wrapper of $(node_name "$i") to exit" gone "$wrapper" $((AMQP_PORT + i - 1))
	rm -f "$(node_dir "$i")/pid"
}

rabbit_status() {
	local i ok=0 seen= p
	for i in $(seq $NODES); do
		if node_answers "$i"; then
			echo "rabbitmq $(node_name "$i") running: amqp $((AMQP_PORT + i - 1)), stream $((STREAM_PORT + i - 1)), pid $(node_pid "$i")"
			[ -n "$seen" ] || seen=$(running_nodes "$i" 2>/dev/null || true)
			p=$(partitions "$i" 2>/dev/null || true)
			if [ -n "$p" ]; then
				echo "rabbitmq $(node_name "$i") partitioned from: $p"
				ok=1
			fi
		else
			echo "rabbitmq $(node_name "$i") down"
			ok=1
		fi
	done
	[ -z "$seen" ] || echo "rabbitmq cluster running: $seen"
	return $ok
}

# ---------------------------------------------------------------- PostgreSQL

pg_bin() {
	if [ -n "${IDEM_CLUSTER_PG_BIN:-}" ]; then echo "$IDEM_CLUSTER_PG_BIN"; return; fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	if [ -n "$d" ]; then echo "$d"; elif command -v initdb >/dev/null; then dirname "$(command -v initdb)"; fi
}

pg_dir() { echo "$DIR/pg/pg$1"; }
pg_port() { echo $((PG_PORT + $1 - 1)); }
pg_name() { echo "idem_pg$1"; } # application_name and replication slot
other() { echo $((3 - $1)); }

# as_pg runs a PostgreSQL server command as the user that owns the data:
# postgres when this script runs as root (initdb refuses root), else the caller.
as_pg() {
	if [ "$(id -u)" = 0 ]; then
		(cd "$DIR/pg" && exec runuser -u postgres -- env IDEM_CLUSTER_OWNER="$DIR" PATH="$PG_BIN:$PATH" "$@" 9>&-)
	else
		(cd "$DIR/pg" && export IDEM_CLUSTER_OWNER=$DIR PATH=$PG_BIN:$PATH && exec "$@" 9>&-)
	fi
}

pg_url() { echo "postgres://root@$HOST:$(pg_port "$1")/test?sslmode=disable"; }

psql_on() { # I SQL...: one statement per argument, each its own transaction
	local i=$1 args=() sql
	shift
	for sql in "$@"; do args+=(-c "$sql"); done
	psql "host=$HOST port=$(pg_port "$i") user=root dbname=postgres connect_timeout=5" -XAtq -v ON_ERROR_STOP=1 "${args[@]}"
}

pg_role() { # primary, standby or down
	case $(psql_on "$1" 'SELECT pg_is_in_recovery()' 2>/dev/null) in
	f) echo primary ;;
	t) echo standby ;;
	*) echo down ;;
	esac
}

pg_timeline() { # of a primary: the first 8 hex digits of its current WAL file
	psql_on "$1" 'SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)'
}

pg_start() {
	local i=$1
	[ -f "$(pg_dir "$i")/PG_VERSION" ] || die "$(pg_name "$i") has no data dir"
	log "starting PostgreSQL $(pg_name "$i") on port $(pg_port "$i")"
	as_pg pg_ctl -D "$(pg_dir "$i")" -l "$DIR/pg/log/pg$i.log" -w -t "$WAIT_SECONDS" start >/dev/null ||
		{ tail -n 20 "$DIR/pg/log/pg$i.log" >&2; die "$(pg_name "$i") did not start"; }
}

pg_stop_now() {
	local i=$1
	[ -f "$(pg_dir "$i")/postmaster.pid" ] || return 0
	log "stopping PostgreSQL $(pg_name "$i") at once (pg_ctl stop -m immediate)"
	as_pg pg_ctl -D "$(pg_dir "$i")" -m immediate -w -t "$WAIT_SECONDS" stop >/dev/null 2>&1 || true
	local pid
	pid=$(head -n 1 "$(pg_dir "$i")/postmaster.pid" 2>/dev/null) && owned "$pid" && kill -9 "$pid" || true
	wait_until "$(pg_name "$i") to stop" gone "" "$(pg_port "$i")"
}

# pg_node_conf I writes what differs between the nodes; postgresql.conf
# includes it, and pg_basebackup copies it, so it is rewritten afterwards.
pg_node_conf() {
	echo "port = $(pg_port "$1")" | as_pg tee "$(pg_dir "$1")/node.conf" >/dev/null
}

# replication P NAME prints the state and sync state of standby NAME as
# primary P sees it ("streaming async").
replication() {
	psql_on "$1" "SELECT state || ' ' || sync_state FROM pg_stat_replication WHERE application_name = '$2'"
}
streaming() { case $(replication "$1" "$2") in "streaming ${3:-}"*) return 0 ;; *) return 1 ;; esac; }
is_role() { [ "$(pg_role "$1")" = "$2" ]; }

pg_init_primary() {
	local i=$1 d
	d=$(pg_dir "$i")
	log "initdb $(pg_name "$i")"
	as_pg initdb -D "$d" -U root -A trust -E UTF8 --locale=C --no-sync >"$DIR/pg/log/initdb.log" 2>&1 ||
		{ tail -n 20 "$DIR/pg/log/initdb.log" >&2; die "initdb failed"; }
	as_pg tee -a "$d/postgresql.conf" >/dev/null <<-CONF
		# idem cluster: replication on spare ports (scripts/cluster.sh)
		listen_addresses = '$HOST'
		unix_socket_directories = '$DIR/pg/run'
		max_connections = 200
		wal_level = replica
		max_wal_senders = 10
		max_replication_slots = 10
		wal_keep_size = '256MB'
		hot_standby = on
		hot_standby_feedback = on
		wal_retrieve_retry_interval = '1s'
		wal_log_hints = on
		include_if_exists = 'node.conf'
	CONF
	pg_node_conf "$i"
	pg_start "$i"
	psql_on "$i" 'CREATE DATABASE test' >/dev/null
}

# pg_init_standby I makes node I a fresh copy of the primary, following it
# through a replication slot of its own.
pg_init_standby() {
	local i=$1 p
	p=$(other "$i")
	log "pg_basebackup $(pg_name "$i") from $(pg_name "$p")"
	pg_stop_now "$i"
	as_pg rm -rf "$(pg_dir "$i")"
	psql_on "$p" "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '$(pg_name "$i")'" >/dev/null
	as_pg pg_basebackup -d "host=$HOST port=$(pg_port "$p") user=root application_name=$(pg_name "$i")" \
		-D "$(pg_dir "$i")" -R -X stream -C -S "$(pg_name "$i")" -c fast --no-sync >"$DIR/pg/log/basebackup.log" 2>&1 ||
		{ tail -n 20 "$DIR/pg/log/basebackup.log" >&2; die "pg_basebackup failed"; }
	pg_node_conf "$i"
	pg_start "$i"
	wait_until "$(pg_name "$i") to stream from $(pg_name "$p")" streaming "$p" "$(pg_name "$i")"
}

pg_mode() { cat "$DIR/pg/mode" 2>/dev/null || echo async; }

# pg_apply_mode P sets the replication mode on primary P.
pg_apply_mode() {
	local p=$1 s
	s=$(pg_name "$(other "$p")")
	if [ "$(pg_mode)" = sync ]; then
		psql_on "$p" "ALTER SYSTEM SET synchronous_standby_names = '$s'" \
			"ALTER SYSTEM SET synchronous_commit = 'remote_apply'" 'SELECT pg_reload_conf()' >/dev/null
		wait_until "$s to be a synchronous standby" streaming "$p" "$s" sync
	else
		psql_on "$p" 'ALTER SYSTEM RESET synchronous_standby_names' \
			'ALTER SYSTEM RESET synchronous_commit' 'SELECT pg_reload_conf()' >/dev/null
	fi
}

pg_roles() { echo "$(pg_role 1) $(pg_role 2)"; }

pg_primary() { # the index of the primary, if one answers
	local r
	read -r -a r <<<"$(pg_roles)"
	if [ "${r[0]}" = primary ]; then echo 1; elif [ "${r[1]}" = primary ]; then echo 2; else return 1; fi
}

pg_files() {
	mkdir -p "$DIR/pg/log" "$DIR/pg/run"
	[ "$(id -u)" != 0 ] || chown postgres: "$DIR/pg" "$DIR/pg/log" "$DIR/pg/run"
	chmod 700 "$DIR/pg/run"
}

# pg_repair brings the pair back to one primary and one streaming standby,
# keeping the data: a node that is down is started when it was the primary,
# or made a fresh standby of the primary that took over; of two primaries,
# the one on the older timeline becomes the standby.
pg_repair() {
	pg_files
	if [ ! -f "$(pg_dir 1)/PG_VERSION" ] && [ ! -f "$(pg_dir 2)/PG_VERSION" ]; then
		pg_init_primary 1
		pg_init_standby 2
		pg_apply_mode 1
		return
	fi
	local r p s
	read -r -a r <<<"$(pg_roles)"
	case "${r[0]} ${r[1]}" in
	"primary standby") p=1 ;;
	"standby primary") p=2 ;;
	"primary down" | "down primary")
		[ "${r[0]}" = primary ] && p=1 || p=2
		# "down" may be a node that does not answer yet still runs (a
		# thawed, frozen primary): it is stopped before it is replaced.
		pg_stop_now "$(other "$p")"
		pg_init_standby "$(other "$p")"
		;;
	"standby down" | "down standby")
		[ "${r[0]}" = down ] && p=1 || p=2
		[ -f "$(pg_dir "$p")/standby.signal" ] && die "no PostgreSQL primary left: run pg-promote, or pg-recreate"
		pg_start "$p"
		;;
	"primary primary")
		p=1
		[[ "$(pg_timeline 2)" > "$(pg_timeline 1)" ]] && p=2
		pg_stop_now "$(other "$p")"
		pg_init_standby "$(other "$p")"
		;;
	"down down")
		for p in 1 2; do
			[ -f "$(pg_dir "$p")/PG_VERSION" ] && [ ! -f "$(pg_dir "$p")/standby.signal" ] && break
		done
		[ -f "$(pg_dir "$p")/PG_VERSION" ] && [ ! -f "$(pg_dir "$p")/standby.signal" ] ||
			die "neither PostgreSQL node can be a primary: run pg-recreate"
		pg_start "$p"
		s=$(other "$p")
		if [ -f "$(pg_dir "$s")/standby.signal" ]; then pg_start "$s"; else pg_init_standby "$s"; fi
		;;
	*) die "PostgreSQL nodes are ${r[0]} and ${r[1]}: run pg-recreate" ;;
	esac
	s=$(pg_name "$(other "$p")")
	wait_until "$s to stream from $(pg_name "$p")" streaming "$p" "$s"
	pg_apply_mode "$p"
}

pg_stop_primary() {
	local p
	p=$(pg_primary) || die "no PostgreSQL primary is running"
	pg_stop_now "$p"
}

pg_promote() {
	local s
	for s in 1 2; do [ "$(pg_role "$s")" = standby ] && break; done
	[ "$(pg_role "$s")" = standby ] || die "no PostgreSQL standby is running"
	log "promoting $(pg_name "$s")"
	# Alone, a primary that waits for a synchronous standby would never commit.
	psql_on "$s" 'ALTER SYSTEM RESET synchronous_standby_names' 'SELECT pg_reload_conf()' >/dev/null
	as_pg pg_ctl -D "$(pg_dir "$s")" -w -t "$WAIT_SECONDS" promote >/dev/null
	wait_until "$(pg_name "$s") to be primary" is_role "$s" primary
}

pg_set_mode() {
	case ${1:-} in sync | async) ;; *) die "pg-mode takes sync or async" ;; esac
	echo "$1" >"$DIR/pg/mode"
	local p
	p=$(pg_primary) || die "no PostgreSQL primary is running"
	[ "$(pg_role "$(other "$p")")" = standby ] || die "no PostgreSQL standby is running: run pg-rejoin"
	pg_apply_mode "$p"
	log "PostgreSQL replication is $1"
}

pg_status() {
	local i ok=0
	for i in 1 2; do
		echo "postgresql $(pg_name "$i") $(pg_role "$i"): port $(pg_port "$i")"
	done
	local p
	if p=$(pg_primary); then
		psql_on "$p" "SELECT 'postgresql replication to ' || application_name || ': ' || state || ', ' || sync_state FROM pg_stat_replication" || true
		[ "$(pg_role "$(other "$p")")" = standby ] || ok=1
	else
		ok=1
	fi
	echo "postgresql mode: $(pg_mode)"
	return $ok
}

# ---------------------------------------------------------------- verbs

print_env() {
	local i amqp=() stream=() nodes=()
	for i in $(seq $NODES); do
		amqp+=("amqp://guest:guest@$HOST:$((AMQP_PORT + i - 1))/")
		stream+=("rabbitmq-stream://guest:guest@$HOST:$((STREAM_PORT + i - 1))/")
		nodes+=("$(node_name "$i")")
	done
	local IFS=,
	echo "export IDEM_CLUSTER_NODES='${nodes[*]}'"
	echo "export IDEM_CLUSTER_AMQP_URLS='${amqp[*]}'"
	echo "export IDEM_CLUSTER_STREAM_URLS='${stream[*]}'"
	echo "export IDEM_CLUSTER_PG_URL='postgres://root@$HOST:$(pg_port 1),$HOST:$(pg_port 2)/test?sslmode=disable&target_session_attrs=read-write'"
	echo "export IDEM_CLUSTER_PG_NODE_URLS='$(pg_url 1),$(pg_url 2)'"
}

ensure_packages() {
	local missing=()
	[ -n "$(rabbit_bin)" ] || missing+=(rabbitmq-server)
	[ -n "$(pg_bin)" ] || missing+=(postgresql)
	command -v psql >/dev/null || missing+=(postgresql-client)
	command -v flock >/dev/null || missing+=(util-linux)
	[ ${#missing[@]} -gt 0 ] || return 0
	can_install || die "missing ${missing[*]}: run, as root on Debian: apt-get install -y ${missing[*]}"
	apt_install "${missing[@]}"
}

# lock lets one verb at a time change the topology. Whatever the script starts
# closes fd 9 (9>&-), or a node would hold the lock as long as it runs.
lock() {
	exec 9>>"$DIR/lock"
	flock -w "$WAIT_SECONDS" 9 || die "another scripts/cluster.sh holds $DIR/lock"
}

prepare() { # the state dir, and the tools every verb needs
	if [ ! -d "$DIR" ]; then
		mkdir -p "$DIR"
		chmod 755 "$DIR" # the postgres user goes through it
		touch "$MARKER"
	fi
	[ -f "$MARKER" ] || die "$DIR exists and was not made by this script; set IDEM_CLUSTER_DIR"
	RABBIT_BIN=$(rabbit_bin)
	PG_BIN=$(pg_bin)
}

require_up() { [ -f "$MARKER" ] || die "the cluster is not up (run scripts/cluster.sh up)"; }

up() {
	case ${1:-} in
	--sync) IDEM_CLUSTER_PG_SYNC=1 ;;
	--async) IDEM_CLUSTER_PG_SYNC=0 ;;
	"") ;;
	*) die "up takes --sync or --async" ;;
	esac
	local start=$SECONDS
	ensure_packages
	prepare
	lock
	rabbit_up
	pg_files
	case ${IDEM_CLUSTER_PG_SYNC:-} in
	1) echo sync >"$DIR/pg/mode" ;;
	0) echo async >"$DIR/pg/mode" ;;
	esac
	pg_repair
	log "PostgreSQL ready: primary $(pg_name "$(pg_primary)"), $(pg_mode) replication"
	log "up in $((SECONDS - start))s (state in $DIR; scripts/cluster.sh down removes it)"
	print_env
}

down() {
	[ -d "$DIR" ] || { log "nothing to remove at $DIR"; return; }
	[ -f "$MARKER" ] || die "$DIR was not made by this script; not removing it"
	prepare
	lock
	local i pid f
	for i in 1 2; do [ ! -d "$(pg_dir "$i")" ] || pg_stop_now "$i"; done
	for i in $(seq $NODES); do
		for f in pid wrapper; do
			pid=$(cat "$(node_dir "$i")/$f" 2>/dev/null) || continue
			if owned "$pid"; then
				log "kill -9 $(node_name "$i") ($f $pid)"
				kill -9 "$pid" 2>/dev/null || true
			fi
		done
	done
	# What is left: children of the nodes (erl_child_setup), CLI tools, epmd.
	local left deadline=$((SECONDS + 30))
	while :; do
		left=$(leftovers)
		[ -n "$left" ] || break
		[ $SECONDS -lt $deadline ] || die "processes of $DIR survived kill -9: $left"
		for pid in $left; do kill -9 "$pid" 2>/dev/null || true; done
		sleep 0.5
	done
	rm -rf "$DIR"
	log "removed $DIR"
}

leftovers() { # processes of this state dir, except this script and its callers
	local pid self=" $$ $BASHPID " p=$$
	while [ "$p" -gt 1 ] 2>/dev/null; do
		p=$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null) || break
		self+="$p "
	done
	{ grep -lzxF "IDEM_CLUSTER_OWNER=$DIR" /proc/[0-9]*/environ 2>/dev/null || true; } | cut -d/ -f3 |
		while read -r pid; do
			case $self in *" $pid "*) ;; *) echo "$pid" ;; esac
		done | paste -sd' '
}

status() {
	[ -f "$MARKER" ] || { echo "not up ($DIR does not exist)"; return 1; }
	prepare
	local ok=0
	rabbit_status || ok=1
	pg_status || ok=1
	return $ok
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

verb=${1:-}
shift || true
case $verb in
up) up "$@" ;;
down) down ;;
env) print_env ;;
status) status ;;
kill | start | stop | freeze | thaw)
	[ $# = 1 ] || die "$verb takes a node name"
	require_up
	prepare
	i=$(node_index "$1")
	lock
	case $verb in
	kill) rabbit_kill "$i" ;;
	start) epmd_up && rabbit_start "$i" && rabbit_wait "$i" ;;
	stop) rabbit_stop "$i" ;;
	freeze) rabbit_freeze "$i" ;;
	thaw) rabbit_thaw "$i" ;;
	esac
	;;
ctl | queues)
	[ $# -ge 1 ] || die "$verb takes a node name and arguments"
	require_up
	prepare
	i=$(node_index "$1")
	shift
	if [ "$verb" = ctl ]; then cli rabbitmqctl "$i" "$@"; else cli rabbitmq-queues "$i" "$@"; fi
	;;
pg-stop-primary | pg-promote | pg-failover | pg-rejoin | pg-recreate | pg-mode)
	require_up
	prepare
	lock
	case $verb in
	pg-stop-primary) pg_stop_primary ;;
	pg-promote) pg_promote ;;
	pg-failover) pg_stop_primary && pg_promote ;;
	pg-rejoin) pg_repair ;;
	pg-recreate)
		for i in 1 2; do pg_stop_now "$i"; done
		as_pg rm -rf "$(pg_dir 1)" "$(pg_dir 2)"
		pg_repair
		;;
	pg-mode) pg_set_mode "$@" ;;
	esac
	;;
help | -h | --help) usage ;;
*)
	usage >&2
	exit 2
	;;
esac
