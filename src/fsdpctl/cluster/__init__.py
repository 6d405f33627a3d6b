"""The cluster a job runs on: made, checked, provisioned and inspected, before and beside the jobs.

    preflight      `cluster check`: ask AWS (quotas, offerings, the VPC) before any money is spent
    lifecycle the EKS cluster the settings describe, through eksctl or terraform (create, delete)
    fsx            the shared FSx for Lustre file system of an eksctl cluster
    deploy what `fsdpctl deploy` installs: etcd, the job operator, device plugins, monitoring
    deploy_status what is installed (`deploy status`), which the EKS backend also reads before a run
    image          the trainer image: built, tagged, pushed to ECR
    manifests      `fsdpctl manifest`: the job's objects as YAML or JSON, validated
    doctor         preflight checks for a workstation, a GPU node or a pod (`fsdpctl doctor`)
    checks         one check result, shared by `doctor` and `cluster check`

Imports: the settings, the job core (the rendering, `fsdpctl.job.render`), the planner and the
adapters (AWS, eksctl, terraform, Kubernetes, docker) that reach the outside systems; never a
backend or the CLI (a contract in pyproject.toml). The CLI and the EKS backend import it.
"""
