#!/usr/bin/env bash
# Records what psql, psycopg (+ pgvector) and asyncpg send to a server, message by message.
#
#   tests/pg_clients/capture.sh OUT.log     # PG* env names the real server (PGHOST must be TCP)
#
# Starts pgwire_tap.py on a free port of 127.0.0.1 in front of $PGHOST:$PGPORT, runs psql's
# startup and backslash commands (\dt, \dt+, \d, \d TABLE, \l) and capture_clients.py through
# it, each section headed by a '=== name' line, and writes the decoded messages to OUT.log.
# CAPTURED.md was made this way against PostgreSQL 16 + pgvector; run it against `fragvec serve`
# to compare answers. Needs FRAGVEC_PG_PYTHON (.ci/pg-clients setup) and FRAGVEC_PSQL.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: capture.sh OUT.log}"
py="${FRAGVEC_PG_PYTHON:?run: eval \"\$(.ci/pg-clients setup)\"}"
psql_bin="${FRAGVEC_PSQL:-psql}"
target="${FV_TARGET:-fragvec}"
t="${FV_PREFIX:-cap$$}_items"

: >"$out"
port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$py" "$here/pgwire_tap.py" --listen "127.0.0.1:$port" --upstream "${PGHOST:-127.0.0.1}:${PGPORT:-5432}" \
    --log "$out" --max-value 400 </dev/null >/dev/null 2>&1 &
tap=$!
trap 'kill $tap 2>/dev/null || true' EXIT
for _ in $(seq 50); do
    grep -q listening "$out" 2>/dev/null && break
    sleep 0.1
done

section() {
    sleep 0.3
    echo "=== $*" >>"$out"
}

export PGHOST=127.0.0.1 PGPORT="$port"
p() { "$psql_bin" -X "$@" >/dev/null 2>&1 || echo "capture: psql $* failed" >&2; }

section "psql $("$psql_bin" --version | awk '{print $3}'): setup (not part of the contract)"
if [ "$target" = postgres ]; then p -c "CREATE EXTENSION IF NOT EXISTS vector"; fi
p -c "DROP TABLE IF EXISTS $t"
p -c "CREATE TABLE $t (id BIGINT, category INT, emb VECTOR(3))"
p -c "INSERT INTO $t VALUES (1, 1, '[1,2,3]'), (2, 2, '[4,5,6]')"
section "psql: startup, then SELECT 1 (psql -c)"
p -c "SELECT 1"
section "psql: interactive startup (stdin not a terminal), then \\q"
echo '\q' | "$psql_bin" -X >/dev/null 2>&1 || true
section "psql: \\dt"
p -c '\dt'
section "psql: \\dt+"
p -c '\dt+'
section "psql: \\d"
p -c '\d'
section "psql: \\d $t"
p -c "\\d $t"
section "psql: \\d+ $t"
p -c "\\d+ $t"
section "psql: setup: an index on $t (not part of the contract)"
if [ "$target" = postgres ]; then
    p -c "CREATE INDEX ${t}_idx ON $t USING ivfflat (emb vector_l2_ops) WITH (lists = 1)"
else
    p -c "CREATE VECTOR INDEX ${t}_idx ON $t (emb) USING IVF_FLAT WITH (num_partitions = 1)"
fi
section "psql: \\d $t (a table with an index: relhasindex is true)"
p -c "\\d $t"
section "psql: \\d no_such_table"
p -c '\d no_such_table'
section "psql: \\l"
p -c '\l'
section "psql: \\dn"
p -c '\dn'
section "psql: \\df l2_distance"
p -c '\df l2_distance'
section "psql: \\dT vector"
p -c '\dT vector'
section "psql: a KNN query"
p -c "SELECT id FROM $t ORDER BY emb <-> '[1,2,3]' LIMIT 2"
section "psql: an error with VERBOSITY verbose"
p -v VERBOSITY=verbose -c "SELECT * FROM no_such_table"
section "psql: cleanup (not part of the contract)"
p -c "DROP TABLE $t"

FV_TARGET="$target" "$py" "$here/capture_clients.py" "$out"
sleep 0.3
echo "capture: $(grep -c '' "$out") lines in $out" >&2
