"""MLflow: compare runs, the runs view, plots, the UI server."""
