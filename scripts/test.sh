#!/usr/bin/env bash
# Installs what the tests need (etcd, Java, Python deps; see install-test-deps.sh) and runs the
# whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
python3 -m ruff check .
python3 -m ruff format --check .
exec python3 -m pytest -q -p no:cacheprovider "$@"
