"""The job core: what protects a job whichever backend runs it.

A backend (`fsdpctl.backends.<name>`) only translates: it submits a job to its place, observes it,
signals and cancels it, and says where its logs are. The rules that keep a job safe are kept here,
once, and every backend uses them:

    home      the job's directory FSDPCTL_HOME/jobs/<job>/ and the modes of what fsdpctl makes there
    lock      its lock: every verb that changes the job holds it, waiting a bounded time for a holder
    state     its state file (versioned, typed, checked on read, written atomically, mode 0600)
    shape     what outside programs answer (ids, counts, node indices), checked before it is used
    protocol  the Backend protocol the CLI and the runner speak
    runner    the verbs over a backend: submit then record, or cancel; unknown is never an outcome;
              a job list over every backend; read verbs that never need to write

Paths are derived (settings + job + run id), never taken from a file: a state names ids, never
where to delete or write. The model is torchx's Runner over its schedulers (torchx/runner/api.py,
torchx/schedulers/api.py: an empty describe is "unknown", never "failed"), with the discipline of a
kubelet's own bookkeeping.

Imports: fsdpctl's pure modules, files, settings, reports, targets and the adapters; never
`fsdpctl.backends` (they import this) nor the CLI.
"""
