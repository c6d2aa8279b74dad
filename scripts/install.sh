#!/usr/bin/env bash
# Installs Magnetar for python3 (with --dev: editable, plus what the tests need from PyPI).
# Works on a fresh Debian machine: installs pip if it is missing, and installs beside Debian's
# own packages when python3 is marked externally managed (PEP 668).
set -euo pipefail
cd "$(dirname "$0")/.."

target="."
if [ "${1:-}" = "--dev" ]; then
  target=".[dev]"
fi
as_root=""
[ "$(id -u)" -eq 0 ] || as_root="sudo"

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "installing pip (Debian package python3-pip)"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq python3-pip >/dev/null
fi

flags=(-q --disable-pip-version-check)
if python3 - <<'PY'
import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)
PY
then
  flags+=(--break-system-packages)
fi
if [ "$target" = ".[dev]" ]; then
  flags+=(-e)
fi
python3 -m pip install "${flags[@]}" "$target"
