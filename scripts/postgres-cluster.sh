#!/usr/bin/env bash
# A throwaway PostgreSQL server on this machine, for trainyard's PostgreSQL store tests and for
# trying the team server (TRAINYARD_DATABASE_URL) by hand.
#
#   scripts/postgres-cluster.sh start [DIR]   # initdb (first time) + start; prints the admin URL
#   scripts/postgres-cluster.sh url [DIR]     # the admin URL (exit 1 when it is not up)
#   scripts/postgres-cluster.sh stop [DIR]    # stop the server and remove DIR
#
# DIR (default $TRAINYARD_PG_DIR, else /tmp/trainyard-postgres) holds the data folder, the log
# and the server's Unix socket. The server listens on that socket only (no TCP port), so any
# number of these run side by side on one machine; local connections are trusted (a test
# server: never put data you care about in it). The URL printed is SQLAlchemy's, for the
# psycopg driver (`pip install 'trainyard[postgres]'`):
#   postgresql+psycopg://postgres@/postgres?host=DIR
# Each test makes a database of its own in it (tests/support/pg_support.py).
#
# Needs Debian's `postgresql` package (binaries under /usr/lib/postgresql/N/bin); as root it
# installs it when missing, and runs the server as the `postgres` user (PostgreSQL refuses
# to run as root).
set -euo pipefail

DIR="${2:-${TRAINYARD_PG_DIR:-/tmp/trainyard-postgres}}"
DATA="$DIR/data"

say() { printf 'postgres-cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

bindir() {
  local dir
  dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  if [ -z "$dir" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing postgresql (Debian)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  fi
  [ -n "$dir" ] || die "no PostgreSQL server binaries (apt-get install postgresql)"
  echo "$dir"
}

# as_owner CMD...: run CMD as the data folder's owner (postgres when we are root).
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

url() { echo "postgresql+psycopg://postgres@/postgres?host=$DIR"; }

start() {
  local bin
  bin="$(bindir)"
  mkdir -p "$DIR"
  chmod 0755 "$DIR"
  [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    as_owner "$bin/initdb" -D "$DATA" -U postgres --auth=trust --no-sync -E UTF8 >"$DIR/initdb.log" 2>&1 \
      || die "initdb failed: $(tail -n 5 "$DIR/initdb.log")"
  fi
  if ! as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    as_owner "$bin/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 \
      -o "-c listen_addresses='' -c unix_socket_directories='$DIR' -c fsync=off -c max_connections=200" \
      start >/dev/null || die "the server did not start: $(tail -n 5 "$DIR/server.log")"
  fi
  url
}

stop() {
  local bin
  bin="$(bindir)"
  if [ -f "$DATA/PG_VERSION" ]; then
    as_owner "$bin/pg_ctl" -D "$DATA" -m immediate -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) as_owner "$(bindir)/pg_ctl" -D "$DATA" status >/dev/null 2>&1 || die "not up in $DIR"; url ;;
  *) die "usage: $0 start|url|stop [DIR]" ;;
esac
