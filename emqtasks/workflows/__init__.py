"""Workflows: signatures, chain / group / chord, WorkflowHandle (canvas.py)."""
