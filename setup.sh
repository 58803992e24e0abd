#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine: clang (tinygrad's CPU backend), a venv in .venv, this package with its test extras. Each step says
# what it does on a line of its own, and pip's install a line per package it collects (the whole takes a minute or more the first time).
set -euo pipefail
cd "$(dirname "$0")"
step() { echo "setup: $*"; }
if command -v clang >/dev/null; then step "clang: $(command -v clang) (tinygrad's CPU backend compiles with it)"
else
  step "installing clang with apt-get (tinygrad's CPU backend compiles with it) ..."
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq clang >/dev/null
fi
if [ -x .venv/bin/python ]; then step ".venv: there already, reused"
else
  step "making the virtual environment .venv ..."
  python3 -m venv .venv
fi
step "upgrading pip in .venv ..."
.venv/bin/pip install -q --upgrade pip
step "installing this package and its test extras into .venv from PyPI (tinygrad, onnx, onnxruntime, msgq, ray, ...) ..."
# pip's lines that say what it fetches and installs, one a package (sed, unlike grep, succeeds when there is none)
.venv/bin/pip install -e '.[test]' | sed -un 's/^\(Collecting\|Installing collected packages\|Successfully installed\)/setup:   pip: \1/p'
step "done: .venv ready (.venv/bin/python -m sunnypilot.modeld_v2.tools.demo runs the demo)"
