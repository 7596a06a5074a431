"""The producer API: App, Task and JobHandle, the task options and registry, the hooks,
the job's context, the retry policy, and a call made into a job row (jobs.build_job)."""
