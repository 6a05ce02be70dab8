// Package deploy holds the tests of what deploys ratelimitd: the Helm chart
// in helm/ratelimitd, rendered with helm and checked against the Kubernetes
// schemas by kubectl-validate, and the Grafana dashboard in
// grafana/ratelimitd.json, whose every metric the service must expose.
//
// The package has tests only. helm and kubectl-validate must be on PATH
// (.ci/run installs the pinned versions); without them the chart's tests
// skip, and fail under CI=true. docs/deploy.md says why these tools.
package deploy
