// Pins the node runtime the local cluster builds (containerd, its runc shim, ctr); keeps their
// packages in go.sum.
//go:build tools

package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
