#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine: clang (tinygrad's CPU backend), a venv in .venv, this package with its test extras.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v clang >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq clang >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q -e '.[test]'
echo "setup done: .venv ready"
