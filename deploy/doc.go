// Package deploy holds the tests of what deploys ratelimitd: the Helm chart
// in helm/ratelimitd, rendered with helm and checked against the Kubernetes
// schemas by kubectl-validate, the Grafana dashboard in
// grafana/ratelimitd.json, whose every metric the service must expose, and
// docs/gateways.md, whose every configuration must be an excerpt of the
// gateways' files in gateways/ (which the e2e tests run).
//
// The package has tests only. helm and kubectl-validate must be on PATH
// (.ci/run installs the pinned versions); without them the chart's tests
// skip, and fail under CI=true. docs/deploy.md says why these tools.
package deploy
