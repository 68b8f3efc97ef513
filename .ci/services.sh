#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis servers the tests use are up on loopback.
# Starts them when installed but stopped; installs them with apt on CI if missing.
set -euo pipefail

PGHOST_ADDR=${PGHOST_ADDR:-127.0.0.1}
PGPORT_NUM=${PGPORT_NUM:-5432}
REDIS_PORT_NUM=${REDIS_PORT_NUM:-6379}

have() { command -v "$1" >/dev/null 2>&1; }

apt_install() {
  if [ "${CI:-}" = "true" ] && [ "$(id -u)" = "0" ] && have apt-get; then
    echo "services: installing $* with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "services: $* missing; install it (Debian: apt-get install $*)" >&2
    return 1
  fi
}

pg_up() { pg_isready -q -h "$PGHOST_ADDR" -p "$PGPORT_NUM" 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT_NUM" ping 2>/dev/null | grep -q PONG; }

if ! have pg_isready || ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
  apt_install postgresql postgresql-client
fi
if ! pg_up; then
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  echo "services: starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
pg_up || { echo "services: PostgreSQL is not answering on $PGHOST_ADDR:$PGPORT_NUM" >&2; exit 1; }

if ! have redis-server || ! have redis-cli; then
  apt_install redis-server redis-tools
fi
if ! redis_up; then
  echo "services: starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT_NUM" --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis_up && break; sleep 1; done
fi
redis_up || { echo "services: Redis is not answering on 127.0.0.1:$REDIS_PORT_NUM" >&2; exit 1; }
echo "services: PostgreSQL and Redis are up"

# The browser tests drive Debian's Chromium (Playwright cannot download its own here).
if [ ! -x /usr/bin/chromium ]; then
  apt_install chromium
fi

# The metrics tests scrape GET /metrics with Debian's Prometheus.
if ! command -v prometheus >/dev/null 2>&1; then
  apt_install prometheus
fi
