"""The Slurm backend: the job as a batch script, submitted and watched through Slurm's own
commands."""
