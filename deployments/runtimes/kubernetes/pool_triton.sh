#!/bin/sh
# The triton container's command in a Kubernetes pool's pod (pool_manifests.py): Triton with a backend directory
# whose python backend starts every model's stub through Modelport's wrapper (pool_stub.py), which confines the
# model's process to its own memory limit before any model code runs.
#
# Usage: sh pool_triton.sh [tritonserver arguments...]
# The image's backends are linked, not copied: the real stub finds its libraries through an RPATH relative to its
# own location. Only the stub entry of python/ is replaced, by a script that runs the wrapper. Any failure stops the
# container before Triton starts (set -e): a pool never serves its models unconfined.
set -eu

BACKENDS="${MODELPORT_TRITON_BACKENDS:-/opt/tritonserver/backends}"
OUT="${MODELPORT_BACKEND_DIR:-/run/modelport-backends}"
WRAPPER="${MODELPORT_STUB_WRAPPER:-/etc/modelport/agent/pool_stub.py}"
STUB=triton_python_backend_stub

test -x "$BACKENDS/python/$STUB" || { echo "modelport pool: no python backend stub in $BACKENDS/python" >&2; exit 1; }
test -f "$WRAPPER" || { echo "modelport pool: no stub wrapper at $WRAPPER" >&2; exit 1; }
rm -rf "$OUT/python"
mkdir -p "$OUT/python"
for backend in "$BACKENDS"/*; do
    name=$(basename "$backend")
    if [ "$name" != python ]; then
        ln -sfn "$backend" "$OUT/$name"
    fi
done
for file in "$BACKENDS"/python/*; do
    if [ "$(basename "$file")" != "$STUB" ]; then
        ln -sfn "$file" "$OUT/python/"
    fi
done
# python3 -I: no user site, no PYTHON* variables, no current directory on the path.
printf '#!/bin/sh\nexec python3 -I %s %s "$@"\n' "$WRAPPER" "$BACKENDS/python/$STUB" > "$OUT/python/$STUB"
chmod 0555 "$OUT/python/$STUB"
exec tritonserver --backend-directory="$OUT" "$@"
