"""Periodic schedules: their timings (cron.py) and the declaration, stored form and store
on a queue (schedule.py). The worker keeps them in worker/scheduler.py."""
