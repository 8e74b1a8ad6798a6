#!/usr/bin/env bash
# The Go toolchain and Debian's fluent-logger-golang sources for the Go interop
# test (tests/interop/test_fluent_logger_golang.py, which also runs this).
#
#   scripts/go-interop-deps.sh     install what is missing, quietly
#
# Idempotent: apt-get runs only when a package is not installed, and then
# "apt-get update" once before the install (scripts/apt-install.sh). The
# sender is built offline in GOPATH mode against /usr/share/gocode (Debian
# ships the sources without a go.mod), so nothing is fetched at build time.
#
# Exit: 0 installed (or already there); 1 could not install (not root, apt
# failed, files missing after the install); 2 the Debian archive is not
# reachable (or this system has no apt-get), printed on stderr: callers may
# skip on 2 only.
set -euo pipefail

SOURCE=/usr/share/gocode/src/github.com/fluent/fluent-logger-golang/fluent/fluent.go

bash "$(dirname "$0")/apt-install.sh" go-interop-deps golang-go golang-github-fluent-fluent-logger-golang-dev

command -v go >/dev/null 2>&1 || { echo "go-interop-deps: no go on PATH after the install" >&2; exit 1; }
[[ -f $SOURCE ]] || { echo "go-interop-deps: $SOURCE missing after the install" >&2; exit 1; }
