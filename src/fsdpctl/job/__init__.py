"""The job core: what protects a job whichever backend runs it.

A backend (`fsdpctl.backends.<name>`) only translates: it submits a job to its place, observes it,
signals and cancels it, and says where its logs are. The rules that keep a job safe are kept here,
once, and every backend uses them:

    home      the job's directory FSDPCTL_HOME/jobs/<job>/ and the modes of what fsdpctl makes there
    lock its lock: every verb that changes the job holds it, waiting a bounded time for a holder
    state     its state file (versioned, typed, checked on read, written atomically, mode 0600)
    shape     what outside programs answer (ids, counts, node indices), checked before it is used
    protocol  the Backend protocol the CLI and the runner speak
    runner    the verbs over a backend: submit then record, or cancel; unknown is never an outcome;
              a job list over every backend; read verbs that never need to write
    outage    how long a verb rides out a silent API server or slurmctld, and no longer

and what a job is, whichever place runs it (pure unless said):

    spec      settings -> `JobSpec` once (storage, resources, rendezvous, restarts, labels)
    policy    the paths, command, environment and budgets each part of the spec is decided by
    render    the Kubernetes objects of a spec (EKS and the local backend both start from them),
              reading the templates that ship with fsdpctl
    validate  those objects against the real schemas, and Kubernetes' name and label rules
    prestep   the pre-step (hub download, volume preparation) before the trainers start
    hf_token  the Hugging Face token a job gets besides its spec, read at the last moment
    record    the run record: what ran, with which settings (secrets masked) and code
    store     the run records on disk (FSDPCTL_HOME), written atomically
    reports   the phases and reports every backend answers in
    progress  training progress from the trainer's JSON log lines
    failures  why a job failed, from its logs: torchrun's root cause, the failing rank's error
    kstatus   what a job on Kubernetes is doing, from the objects the API returns
    crilog    the container runtime's log-line format

Paths are derived (settings + job + run id), never taken from a file: a state names ids, never
where to delete or write. The model is torchx's Runner over its schedulers (torchx/runner/api.py,
torchx/schedulers/api.py: an empty describe is "unknown", never "failed"), with the discipline of a
kubelet's own bookkeeping.

Imports: fsdpctl's cross-cutting modules (errors, files, redact, targets), the settings, the
planner (`fsdpctl.plan`: the policy's budgets) and the adapters (git, for the record's code
version); never `fsdpctl.backends` (they import this), the cluster nor the CLI (contracts in
pyproject.toml).
"""
