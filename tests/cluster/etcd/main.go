// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain), at the version the pinned
// Kubernetes release uses. Built rather than taken from Debian (3.4.23): the API server's watch
// cache and watch-list streams need etcd's watch progress requests (etcd >= 3.4.31 or 3.5.13).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
