#!/usr/bin/env bash
# Builds the real control plane (kube-apiserver, kube-controller-manager, kubectl, etcd) from the
# pinned Go modules beside this script into a cache keyed by version, outside the checkout so that
# every clone on the machine shares it (LORAFLOW_CACHE, default ~/.cache/loraflow). Prints the
# folder; a second run with the binaries present does nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kube_version=v1.37.2
etcd_version=v3.7.3
out="${LORAFLOW_CACHE:-$HOME/.cache/loraflow}/kubebin/kube-$kube_version-etcd-$etcd_version"
programs=(kube-apiserver kube-controller-manager kubectl etcd)

built() {
  for p in "${programs[@]}"; do [ -x "$out/$p" ] || return 1; done
}
if built; then echo "$out"; exit 0; fi
# One build at a time on the machine (make and a test session may both ask): the others wait for it.
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if built; then echo "$out"; exit 0; fi

# The pinned go.mod and go.sum are the whole truth: nothing is resolved anew, nothing fetched but them.
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
mkdir -p "$out.partial"
echo "Building the Kubernetes control plane $kube_version and etcd $etcd_version into $out" >&2
echo "(once per machine: about 15-25 minutes on 2 cores and a few GB of Go build cache)" >&2
start=$(date +%s)

version=k8s.io/component-base/version
ldflags="-s -w -X $version.gitVersion=$kube_version -X $version.gitMajor=1 -X $version.gitMinor=37"
ldflags+=" -X $version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"
(
  cd "$here/gomod/kube"
  for p in kube-apiserver kube-controller-manager kubectl; do
    [ -x "$out.partial/$p" ] && continue
    go build -trimpath -pgo=off -ldflags "$ldflags" -o "$out.partial/$p" "k8s.io/kubernetes/cmd/$p"
  done
)
(
  cd "$here/gomod/etcd"
  [ -x "$out.partial/etcd" ] || go build -trimpath -ldflags "-s -w" -o "$out.partial/etcd" go.etcd.io/etcd/server/v3
)
rm -rf "$out" && mv "$out.partial" "$out"
echo "Built in $(( $(date +%s) - start )) s" >&2
echo "$out"
