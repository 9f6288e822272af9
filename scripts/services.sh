#!/usr/bin/env bash
# Makes PostgreSQL and RabbitMQ (with the stream and consistent-hash exchange
# plugins) available for idem's demo and tests. Safe to run again and again:
# what already answers is left alone. On a Debian machine, as root, it installs and starts what is missing
# without systemd; anywhere else it exits non-zero with the commands to run.
#
#   IDEM_PG_URL    default postgres://root@127.0.0.1:5432/test?sslmode=disable
#   IDEM_AMQP_URL  default amqp://guest:guest@127.0.0.1:5672/
#   IDEM_STREAM_PORT default 5552
#
# With --chromium it also makes a headless browser available for the
# console's browser test (make console-test): Debian's chromium, installed
# when /usr/bin/chromium is missing (IDEM_CHROMIUM names another binary).
# With --promtool it also installs Prometheus's promtool for the alert
# rules' tests (make alerts-test), from Debian's prometheus package.
set -euo pipefail

PG_URL=${IDEM_PG_URL:-postgres://root@127.0.0.1:5432/test?sslmode=disable}
AMQP_URL=${IDEM_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
STREAM_PORT=${IDEM_STREAM_PORT:-5552}
WAIT_SECONDS=${IDEM_SERVICES_WAIT:-90}

log() { echo "services: $*" >&2; }

# host_port URL DEFAULT_PORT prints "host port" of a URL.
host_port() {
	local rest=${1#*://}
	rest=${rest#*@}
	rest=${rest%%/*}
	rest=${rest%%\?*}
	local host=${rest%:*} port=${rest##*:}
	[ "$host" = "$rest" ] && port=$2
	[ -n "$host" ] || host=127.0.0.1
	echo "$host $port"
}

read -r PG_HOST PG_PORT <<<"$(host_port "$PG_URL" 5432)"
read -r AMQP_HOST AMQP_PORT <<<"$(host_port "$AMQP_URL" 5672)"

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

is_local() { case "$1" in 127.*|localhost|::1) return 0;; *) return 1;; esac; }

# shellcheck source=apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

wait_for() { # what, command...
	local what=$1; shift
	local deadline=$((SECONDS + WAIT_SECONDS))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			log "$what did not answer within ${WAIT_SECONDS}s"
			return 1
		fi
		sleep 1
	done
}

pg_answers() { command -v psql >/dev/null && psql "$PG_URL" -Atqc 'select 1' 2>/dev/null | grep -qx 1; }

manual_pg() {
	cat >&2 <<MSG
services: PostgreSQL is not reachable at $PG_HOST:$PG_PORT and this script cannot set it up here
          (it needs root on Debian, and a local address). Run, as root on Debian:
    apt-get update && apt-get install -y postgresql
    pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start
    su postgres -c "psql -c \"CREATE ROLE root SUPERUSER LOGIN\""
    su postgres -c "createdb -O root test"
  or point IDEM_PG_URL at a PostgreSQL you have (current: ${PG_URL%%@*}@...).
MSG
	exit 1
}

ensure_postgres() {
	if pg_answers; then log "PostgreSQL answers at $PG_HOST:$PG_PORT"; return; fi
	if port_open "$PG_HOST" "$PG_PORT" && ! command -v psql >/dev/null; then
		can_install || manual_pg
		apt_install postgresql-client
		if pg_answers; then log "PostgreSQL answers at $PG_HOST:$PG_PORT"; return; fi
	fi
	is_local "$PG_HOST" && can_install || manual_pg
	if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
		apt_install postgresql postgresql-client
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -n 1)
	local hba=/etc/postgresql/$version/main/pg_hba.conf
	if ! grep -q '# idem: trust local root' "$hba"; then
		log "allowing role root from 127.0.0.1 without a password ($hba)"
		sed -i '1i host all root 127.0.0.1/32 trust # idem: trust local root\nhost all root ::1/128 trust # idem: trust local root' "$hba"
		pg_ctlcluster --skip-systemctl-redirect "$version" main reload >/dev/null 2>&1 || true
	fi
	if ! pg_ctlcluster "$version" main status >/dev/null 2>&1; then
		log "starting PostgreSQL $version"
		pg_ctlcluster --skip-systemctl-redirect "$version" main start
	fi
	wait_for "PostgreSQL" su postgres -c "psql -Atqc 'select 1'"
	local db user
	user=$(sed -E 's#^[a-z]+://([^:@/]+).*#\1#' <<<"$PG_URL")
	db=$(sed -E 's#^[^/]*//[^/]*/([^?]*).*#\1#' <<<"$PG_URL")
	su postgres -c "psql -Atqc \"SELECT 1 FROM pg_roles WHERE rolname = '$user'\"" | grep -q 1 ||
		su postgres -c "psql -qc 'CREATE ROLE \"$user\" SUPERUSER LOGIN'"
	su postgres -c "psql -Atqc \"SELECT 1 FROM pg_database WHERE datname = '$db'\"" | grep -q 1 ||
		su postgres -c "createdb -O '$user' '$db'"
	wait_for "PostgreSQL at $PG_HOST:$PG_PORT" pg_answers || manual_pg
	log "PostgreSQL ready at $PG_HOST:$PG_PORT"
}

manual_rabbit() {
	cat >&2 <<MSG
services: RabbitMQ is not ready at $AMQP_HOST:$AMQP_PORT (streams on $STREAM_PORT) and this script
          cannot set it up here (it needs root on Debian, and a local address). Run, as root on Debian:
    apt-get update && apt-get install -y rabbitmq-server
    rabbitmq-plugins --offline enable $PLUGINS
    rabbitmq-server -detached
    rabbitmqctl await_startup
  or point IDEM_AMQP_URL at a RabbitMQ (>= 3.10, with $PLUGINS enabled) you have.
MSG
	exit 1
}

# The plugins idem needs beside the broker: streams (stream consumers,
# replays) and the consistent-hash exchange (partitioned consumers).
PLUGINS="rabbitmq_stream rabbitmq_consistent_hash_exchange"

# ensure_plugins enables those of PLUGINS a local broker lacks (enabling is
# online and leaves the rest of the broker alone). A remote broker is left
# as it is: its operator enables them.
ensure_plugins() {
	is_local "$AMQP_HOST" && command -v rabbitmq-plugins >/dev/null && [ "$(id -u)" = 0 ] || return 0
	local enabled missing=()
	enabled=$(timeout "$WAIT_SECONDS" rabbitmq-plugins list -e -m 2>/dev/null) || return 0
	for p in $PLUGINS; do
		grep -qx "$p" <<<"$enabled" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "enabling ${missing[*]}"
	timeout "$WAIT_SECONDS" rabbitmq-plugins enable "${missing[@]}" >/dev/null
}

ensure_rabbitmq() {
	if port_open "$AMQP_HOST" "$AMQP_PORT" && port_open "$AMQP_HOST" "$STREAM_PORT"; then
		ensure_plugins
		log "RabbitMQ answers at $AMQP_HOST:$AMQP_PORT, streams at $STREAM_PORT"
		return
	fi
	is_local "$AMQP_HOST" && can_install || manual_rabbit
	if ! command -v rabbitmq-server >/dev/null; then
		apt_install rabbitmq-server
	fi
	if ! port_open "$AMQP_HOST" "$AMQP_PORT"; then
		log "starting RabbitMQ"
		# shellcheck disable=SC2086
		rabbitmq-plugins --offline enable $PLUGINS >/dev/null
		rabbitmq-server -detached >/dev/null 2>&1 || true
		wait_for "RabbitMQ" port_open "$AMQP_HOST" "$AMQP_PORT" || manual_rabbit
		timeout "$WAIT_SECONDS" rabbitmqctl await_startup >/dev/null 2>&1 || true
	fi
	if ! port_open "$AMQP_HOST" "$STREAM_PORT"; then
		log "enabling rabbitmq_stream"
		rabbitmq-plugins enable rabbitmq_stream >/dev/null
		wait_for "RabbitMQ streams on $STREAM_PORT" port_open "$AMQP_HOST" "$STREAM_PORT" || manual_rabbit
	fi
	ensure_plugins
	log "RabbitMQ ready at $AMQP_HOST:$AMQP_PORT, streams at $STREAM_PORT"
}

manual_chromium() {
	cat >&2 <<MSG
services: no chromium at $CHROMIUM and this script cannot install it here (it needs root on
          Debian). Run, as root on Debian:
    apt-get update && apt-get install -y chromium
  or point IDEM_CHROMIUM at a Chromium or Chrome binary you have.
MSG
	exit 1
}

CHROMIUM=${IDEM_CHROMIUM:-/usr/bin/chromium}

ensure_chromium() {
	if [ -x "$CHROMIUM" ]; then log "chromium at $CHROMIUM"; return; fi
	[ "$CHROMIUM" = /usr/bin/chromium ] && can_install || manual_chromium
	apt_install chromium
	[ -x "$CHROMIUM" ] || manual_chromium
	log "chromium installed at $CHROMIUM"
}

# ensure_promtool installs promtool, which tests the alert rules
# (make alerts-test), from Debian's prometheus package when it is missing.
# The package's init script would start a Prometheus server: a policy-rc.d
# forbids starting services while it installs, and goes afterwards. Without
# root on Debian it says what to run and goes on (make alerts-test then
# fails, naming it). Only make alerts-test asks for it (--promtool).
ensure_promtool() {
	command -v promtool >/dev/null && return 0
	if ! can_install; then
		log "promtool is missing (make alerts-test needs it): apt-get install prometheus, or put promtool on PATH"
		return 0
	fi
	local policy=/usr/sbin/policy-rc.d
	if [ -e "$policy" ]; then
		apt_install prometheus
	else
		printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
		apt_install prometheus
		rm -f "$policy"
		trap - EXIT
	fi
	log "promtool $(promtool --version 2>&1 | head -n 1 | awk '{print $3}') installed"
}

ensure_postgres
ensure_rabbitmq
# What only one suite needs is installed when that suite asks for it.
for want in "$@"; do
	case $want in
	--chromium) ensure_chromium ;;
	--promtool) ensure_promtool ;;
	*) log "unknown option $want (known: --chromium, --promtool)"; exit 2 ;;
	esac
done
