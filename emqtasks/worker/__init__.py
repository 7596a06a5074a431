"""The worker pool: a master (master.py) and forked children (child.py) sharing slots
(slots.py), riding out Redis outages (resilience.py). A producer never imports this."""
