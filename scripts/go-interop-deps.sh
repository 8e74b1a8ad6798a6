#!/usr/bin/env bash
# The Go toolchain and Debian's fluent-logger-golang sources for the Go interop
# test (tests/interop/test_fluent_logger_golang.py, which also runs this).
#
#   scripts/go-interop-deps.sh     install what is missing, quietly
#
# Idempotent: apt-get runs only when a package is not installed, and then
# "apt-get update" once before the install. The sender is built offline in
# GOPATH mode against /usr/share/gocode (Debian ships the sources without a
# go.mod), so nothing is fetched at build time.
#
# Exit: 0 installed (or already there); 1 could not install (not root, apt
# failed, files missing after the install); 2 the Debian archive is not
# reachable (or this system has no apt-get), printed on stderr: callers may
# skip on 2 only.
set -euo pipefail

PACKAGES=(golang-go golang-github-fluent-fluent-logger-golang-dev)
SOURCE=/usr/share/gocode/src/github.com/fluent/fluent-logger-golang/fluent/fluent.go

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    for package in "${PACKAGES[@]}"; do
        installed "$package" || missing+=("$package")
    done
else
    missing=("${PACKAGES[@]}")
fi

if [[ ${#missing[@]} -gt 0 ]]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "go-interop-deps: apt-get not found: cannot install ${missing[*]}" >&2
        exit 2
    fi
    if [[ $(id -u) -ne 0 ]]; then
        echo "go-interop-deps: ${missing[*]} not installed and installing needs root" >&2
        exit 1
    fi
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    export DEBIAN_FRONTEND=noninteractive
    apt_opts=(-q -o DPkg::Lock::Timeout=300)
    echo "go-interop-deps: installing ${missing[*]} from the Debian packages" >&2
    # "apt-get update" may exit 0 with warnings when a mirror is down: judge
    # reachability from its output, and only when the install itself fails.
    update_rc=0
    apt-get "${apt_opts[@]}" update >"$log" 2>&1 || update_rc=$?
    if ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
        tail -n 20 "$log" >&2
        if grep -Eqi 'Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect|Network is unreachable|Connection (refused|timed out)' "$log"; then
            echo "go-interop-deps: the Debian archive is not reachable (apt-get update exit $update_rc)" >&2
            exit 2
        fi
        echo "go-interop-deps: apt-get install ${missing[*]} failed" >&2
        exit 1
    fi
fi

command -v go >/dev/null 2>&1 || { echo "go-interop-deps: no go on PATH after the install" >&2; exit 1; }
[[ -f $SOURCE ]] || { echo "go-interop-deps: $SOURCE missing after the install" >&2; exit 1; }
