"""Planning, before anything runs (pure): what a job needs and what it will cost, from the settings.

    planner    memory per GPU, step time, throughput, MFU and cost (`fsdpctl plan`)
    fit        whether the job fits where it would run, and the cheapest fix when it does not
    sweep      the planner over a grid of models, instance types and node counts (`plan --table`)
    published  published FSDP numbers with their sources, against the planner's prediction
    nodefit    what a job's GPU nodes offer against what its pods request
    volume     the shared volume's write rate, the save-vs-interval warning, `plan`'s volume report
    instances  the one table of GPU instance types (settings, plan, pods and terraform read it)

What the job keeps on the volume and the FSx capacity that holds it are the settings'
(`fsdpctl.settings.storage`: the settings size FSX_STORAGE_GIB with it), re-exported by `volume`.

Imports: the settings, the job core's pure models (`fsdpctl.job.kstatus`), errors, targets and the
trainer's pure modules; never an adapter, a backend, the cluster or the CLI (a contract in
pyproject.toml). The CLI, the job core's policy and the backends import it.
"""
