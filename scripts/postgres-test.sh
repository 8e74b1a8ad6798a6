#!/usr/bin/env bash
# A throw-away PostgreSQL server for the auth tests (tests/auth/conftest.py runs it).
#
#   scripts/postgres-test.sh start DIR   install PostgreSQL if missing (Debian packages),
#                                        create a cluster in DIR, start it on a free
#                                        127.0.0.1 port, create a password user and a
#                                        database; print the SQLAlchemy URL on stdout
#   scripts/postgres-test.sh stop DIR    stop that server (DIR is left for the caller)
#
# Idempotent: "start" on a DIR whose server runs prints the same URL again;
# apt-get runs only when no PostgreSQL binaries are found. The user may create
# databases (the tests make one per test). The server is tuned for tests
# (fsync off): never point anything real at it.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
action=$1
base=$(realpath -m "$2")
data=$base/data
sock=$base/sock

pg_bindir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n $dir && -x $dir/initdb && -x $dir/pg_ctl ]]; then
        echo "$dir"
    fi
}

# Run a PostgreSQL program as the cluster owner: "postgres" when we are root
# (the server refuses to run as root), ourselves otherwise.
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

install_postgres() {
    if [[ $(id -u) -ne 0 ]]; then
        echo "postgres-test: PostgreSQL is not installed and installing it needs root" >&2
        exit 1
    fi
    echo "postgres-test: installing PostgreSQL from the Debian packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
    local bin port password url
    if [[ -f $base/url && -f $data/postmaster.pid ]] && bin=$(pg_bindir) && [[ -n $bin ]] \
        && as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
        cat "$base/url"
        return
    fi
    bin=$(pg_bindir)
    if [[ -z $bin ]]; then
        install_postgres
        bin=$(pg_bindir)
        [[ -n $bin ]] || { echo "postgres-test: no initdb after the install" >&2; exit 1; }
    fi
    if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
        useradd --system --no-create-home --shell /usr/sbin/nologin postgres
    fi

    mkdir -p "$base"
    chmod 0755 "$base"
    rm -rf "$data" "$sock"
    mkdir -p "$data" "$sock"
    if [[ $(id -u) -eq 0 ]]; then
        chown postgres: "$data" "$sock"
    fi
    chmod 0700 "$data"

    as_owner "$bin/initdb" -D "$data" -U postgres -E UTF8 --no-locale \
        --auth-local=trust --auth-host=scram-sha-256 >"$base/initdb.log" 2>&1 \
        || { cat "$base/initdb.log" >&2; exit 1; }

    local started=0
    for _ in 1 2 3 4 5; do
        port=$(free_port)
        if as_owner "$bin/pg_ctl" -D "$data" -l "$sock/server.log" -w -t 60 start \
            -o "-p $port -k $sock -c listen_addresses=127.0.0.1 -c fsync=off \
                -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
            >/dev/null 2>&1; then
            started=1
            break
        fi
    done
    if [[ $started -ne 1 ]]; then
        echo "postgres-test: the server did not start:" >&2
        cat "$sock/server.log" >&2 || true
        exit 1
    fi

    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    as_owner "$bin/psql" -h "$sock" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
        -c "CREATE ROLE appliance LOGIN CREATEDB PASSWORD '$password'" \
        -c "CREATE DATABASE appliance_test OWNER appliance" >/dev/null
    url="postgresql+psycopg://appliance:$password@127.0.0.1:$port/appliance_test"
    (umask 077 && echo "$url" >"$base/url")
    echo "$url"
}

stop() {
    local bin
    bin=$(pg_bindir)
    if [[ -n $bin && -f $data/postmaster.pid ]]; then
        as_owner "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
    fi
}

case $action in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
