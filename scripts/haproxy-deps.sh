#!/usr/bin/env bash
# Debian's HAProxy for the PROXY protocol tests (tests/interop/haproxy.py runs
# this; HAProxy sits in front of the backends in TCP mode with send-proxy-v2).
#
#   scripts/haproxy-deps.sh     install haproxy when missing, quietly; print its version
#
# Idempotent: apt-get runs only when the package is not installed, and then
# "apt-get update" once before the install (scripts/apt-install.sh, which
# also keeps the package from starting its own service). Only the binary is
# used: the tests start their own haproxy in the foreground with their own
# configuration.
#
# Exit: 0 installed (or already there; the version line on stdout, and
# "haproxy-deps: installed haproxy" on stderr when it was installed now);
# 1 could not install (not root, apt failed, no haproxy after the install);
# 2 the Debian archive is not reachable (or this system has no apt-get),
# printed on stderr: callers may skip on 2 only.
set -euo pipefail

bash "$(dirname "$0")/apt-install.sh" haproxy-deps haproxy

bin=$(command -v haproxy || echo /usr/sbin/haproxy)
[[ -x $bin ]] || { echo "haproxy-deps: no haproxy binary after the install" >&2; exit 1; }
# "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/": the first line.
# (Read whole, not piped to head: with pipefail an early-closed pipe fails the script.)
version=$("$bin" -v 2>/dev/null) || { echo "haproxy-deps: $bin -v failed" >&2; exit 1; }
echo "${version%%$'\n'*}"
