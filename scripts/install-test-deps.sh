#!/usr/bin/env bash
# Installs everything the test suite needs on a Debian machine: etcd, Java 17 (for the Spark
# source), and the Python package with its dev extra (scripts/install.sh --dev). Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
# The security tests and docs make keys and hashes with openssl and call the admin API with curl.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
# Apache's htpasswd makes the basic provider's test hashes independently of our code.
command -v htpasswd >/dev/null 2>&1 || need_apt+=(apache2-utils)
# deploy/k8s is rendered with `kubectl kustomize` (Debian's kubectl: package kubernetes-client,
# kubectl 1.20 with kustomize v2.0.3 on Debian 12; the manifests keep to what that reads, and a
# current kubectl renders them the same). A kubectl already here is used as it is, if it has
# `kustomize` (1.14 or later).
if ! command -v kubectl >/dev/null 2>&1; then
  need_apt+=(kubernetes-client)
elif ! kubectl kustomize --help >/dev/null 2>&1; then
  echo "warning: $(command -v kubectl) has no 'kustomize' (kubectl 1.14 or later has);" \
    "the deploy/k8s tests will fail with it" >&2
fi
# The quick start is walked in a fresh virtual environment (tests/integration/test_quickstart.py):
# Debian's python3 makes one with pip only with python3-venv.
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "installing Debian packages: ${need_apt[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

bash scripts/install.sh --dev
