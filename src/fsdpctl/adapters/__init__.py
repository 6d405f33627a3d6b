"""One adapter per outside system (STYLE.md): AWS (boto3), the Kubernetes API, eksctl, terraform,
docker, git, etcd, the Hugging Face Hub, Prometheus, HTTP downloads, network namespaces and a
container's log writer. Only this package starts processes (`fsdpctl.adapters.shell`) or speaks to
an SDK; its callers get typed answers and errors naming the system, never the SDK's own.

Imports: fsdpctl's cross-cutting modules (errors, files, outside, redact) and the pure log-line
format `fsdpctl.job.crilog`; never the settings, the planner, the cluster, a backend or the CLI
(contracts in pyproject.toml: the adapters are the bottom layer under the backends and the CLI).
"""
