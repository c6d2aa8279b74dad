#!/usr/bin/env bash
# Installs what the tests need (etcd, Java, Python deps; see install-test-deps.sh) and runs the
# whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-test-deps.sh
python3 -m ruff check .
python3 -m ruff format --check .
# The exit status is pytest's verdict: tests/support/client_guard.py fails any test that leaves an
# official pulsar.Client open and ends the process with os._exit(status) after the summary, so
# native threads still alive at exit cannot turn a green run into an abort (134).
# Two workers (pytest-xdist), each running whole modules (--dist loadfile) so a module's shared
# standalone, cluster or Spark session is started once; most of a test's time is spent waiting
# on real processes, so two workers on two cores roughly halve the run. Each worker takes ports
# from its own range (tests/support/etcd.free_port). MAGNETAR_TEST_WORKERS=0 runs in one process.
exec python3 -m pytest -q -p no:cacheprovider -n "${MAGNETAR_TEST_WORKERS:-2}" --dist loadfile "$@"
