#!/usr/bin/env bash
# PostgreSQL 16 + pgvector on loopback, the reference the client scripts are validated against.
#
#   eval "$(tests/pg_clients/reference_postgres.sh start)"   # prints PG* and FV_TARGET=postgres
#   .ci/pg-clients run                                       # every script against it
#   tests/pg_clients/reference_postgres.sh stop              # stops it (REFERENCE_PG_DIR)
#
# A developer's tool, not part of CI. `start` installs the `pgserver` wheel (PostgreSQL 16.2
# with pgvector 0.6.2's vector.so) into a scratch virtualenv (${REFERENCE_PG_VENV:-/tmp/pgserver-venv}),
# initdb's a cluster in a new temporary directory with SCRAM-SHA-256 for TCP, starts postgres
# on a free port of 127.0.0.1 with every statement logged (log_statement = all,
# log_min_duration_statement = 0: parse / bind / execute with their parameters) to
# $REFERENCE_PG_DIR/server.log, and creates the vector extension. postgres refuses to run as
# root, so as root it runs as the `postgres` user (or `nobody`).
set -euo pipefail

venv="${REFERENCE_PG_VENV:-/tmp/pgserver-venv}"
pgserver_version="0.1.4"
password="fragvec-reference"

bin_dir() {
    echo "$venv/lib/python$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')/site-packages/pgserver/pginstall/bin"
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then
        local user=postgres
        id "$user" >/dev/null 2>&1 || user=nobody
        su "$user" -s /bin/bash -c "$*"
    else
        bash -c "$*"
    fi
}

start() {
    if ! [ -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import pgserver' 2>/dev/null; then
        echo "reference_postgres: installing pgserver==$pgserver_version into $venv" >&2
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install --quiet "pgserver==$pgserver_version" >&2
    fi
    local bin dir port
    bin="$(bin_dir)"
    dir="$(mktemp -d /tmp/reference-pg.XXXXXX)"
    chmod 755 "$dir"
    port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    echo "$password" >"$dir/pw"
    if [ "$(id -u)" = 0 ]; then
        local user=postgres
        id "$user" >/dev/null 2>&1 || user=nobody
        chown "$user" "$dir" "$dir/pw"
    fi
    as_owner "'$bin/initdb' -D '$dir/data' -U postgres --auth-local=trust --auth-host=scram-sha-256 --pwfile='$dir/pw' -E UTF8 --locale=C.UTF-8" >"$dir/initdb.log" 2>&1 ||
        { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "'$bin/pg_ctl' -D '$dir/data' -l '$dir/server.log' -w -o \"-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='$dir' -c max_connections=200 -c log_statement=all -c log_min_duration_statement=0 -c log_parameter_max_length=-1 -c log_connections=on\" start" >&2 ||
        { cat "$dir/server.log" >&2; exit 1; }
    as_owner "'$bin/psql' -h '$dir' -p $port -U postgres -d postgres -X -q -c 'CREATE EXTENSION IF NOT EXISTS vector'" >&2
    echo "reference_postgres: PostgreSQL 16 + pgvector on 127.0.0.1:$port, data and log in $dir" >&2
    cat <<EOF
export PGHOST=127.0.0.1
export PGPORT=$port
export PGUSER=postgres
export PGPASSWORD=$password
export PGDATABASE=postgres
export FV_TARGET=postgres
export REFERENCE_PG_DIR=$dir
EOF
}

stop() {
    local dir="${REFERENCE_PG_DIR:-}"
    if [ -z "$dir" ] || ! [ -f "$dir/data/postmaster.pid" ]; then
        echo "reference_postgres: REFERENCE_PG_DIR names no running cluster; nothing to stop" >&2
        return 0
    fi
    as_owner "'$(bin_dir)/pg_ctl' -D '$dir/data' -m fast -w stop" >&2
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
    echo "usage: eval \"\$($0 start)\"  ...  $0 stop" >&2
    exit 2
    ;;
esac
