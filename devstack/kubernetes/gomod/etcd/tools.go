//go:build tools

// The program this module builds; the import keeps it in go.mod and go.sum.
package etcdbin

import _ "go.etcd.io/etcd/server/v3"
