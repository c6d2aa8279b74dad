#!/usr/bin/env bash
# Regenerates common/proto/*_pb2*.py from the .proto files. The generated modules are committed
# so that installing Magnetar needs no protoc; run this after editing a .proto file.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# protoc derives import paths from the directory layout, so mirror the import namespace.
mkdir -p "$work/src/magnetar/common/proto" "$work/out"
cp common/proto/*.proto "$work/src/magnetar/common/proto/"
python3 -m grpc_tools.protoc -I "$work/src" --python_out="$work/out" --pyi_out="$work/out" \
  "$work"/src/magnetar/common/proto/*.proto
# gRPC stubs only for the files that define a service.
for proto in "$work"/src/magnetar/common/proto/*.proto; do
  if grep -q '^service ' "$proto"; then
    python3 -m grpc_tools.protoc -I "$work/src" --grpc_python_out="$work/out" "$proto"
  fi
done
cp "$work"/out/magnetar/common/proto/*.py "$work"/out/magnetar/common/proto/*.pyi common/proto/
ls common/proto/
