#!/usr/bin/env bash
# The kind backend: where Docker and kind exist (a laptop, GitHub Actions).
#
#   e2e/kind.sh            create a kind cluster, build and load the image, run the e2e suite
#   KEEP=1 e2e/kind.sh     ... and leave the cluster up afterwards
#
# Each test helm-installs the chart into its own namespace (e2e/conftest.py), so this script
# only provides the cluster and the image. kubectl and helm come from PATH, or from the
# pinned wheel (tools/k8s_tools.py) when absent.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-tiergate-e2e}"
# The chart's default image is tiergate:<appVersion>; the suite installs it with defaults.
IMAGE="tiergate:$(awk '$1 == "appVersion:" {gsub(/"/, "", $2); print $2}' charts/tiergate/Chart.yaml)"

command -v docker >/dev/null || { echo "kind.sh: docker is needed (use 'make e2e' for the local backend)" >&2; exit 2; }
command -v kind >/dev/null || { echo "kind.sh: kind is needed: https://kind.sigs.k8s.io" >&2; exit 2; }
make --no-print-directory install
if ! command -v helm >/dev/null || ! command -v kubectl >/dev/null; then
    PATH="$(.venv/bin/python -P tools/k8s_tools.py --print-dir):$PATH"
fi
# The suite calls <bin>/kubectl and <bin>/helm: one folder holding both, wherever they live.
work="$(mktemp -d)"
mkdir -p "$work/bin"
ln -s "$(command -v kubectl)" "$work/bin/kubectl"
ln -s "$(command -v helm)" "$work/bin/helm"
kubeconfig="$work/kubeconfig"

created=0
cleanup() {
    if [[ $created == 1 && "${KEEP:-}" != 1 ]]; then
        kind delete cluster --name "$CLUSTER" --kubeconfig "$kubeconfig" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --kubeconfig "$kubeconfig" --wait 2m
    created=1  # only a cluster this run created is deleted at the end
fi
kind export kubeconfig --name "$CLUSTER" --kubeconfig "$kubeconfig"

docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

KUBECONFIG="$kubeconfig" TIERGATE_E2E_BACKEND=kind TIERGATE_E2E_BIN="$work/bin" \
    .venv/bin/python -P -m pytest -q -p no:cacheprovider e2e "$@"
