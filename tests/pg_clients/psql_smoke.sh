#!/usr/bin/env bash
# psql against `fragvec serve` (or PostgreSQL 16 + pgvector as the reference).
#
# psql's backslash commands are catalog queries (pg_class, pg_namespace, pg_attribute, ...; their
# texts are in CAPTURED.md): \dt, \dt+, \d, \d TABLE, \di and \l must answer with the table,
# its columns, its vector index and the database. Then a KNN query, and errors: with VERBOSITY verbose the SQLSTATE
# appears in the message, and with ON_ERROR_STOP psql exits 3.
#
# Env: PGHOST PGPORT PGUSER PGPASSWORD PGDATABASE, FRAGVEC_PSQL (default: psql on PATH),
# FV_TARGET=fragvec|postgres, FV_PREFIX.
set -euo pipefail

psql_bin="${FRAGVEC_PSQL:-psql}"
target="${FV_TARGET:-fragvec}"
prefix="${FV_PREFIX:-t_$$}"
t="${prefix}_pitems"
db="${PGDATABASE:-${PGUSER:-$(id -un)}}"
step=""
out="$(mktemp)"
cleanup() {
    rm -f "$out" "$out.sql"
    # The table goes whether the run passed or not (FV_KEEP=1 keeps it for a look).
    if [ -z "${FV_KEEP:-}" ]; then
        "$psql_bin" -X -q -c "DROP TABLE IF EXISTS $t" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT

fail() {
    echo "psql_smoke: FAILED against $target at step '$step': $*" >&2
    if [ -s "$out" ]; then
        echo "--- psql's output:" >&2
        cat "$out" >&2
        echo "---" >&2
    fi
    exit 1
}

# psql without ~/.psqlrc, stopping at the first error; the output goes to $out as well.
q() {
    "$psql_bin" -X -v ON_ERROR_STOP=1 "$@" >"$out" 2>&1 || fail "psql exited $? for: $*"
    if [ -n "${FV_VERBOSE:-}" ]; then cat "$out" >&2; fi
}

# The output must hold a line matching this (grep -E) pattern.
has() {
    grep -Eq -- "$1" "$out" || fail "no line matches /$1/"
}

step="connect and setup"
if [ "$target" = postgres ]; then
    q -c "CREATE EXTENSION IF NOT EXISTS vector"
fi
q -c "DROP TABLE IF EXISTS $t"
q -c "CREATE TABLE $t (id BIGINT, category INT, emb VECTOR(3))"
q -c "INSERT INTO $t VALUES (1, 1, '[1,0,0]'), (2, 1, '[0,2,0]'), (3, 2, '[0,0,4]'), (4, 2, '[1,1,1]'), (5, 1, '[4,5,6]')"
has '^INSERT 0 5$'

step="\\dt lists the table"
q -c '\dt'
has "^ *[a-z_]+ *\\| *$t *\\| *table *\\|"

step="\\dt+ lists the table with its size"
q -c '\dt+'
has "^ *[a-z_]+ *\\| *$t *\\| *table *\\|"

step="\\dt with a pattern"
q -c "\\dt $t"
has "\\| *$t *\\| *table"

step="\\d lists the table"
q -c '\d'
has "\\| *$t *\\| *table *\\|"

step="\\d TABLE describes its columns"
q -c "\\d $t"
has "^Table \"[a-z_]+\\.$t\"|^ *Table \"[a-z_]+\\.$t\""
has '^ *id *\| *bigint *\|'
has '^ *category *\| *integer *\|'
has '^ *emb *\| *vector\(3\) *\|'

step="\\d TABLE lists its vector index"
if [ "$target" = postgres ]; then
    q -c "CREATE INDEX ${t}_idx ON $t USING ivfflat (emb vector_l2_ops) WITH (lists = 1)"
    q -c "\\d $t"
    has "^ *\"${t}_idx\" ivfflat \\(emb vector_l2_ops\\)"
else
    q -c "CREATE VECTOR INDEX ${t}_idx ON $t (emb) USING IVF_FLAT WITH (num_partitions = 1)"
    q -c "\\d $t"
    has "^Indexes:"
    has "^ *\"${t}_idx\" ivf_flat \\(emb\\) WITH \\(num_partitions=1, metric=l2\\)"
    q -c "\\di"
    has "\\| *${t}_idx *\\| *index *\\|"
fi

step="\\l lists the database"
q -c '\l'
has "^ *$db *\\|"

step="KNN query, unaligned output"
q -At -c "SELECT id FROM $t ORDER BY emb <-> '[1,2,3]' LIMIT 2"
[ "$(tr '\n' ' ' <"$out")" = "4 3 " ] || fail "KNN ids: want '4 3'"

step="KNN with distances, aligned output"
q -c "SELECT id, emb <-> '[1,2,3]' AS d FROM $t ORDER BY d LIMIT 3"
has '^ *id *\| *d *$'
has '^ *4 *\| *2\.236'
has '^\(3 rows\)$'

step="vectors come back in pgvector's text form"
q -At -c "SELECT emb FROM $t WHERE id = 5"
has '^\[4,5,6\]$'

step="a script with several statements, \\set variables and a \\gset"
cat >"$out.sql" <<EOF
\\set qv '''[0,0,3]'''
SELECT count(*) AS n FROM $t \\gset
\\echo rows :n
SELECT id FROM $t ORDER BY emb <-> :qv LIMIT 1;
DELETE FROM $t WHERE id = 5;
SELECT count(*) FROM $t;
EOF
q -At -f "$out.sql"
rm -f "$out.sql"
has '^rows 5$'
has '^3$'
has '^DELETE 1$'
has '^4$'

step="an error shows its SQLSTATE with VERBOSITY verbose"
set +e
"$psql_bin" -X -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "SELECT * FROM ${prefix}_no_such_table" >"$out" 2>&1
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a missing table did not fail"
has '^ERROR: +42P01: '

step="ON_ERROR_STOP stops a script at its error (exit 3) and the rest does not run"
printf 'SELECT 1;\nSELEC 2;\nSELECT 424242;\n' >"$out.sql"
set +e
"$psql_bin" -X -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -At -f "$out.sql" >"$out" 2>&1
rc=$?
set -e
rm -f "$out.sql"
[ "$rc" -eq 3 ] || fail "psql exited $rc, want 3"
has 'ERROR: +42601: '
if grep -q 424242 "$out"; then fail "the statement after the error ran"; fi

step="\\set VERBOSITY verbose inside a session"
set +e
printf '\\set VERBOSITY verbose\nSELECT nope FROM %s;\n' "$t" | "$psql_bin" -X >"$out" 2>&1
set -e
has '^ERROR: +42703: '

step="cleanup"
q -c "DROP TABLE $t"
echo "psql_smoke: ok against $target ($("$psql_bin" --version))" >&2
