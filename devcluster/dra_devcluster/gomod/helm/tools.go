// Pins the helm CLI the chart tests use (helm lint, template, install, upgrade, uninstall); keeps
// its packages in go.sum.
//go:build tools

package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
